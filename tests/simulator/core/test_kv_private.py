"""Private blocks against the reference, operation by operation: two KV managers driven alike, one given
the requests' ``private_from`` (their own blocks marked, not indexed) and one not (every block indexed).
Every lookup, table, hand-out order, eviction count and cached-block count must agree at every step."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from kv_twins import TwinKVMachine

from simulator import native
from simulator.core import block_pool
from simulator.core.block_pool import BlockPool
from simulator.core.kv_manager import KVManager
from simulator.core.request import HashTail, Request, RequestSpec, splitmix64

BS = 4
SHARED = 2
"""Leading blocks of a request that carry its family's system prompt (shared); the rest are its own."""


def _spec(request_id: int, family: int, prompt: int, output: int, *, private: bool) -> RequestSpec:
    """Hashes for prompt and answer, as the synthetic workloads make them: the first ``SHARED`` blocks are
    the family's, the rest the request's own (a retry of the same request carries the same ones). The
    private twin's own hashes are a tail, derived only when something reads them (a retry builds a new
    spec: its tail is not derived even when an earlier life's was)."""
    num_full = (prompt + output) // BS
    key = (request_id + 1) << 32
    hashes = tuple(family * 100 + i if i < SHARED else splitmix64(key ^ i) for i in range(num_full))
    if not private:
        return RequestSpec(request_id, 0.0, prompt, output, block_hashes=hashes)
    tail = HashTail(key, SHARED, num_full) if num_full > SHARED else None
    return RequestSpec(request_id, 0.0, prompt, output, block_hashes=hashes[:SHARED] if tail else hashes,
                       private_from=SHARED, hash_tail=tail)


def _plain_walk(kv: KVManager, request: Request) -> list[int]:
    """The lookup as a walk of the index, hash by hash: what ``get_computed_blocks`` answers, also when it
    answers a request looked up again from its last answer."""
    if not request.num_hashed_blocks:
        return []
    hits = []
    for block_hash in request.block_hashes[:min(request.num_hashed_blocks, (request.num_tokens - 1) // BS)]:
        block = kv.pool.cached.get(block_hash)
        if block is None:
            break
        hits.append(block)
    return hits


class TwinMachine(TwinKVMachine):
    """Admit (with prefix hits), compute, produce, finish, preempt and re-admit, retry as a new request."""

    @initialize(num_blocks=st.integers(6, 40), prefill_worker=st.booleans())
    def setup(self, num_blocks: int, prefill_worker: bool) -> None:
        self.twins = (KVManager(num_blocks, BS), KVManager(num_blocks, BS))  # private, reference
        self.prefill_worker = prefill_worker
        """Requests end at their first token, as on a prefill worker (they always leave unfinished)."""
        self.running: dict[int, tuple[Request, Request]] = {}
        self.waiting: dict[int, tuple[Request, Request]] = {}
        self.next_id = 0
        self.owner: dict[int, int] = {}
        """Each request's own hashes -> its id."""
        self.runs_seen = [0, 0]
        """Runs freed, and the most queued at once."""

    def _make(self, request_id: int, family: int, prompt: int, output: int) -> tuple[Request, Request]:
        if self.prefill_worker:
            output = max(output, 2)  # one token would be the whole request: it finishes on the prefill worker
        pair = (Request(_spec(request_id, family, prompt, output, private=True)),
                Request(_spec(request_id, family, prompt, output, private=False)))
        self.owner.update((h, request_id) for h in pair[1].block_hashes[SHARED:])
        if self.prefill_worker:
            for request in pair:
                request.max_output_tokens = 1
        return pair

    def _admit(self, pair: tuple[Request, Request], chunk: int) -> None:
        hits = [kv.get_computed_blocks(r) for kv, r in zip(self.twins, pair, strict=True)]
        assert hits[0] == hits[1] == _plain_walk(self.twins[1], pair[1])
        num_new = min(chunk, pair[1].num_tokens - len(hits[1]) * BS)
        fresh = [kv.allocate(r, num_new, h) for kv, r, h in zip(self.twins, pair, hits, strict=True)]
        assert fresh[0] == fresh[1]
        if fresh[1] is None:
            self.waiting[pair[1].request_id] = pair
            return
        for request, hit in zip(pair, hits, strict=True):
            request.num_computed_tokens = len(hit) * BS + num_new
        self.running[pair[1].request_id] = pair

    @rule(family=st.integers(0, 2), prompt=st.integers(1, 40), output=st.integers(1, 12), chunk=st.integers(1, 24))
    def arrive(self, family: int, prompt: int, output: int, chunk: int) -> None:
        pair = self._make(self.next_id, family, prompt, output)
        self.next_id += 1
        self._admit(pair, chunk)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), chunk=st.integers(1, 24))
    def readmit(self, data: st.DataObject, chunk: int) -> None:
        pair = self.waiting.pop(data.draw(st.sampled_from(sorted(self.waiting))))
        self._admit(pair, chunk)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def look_up(self, data: st.DataObject) -> None:
        """A waiting request looked up without being admitted (a blocked queue head, step after step)."""
        pair = self.waiting[data.draw(st.sampled_from(sorted(self.waiting)))]
        hits = [kv.get_computed_blocks(r) for kv, r in zip(self.twins, pair, strict=True)]
        assert hits[0] == hits[1] == _plain_walk(self.twins[1], pair[1])

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), chunk=st.integers(1, 24))
    def retry(self, data: st.DataObject, chunk: int) -> None:
        """A request lost with a replica comes back as a new request object with the same spec."""
        old = self.waiting.pop(data.draw(st.sampled_from(sorted(self.waiting))))
        spec = old[1].spec
        self._admit(self._make(spec.request_id, spec.block_hashes[0] // 100 if spec.block_hashes else 0,
                               spec.prompt_tokens, spec.output_tokens), chunk)

    def _finishing(self, pair: tuple[Request, Request]) -> None:
        if pair[1].num_indexed_blocks > pair[0].mark_from:
            self.runs_seen[0] += 1

    @invariant()
    def the_same_to_every_reader(self) -> None:
        private, reference = (kv.pool for kv in self.twins)
        queued = sum(1 for entry in private._freed[private._freed_head:] if isinstance(entry, list))
        self.runs_seen[1] = max(self.runs_seen[1], queued)
        assert private.free_queue == reference.free_queue
        assert private.num_evictions == reference.num_evictions
        assert private.num_cached == reference.num_cached == len(reference.cached)
        assert [private.ref_count(b) for b in range(private.num_blocks)] == \
               [reference.ref_count(b) for b in range(reference.num_blocks)]
        for pair in self.running.values():
            assert pair[0].block_table == pair[1].block_table
        # Every hash someone may still look up answers alike; the rest are marked: held by their request, or
        # free in a run.
        exposed = self.twins[0]._exposed
        in_runs = private._run_blocks()
        tables = {pair[0].request_id: pair[0].block_table for pair in self.running.values()}
        marked = 0
        for block_hash, block in reference.cached.items():
            owner = self.owner.get(block_hash)
            if owner is None or owner in exposed or self.prefill_worker:
                assert private.cached.get(block_hash) == block
            else:
                assert block_hash not in private.cached
                assert block in in_runs or block in tables.get(owner, ())
                marked += 1
        assert private.num_marked == marked
        assert all(private.ref_count(b) == 0 for b in in_runs)
        if self.prefill_worker:
            assert private.num_marked == 0, "a prefill worker's requests must not be marked"

    def teardown(self) -> None:
        _RUNS_SEEN.append((self.runs_seen[0], self.runs_seen[1]))


