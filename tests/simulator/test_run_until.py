"""``replica.run_until`` is ``env.run(until)``: the same events in the same order, the same clock at the end,
with ordinary SimPy processes mixed in among the replicas' callback events; and the replica's native
searches and heap are ``bisect``'s and ``heapq``'s."""

from __future__ import annotations

import heapq
import math
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st
from simpy.events import URGENT

from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import load_profile
from simulator.fleet.arrival_feed import ArrivalFeed
from simulator.fleet.clock import heap_pop, heap_push, heap_replace, run_until
from simulator.fleet.replica import Replica
from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries

PROFILE = "h200-llama-3-8b-tp1-analytic"


def _specs(n: int, seed: int) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.05, n))
    arrivals[3] = arrivals[2]  # two requests at one instant
    return [RequestSpec(request_id=i, arrival_s=float(t), prompt_tokens=int(rng.integers(20, 600)),
                        output_tokens=int(rng.integers(1, 120))) for i, t in enumerate(arrivals)]


def _fleet(fast_path: bool, seed: int) -> tuple[simpy.Environment, RequestLog, list[tuple[str, float]]]:
    env = simpy.Environment()
    specs = _specs(60, seed)
    log = RequestLog(len(specs))
    cost = CostModel(load_profile(PROFILE))
    config = SchedulerConfig(num_blocks=400, block_size=16, max_num_seqs=8)
    replicas = [Replica(env, i, config, cost, log, ReplicaSeries(i, 0.5), fast_path=fast_path) for i in range(2)]
    visits: list[tuple[str, float]] = []

    def watcher() -> Generator[simpy.Event, Any, None]:
        """An ordinary SimPy process: it reads the replicas between their own events."""
        for _ in range(200):  # bounded: with until=None the run ends when the queue empties
            yield env.timeout(0.037)
            # kv_used_frac applies the decode-run steps that have ended by now: it reads the replica's clock
            visits.append((f"load {replicas[0].load} {replicas[1].load} kv {replicas[0].kv_used_frac!r}", env.now))

    def urgent_at(at_s: float) -> None:
        event = simpy.Event(env)
        event._ok = True
        event.callbacks.append(lambda _e: visits.append(("urgent", env.now)))
        env.schedule(event, URGENT, at_s - env.now)

    env.process(watcher())
    urgent_at(1.0)

    def route(spec: RequestSpec, now: float) -> int:
        if spec.request_id % 7 == 0:
            # An urgent SimPy event due now, scheduled from inside one of the feed's own events: it goes
            # ahead of the event being handled on the queue (run_until pops that one after its callbacks).
            urgent_at(now)
        return spec.request_id % 2

    ArrivalFeed(env, specs, log, replicas, route=route)
    return env, log, visits


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("until", [None, 1.0, 2.22])
def test_run_until_matches_simpy_run(fast_path: bool, until: float | None) -> None:
    expected_env, expected_log, expected_visits = _fleet(fast_path, seed=7)
    steps = 0
    simpy_step = expected_env.step

    def counted_step() -> None:
        nonlocal steps
        steps += 1
        simpy_step()

    expected_env.step = counted_step  # type: ignore[method-assign]
    expected_env.run(until=until)
    env, log, visits = _fleet(fast_path, seed=7)
    processed = run_until(env, until)
    # SimPy's last step is its own until-event, or (no until) the call that finds the queue empty.
    assert processed == steps - 1
    assert env.now == expected_env.now
    assert visits == expected_visits
    a, b = log.columns(), expected_log.columns()
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key], equal_nan=True), key
    if until is None:
        assert not math.isnan(float(np.nanmax(a["finish_s"])))
    else:
        assert env.now == until
        assert ("urgent", 1.0) in visits  # an urgent event due at the stop time still runs (SimPy's order)


def test_run_until_refuses_a_stop_time_not_ahead_of_the_clock() -> None:
    env = simpy.Environment()
    env.run(until=2.0)
    with pytest.raises(ValueError, match="greater than the current simulation time"):
        run_until(env, 2.0)
    with pytest.raises(ValueError, match="greater than the current simulation time"):
        run_until(env, 1.0)


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0]), st.sampled_from([0, 1]),
                          st.sampled_from(["push", "pop", "replace"])), max_size=60))
