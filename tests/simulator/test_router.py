"""Routing policies: exact small cases, staleness accounting, and properties of consistent hashing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.core.request import RequestSpec
from simulator.fleet.hash_ring import AffinityRoute, HashRing, stable_hash64
from simulator.fleet.loads import LoadLevels, first_min_index, first_min_of, least_loaded_index, least_loaded_of
from simulator.fleet.prefix_route import PrefixAwareRoute
from simulator.fleet.router import (
    ROUTERS,
    LeastRequestsRouter,
    LiveViews,
    PowerOfTwoRouter,
    PrefixAwareRouter,
    ReplicaView,
    RoundRobinRouter,
    Router,
    RouterConfig,
    RouterPolicy,
    RouterState,
    SessionAffinityRouter,
    load_of,
    make_router,
)


@dataclass
class FakeReplica:
    """A live replica as the router sees it: plain mutable attributes and a set of cached block hashes."""

    replica_id: int
    num_running: int = 0
    num_waiting: int = 0
    kv_used_frac: float = 0.0
    cached: set[int] = field(default_factory=set)
    speed: float = 1.0

    @property
    def load(self) -> int:
        return self.num_running + self.num_waiting

    def prefix_match_blocks(self, block_hashes: Sequence[int], num_blocks: int | None = None) -> int:
        matched = 0
        for h in block_hashes:
            if h not in self.cached:
                break
            matched += 1
        return matched


def fleet(*loads: int) -> list[FakeReplica]:
    return [FakeReplica(replica_id=i, num_running=load) for i, load in enumerate(loads)]


def spec(request_id: int = 0, *, session_id: int | None = None, blocks: tuple[int, ...] = ()) -> RequestSpec:
    return RequestSpec(
        request_id=request_id,
        arrival_s=0.0,
        prompt_tokens=16 * max(1, len(blocks)),
        output_tokens=8,
        block_hashes=blocks,
        session_id=session_id,
    )


def build(policy: RouterPolicy, seed: int = 0, num_replicas: int = 4, **knobs: Any) -> Router:
    return make_router(RouterConfig(policy=policy, **knobs), num_replicas=num_replicas, seed=seed)


# ------------------------------------------------------------------------------------ registry, config


def test_registry_matches_policy_names_and_classes() -> None:
    assert tuple(ROUTERS) == get_args(RouterPolicy)
    for name in get_args(RouterPolicy):
        assert isinstance(build(name), ROUTERS[name])


def test_config_is_frozen_strict_and_validated() -> None:
    config = RouterConfig(policy="least_requests", refresh_s=0.5)
    with pytest.raises(ValidationError):
        config.refresh_s = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        RouterConfig(policy="least_requests", refersh_s=0.5)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        RouterConfig(policy="fastest")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        RouterConfig(refresh_s=-1.0)
    with pytest.raises(ValidationError):
        RouterConfig(load_factor_epsilon=0.0)
    assert RouterConfig.model_validate({"policy": "prefix_aware", "load_weight": 3}).load_weight == 3.0


def test_make_router_rejects_empty_fleet_and_routers_reject_no_views() -> None:
    with pytest.raises(ValueError):
        build("round_robin", num_replicas=0)
    for name in get_args(RouterPolicy):
        with pytest.raises(ValueError):
            build(name).choose(spec(), [], 0.0)


def test_stable_hash_is_splitmix64() -> None:
    # First output of SplitMix64 seeded with 0: a fixed value, whatever PYTHONHASHSEED is.
    assert stable_hash64(0) == 0xE220A8397B1DCDAF
    assert stable_hash64(-1) == stable_hash64((1 << 64) - 1)


# -------------------------------------------------------------------------------------- simple policies


def test_round_robin_cycles() -> None:
    router = RoundRobinRouter()
    views = fleet(5, 0, 0)
    assert [router.choose(spec(i), views, 0.0) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_requests_picks_min_ties_by_lowest_id() -> None:
    router = LeastRequestsRouter()
    assert router.choose(spec(), fleet(3, 1, 2), 0.0) == 1
    views = fleet(3, 1, 1)
    views[1].num_waiting = 1  # running + waiting counts
    assert router.choose(spec(), views, 0.0) == 2
    # Ties go to the lowest replica id, even when ids are not in index order.
    views = [FakeReplica(replica_id=7, num_running=1), FakeReplica(replica_id=3, num_running=1)]
    assert router.choose(spec(), views, 0.0) == 1


def test_least_kv_picks_lowest_kv_then_load() -> None:
    router = build("least_kv")
    views = fleet(0, 5, 2)
    views[0].kv_used_frac = 0.9
    views[1].kv_used_frac = 0.2
    views[2].kv_used_frac = 0.2
    assert router.choose(spec(), views, 0.0) == 2


def test_power_of_two_picks_the_better_of_its_samples() -> None:
    router = build("power_of_two", seed=11)
    twin = build("power_of_two", seed=11)
    assert isinstance(twin, PowerOfTwoRouter)
    views = fleet(4, 0, 9, 2, 2, 7)
    for i in range(200):
        a, b = twin.sample_pair(len(views))
        assert a != b
        expected = min(a, b, key=lambda j: (load_of(views[j]), j))
        assert router.choose(spec(i), views, 0.0) == expected


@settings(max_examples=60, deadline=None)
@given(loads=st.lists(st.integers(0, 50), min_size=2, max_size=12), seed=st.integers(0, 2**32 - 1))
def test_power_of_two_never_picks_a_strict_maximum(loads: list[int], seed: int) -> None:
    router = build("power_of_two", seed=seed)
    views = fleet(*loads)
    top = max(loads)
    unique_max = loads.count(top) == 1
    for i in range(20):
        chosen = router.choose(spec(i), views, 0.0)
        assert not (unique_max and loads[chosen] == top)


@pytest.mark.parametrize("policy", ["random", "power_of_two"])
def test_seeded_policies_are_deterministic(policy: RouterPolicy) -> None:
    views = fleet(*range(8))

    def run(seed: int) -> list[int]:
        router = build(policy, seed=seed)
        return [router.choose(spec(i), views, 0.0) for i in range(50)]

    assert run(3) == run(3)
    assert run(3) != run(4)


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(get_args(RouterPolicy)),
    loads=st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 40), st.floats(0, 1)), min_size=1, max_size=10
    ),
    session=st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    blocks=st.lists(st.integers(0, 5), max_size=6),
    seed=st.integers(0, 1000),
)
def test_chosen_index_always_in_range(
    policy: RouterPolicy,
    loads: list[tuple[int, int, float]],
    session: int | None,
    blocks: list[int],
    seed: int,
) -> None:
    views = [
        FakeReplica(replica_id=i, num_running=r, num_waiting=w, kv_used_frac=kv, cached={i, i + 1})
        for i, (r, w, kv) in enumerate(loads)
    ]
    router = build(policy, seed=seed, num_replicas=len(views))
    for i in range(5):
        assert 0 <= router.choose(spec(i, session_id=session, blocks=tuple(blocks)), views, 0.0) < len(views)


# ---------------------------------------------------------------------------------------------- staleness


def test_live_state_returns_the_replicas_themselves() -> None:
    replicas = fleet(0, 0)
    state = RouterState(replicas, refresh_s=0.0)
    assert list(state.views(5.0)) == replicas
    state.record_dispatch(0)  # no local accounting on live views: the replica counts it
    assert replicas[0].num_waiting == 0


def test_stale_least_requests_counts_its_own_dispatches() -> None:
    replicas = fleet(0, 0, 0, 0)  # the live replicas never change here: only local accounting can spread
    state = RouterState(replicas, refresh_s=1.0)
    router = LeastRequestsRouter()
    chosen = [state.route(router, spec(i), now_s=0.1 + 0.01 * i) for i in range(8)]
    assert sorted(chosen) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert chosen[:4] == [0, 1, 2, 3]


def test_stale_views_lag_until_the_next_grid_point() -> None:
    replicas = fleet(0, 5)
    state = RouterState(replicas, refresh_s=1.0)
    router = LeastRequestsRouter()
    assert state.route(router, spec(0), now_s=0.2) == 0
    assert state.last_refresh_s == 0.2
    replicas[0].num_running = 10  # the router does not see this before t = 1.0
    assert state.route(router, spec(1), now_s=0.9) == 0
    assert state.route(router, spec(2), now_s=1.0) == 1  # refreshed: sees 10 vs 5
    assert state.last_refresh_s == 1.0
    # The refresh forgot the in-flight counts: the snapshot itself now holds what reached the replicas.
    snapshot = state.views(1.5)[0]
    assert snapshot.num_running == 10 and snapshot.num_waiting == 0


def test_stale_views_read_prefix_cache_live() -> None:
    replicas = fleet(0, 0)
    state = RouterState(replicas, refresh_s=10.0)
    views = state.views(0.0)
    replicas[1].cached = {1, 2}
    assert views[1].prefix_match_blocks((1, 2, 3)) == 2


def test_route_rejects_an_out_of_range_choice() -> None:
    class Broken:
        def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
            return len(views)

    state = RouterState(fleet(0, 0), refresh_s=0.0)
    with pytest.raises(RuntimeError):
        state.route(Broken(), spec(), 0.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------- session affinity


def test_session_turns_stick_while_load_is_balanced() -> None:
    router = SessionAffinityRouter(epsilon=0.25, virtual_nodes=100)
    replicas = fleet(3, 3, 3, 3)
    for session in range(40):
        homes = {router.choose(spec(turn, session_id=session), replicas, 0.0) for turn in range(5)}
        assert len(homes) == 1
    # Sessions spread over the fleet rather than piling on one replica.
    homes_all = {router.choose(spec(0, session_id=s), replicas, 0.0) for s in range(40)}
    assert homes_all == {0, 1, 2, 3}


def test_session_moves_when_its_replica_exceeds_the_bound_and_comes_back() -> None:
    router = SessionAffinityRouter(epsilon=0.25, virtual_nodes=100)
    replicas = fleet(2, 2, 2, 2)
    session = 12345
    home = router.choose(spec(0, session_id=session), replicas, 0.0)
    fallback = list(router.ring_for(replicas).walk(session))[1]
    # Total 6 + 16 = 22 -> capacity ceil(1.25 * 23 / 4) = 8; the home replica at 16 is over it.
    replicas[home].num_running = 16
    assert router.capacity(replicas) == 8
    assert router.choose(spec(1, session_id=session), replicas, 0.0) == fallback != home
    replicas[home].num_running = 2
    assert router.choose(spec(2, session_id=session), replicas, 0.0) == home


def test_requests_without_session_go_to_least_requests() -> None:
    router = SessionAffinityRouter(epsilon=0.25, virtual_nodes=10)
    assert router.choose(spec(), fleet(4, 2, 1, 3), 0.0) == 2


@settings(max_examples=30, deadline=None)
@given(
    sessions=st.lists(st.integers(0, 50), min_size=1, max_size=200),
    num_replicas=st.integers(1, 8),
    epsilon=st.sampled_from([0.1, 0.25, 1.0]),
)
def test_bounded_load_is_never_exceeded(sessions: list[int], num_replicas: int, epsilon: float) -> None:
    # Requests never finish here: the worst case for the bound. After each placement every replica must hold
    # at most ceil((1 + eps) * total / N) requests (Mirrokni et al., Lemma 1).
    router = SessionAffinityRouter(epsilon=epsilon, virtual_nodes=20)
    replicas = fleet(*([0] * num_replicas))
    for i, session in enumerate(sessions):
        replicas[router.choose(spec(i, session_id=session), replicas, 0.0)].num_running += 1
        total = i + 1
        assert max(load_of(r) for r in replicas) <= math.ceil((1 + epsilon) * total / num_replicas)


@settings(max_examples=40, deadline=None)
@given(
    placements=st.lists(st.tuples(st.integers(-1, 30), st.integers(0, 3)), min_size=1, max_size=120),
    num_replicas=st.integers(1, 8),
    epsilon=st.sampled_from([0.1, 0.25, 1.0]),
)
def test_session_affinity_on_live_views_routes_as_on_plain_views(placements: list[tuple[int, int]],
                                                                  num_replicas: int, epsilon: float) -> None:
    """The live-view paths (``choose`` on ``LiveViews``, and ``live_route``'s ``AffinityRoute``: loads and their
    running total off the fleet's load list, the ring's owner looked up directly) pick what the generic path
    picks from the replicas themselves, as loads rise and fall and replicas join (a new ring); fails with the
    owner taken past its capacity, the capacity counted from a stale total, or a ring of the old size. Session
    -1 stands for a request without a session (least loaded)."""
    live_router = SessionAffinityRouter(epsilon=epsilon, virtual_nodes=20)
    plain_router = SessionAffinityRouter(epsilon=epsilon, virtual_nodes=20)
    replicas = fleet(*([0] * num_replicas))
    levels = LoadLevels(num_replicas)
    route = live_router.live_route(LiveViews(replicas, levels))  # reads the load list, which grows in place
    assert isinstance(route, AffinityRoute)
    for i, (session, leave) in enumerate(placements):
        request = spec(i, session_id=None if session < 0 else session)
        choice = live_router.choose(request, LiveViews(replicas, levels), 0.0)
        assert choice == plain_router.choose(request, tuple(replicas), 0.0)
        assert route(request, 0.0) == choice
        replicas[choice].num_running += 1
        levels.set(choice, replicas[choice].load)
        assert levels.total == sum(r.load for r in replicas)
        if leave == 3:  # a replica joins
            replicas.append(FakeReplica(replica_id=len(replicas), num_running=0))
            levels.append()
            continue
        gone = (choice + leave) % len(replicas)  # a request ends somewhere now and then
        if leave and replicas[gone].num_running:
            replicas[gone].num_running -= 1
            levels.set(gone, replicas[gone].load)


def test_affinity_route_keeps_each_sessions_owner_without_growing_past_its_bound() -> None:
    """``AffinityRoute`` remembers the owners it found (a session's later turns skip the hash): asked again,
    and after its memory was emptied for outgrowing its bound (3 here), it answers the ring's owner, and it
    holds no more than the bound."""
    levels = LoadLevels(5)
    route = AffinityRoute(levels, epsilon=100.0, virtual_nodes=20, homes_kept=3)  # capacity never reached
    ring = HashRing(range(5), 20)
    for turn in range(3):
        for session in range(10):
            assert route(spec(turn * 10 + session, session_id=session * 7919), 0.0) == ring.owner(session * 7919)
    assert len(route._homes) <= 3


@settings(max_examples=25, deadline=None)
@given(num_replicas=st.integers(2, 16), salt=st.integers(0, 2**20))
def test_adding_a_replica_moves_about_one_nth_of_sessions(num_replicas: int, salt: int) -> None:
    sessions = [salt * 10_000 + s for s in range(2000)]
    before = HashRing(range(num_replicas), virtual_nodes=100)
    after = HashRing(range(num_replicas + 1), virtual_nodes=100)
    moved = [s for s in sessions if next(before.walk(s)) != next(after.walk(s))]
    # Only sessions that now belong to the new replica move; no reshuffling among the old ones.
    assert all(next(after.walk(s)) == num_replicas for s in moved)
    # Expected share 1/(N+1); 100 virtual nodes keep it within a factor of two.
    assert len(moved) / len(sessions) < 2.0 / (num_replicas + 1)
    assert len(moved) / len(sessions) > 0.4 / (num_replicas + 1)
    # Removing a replica moves exactly the sessions it owned; the rest stay put.
    without_first = HashRing(range(1, num_replicas), virtual_nodes=100)
    for s in sessions:
        owner = next(before.walk(s))
        assert (next(without_first.walk(s)) == owner) == (owner != 0)


def test_ring_walk_visits_every_replica_once() -> None:
    ring = HashRing([5, 9, 2], virtual_nodes=7)
    for key in range(50):
        assert sorted(ring.walk(key)) == [2, 5, 9]


# ------------------------------------------------------------------------------------------ prefix aware


def test_prefix_aware_prefers_the_replica_holding_the_prefix() -> None:
    router = PrefixAwareRouter(prefix_weight=1.0, load_weight=2.0)
    replicas = fleet(3, 3, 4, 3)
    replicas[2].cached = {10, 11, 12, 13}
    request = spec(blocks=(10, 11, 12, 13))
    # Holder: 1 - 2 * 4/4 = -1; the others: 0 - 2 * 3/4 = -1.5.
    assert router.choose(request, replicas, 0.0) == 2
    # A longer match wins over a shorter one at equal load.
    replicas[2].num_running = 3
    replicas[1].cached = {10, 11}
    assert router.choose(request, replicas, 0.0) == 2
    replicas[2].cached = {10}
    assert router.choose(request, replicas, 0.0) == 1


def test_prefix_aware_avoids_an_overloaded_holder() -> None:
    router = PrefixAwareRouter(prefix_weight=1.0, load_weight=2.0)
    replicas = fleet(12, 4, 5)
    replicas[0].cached = {1, 2, 3}
    request = spec(blocks=(1, 2, 3))
    # Holder: 1 - 2 * 12/12 = -1; replica 1: 0 - 2 * 4/12 = -0.67 -> replica 1.
    assert router.choose(request, replicas, 0.0) == 1
    # Mildly busier holder (7 vs 4): 1 - 2 = -1 vs -2 * 4/7 = -1.14 -> holder keeps it.
    replicas[0].num_running = 7
    assert router.choose(request, replicas, 0.0) == 0


def test_prefix_aware_without_hashes_is_least_loaded_ties_by_load_then_id() -> None:
    router = build("prefix_aware")
    assert router.choose(spec(), fleet(3, 1, 1, 2), 0.0) == 1
    assert router.choose(spec(), fleet(0, 0, 0), 0.0) == 0
    # Zero load weight: equal scores fall back to lower load.
    router = PrefixAwareRouter(prefix_weight=1.0, load_weight=0.0)
    assert router.choose(spec(blocks=(1,)), fleet(5, 2, 9), 0.0) == 1


@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=70))
def test_the_load_list_pick_is_the_first_minimum(loads: list[int]) -> None:
    expected = loads.index(min(loads))
    assert first_min_index(loads) == expected  # the native loop, whichever build runs
    assert least_loaded_index(loads) == expected


@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=70), st.data())
def test_the_ready_replicas_pick_is_the_first_minimum(loads: list[int], data: st.DataObject) -> None:
    """A dynamic fleet's pick among its ready replicas (any subset, in any order), zeros frequent: the loop
    stops at the first zero, which must be the first minimum."""
    ids = data.draw(st.lists(st.integers(0, len(loads) - 1), min_size=1, max_size=len(loads), unique=True))
    expected = min(ids, key=loads.__getitem__)
    assert first_min_of(loads, ids) == expected  # the native loop, whichever build runs
    assert least_loaded_of(loads, ids) == expected


def _levels(loads: list[int]) -> LoadLevels:
    """A fleet's load levels holding ``loads``, written as replicas write them."""
    levels = LoadLevels(len(loads))
    for index, load in enumerate(loads):
        levels.set(index, load)
    return levels


@given(st.integers(1, 12), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=200), st.data())
def test_load_levels_know_the_smallest_load_and_the_picks_stop_there(size: int, changes: list[tuple[int, int]],
                                                                     data: st.DataObject) -> None:
    """Loads set and replicas added in any order (mostly by one, as requests come and go; sometimes
    anywhere, as a lost replica's drop to 0): ``lowest`` is always the smallest load, and the picks that
    stop at it are the first minimum of every replica and of any ready subset (a pick stopping below or
    above the smallest load, or a stale ``lowest``, would not be)."""
    levels = LoadLevels(size)
    for where, step in changes:
        if where == 40:
            levels.append()
        else:
            index = where % len(levels.values)
            old = levels.values[index]
            levels.set(index, max(0, old + step - 3) if step else 0)
        values = levels.values
        assert levels.lowest == min(values)
        assert first_min_index(values, levels.lowest) == values.index(min(values))
        assert least_loaded_index(values, levels.lowest) == values.index(min(values))
    values = levels.values
    ids = data.draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=len(values), unique=True))
    expected = min(ids, key=values.__getitem__)
    assert first_min_of(values, ids, levels.lowest) == expected
    assert least_loaded_of(values, ids, levels.lowest) == expected