_RUNS_SEEN: list[tuple[int, int]] = []
"""Over the machines run: runs freed, and the most queued at once (``test_the_twins_free_runs``)."""

TestTwins = TwinMachine.TestCase
TestTwins.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)


def test_the_twins_free_runs() -> None:
    """The state machine reaches what it is for: finished requests freeing marked blocks as runs, several
    queued at once (derandomized, so that the check is the same every time)."""
    _RUNS_SEEN.clear()
    machine = settings(max_examples=200, stateful_step_count=50, deadline=None, database=None, derandomize=True)
    run_state_machine_as_test(TwinMachine, settings=machine)
    # Loose floors: the derandomized draws differ between machines (CI freed 32 runs in 100 examples where
    # this one freed 117); the scripted test below reaches the case for certain.
    assert sum(freed for freed, _ in _RUNS_SEEN) >= 10
    assert any(at_once >= 2 for _, at_once in _RUNS_SEEN)


def test_scripted_twins_free_runs_queued_together() -> None:
    """Requests of two families admitted, run to their ends and freed one after another: each frees its
    marked blocks as a run, the runs wait in the free queue together, and new requests evict them, with
    both twins agreeing after every operation."""
    machine = TwinMachine()
    machine.setup(24, False)
    for request_id in range(4):
        machine._admit(machine._make(request_id, request_id % 2, 17, 3), 24)
        machine.next_id += 1
        machine.the_same_to_every_reader()
    for request_id in range(4):
        pair = machine.running[request_id]
        while request_id in machine.running:
            if pair[1].num_computed_tokens < pair[1].num_tokens:
                assert machine._compute(pair, pair[1].num_tokens - pair[1].num_computed_tokens)
            else:
                machine._produce(pair)
            machine.the_same_to_every_reader()
    assert machine.runs_seen == [4, 4]
    for request_id in range(4, 9):  # fresh requests take the free blocks: the runs are evicted, in order
        machine._admit(machine._make(request_id, 2, 21, 2), 24)
        machine.next_id += 1
        machine.the_same_to_every_reader()
    assert not machine.waiting
    assert machine.twins[0].pool.num_evictions == machine.twins[1].pool.num_evictions > 0


