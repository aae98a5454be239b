"""A simulated replica under async scheduling (vLLM's batch queue of two): the step after the one in flight
is scheduled when that one starts, so an arrival during step n is admitted at step n + 2, and every request
still finishes with exactly its tokens."""

from __future__ import annotations

import simpy

from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec
from simulator.core.step import StepPlan
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import load_profile
from simulator.fleet.replica import Replica
from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries


def _replay(async_scheduling: bool) -> tuple[list[tuple[int, tuple[int, ...], tuple[int, ...]]], RequestLog]:
    """Request 0 (long) at t = 0; request 1 arrives during request 0's third step. Returns each plan's
    (step id, request ids, new tokens) and the log."""
    env = simpy.Environment()
    config = SchedulerConfig(num_blocks=256, async_scheduling=async_scheduling)
    cost = CostModel(load_profile("h200-llama-3-8b-tp1-analytic"))
    log = RequestLog(4)
    plans: list[StepPlan] = []
    replica = Replica(env, 0, config, cost, log, ReplicaSeries(0, 1.0), fast_path=False, on_plan=plans.append)
    replica.submit(RequestSpec(0, 0.0, 100, 8))
    prefill_s = cost.time_of(1, 100, 0, 0, 100, 100 * 50.0, 0)
    decode_s = cost.time_of(1, 1, 1, 101, 0, 0.0, 0)
    arrival = prefill_s + 1.5 * decode_s  # inside the second decode step (step 2)

    def late() -> simpy.events.Event:
        yield env.timeout(arrival)
        replica.submit(RequestSpec(1, arrival, 50, 3))

    env.process(late())
    env.run()
    return [(p.step_id, tuple(r.request_id for r in p.requests), tuple(p.num_new_tokens)) for p in plans], log


def test_sync_admits_an_arrival_at_the_next_step() -> None:
    plans, _ = _replay(False)
    admitted = next(step for step, ids, _ in plans if 1 in ids)
    assert admitted == 3  # arrived during step 2; step 3 is scheduled when step 2 ends


def test_async_admits_an_arrival_a_step_later_and_loses_nothing() -> None:
    plans, log = _replay(True)
    admitted = next(step for step, ids, _ in plans if 1 in ids)
    assert admitted == 4  # step 3 was scheduled when step 2 started, before the arrival
    assert plans[0][1:] == ((0,), (100,)) and plans[1][1:] == ((0,), (1,)), "decode scheduled behind the prefill"
    decoded = [sum(n for step, ids, new in plans for rid, n in zip(ids, new, strict=True) if rid == r) for r in (0, 1)]
    assert decoded == [100 + 7, 50 + 2], "each request computed its prompt and all but its last token, once"
    _, sync_log = _replay(False)
    assert all(log.finish_s[:2] > 0) and all(sync_log.finish_s[:2] > 0)
    # The step lag shows in request 1's first token.
    assert log.first_token_s[1] > sync_log.first_token_s[1]