def test_load_levels_refuse_a_negative_load() -> None:
    levels = LoadLevels(2)
    with pytest.raises(ValueError, match=">= 0"):
        levels.set(0, -1)
    assert levels.values == [0, 0] and levels.lowest == 0


def test_the_load_list_pick_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="no replicas"):
        least_loaded_index([])


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=40), st.integers(0, 1000))
def test_live_least_requests_routes_as_its_choose_does(loads: list[int], rid: int) -> None:
    """On live views, RouterState hands the fleet least_requests' own load-list route: the same pick as
    ``choose`` on the replicas, for any loads."""
    replicas = [FakeReplica(i, num_waiting=load) for i, load in enumerate(loads)]
    router = LeastRequestsRouter()
    state = RouterState(replicas, 0.0, loads=_levels(loads))
    route = state.route_fn(router)
    assert not hasattr(route, "func")  # not the generic path: a partial of RouterState.route
    request = spec(rid)
    assert route(request, 0.0) == router.choose(request, replicas, 0.0) == state.route(router, request, 0.0)


def test_routes_on_snapshots_or_without_a_live_route_go_through_route() -> None:
    replicas = [FakeReplica(i) for i in range(3)]
    stale = RouterState(replicas, 1.0, loads=_levels([0, 0, 0]))
    assert getattr(stale.route_fn(LeastRequestsRouter()), "func", None) == stale.route  # refreshes, counts
    live = RouterState(replicas, 0.0, loads=_levels([0, 0, 0]))
    assert getattr(live.route_fn(RoundRobinRouter()), "func", None) == live.route


