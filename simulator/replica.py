"""One simulated replica: the serving core's scheduler, with the clock advanced by a cost model.

The replica runs the same ``core.Scheduler`` the real engine runs; where the engine would run the model,
the replica yields a SimPy timeout of ``CostModel.step_time(plan.shape)``. One SimPy event per engine
step, never per token; an idle replica sleeps until work arrives.
"""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.cost_model import CostModel
from simulator.metrics import ReplicaSeries, RequestLog


class Replica:
    """A SimPy process owning one scheduler. Satisfies the router's ``ReplicaView`` protocol live."""

    def __init__(
        self,
        env: simpy.Environment,
        replica_id: int,
        config: SchedulerConfig,
        cost_model: CostModel,
        log: RequestLog,
        series: ReplicaSeries,
        *,
        network_latency_s: float = 0.0,
    ) -> None:
        self.env = env
        self.replica_id = replica_id
        self.scheduler = Scheduler(config)
        self.cost_model = cost_model
        self.log = log
        self.series = series
        self.network_latency_s = network_latency_s
        self.num_steps = 0
        self.busy_s = 0.0
        self._wakeup: simpy.Event | None = None
        self.process = env.process(self._run())

    # ----- ReplicaView ---------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def kv_used_frac(self) -> float:
        pool = self.scheduler.kv.pool
        return pool.num_used / pool.num_blocks

    def prefix_match_blocks(self, block_hashes: Sequence[int]) -> int:
        return self.scheduler.kv.prefix_match_blocks(block_hashes)

    # ----- work ------------------------------------------------------------------------------------

    def submit(self, spec: RequestSpec) -> None:
        request = self.scheduler.add_request(spec)
        if request.status is RequestStatus.REJECTED:
            self.log.on_rejected(spec.request_id, self.env.now)
            return
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _run(self):  # type: ignore[no-untyped-def]  # a SimPy generator
        env = self.env
        scheduler = self.scheduler
        cost = self.cost_model
        log = self.log
        latency = self.network_latency_s
        kv = scheduler.kv
        pool = kv.pool
        series = self.series
        while True:
            if not scheduler.has_work:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                continue
            plan = scheduler.schedule()
            if plan.is_empty:
                # Work that cannot start (it waits on memory no running request will free): wait for
                # the next arrival rather than spin. The core rejects requests that can never fit.
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                continue
            start = env.now
            for rid in plan.admitted_ids:
                log.on_scheduled(rid, start)
            step_s = cost.step_time(plan.shape)
            yield env.timeout(step_s)
            self.num_steps += 1
            self.busy_s += step_s
            scheduler.update(plan)
            now = env.now
            delivered = now + latency
            for request in plan.requests:
                if request.num_output_tokens == 1 and request.num_computed_tokens == request.num_prompt_tokens:
                    log.on_first_token(request.request_id, delivered)
                if request.status is RequestStatus.FINISHED:
                    log.on_finish(request.request_id, delivered, request.num_cached_tokens,
                                  request.num_preemptions)
            series.maybe_sample(now, len(scheduler.running), scheduler.num_waiting, pool.num_used,
                                pool.num_blocks, kv.num_hit_tokens, kv.num_lookup_tokens)
