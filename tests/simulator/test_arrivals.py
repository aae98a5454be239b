"""The arrival feed: every request logged, routed and submitted at its own arrival time, same-instant
arrivals together (the replica's first step sees all of them)."""

from __future__ import annotations

import math

import pytest
import simpy

from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import load_profile
from simulator.fleet.arrival_feed import ArrivalFeed
from simulator.fleet.replica import Replica
from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries

PROFILE = "h200-llama-3-8b-tp1-analytic"


def make_replicas(env: simpy.Environment, log: RequestLog, n: int) -> list[Replica]:
    cost = CostModel(load_profile(PROFILE))
    config = SchedulerConfig(num_blocks=4096, block_size=16)
    return [Replica(env, i, config, cost, log, ReplicaSeries(i, 1.0)) for i in range(n)]


def specs(arrivals: list[float]) -> list[RequestSpec]:
    return [RequestSpec(request_id=i, arrival_s=t, prompt_tokens=100 + 10 * i, output_tokens=20)
            for i, t in enumerate(arrivals)]


def test_every_request_arrives_at_its_time_and_same_instant_arrivals_start_together() -> None:
    env = simpy.Environment()
    arrivals = [0.0, 0.0, 1.25, 1.25, 1.25, 7.5]
    log = RequestLog(len(arrivals))
    replicas = make_replicas(env, log, 2)
    seen: list[tuple[int, float]] = []
    progress: list[int] = []

    def route(spec: RequestSpec, now_s: float) -> int:
        seen.append((spec.request_id, now_s))
        return spec.request_id % 2

    feed = ArrivalFeed(env, specs(arrivals), log, replicas, route=route, progress=progress.append,
                       report_every=2)
    env.run()
    assert seen == [(i, t) for i, t in enumerate(arrivals)]  # routed at exactly its arrival time
    assert feed.num_arrived == len(arrivals) and progress == [2, 4, 6]
    columns = log.columns()
    assert columns["arrival_s"].tolist() == arrivals
    assert columns["replica"].tolist() == [0, 1, 0, 1, 0, 1]
    # Requests arriving together on an idle replica are scheduled in its first step, at that instant.
    assert columns["first_scheduled_s"].tolist()[:2] == [0.0, 0.0]
    assert not any(math.isnan(t) for t in columns["finish_s"].tolist())  # all served


def test_a_feed_without_a_router_serves_one_replica_only() -> None:
    env = simpy.Environment()
    log = RequestLog(2)
    with pytest.raises(ValueError, match="exactly one replica"):
        ArrivalFeed(env, specs([0.0, 1.0]), log, make_replicas(env, log, 2))
    with pytest.raises(ValueError, match="report_every"):
        ArrivalFeed(env, specs([0.0]), log, make_replicas(env, log, 1), report_every=0)


def test_an_empty_workload_schedules_nothing() -> None:
    env = simpy.Environment()
    log = RequestLog(0)
    ArrivalFeed(env, [], log, make_replicas(env, log, 1))
    assert env.peek() == math.inf  # no event on the queue
    env.run()
    assert env.now == 0.0
