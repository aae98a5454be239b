"""KV tiers below the device pool: eviction moves blocks down, lookups continue into the tiers, the
load-or-recompute choice crosses over where the link says, swap shares the host tier, nothing is lost."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from simulator.core.config import Preemption, SchedulerConfig
from simulator.core.kv_tiers import (
    EVICTION_POLICIES,
    KVTiers,
    TierKind,
    TierLoad,
    TierSource,
    TierSpec,
    TierStore,
)
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler

BS = 16


class LinearCost:
    """A link of ``bytes_per_s`` for blocks of ``block_bytes`` (plus ``latency_s`` per load), and a prefill of
    ``s_per_token`` per token: a cost model whose crossover is worked out by hand."""

    def __init__(self, *, bytes_per_s: float, block_bytes: float = 1e6, latency_s: float = 0.0,
                 s_per_token: float = 1e-4) -> None:
        self.bytes_per_s = bytes_per_s
        self.block_bytes = block_bytes
        self.latency_s = latency_s
        self.s_per_token = s_per_token

    def load_s(self, num_blocks_by_tier: Sequence[int]) -> float:
        n = sum(num_blocks_by_tier)
        return self.latency_s + n * self.block_bytes / self.bytes_per_s if n else 0.0

    def prefill_s(self, num_computed_tokens: int, num_new_tokens: int) -> float:
        return num_new_tokens * self.s_per_token


eviction_ops = st.lists(st.tuples(st.sampled_from(["add", "touch", "touch_range", "pop"]), st.sampled_from(range(5)),
                                  st.sampled_from(range(6))), min_size=10, max_size=120)
"""Operations on an eviction order: (kind, a hash's index, a range's other end), over five hashes (so that
most touches find theirs held)."""


@settings(max_examples=300, deadline=None)
@given(policy=st.sampled_from(sorted(EVICTION_POLICIES)), slack=st.sampled_from([0, 1, 3, 1024]), ops=eviction_ops)
def test_an_eviction_order_gives_up_its_hashes_as_an_ordered_dict_would(policy: str, slack: int,
                                                                        ops: list[tuple[str, int, int]]) -> None:
    """The order a tier evicts in, against the definition: a hash stored goes last; under LRU a hit on a
    held hash moves it last (FIFO leaves it); the victim is the first. Its queue of stale entries is
    compacted at every threshold (``compact_slack``: 0 compacts at every touch that leaves one stale
    entry more than it holds), and what it holds and in which order never differs."""
    order = EVICTION_POLICIES[policy](compact_slack=slack)
    model: OrderedDict[int, None] = OrderedDict()
    lru = policy == "lru"
    keys = [1000 + 7 * i for i in range(5)]  # as a prompt's hashes: a tuple read by position
    for kind, a, b in ops:
        if kind == "add" and keys[a] not in model:
            order.add(keys[a])
            model[keys[a]] = None
        elif kind == "touch" and keys[a] in model:
            order.touch(keys[a])
            if lru:
                model.move_to_end(keys[a])
        elif kind == "touch_range":
            start, stop = min(a, b), max(a, b)
            order.touch_range(tuple(keys), start, stop)
            for key in keys[start:stop]:
                if lru and key in model:
                    model.move_to_end(key)
        elif kind == "pop" and model:
            assert order.pop_victim() == model.popitem(last=False)[0]
        assert order.hashes() == list(model)
        assert len(order) == len(model)
        assert all((key in order) == (key in model) for key in keys)
        assert all((key in order.members()) == (key in model) for key in keys)


def spec(rid: int, prompt: int, hashes: Sequence[int], output: int = 1) -> RequestSpec:
    return RequestSpec(rid, 0.0, prompt, output, tuple(hashes))


def run_to_end(s: Scheduler) -> list:
    plans = []
    while s.has_work:
        plan = s.schedule()
        plans.append(plan)
        s.update(plan)
    return plans


def scheduler(num_blocks: int, tiers: list[TierSpec], cost: LinearCost, **kw: object) -> Scheduler:
    s = Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=BS, **kw))  # type: ignore[arg-type]
    s.attach_tiers(KVTiers([TierStore(t) for t in tiers], cost, block_size=BS))
    return s


def evict_prefix_then_return(cost: LinearCost) -> Scheduler:
    """Request 0 computes 8 blocks; request 1 (other hashes) fills the 10-block pool, evicting them into the
    host tier; request 2 repeats request 0's prompt."""
    s = scheduler(10, [TierSpec(name="host")], cost)
    prompt = list(range(100, 108))
    s.add_request(spec(0, 8 * BS + 1, prompt))
    run_to_end(s)
    s.add_request(spec(1, 9 * BS + 1, range(200, 209)))
    run_to_end(s)
    assert all(h in s.tiers.stores[0] for h in prompt)  # type: ignore[union-attr]
    s.add_request(spec(2, 8 * BS + 1, prompt))
    return s


