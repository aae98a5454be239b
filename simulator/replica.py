"""One simulated replica: the serving core's scheduler, with the clock advanced by a cost model.

The replica runs the same ``core.Scheduler`` the real engine runs; where the engine would run the model,
the replica yields a SimPy timeout of ``CostModel.step_time(plan.shape)``. One SimPy event per engine
step, never per token; an idle replica sleeps until work arrives.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import simpy

from simulator.core.config import Batching, SchedulerConfig
from simulator.core.decode_run import DecodeRun
from simulator.core.request import Request, RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.core.step import StepPlan
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
        fast_path: bool = True,
        on_plan: Callable[[StepPlan], None] | None = None,
        loads: list[int] | None = None,
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
        self.fast_path = fast_path
        self.on_plan = on_plan
        """Called with every plan the scheduler makes on the step-by-step path (validation records them)."""
        self.loads = loads
        """The fleet's load list, if any: this replica keeps ``loads[replica_id]`` equal to ``load``
        (the least-loaded scan then reads one list instead of every replica)."""
        self.num_fast_steps = 0
        """Steps advanced inside decode runs (the rest went one event per step)."""
        self._wakeup: simpy.Event | None = None
        self._run_state: _ActiveRun | None = None
        self.process = env.process(self._run())

    # ----- ReplicaView ---------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def load(self) -> int:
        """Running + waiting + swapped: every request the scheduler holds (one C-level length)."""
        return len(self.scheduler.requests)

    @property
    def kv_used_frac(self) -> float:
        self.sync()
        pool = self.scheduler.kv.pool
        return pool.num_used / pool.num_blocks

    def prefix_match_blocks(self, block_hashes: Sequence[int]) -> int:
        self.sync()
        return self.scheduler.kv.prefix_match_blocks(block_hashes)

    def sync(self) -> None:
        """Inside a decode run, apply the steps that have ended by now, so that anything reading this
        replica sees exactly the state the step-by-step path would have."""
        active = self._run_state
        if active is not None:
            active.advance(self.env.now)

    # ----- work ------------------------------------------------------------------------------------

    def submit(self, spec: RequestSpec) -> None:
        self.sync()  # steps that ended before this arrival are sampled without it
        request = self.scheduler.add_request(spec)
        if request.status is RequestStatus.REJECTED:
            self.log.on_rejected(spec.request_id, self.env.now)
            return
        self._publish_load()
        active = self._run_state
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()
        elif active is not None and active.cut_on_arrival and not active.cut:
            active.cut_at(self.env.now)  # the scheduler would try to admit it at the next step boundary

    def _publish_load(self) -> None:
        """Requests were added or finished: keep the fleet's load list equal to ``load``."""
        if self.loads is not None:
            self.loads[self.replica_id] = len(self.scheduler.requests)

    def _run(self):  # type: ignore[no-untyped-def]  # a SimPy generator
        env = self.env
        scheduler = self.scheduler
        cost = self.cost_model
        log = self.log
        latency = self.network_latency_s
        kv = scheduler.kv
        pool = kv.pool
        series = self.series
        fast_path = self.fast_path
        cut_possible = scheduler.config.batching is not Batching.STATIC
        max_num_seqs = scheduler.config.max_num_seqs
        while True:
            if not scheduler.has_work:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                continue
            if fast_path:
                num_steps = scheduler.steady_decode_steps()
                if num_steps >= 2:
                    # A decode run: ``num_steps`` identical decode steps in one event, cut short by an
                    # arrival the scheduler would try to admit (``submit`` -> ``_ActiveRun.cut_at``).
                    run = DecodeRun(scheduler, num_steps)
                    start = env.now
                    # Step end times accumulated one addition at a time from now, as the step-by-step
                    # clock does.
                    ends = cost.decode_step_ends(run.batch, run.ctx_sum_start, num_steps, start)
                    active = _ActiveRun(self, run, ends, cut_possible and run.batch < max_num_seqs)
                    self._run_state = active
                    active.advance(start)  # the first step is scheduled now
                    active.timeout = env.timeout(ends[-1] - start)
                    yield active.timeout
                    k = run.num_steps
                    while env.now < ends[k - 1]:  # cut: the clock reached the cut step's end a hair early
                        active.timeout = env.timeout(ends[k - 1] - env.now)
                        yield active.timeout
                    finished = active.close()
                    self._run_state = None
                    if finished:
                        self._publish_load()
                        delivered = ends[k - 1] + latency
                        for request in finished:
                            log.on_finish(request.request_id, delivered, request.num_cached_tokens,
                                          request.num_preemptions)
                    self.num_steps += k
                    self.num_fast_steps += k
                    self.busy_s += ends[k - 1] - start
                    continue
            plan = scheduler.schedule()
            if self.on_plan is not None:
                self.on_plan(plan)
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
            if scheduler.update(plan):
                self._publish_load()
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