@settings(max_examples=60, deadline=None)
@given(
    replicas=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8)), min_size=1, max_size=8),
    prompt_blocks=st.integers(0, 10),
    weights=st.sampled_from([(1.0, 2.0), (1.0, 0.0), (0.0, 1.0), (0.7, 0.3)]),
)
def test_prefix_aware_live_route_picks_as_choose(replicas: list[tuple[int, int]], prompt_blocks: int,
                                                 weights: tuple[float, float]) -> None:
    """``live_route``'s ``PrefixAwareRoute`` (one loop, the best kept as it goes) picks what ``choose`` picks
    (scores, then lower load, then lower id), ties included: equal caches and loads are common here."""
    prefix_weight, load_weight = weights
    router = PrefixAwareRouter(prefix_weight=prefix_weight, load_weight=load_weight)
    blocks = tuple(range(100, 100 + prompt_blocks))
    views = [FakeReplica(replica_id=i, num_running=load, cached=set(blocks[:cached]))
             for i, (load, cached) in enumerate(replicas)]
    levels = _levels([v.load for v in views])
    request = spec(7, blocks=blocks)
    live = LiveViews(views, levels)
    assert router.live_route(live)(request, 0.0) == router.choose(request, live, 0.0) == router.choose(
        request, tuple(views), 0.0)