def test_evicted_blocks_move_down_and_a_hit_there_is_loaded() -> None:
    s = evict_prefix_then_return(LinearCost(bytes_per_s=1e12))
    plan = s.schedule()
    assert plan.loads is not None and len(plan.loads) == 1
    op = plan.loads[0]
    assert op.block_hashes == tuple(range(100, 108)) and op.tiers == (0,) * 8
    assert plan.num_new_tokens == [1] and plan.num_computed_tokens == [8 * BS]  # only the last token runs
    assert s.tiers is not None and s.tiers.counters.num_hit_blocks == [8]
    assert s.kv.prefix_match_blocks(list(range(100, 108))) == 8  # the loaded blocks are indexed again
    assert not s.tiers.problems()


def test_load_versus_recompute_crosses_over_at_the_links_bandwidth() -> None:
    # Loading 8 blocks of 1 MB costs latency + 8e6 / bw; recomputing them costs 8 * 16 tokens * 1e-4 s.
    # Loading pays while 1e-3 + 8e6 / bw < 0.0128 s, i.e. bw > 8e6 / 0.0118 = 677,966,101.7 B/s.
    crossover = 8e6 / (8 * BS * 1e-4 - 1e-3)
    for bw, loads in [(crossover * 1.01, True), (crossover * 0.99, False)]:
        s = evict_prefix_then_return(LinearCost(bytes_per_s=bw, latency_s=1e-3))
        plan = s.schedule()
        assert s.tiers is not None
        if loads:
            assert plan.loads is not None and plan.num_new_tokens == [1]
            assert (s.tiers.counters.num_loads, s.tiers.counters.num_recomputes) == (1, 0)
        else:
            assert plan.loads is None and plan.num_new_tokens == [8 * BS + 1]
            assert (s.tiers.counters.num_loads, s.tiers.counters.num_recomputes) == (0, 1)


def test_a_fast_tier_is_loaded_and_a_slow_tier_behind_it_recomputed() -> None:
    # Host holds blocks 0-3 (fast), disk the rest (slow): the best plan loads the host run only.
    class TwoLinks(LinearCost):
        def load_s(self, num_blocks_by_tier: Sequence[int]) -> float:
            return num_blocks_by_tier[0] * 1e-5 + num_blocks_by_tier[1] * 1.0

    tiers = KVTiers([TierStore(TierSpec(name="host")), TierStore(TierSpec(name="disk", kind=TierKind.DISK))],
                    TwoLinks(bytes_per_s=1.0), block_size=BS)
    for h in range(4, 8):
        tiers.stores[1].offer(h, 0)
    for h in range(4):
        tiers.stores[0].offer(h, 0)
    load = tiers.plan(list(range(8)), 0, 8 * BS + 1, 8)
    assert load is not None and load.tiers == [0, 0, 0, 0, 1, 1, 1, 1] and load.num_load_blocks == 4


def test_hit_count_admission_keeps_only_blocks_hit_often_enough() -> None:
    tiers = KVTiers([TierStore(TierSpec(name="host", min_hits=2))], LinearCost(bytes_per_s=1e9), block_size=BS)
    tiers.count_hits([1, 2, 2])
    tiers.on_evict(1)
    tiers.on_evict(2)
    assert 2 in tiers.stores[0] and 1 not in tiers.stores[0]
    assert tiers.counters.num_dropped == 1 and not tiers.problems()


