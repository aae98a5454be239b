"""Replay of one workload step by step, on the real engine and on a simulated replica, recorded alike.

The engine side serves RequestSpecs on the wall clock (``realtime``: arrivals wait for their time, tokens
are stamped by the engine) or on a virtual clock advanced by the cost model's time of each step
(``lockstep``: a request enters at the step boundary where a simulated replica would see it). The simulator
side runs a SimPy replica whose scheduler records every plan. Both yield one ``Composition`` per step, so
calibration/fidelity.py can compare them index by index.

This module only feeds arrivals and records what happened: both sides run ``simulator.core``'s Scheduler,
and nothing here decides anything about scheduling.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.step import StepPlan, StepShape
from simulator.cost.cost_model import CostModel
from simulator.results.request_log import RequestLog

Composition = tuple[tuple[int, int], ...]
"""One step as (request id, new tokens) per scheduled request, in plan order."""


# ----- the engine side ---------------------------------------------------------------------------------


@dataclass(slots=True)
class EngineRun:
    """What the engine did: per-request log, step compositions and per-step times."""

    log: RequestLog
    steps: list[Composition]
    step_shapes: list[StepShape]
    device_s: list[float]
    cycle_s: list[float]
    cpu_s: list[float] = field(default_factory=list)
    """Thread CPU time of each ``engine.step()`` (the profile's clock on CPU with one torch thread)."""
    predicted_s: list[float] = field(default_factory=list)
    """Cost model's step time of each step (lockstep mode)."""
    admitted_at_step: dict[int, int] = field(default_factory=dict)
    """Step index before which each request was handed to the engine."""
    wall_s: float = 0.0


def _composition(request_ids: Sequence[int], num_new: Sequence[int]) -> Composition:
    return tuple(zip(request_ids, num_new, strict=True))


class _WallClock:
    """Real time: arrivals wait on the wall clock; tokens are stamped by the engine as they appear."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.t0 = engine.now()

    def now(self) -> float:
        return self._engine.now() - self.t0

    def idle_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))

    def account(self, run: EngineRun, record: Any, cpu_s: float) -> None:
        _account(run, record, self.t0, cpu_s)


class _VirtualClock:
    """Lockstep: a clock advanced by the cost model's time of each step the engine runs, as a simulated
    replica's would be; the engine's own times are recorded but decide nothing."""

    def __init__(self, cost: CostModel) -> None:
        self._cost = cost
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def idle_until(self, t: float) -> None:
        self._t = max(self._t, t)  # idle: the replica sleeps until the next arrival

    def account(self, run: EngineRun, record: Any, cpu_s: float) -> None:
        step_s = self._cost.step_time(record.shape)
        self._t += step_s
        run.predicted_s.append(step_s)
        _account(run, record, None, cpu_s, virtual_end_s=self._t)


def run_engine_realtime(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]],
                        *, progress: bool = True) -> EngineRun:
    """Serve ``specs`` on the wall clock: each request is added at the first step boundary at or after
    its arrival time; while idle the loop sleeps until the next arrival."""
    return _serve(engine, specs, prompts, _WallClock(engine), desc="engine (real time)", progress=progress)


def run_engine_lockstep(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]],
                        cost: CostModel, *, progress: bool = True) -> EngineRun:
    """Serve ``specs`` on a virtual clock advanced by ``cost`` per step: a request is added at the step
    boundary where a simulated replica would see it. Deterministic; times are measured but not used
    for decisions."""
    return _serve(engine, specs, prompts, _VirtualClock(cost), desc="engine (lockstep)", progress=progress)


def _serve(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]],
           clock: _WallClock | _VirtualClock, *, desc: str, progress: bool) -> EngineRun:
    """The replay loop both modes share: hand over arrivals at each step boundary, step the engine, and
    let ``clock`` say what time it is, how idling passes, and how a step is accounted."""
    log = RequestLog(len(specs))
    run = EngineRun(log=log, steps=[], step_shapes=[], device_s=[], cycle_s=[])
    bar = _bar(len(specs), desc, progress)
    wall0 = time.perf_counter()
    i, n = 0, len(specs)
    while i < n or engine.has_work:
        i = _add_arrivals(engine, specs, prompts, i, clock.now(), run)
        if not engine.has_work:
            clock.idle_until(specs[i].arrival_s)
            continue
        cpu0 = time.thread_time()
        record = engine.step()
        cpu_s = time.thread_time() - cpu0
        if record.shape.num_seqs == 0:
            if i >= n:
                raise RuntimeError("the engine has work it cannot start and no arrival will change that")
            clock.idle_until(specs[i].arrival_s)
            continue
        clock.account(run, record, cpu_s)
        if bar is not None:
            bar.update(len(record.finished_ids))
    run.wall_s = time.perf_counter() - wall0
    log.record_produced({})  # the engine served every request to its end
    if bar is not None:
        bar.close()
    return run


def _add_arrivals(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]], i: int,
                  now: float, run: EngineRun) -> int:
    """Hand the engine every request that has arrived by ``now``, from index ``i``; returns the next index."""
    log = run.log
    while i < len(specs) and specs[i].arrival_s <= now:
        spec = specs[i]
        log.on_arrival(spec.request_id, spec.arrival_s, spec.prompt_tokens, spec.output_tokens, None)
        if engine.add_request(spec, prompts[i]).status is RequestStatus.REJECTED:
            log.on_rejected(spec.request_id, spec.arrival_s)
        run.admitted_at_step[spec.request_id] = len(run.steps)
        i += 1
    return i


def _account(run: EngineRun, record: Any, t0: float | None, cpu_s: float, *,
             virtual_end_s: float | None = None) -> None:
    """Log first tokens and finishes of one step: at the engine's token timestamps (real time) or at the
    virtual step end (lockstep)."""
    run.steps.append(_composition(record.request_ids, record.num_new_tokens))
    run.step_shapes.append(record.shape)
    run.device_s.append(record.device_s)
    run.cycle_s.append(record.cycle_s)
    run.cpu_s.append(cpu_s)
    finished = set(record.finished_ids)
    for event in record.events:
        t = virtual_end_s if virtual_end_s is not None else event.timestamp_s - (t0 or 0.0)
        run.log.on_first_token(event.request_id, t)
        if event.request_id in finished:
            run.log.on_finish(event.request_id, t, 0, 0)


# ----- the simulator side ------------------------------------------------------------------------------


def simulate_recorded(config: SchedulerConfig, cost: CostModel, specs: Sequence[RequestSpec]) -> list[Composition]:
    """The simulator's step compositions: a SimPy replica (step by step) whose scheduler records each plan."""
    import simpy

    from simulator.fleet.arrival_feed import ArrivalFeed
    from simulator.fleet.clock import run_until
    from simulator.fleet.replica import Replica
    from simulator.results.series import ReplicaSeries

    env = simpy.Environment()
    log = RequestLog(len(specs))
    plans: list[StepPlan] = []

    def record(plan: StepPlan) -> None:
        if plan.requests:
            plans.append(plan)

    replica = Replica(env, 0, config, cost, log, ReplicaSeries(0, 1.0), fast_path=False, on_plan=record)

    ArrivalFeed(env, specs, log, [replica])
    run_until(env)
    return [_composition([r.request_id for r in p.requests], p.num_new_tokens) for p in plans]


def _bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, mininterval=0.5)