def test_the_native_heap_is_heapq(ops: list[tuple[float, int, str]]) -> None:
    """Pushes, pops and replacements of the head (ties in time and priority included) leave the very list
    heapq would, item for item."""
    ours: list[tuple[float, int, int, Any]] = []
    theirs: list[tuple[float, int, int, Any]] = []
    for eid, (at, priority, op) in enumerate(ops):
        entry = (at, priority, eid, object())
        if op == "pop" and theirs:
            assert heap_pop(ours) == heapq.heappop(theirs)
        elif op == "replace" and theirs:
            assert heap_replace(ours, entry) == heapq.heapreplace(theirs, entry)
        else:
            heap_push(ours, entry)
            heapq.heappush(theirs, entry)
        assert ours == theirs
    while theirs:
        assert heap_pop(ours) == heapq.heappop(theirs)
    assert ours == []


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 2.5]), min_size=1, max_size=40), st.data())
def test_moving_an_event_keeps_the_queue_a_heap(times: list[float], data: st.DataObject) -> None:
    """Clock.move on a queue of events: the moved event pops at its new time, as a new event at that time
    would (a fresh id), earlier or later, every other event is untouched, and the queue stays a valid heap
    for SimPy."""
    env = simpy.Environment()
    clock = Replica(env, 0, SchedulerConfig(num_blocks=8), CostModel(load_profile(PROFILE)), RequestLog(1),
                    ReplicaSeries(0, 1.0)).clock
    fired: list[int] = []
    events = [clock.at(t, [lambda _event, i=i: fired.append(i)]) for i, t in enumerate(times)]
    index = data.draw(st.integers(0, len(times) - 1))
    new_at = data.draw(st.sampled_from([0.0, 0.25, 1.0, 2.5, 3.0]))
    moved = clock.move(events[index], new_at)
    assert (moved is events[index]) == (new_at < times[index])  # not earlier: a fresh event, the old a no-op
    queue = env._queue
    assert all(not queue[child] < queue[(child - 1) // 2] for child in range(1, len(queue)))
    expected = sorted((times[i] if i != index else new_at, i if i != index else len(times), i)
                      for i in range(len(times)))
    env.run()
    assert fired == [i for _, _, i in expected]
    with pytest.raises(RuntimeError, match="not on the queue"):
        clock.move(events[index], 0.0)


def test_skipping_the_clock_on_inside_an_event_happens_only_when_nothing_is_due_by_then() -> None:
    """Clock.skip_to, from an event's callbacks: the clock moves on (everything reading it sees the new
    time) when no other event is due by then and the run does not stop before; otherwise it stays put and
    says so. Later events fire as before."""
    env = simpy.Environment()
    clock = Replica(env, 0, SchedulerConfig(num_blocks=8), CostModel(load_profile(PROFILE)), RequestLog(1),
                    ReplicaSeries(0, 1.0)).clock
    seen: list[tuple[str, float, bool]] = []

    def skipper(name: str, to: float):
        return lambda _e: seen.append((name, clock.now(), clock.skip_to(to))) or seen.append((name, env.now, True))

    clock.at(1.0, [skipper("a", 1.5)])  # nothing due by 1.5: moves on
    clock.at(2.0, [skipper("b", 3.0)])  # c is due at 3.0 (a tie): stays
    clock.at(3.0, [skipper("c", 3.5)])
    clock.at(4.0, [skipper("d", 5.0)])  # the run stops at 4.5: stays
    assert clock.skip_to(0.5) is False  # outside run_until
    run_until(env, 4.5)
    assert seen == [("a", 1.0, True), ("a", 1.5, True), ("b", 2.0, False), ("b", 2.0, True),
                    ("c", 3.0, True), ("c", 3.5, True), ("d", 4.0, False), ("d", 4.0, True)]
    assert env.now == 4.5


def test_an_event_is_reused_only_once_it_has_fired() -> None:
    """Clock.at's reuse takes the caller's last event again only after it fired: never a pending one, nor
    the no-op a same-time move leaves on the queue, which would then fire the new callbacks early."""
    env = simpy.Environment()
    clock = Replica(env, 0, SchedulerConfig(num_blocks=8), CostModel(load_profile(PROFILE)), RequestLog(1),
                    ReplicaSeries(0, 1.0)).clock
    fired: list[tuple[str, float]] = []
    first = clock.at(1.0, [lambda _e: fired.append(("first", env.now))])
    second = clock.at(2.0, [lambda _e: fired.append(("second", env.now))], reuse=first)
    assert second is not first  # first is still pending
    run_until(env, 1.5)
    third = clock.at(3.0, [lambda _e: fired.append(("third", env.now))], reuse=first)
    assert third is first  # fired: taken again, with its new callbacks
    moved = clock.move(second, 2.0)  # same time: second stays queued as a no-op
    fourth = clock.at(4.0, [lambda _e: fired.append(("fourth", env.now))], reuse=second)
    assert fourth is not second and moved is not second
    run_until(env)
    assert fired == [("first", 1.0), ("second", 2.0), ("third", 3.0), ("fourth", 4.0)]
