"""Chained blocks against the reference, operation by operation: two KV managers driven alike by the turns of
multi-turn sessions, one given the requests' ``chain_from`` and ``private_from`` (a session's blocks past its
system prompt handed from turn to turn without the index, a last turn's own blocks marked) and one not (every
block indexed). Every lookup, table, hand-out order, eviction count, cached-block count and routing answer
must agree at every step, whatever the order of arrivals, preemptions, retries and finishes."""

from __future__ import annotations

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
from kv_twins import Pair, TwinKVMachine

from simulator import native
from simulator.core import block_pool
from simulator.core.kv_manager import KVManager
from simulator.core.request import HashTail, Request, RequestSpec, splitmix64
from simulator.fleet.prefix_index import indexed_lengths

BS = 4
SYS = 2
"""Blocks of a session's system prompt (its family's, shared by every session of the family)."""



def _session_key(session: int) -> int:
    return (session + 1) << 32


def _hashes(family: int, session: int, num_full: int) -> tuple[int, ...]:
    """A session's stream as the synthetic keys make it: the family's system prompt blocks, then blocks keyed
    by (session, position), alike in every turn of the session."""
    key = _session_key(session)
    return tuple(family * 100 + i if i < SYS else splitmix64(key ^ i) for i in range(num_full))


class ChainMachine(TwinKVMachine):
    """Sessions' turns arrive (a turn may come while the previous one still runs), are admitted with their
    prefix hits, compute, produce, finish, are preempted and re-admitted, or retried as new requests."""

    @initialize(num_blocks=st.integers(8, 48), share=st.booleans())
    def setup(self, num_blocks: int, share: bool = True) -> None:
        self.twins = (KVManager(num_blocks, BS), KVManager(num_blocks, BS))  # chained, reference
        self.shared: dict[int, int] | None = {} if share else None
        """The twins' indexes mirrored into one, as a fleet-wide index holds its replicas' (bits 1 and 2)."""
        if self.shared is not None:
            for r, kv in enumerate(self.twins):
                kv.pool.share_index(self.shared, 1 << r)
        self.running: dict[int, Pair] = {}
        self.waiting: dict[int, Pair] = {}
        self.sessions: dict[int, tuple[int, int, bool]] = {}
        """Each session's family, tokens so far (its last turn's prompt and answer) and whether it ended."""
        self.next_id = 0
        self.takes = 0
        """Turns that took over a run an earlier turn of their session left."""

    def _make(self, request_id: int, family: int, session: int, prompt: int, output: int, *, last: bool,
              before: int) -> Pair:
        """Turn ``request_id``: ``before`` tokens carried from the session's earlier turns. The chained twin's
        spec promises the chain from ``SYS`` on, and a last turn's own blocks (past what earlier turns
        carried) as a tail; the reference's carries every hash as a value and promises nothing."""
        num_full = (prompt + output) // BS
        hashes = _hashes(family, session, num_full)
        reference = RequestSpec(request_id, 0.0, prompt, output, block_hashes=hashes, session_id=session)
        private = max(SYS, before // BS)
        if last and num_full > private:
            chained = RequestSpec(request_id, 0.0, prompt, output, block_hashes=hashes[:private], session_id=session,
                                  private_from=private, hash_tail=HashTail(_session_key(session), private, num_full),
                                  chain_from=SYS)
        else:
            chained = RequestSpec(request_id, 0.0, prompt, output, block_hashes=hashes, session_id=session,
                                  private_from=private if last else None, chain_from=SYS)
        return Request(chained), Request(reference)

    def _admit(self, pair: Pair, chunk: int) -> None:
        hits = [kv.get_computed_blocks(r) for kv, r in zip(self.twins, pair, strict=True)]
        assert hits[0] == hits[1]
        num_new = min(chunk, pair[1].num_tokens - len(hits[1]) * BS)
        claim = self.twins[0]._claim
        fresh = [kv.allocate(r, num_new, h) for kv, r, h in zip(self.twins, pair, hits, strict=True)]
        assert fresh[0] == fresh[1]
        if fresh[1] is None:
            self.waiting[pair[1].request_id] = pair
            return
        if claim is not None and claim.holder is pair[0]:
            self.takes += 1
        for request, hit in zip(pair, hits, strict=True):
            request.num_computed_tokens = len(hit) * BS + num_new
        self.running[pair[1].request_id] = pair

    @rule(family=st.integers(0, 1), prompt=st.integers(1, 24), output=st.integers(1, 12), chunk=st.integers(1, 40),
          last=st.booleans(), data=st.data())
    def turn(self, family: int, prompt: int, output: int, chunk: int, last: bool, data: st.DataObject) -> None:
        """A new session's first turn, or the next turn of a session that has not ended."""
        open_sessions = sorted(s for s, (_, _, ended) in self.sessions.items() if not ended)
        session = data.draw(st.sampled_from([*open_sessions, len(self.sessions)]))
        family, before, _ = self.sessions.get(session, (family, SYS * BS, False))
        prompt += before
        pair = self._make(self.next_id, family, session, prompt, output, last=last, before=before)
        self.sessions[session] = (family, prompt + output, last)
        self.next_id += 1
        self._admit(pair, chunk)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), chunk=st.integers(1, 40))
    def readmit(self, data: st.DataObject, chunk: int) -> None:
        self._admit(self.waiting.pop(data.draw(st.sampled_from(sorted(self.waiting)))), chunk)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def look_up(self, data: st.DataObject) -> None:
        """A waiting request looked up without being admitted (a blocked queue head)."""
        pair = self.waiting[data.draw(st.sampled_from(sorted(self.waiting)))]
        hits = [kv.get_computed_blocks(r) for kv, r in zip(self.twins, pair, strict=True)]
        assert hits[0] == hits[1]

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), chunk=st.integers(1, 40))
    def retry(self, data: st.DataObject, chunk: int) -> None:
        """A request lost with a replica comes back as a new request object with the same spec."""
        old = self.waiting.pop(data.draw(st.sampled_from(sorted(self.waiting))))
        self._admit((Request(old[0].spec), Request(old[1].spec)), chunk)

    @invariant()
    def the_same_to_every_reader(self) -> None:
        chained, reference = (kv.pool for kv in self.twins)
        assert chained.free_queue == reference.free_queue
        assert chained.num_evictions == reference.num_evictions
        assert chained.num_free == reference.num_free
        assert chained.num_cached == reference.num_cached == len(reference.cached)
        assert [chained.ref_count(b) for b in range(chained.num_blocks)] == \
               [reference.ref_count(b) for b in range(reference.num_blocks)]
        for pair in self.running.values():
            assert pair[0].block_table == pair[1].block_table
        # Every hash looked up in the chained index answers as the reference's, or is held in a chain.
        for block_hash, block in chained.cached.items():
            assert reference.cached.get(block_hash) == block
        # Routing: how much of each session's stream each manager holds, for the sessions whose next turn may
        # still come (an ended session's last blocks are nobody's to look up: a private tail, as before).
        for session, (family, tokens, ended) in self.sessions.items():
            if ended:
                continue
            hashes = _hashes(family, session, tokens // BS)
            walked = [kv.prefix_match_blocks(hashes) for kv in self.twins]
            assert walked[0] == walked[1]
            if self.shared is not None:  # one walk of the shared index answers both walks
                found = indexed_lengths(self.shared, 2, hashes)
                assert [kv.chain_match(hashes, n) for kv, n in zip(self.twins, found, strict=True)] == walked
        if self.shared is not None:
            for r, kv in enumerate(self.twins):
                assert {h for h, mask in self.shared.items() if mask >> r & 1} == set(kv.pool.cached)
            assert all(self.shared.values())

    def teardown(self) -> None:
        _TAKES.append(self.takes)


_TAKES: list[int] = []
"""Over the machines run: how many turns took a run over (``test_the_chains_are_taken_over``)."""


TestChains = ChainMachine.TestCase
TestChains.settings = settings(max_examples=600, stateful_step_count=80, deadline=None)


def test_the_chains_are_taken_over() -> None:
    """The machine reaches what it is for: later turns taking over the runs earlier turns of their sessions
    left (derandomized, so that the check is the same every time)."""
    _TAKES.clear()
    run_state_machine_as_test(ChainMachine, settings=settings(max_examples=60, stateful_step_count=50,
                                                              deadline=None, database=None, derandomize=True))
    # Loose floors: the derandomized draws differ between machines (the twin machine of test_kv_private freed
    # 32 runs on CI where this machine's draws freed 117); the scripted test below reaches the case for certain.
    assert sum(_TAKES) >= 5 and sum(1 for n in _TAKES if n) >= 2, _TAKES


def _run_to_its_end(machine: ChainMachine, pair: Pair) -> None:
    """Compute a running pair's prompt, then produce its tokens until it finishes, the twins agreeing after
    every operation."""
    while pair[1].request_id in machine.running:
        if pair[1].num_computed_tokens < pair[1].num_tokens:
            assert machine._compute(pair, pair[1].num_tokens - pair[1].num_computed_tokens)
        else:
            machine._produce(pair)
        machine.the_same_to_every_reader()


def test_scripted_turns_take_their_runs_over() -> None:
    """One session's four turns, each run to its end before the next arrives: every later turn takes over
    the run its previous turn left, the twins agreeing after every operation."""
    machine = ChainMachine()
    machine.setup(48)
    before = SYS * BS
    for turn in range(4):
        prompt = before + 6
        pair = machine._make(turn, 0, 7, prompt, 5, last=turn == 3, before=before)
        machine.sessions[7] = (0, prompt + 5, turn == 3)
        machine._admit(pair, 40)
        machine.the_same_to_every_reader()
        _run_to_its_end(machine, pair)
        before = prompt + 5
    assert not machine.waiting and machine.takes == 3


def test_turns_on_one_system_prompt_hold_its_blocks_through_one_pin() -> None:
    """Turns of three sessions of one family run at once: the later two find the system prompt's blocks by the
    walk the first one's lookup left, and hold them as one pin (a count, not a reference per block), while
    the pool reports, frees and evicts exactly as the reference that references each block does."""
    machine = ChainMachine()
    machine.setup(48)
    pairs = []
    for session in range(3):
        prompt = SYS * BS + 6
        pair = machine._make(session, 0, session, prompt, 5, last=False, before=SYS * BS)
        machine.sessions[session] = (0, prompt + 5, False)
        machine._admit(pair, 40)
        machine.the_same_to_every_reader()
        pairs.append(pair)
    chained = machine.twins[0]
    pins = {id(pair[0].pin) for pair in pairs[1:]}
    assert len(pins) == 1 and pairs[1][0].pin is not None, "the later turns do not share one pin"
    pin = pairs[1][0].pin
    assert pin.blocks == pairs[1][0].block_table[:SYS] and pin.holders == 2
    assert [chained.pool.ref_count(b) for b in pin.blocks] == [3] * SYS  # the first turn's own, and two holders
    for pair in pairs:
        _run_to_its_end(machine, pair)
    assert pin.holders == 0 and not chained.pool._held_pins
    assert [chained.pool.ref_count(b) for b in pin.blocks] == [0] * SYS


def test_the_chains_survive_compactions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine with the free queue compacted whenever its stale entries outnumber its live ones (not
    after a thousand of them): a chain's run partly handed out at the queue's head must stay the run its
    chain refers to (a compaction once queued a copy of it in its place)."""
    if native.active():
        pytest.skip("the compiled pool reads the compaction threshold as a constant")
    monkeypatch.setattr(block_pool, "_COMPACT_SLACK", 0)
    run_state_machine_as_test(ChainMachine, settings=settings(max_examples=150, stateful_step_count=80,
                                                              deadline=None, database=None, derandomize=True))