class _ActiveRun:
    """A decode run in flight on a replica: which of its steps have been applied, with their samples.

    The step-by-step path allocates a step's KV when the step is scheduled (at its start) and samples
    the series when it ends, so a step is applied once its start has passed and sampled at its end.
    """

    __slots__ = ("cut", "cut_on_arrival", "ends", "num_sampled", "replica", "run", "timeout")

    def __init__(self, replica: Replica, run: DecodeRun, ends: list[float], cut_on_arrival: bool) -> None:
        self.replica = replica
        self.run = run
        self.ends = ends
        self.cut_on_arrival = cut_on_arrival
        self.cut = False
        self.num_sampled = 0
        self.timeout: simpy.Timeout | None = None
        """The event the replica's process waits on: the end of the run's last step."""

    def cut_at(self, now: float) -> None:
        """An arrival during step j: step j completes, then the scheduler sees the new request. The run
        is truncated to j steps and the process's wait moved to step j's end (no SimPy interrupt: the
        process simply waits on a new timeout, as if it had yielded that one)."""
        self.cut = True
        run = self.run
        last = min(bisect.bisect_right(self.ends, now) + 1, run.num_steps)
        last = max(last, run.num_done)
        if last == run.num_steps:
            return  # the arrival came during the run's last step: the wait is already right
        run.truncate(last)
        old = self.timeout
        process = self.replica.process
        if old is None or process.target is not old:
            raise RuntimeError("decode run cut while its replica is not waiting on it")
        new = self.replica.env.timeout(self.ends[last - 1] - now)
        # Retarget the waiting process: what SimPy does when a process yields an event.
        old.callbacks.remove(process._resume)  # type: ignore[union-attr]
        new.callbacks.append(process._resume)  # type: ignore[union-attr]
        process._target = new
        self.timeout = new

    def advance(self, now: float) -> None:
        """Apply every step of the run that has started by ``now``; sample the ones that have ended."""
        run = self.run
        if run.num_done >= run.num_steps:
            return
        started = 1 + bisect.bisect_right(self.ends, now)  # step 1 starts at the run's start
        target = run.num_steps if started > run.num_steps else started
        self._sample_until(target - 1)
        run.advance_to(target)

    def close(self) -> list[Request]:
        """Apply and sample every step of the (possibly truncated) run; returns the requests its last
        step finished (retired before that step is sampled, as ``update`` precedes the sample)."""
        last = self.run.num_steps
        self.advance(self.ends[last - 1])
        self._sample_until(last - 1)
        finished = self.run.finish()
        self._sample(last)
        return finished

    def _sample_until(self, last: int) -> None:
        """Sample steps up to ``last`` — only those whose state a grid point will record: a step is
        needed when the next step ends at or after the next grid point (earlier samples would only be
        overwritten before any grid point sees them)."""
        series = self.replica.series
        ends = self.ends
        while True:
            j = bisect.bisect_left(ends, series.next_sample_s)
            if j <= self.num_sampled:
                j = self.num_sampled + 1
            if j > last:
                return
            self.run.advance_to(j)
            self._sample(j)

    def _sample(self, j: int) -> None:
        series = self.replica.series
        if series.kv_probe is not None and self.ends[j - 1] >= series.next_sample_s:
            self.run.set_counters(j)  # the probe reads per-request tokens: make them exact for step j
        scheduler = self.replica.scheduler
        kv = scheduler.kv
        pool = kv.pool
        self.replica.series.maybe_sample(self.ends[j - 1], len(scheduler.running), scheduler.num_waiting,
                                         pool.num_used, pool.num_blocks, kv.num_hit_tokens, kv.num_lookup_tokens)
        self.num_sampled = j