@dataclass
class CountingReplica(FakeReplica):
    """A fake replica that counts the cache walks asked of it."""

    walks: int = 0

    def prefix_match_blocks(self, block_hashes: Sequence[int], num_blocks: int | None = None) -> int:
        self.walks += 1
        return super().prefix_match_blocks(block_hashes, num_blocks)


def _reference_pick(views: Sequence[FakeReplica], blocks: tuple[int, ...], prefix_weight: float,
                    load_weight: float) -> int:
    """The policy written out plainly: every replica walked and scored, the best by (score, -load, -id)."""
    max_load = max(v.load for v in views)
    ranked = []
    for index, view in enumerate(views):
        hit = view.prefix_match_blocks(blocks) / len(blocks) if blocks else 0.0
        norm_load = view.load / max_load if max_load > 0 else 0.0
        ranked.append((prefix_weight * hit - load_weight * norm_load, -view.load, -view.replica_id, index))
    return max(ranked)[3]


@settings(max_examples=150, deadline=None)
@given(
    replicas=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 12)), min_size=1, max_size=12),
    prompt_blocks=st.integers(0, 12),
    weights=st.sampled_from([(1.0, 2.0), (1.0, 0.0), (0.0, 1.0), (0.7, 0.3), (3.0, 0.1), (0.1, 5.0)]),
    ids=st.randoms(use_true_random=False),
)
def test_prefix_aware_route_picks_as_every_replica_scored(replicas: list[tuple[int, int]], prompt_blocks: int,
                                                          weights: tuple[float, float], ids: Any) -> None:
    """The route skips the cache walks of replicas that cannot win even with a full hit; its pick is still
    the one of scoring every replica (ties by lower load, then lower id, with ids in any order)."""
    prefix_weight, load_weight = weights
    blocks = tuple(range(100, 100 + prompt_blocks))
    replica_ids = list(range(len(replicas)))
    ids.shuffle(replica_ids)
    views = [CountingReplica(replica_id=rid, num_running=load, cached=set(blocks[:cached]))
             for rid, (load, cached) in zip(replica_ids, replicas, strict=True)]
    pick = PrefixAwareRoute(views, prefix_weight, load_weight)(spec(1, blocks=blocks), 0.0)
    assert pick == _reference_pick(views, blocks, prefix_weight, load_weight)


def test_prefix_aware_route_does_not_walk_busy_replicas_that_cannot_win() -> None:
    """One idle replica caches the whole prompt: no busier replica can beat it, so none is walked."""
    blocks = tuple(range(10))
    views = [CountingReplica(replica_id=i, num_running=load, cached=set(blocks) if i == 3 else set(blocks[:4]))
             for i, load in enumerate([5, 6, 7, 1, 8, 9])]
    assert PrefixAwareRoute(views, 1.0, 2.0)(spec(1, blocks=blocks), 0.0) == 3
    assert [v.walks for v in views] == [0, 0, 0, 1, 0, 0]