@pytest.mark.parametrize("with_tiers", [True, False])
def test_no_decode_run_while_a_blocked_head_may_refresh_its_tier_blocks(with_tiers: bool) -> None:
    """A head that cannot fit is tried again every step, and with tiers each try touches the blocks its load
    would read (``KVTiers.refresh``) before the allocation fails: the order of the tier's evictions, which a
    decode run skipping those tries would leave behind. So with tiers a waiting head with a seat free stops
    runs; without them the same blocked head lets the batch decode in one run (fuzz seed 508197: a 0.01 GiB
    host tier of 1-token blocks, whose victims then differed, and with them later loads and finish times)."""
    cost = LinearCost(bytes_per_s=1e9)
    s = evict_prefix_then_return(cost)  # request 2 waits, its 8 prompt blocks in the host tier
    s.waiting.pop()
    s.add_request(spec(3, 5 * BS, range(300, 305), output=60))  # a long decode holding 6 of the 10 blocks
    while not (s.running and s.running[0].num_output_tokens > 0):
        s.update(s.schedule())
    # 9 blocks, of which only the first 2 hashed (found in the host tier): blocked even at the most hits
    s.add_request(spec(2, 8 * BS + 1, range(100, 102)))
    assert s.tiers is not None and s.tiers.find(list(range(100, 102)), 0, 2) == [0, 0]
    if not with_tiers:
        s.tiers = None
    steps = s.steady_decode_steps()
    assert (steps == 0) if with_tiers else (steps >= 2)


def test_swap_takes_its_room_from_the_host_tier() -> None:
    cost = LinearCost(bytes_per_s=1e12)
    s = scheduler(6, [TierSpec(name="host", capacity_blocks=4)], cost, preemption=Preemption.SWAP,
                  max_num_batched_tokens=4096)
    s.add_request(spec(0, 2 * BS, [1, 2], output=2 * BS))
    s.add_request(spec(1, 2 * BS, [3, 4], output=2 * BS))
    while s.has_work and not s.swapped:
        s.update(s.schedule())
    assert s.swapped, "the pool is too small for both: one is swapped out"
    host = s.tiers.host  # type: ignore[union-attr]
    assert host is not None and host.num_reserved == s.num_host_blocks_used > 0
    run_to_end(s)
    assert host.num_reserved == 0 and s.num_host_blocks_used == 0
    assert not s.tiers.problems()  # type: ignore[union-attr]


def test_bad_tier_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity_blocks"):
        TierSpec(name="host", capacity_blocks=-1)
    with pytest.raises(ValueError, match="eviction"):
        TierSpec(name="host", eviction="random")
    with pytest.raises(ValueError, match="prefix cache"):
        Scheduler(SchedulerConfig(num_blocks=4, block_size=BS, enable_prefix_caching=False)).attach_tiers(
            KVTiers([TierStore(TierSpec(name="host"))], LinearCost(bytes_per_s=1.0), block_size=BS))


LAYOUTS = {
    "device-fed store, compute-fed pool last": [
        TierSpec(name="host", capacity_blocks=3),
        TierSpec(name="disk", kind=TierKind.DISK, capacity_blocks=4, min_hits=1),
        TierSpec(name="store", kind=TierKind.REMOTE, capacity_blocks=5, source=TierSource.DEVICE),
        TierSpec(name="pool", kind=TierKind.REMOTE, capacity_blocks=2, source=TierSource.COMPUTE)],
    # Tiers fed directly above tiers fed from above: what they turn away goes no further.
    "compute-fed host first, device-fed store in the middle": [
        TierSpec(name="host", capacity_blocks=3, min_hits=1, source=TierSource.COMPUTE),
        TierSpec(name="disk", kind=TierKind.DISK, capacity_blocks=4),
        TierSpec(name="store", kind=TierKind.REMOTE, capacity_blocks=3, min_hits=1, source=TierSource.DEVICE),
        TierSpec(name="archive", kind=TierKind.DISK, capacity_blocks=2)],
    "an empty compute-fed host": [
        TierSpec(name="host", capacity_blocks=0, source=TierSource.COMPUTE),
        TierSpec(name="disk", kind=TierKind.DISK, capacity_blocks=4)],
}