def test_marked_blocks_are_cached_queued_and_evicted_like_indexed_ones() -> None:
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(4)  # a request's table: a shared block, two of its own, a partial one
    pool.cache_range(blocks, (7, 8, 9), 0, 3, private_from=1)
    assert pool.cached == {7: blocks[0]} and pool.num_cached == 3 and pool.num_marked == 2
    pool.free_marked_table(list(blocks), 1, 3)  # the pool takes the list over: a copy, to read ours after
    # The partial block to the front, then the marked ones as one run, then the shared one: free_blocks's order.
    assert pool.free_queue == [blocks[3], 4, blocks[2], blocks[1], blocks[0]]
    assert pool.num_free == 5 and pool.num_used == 0
    assert [pool.ref_count(b) for b in blocks] == [0, 0, 0, 0] and pool.ref_cnt[:4] == [0, 0, 0, 0]
    assert pool.get_new_blocks(3) == [blocks[3], 4, blocks[2]]  # a slice of the run
    assert pool.num_evictions == 1 and pool.num_cached == 2 and pool.num_marked == 1
    assert pool.get_new_blocks(2) == [blocks[1], blocks[0]]
    assert pool.num_evictions == 3 and pool.num_cached == 0 and not pool.cached
    assert pool.ref_cnt == [1, 1, 1, 1, 1]


def test_marked_blocks_are_indexed_when_asked_and_with_a_listener() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    pool.cache_range(blocks, (7, 8), 0, 2, private_from=0)
    pool.index_private(blocks, (7, 8), 0, 2)
    assert pool.cached == {7: blocks[0], 8: blocks[1]} and pool.num_cached == 2 and pool.num_marked == 0
    listened = BlockPool(4)
    seen: list[int] = []
    listened.on_cache = seen.append
    more = listened.get_new_blocks(2)
    listened.cache_range(more, (7, 8), 0, 2, private_from=0)
    assert seen == [7, 8] and listened.cached == {7: more[0], 8: more[1]} and listened.num_marked == 0


def test_compaction_keeps_runs_whole_and_in_place() -> None:
    pool = BlockPool(3000)
    shared = pool.get_new_blocks(1)
    pool.cache_range(shared, (1,), 0, 1)
    pool.free_blocks(shared)
    own = pool.get_new_blocks(2)
    pool.cache_range(own, (2, 3), 0, 2, private_from=0)
    pool.free_marked_table(list(own), 0, 2)
    order = pool.free_queue
    for _ in range(1500):  # hits on the free shared block leave stale entries until the queue is compacted
        pool.touch(shared)
        pool.free_blocks(shared)
    assert len(pool._freed) < 1100
    assert pool.free_queue[-3:] == [own[1], own[0], shared[0]] and pool.free_queue[:-3] == order[:-3]



def _partly_handed_out_run_then_compacted() -> tuple[BlockPool, list[int], list[int]]:
    """A run (a finished request's marked blocks) at the head of the queue with two of its four blocks handed
    out, then a compaction (hits on a free block leave stale entries until the queue is rebuilt)."""
    pool = BlockPool(8)
    fresh = pool.get_new_blocks(8)  # every block out: what follows comes from the freed queue
    shared, own = fresh[:1], fresh[1:5]
    pool.cache_range(shared, (1,), 0, 1)
    pool.cache_range(own, (2, 3, 4, 5), 0, 4, private_from=0)
    run = list(own)
    pool.free_marked_table(run, 0, 4)  # the queue's head: own's blocks, last first
    pool.free_blocks(shared)
    assert pool.get_new_blocks(2) == [own[3], own[2]]
    compactions = 0
    for _ in range(1100):  # past _COMPACT_SLACK stale entries
        before = len(pool._freed)
        pool.touch(shared)
        pool.free_blocks(shared)
        compactions += len(pool._freed) < before
    assert compactions
    return pool, run, own


def test_compaction_keeps_a_run_the_very_list_a_chain_refers_to() -> None:
    """A session's chain holds its last turn's run by identity: after a compaction the run is still queued and
    still answers with only the blocks not handed out (a copy left in the queue instead let a later turn take
    blocks other requests held: a double free)."""
    pool, run, own = _partly_handed_out_run_then_compacted()
    assert len(run) == 2 and run == [own[0], own[1]]  # what is left of it, in table order
    assert pool.get_new_blocks(1) == [own[1]]  # the queue hands out the same run's next block
    assert len(run) == 1 and pool.take_run(run) == 1
    assert pool.num_free == 1 and not set(pool.free_queue) & set(own)


def test_a_compacted_run_is_indexed_under_its_own_blocks_hashes() -> None:
    pool, run, own = _partly_handed_out_run_then_compacted()
    pool.index_run(run, (2, 3, 4, 5), 0)  # the run was table[0:4]: its live part is own[0], own[1]
    assert pool.cached[2] == own[0] and pool.cached[3] == own[1] and 4 not in pool.cached and 5 not in pool.cached
    assert pool.get_new_blocks(2) == [own[1], own[0]]


def test_the_twins_agree_through_compactions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin machine with the free queue compacted whenever its stale entries outnumber its live ones
    (at the shipped threshold, a thousand stale entries, these small pools never compact)."""
    if native.active():
        pytest.skip("the compiled pool reads the compaction threshold as a constant")
    monkeypatch.setattr(block_pool, "_COMPACT_SLACK", 0)
    run_state_machine_as_test(TwinMachine, settings=settings(max_examples=150, stateful_step_count=50,
                                                             deadline=None, database=None, derandomize=True))