class TierMachine(RuleBasedStateMachine):
    """Random evictions, computes, hits, swap reservations and releases on hierarchies of tiers fed from
    above, by the device's evictions and as blocks are computed: capacities hold, each tier holds a hash
    once, and every hash the device let go is in a tier or counted dropped — checked against a model that
    remembers what was dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: set[int] = set()
        """Hashes the device let go (each must be in a tier or counted gone)."""
        self.computed: set[int] = set()
        """Hashes written on compute (the device still holds them: a tier may turn them away)."""
        self.reserved: list[int] = []

    @initialize(layout=st.sampled_from(sorted(LAYOUTS)))
    def build(self, layout: str) -> None:
        self.tiers = KVTiers([TierStore(t) for t in LAYOUTS[layout]], LinearCost(bytes_per_s=1e9), block_size=BS)

    @rule(block_hash=st.integers(0, 12))
    def evict(self, block_hash: int) -> None:
        self.tiers.on_evict(block_hash)
        self.offered.add(block_hash)

    @rule(block_hash=st.integers(0, 12))
    def compute(self, block_hash: int) -> None:
        self.tiers.on_compute(block_hash)
        self.computed.add(block_hash)

    @rule(block_hash=st.integers(0, 12))
    def hit(self, block_hash: int) -> None:
        self.tiers.count_hits([block_hash])

    @rule(n=st.integers(1, 3))
    def reserve(self, n: int) -> None:
        if self.tiers.reserve_host(n):
            self.reserved.append(n)

    @rule()
    def release(self) -> None:
        if self.reserved:
            self.tiers.release_host(self.reserved.pop(0))

    @invariant()
    def holds(self) -> None:
        assert not self.tiers.problems()
        held = set().union(*(set(s.hashes()) for s in self.tiers.stores))
        assert held <= self.offered | self.computed
        for store in self.tiers.stores:
            assert store.capacity_blocks is None or len(store) + store.num_reserved <= store.capacity_blocks
        # Every offer ends stored somewhere or dropped: drops at least cover what no tier holds.
        gone = self.tiers.counters.num_dropped + sum(s.num_evicted for s in self.tiers.stores)
        assert len(self.offered - held) <= gone


TestTierMachine = TierMachine.TestCase
TestTierMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


PROMPTS = (tuple(range(6)), tuple(range(3, 9)), (1, 3, 5, 7), (0, 1, 2))
"""Block-hash tuples looked up again and again (the same objects, as a queue head's are step after step)."""


def reference_refresh(tiers: KVTiers, load: TierLoad, block_hashes: Sequence[int], start: int) -> None:
    """The refresh by definition: every block the load reads touched in its tier, in prefix order."""
    for position in range(load.num_load_blocks):
        store = tiers.stores[load.tiers[position]]
        block_hash = block_hashes[start + position]
        if block_hash in store:
            store.touch(block_hash)


class PlanCacheMachine(RuleBasedStateMachine):
    """``plan`` keeps its last answer and ``refresh`` skips touching again a run it touched last: random
    evictions, computes, reservations and lookups on two identical hierarchies, one planned and refreshed
    through the cache, the other worked out every time (``find`` + the search, every block touched), give
    the same plans and leave every tier in the same eviction order."""

    def __init__(self) -> None:
        super().__init__()
        self.cached = self._hierarchy()
        self.reference = self._hierarchy()
        self.reserved: list[int] = []
        self.head = (PROMPTS[0], 0, len(PROMPTS[0]) * BS + 1)
        """(block hashes, device hits, prompt tokens) of the request heading the queue."""

    @staticmethod
    def _hierarchy() -> KVTiers:
        specs = [TierSpec(name="host", capacity_blocks=5), TierSpec(name="disk", kind=TierKind.DISK, capacity_blocks=6),
                 TierSpec(name="store", kind=TierKind.REMOTE, capacity_blocks=7, source=TierSource.COMPUTE,
                          eviction="fifo")]
        return KVTiers([TierStore(t) for t in specs], LinearCost(bytes_per_s=1e10, latency_s=1e-4), block_size=BS)

    @rule(block_hash=st.integers(0, 9))
    def evict(self, block_hash: int) -> None:
        for tiers in (self.cached, self.reference):
            tiers.on_evict(block_hash)

    @rule(block_hash=st.integers(0, 9))
    def compute(self, block_hash: int) -> None:
        for tiers in (self.cached, self.reference):
            tiers.on_compute(block_hash)

    @rule(n=st.integers(1, 3))
    def reserve(self, n: int) -> None:
        done = {self.cached.reserve_host(n), self.reference.reserve_host(n)}
        assert len(done) == 1
        if done.pop():
            self.reserved.append(n)

    @rule()
    def release(self) -> None:
        if self.reserved:
            n = self.reserved.pop(0)
            self.cached.release_host(n)
            self.reference.release_host(n)

    @rule(prompt=st.sampled_from(PROMPTS), hits=st.integers(0, 2), extra=st.sampled_from([1, 8, 40]))
    def new_head(self, prompt: tuple[int, ...], hits: int, extra: int) -> None:
        """Another request heads the queue (the one ``plan`` looks up until the next ``new_head``)."""
        self.head = (prompt, hits, len(prompt) * BS + extra)

    @rule(admitted=st.booleans(), repeat=st.integers(1, 3))
    def plan(self, admitted: bool, repeat: int) -> None:
        """The head planned (and, ``admitted``, its load's blocks refreshed), ``repeat`` times in a row."""
        prompt, hits, num_tokens = self.head
        max_blocks = min(len(prompt), (num_tokens - 1) // BS)
        for _ in range(repeat):
            load = self.cached.plan(prompt, hits, num_tokens, max_blocks)
            expected = self.reference.find(prompt, hits, max_blocks)
            want = self.reference._search(prompt, hits, num_tokens, max_blocks)
            assert (load is None) == (want is None) == (not expected)
            if load is None or want is None:
                continue
            assert load.tiers == want.tiers == expected
            assert (load.num_load_blocks, load.load_s) == (want.num_load_blocks, want.load_s)
            if admitted and load.num_load_blocks:
                self.cached.refresh(load, prompt, hits)
                reference_refresh(self.reference, want, prompt, hits)

    @invariant()
    def same_tiers(self) -> None:
        for mine, theirs in zip(self.cached.stores, self.reference.stores, strict=True):
            assert mine.hashes() == theirs.hashes()


TestPlanCacheMachine = PlanCacheMachine.TestCase
TestPlanCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_blocked_heads_plan_is_reused_until_a_tier_changes() -> None:
    """The head planned again with nothing changed gets the same answer without a lookup; a block of its
    prompt stored since extends the run found, one evicted cuts it."""
    tiers = KVTiers([TierStore(TierSpec(name="host", capacity_blocks=4))], LinearCost(bytes_per_s=1e12),
                    block_size=BS)
    for block_hash in (0, 1):
        tiers.on_evict(block_hash)
    prompt = (0, 1, 2, 3)
    first = tiers.plan(prompt, 0, 4 * BS + 1, 4)
    assert first is not None and first.tiers == [0, 0]
    assert tiers.plan(prompt, 0, 4 * BS + 1, 4) is first
    tiers.on_evict(2)
    grown = tiers.plan(prompt, 0, 4 * BS + 1, 4)
    assert grown is not None and grown.tiers == [0, 0, 0]
    assert tiers.plan(prompt, 0, 4 * BS + 1, 4) is grown
    for block_hash in (5, 6):  # the host tier holds 4: 0 and 1 leave it, the last tier, dropped
        tiers.on_evict(block_hash)
    assert tiers.plan(prompt, 0, 4 * BS + 1, 4) is None
    tiers.on_evict(0)
    again = tiers.plan(prompt, 0, 4 * BS + 1, 4)
    assert again is not None and again.tiers == [0]
    other = tiers.plan(prompt, 1, 4 * BS + 1, 4)  # other arguments: looked up
    assert other is None


def test_a_run_touched_since_its_refresh_is_refreshed_again() -> None:
    """Refreshing the run it refreshed last is skipped only while its tier's order has not moved: a block
    of the run touched in between (offered again) is put back in the run's order."""
    tiers = KVTiers([TierStore(TierSpec(name="host", capacity_blocks=4))], LinearCost(bytes_per_s=1e12),
                    block_size=BS)
    for block_hash in (0, 1):
        tiers.on_evict(block_hash)
    prompt = (0, 1, 2)
    load = tiers.plan(prompt, 0, 3 * BS + 1, 3)
    assert load is not None and load.num_load_blocks == 2
    tiers.refresh(load, prompt, 0)
    tiers.on_evict(0)  # present: touched, the host's order is now 1, 0
    assert tiers.stores[0].hashes() == [1, 0]
    assert tiers.plan(prompt, 0, 3 * BS + 1, 3) is load  # membership did not move
    tiers.refresh(load, prompt, 0)
    assert tiers.stores[0].hashes() == [0, 1]


tier_configs = st.builds(
    SchedulerConfig,
    num_blocks=st.integers(8, 30),
    block_size=st.sampled_from([2, 4]),
    preemption=st.sampled_from(list(Preemption)),
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(8, 48),
    max_model_len=st.integers(32, 96),
)
tier_requests = st.lists(st.tuples(st.integers(2, 40), st.integers(1, 12), st.integers(0, 3)), min_size=1,
                         max_size=20)


@settings(max_examples=120, deadline=None)
@given(config=tier_configs, reqs=tier_requests, host_blocks=st.integers(0, 12),
       bandwidth=st.sampled_from([1e3, 1e12]))
def test_random_streams_through_tiers_lose_nothing(config: SchedulerConfig, reqs: list[tuple[int, int, int]],
                                                   host_blocks: int, bandwidth: float) -> None:
    """A bounded host tier over an unbounded disk: every hash the device ever evicted is, at every step, on
    the device, in a tier, or nowhere only if no tier could keep it (never, with the disk unbounded); tier
    invariants hold; every request finishes with every output token; blocks are conserved."""
    tiers = KVTiers([TierStore(TierSpec(name="host", capacity_blocks=host_blocks)),
                     TierStore(TierSpec(name="disk", kind=TierKind.DISK))],
                    LinearCost(bytes_per_s=bandwidth), block_size=config.block_size)
    sched = Scheduler(config)
    sched.attach_tiers(tiers)
    evicted: set[int] = set()
    pool = sched.kv.pool

    def record(block_hash: int, block_id: int) -> None:
        evicted.add(block_hash)
        tiers.on_evict(block_hash, block_id)

    pool.on_evict = record
    bs = config.block_size
    added = []
    pending = list(enumerate(reqs))
    for _ in range(2000):
        if not pending and not sched.has_work:
            break
        if pending:
            rid, (prompt, output, family) = pending.pop(0)
            hashes = tuple(family * 100 + i for i in range((prompt + output) // bs))
            added.append(sched.add_request(RequestSpec(rid, float(rid), prompt, output, block_hashes=hashes)))
        plan = sched.schedule()
        for op in plan.loads or ():
            assert [pool.block_hash(b) for b in op.block_ids] == list(op.block_hashes)  # loaded blocks indexed
        sched.update(plan)
        assert not tiers.problems()
        held = set(pool.cached) | set(tiers.stores[0].hashes()) | set(tiers.stores[1].hashes())
        assert evicted <= held
        assert tiers.counters.num_dropped == 0
        assert pool.num_free + sum(1 for r in pool.ref_cnt if r > 0) == pool.num_blocks
        assert tiers.host is not None and sched.num_host_blocks_used == tiers.host.num_reserved
    assert not sched.has_work
    for request in added:
        assert request.status is RequestStatus.REJECTED or request.num_output_tokens == request.max_output_tokens
