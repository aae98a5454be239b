"""A fleet that changes size and breaks: replicas started and stopped by an autoscaler, each paying a
cold start (``fleet.lifecycle``), crashed by failures (``fleet.failures``), and the router sending only
to ready replicas. No request is lost silently: one held by a replica that crashes (or sent to it before
the router noticed) is retried on another up to ``max_retries`` times, then counted failed; one that
arrives while no replica is ready waits at the router.

Rare events only: lifecycle stages, decisions (every ``interval_s``) and failures are SimPy timeouts
beside the replicas' own events, so the per-step path is the static fleet's. A crashed replica's
requests leave it through the core's own ``Scheduler.abort`` (KV freed there, nothing copied); its
pending step event becomes a no-op. ``fleet.fleet.run_fleet`` stays the path of a fleet that does none of
this (a scenario without ``lifecycle``, ``autoscaling`` or ``failures`` never comes here).
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from simulator.collector import cycle_collector_paused
from simulator.core.request import RequestSpec
from simulator.fleet.arrival_feed import ArrivalFeed, ReadyRoute
from simulator.fleet.autoscaler import Observation, Scaler, ScalingContext
from simulator.fleet.clock import run_until
from simulator.fleet.config import AutoscalingConfig, LifecycleConfig
from simulator.fleet.failures import FailuresConfig
from simulator.fleet.fleet import FleetRun, FleetSetup, InspectFn, ProgressFn, _kv_probe
from simulator.fleet.lifecycle import ENDED, STARTING, ColdStart, Slot, SlotState
from simulator.fleet.loads import LoadLevels, least_loaded_of
from simulator.fleet.replica import Replica
from simulator.fleet.router import make_router
from simulator.results.day import DayLog
from simulator.results.percentiles import percentile
from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries
from simulator.workload.workload import Workload

STATIC_INTERVAL_S = 15.0
"""Bookkeeping period of a fleet without an autoscaler (replica counts, end-of-run check)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DynamicSetup:
    """What a fleet that changes size needs beyond a static fleet's settings."""

    base: FleetSetup
    """The static fleet's settings; ``num_replicas`` is the count at the start (ready at once)."""
    tp: int
    """GPUs per replica (GPU-hours, replicas per node)."""
    lifecycle: LifecycleConfig
    cold_start: ColdStart
    autoscaling: AutoscalingConfig | None
    failures: FailuresConfig | None
    ttft_target_ms: float | None
    """The SLO's TTFT, for the slo policy when its own target is unset."""
    tpot_target_ms: float | None


@dataclass(frozen=True, slots=True)
class DynamicRun:
    """What the clock left: the fleet's run, the day's records, each replica's life, and the requests the
    fleet itself held at the end (waiting at the router, or lost with a replica not yet detected)."""

    fleet: FleetRun
    day: DayLog
    slots: list[Slot]
    pending: list[int]
    gpu_hours: float


class _Drained(Exception):
    """Every request has arrived and ended: the run is over (timers still queued are not)."""


class DynamicFleet:
    """The replicas of a fleet that changes size, the router over its ready ones, and its timers."""

    def __init__(self, env: simpy.Environment, setup: DynamicSetup, workload: Workload, log: RequestLog,
                 day: DayLog) -> None:
        self.env = env
        self.setup = setup
        self.base = setup.base
        self.workload = workload
        self.log = log
        self.day = day
        self.replicas: list[Replica] = []
        self.levels = LoadLevels(0)
        """Each replica's request count (index = replica id), kept by the replica."""
        self.loads: list[int] = self.levels.values
        self.slots: list[Slot] = []
        self.ready: list[Slot] = []
        """Routable slots in replica-id order (a crashed one stays until detected)."""
        self._views: list[Replica] = []
        self._ready_ids: list[int] = []
        self.held: deque[RequestSpec] = deque()
        """Requests waiting at the router for a ready replica."""
        self.router = make_router(self.base.router, 1, self.base.seed)
        self._least = self.base.router.policy == "least_requests"
        self.ready_route: ReadyRoute | None = ReadyRoute(self.levels, log) if self._least else None
        """least_requests: ``dispatch``'s usual case, compiled (the arrival feed tries it first)."""
        self._per_node = max(1, setup.lifecycle.gpus_per_node // setup.tp)
        self._nodes: dict[int, list[Slot]] = {}
        self._dead_nodes: set[int] = set()
        self._rng = np.random.default_rng([self.base.seed, 0xFA11])
        self.feed: ArrivalFeed | None = None
        self.num_requests = len(workload)
        self.last_failure_s = 0.0
        failures = setup.failures
        self._max_retries = failures.max_retries if failures is not None else 0
        self._detection_s = failures.detection_s if failures is not None else 0.0
        self._replace = failures is not None and failures.replace and setup.autoscaling is None
        self.scaler: Scaler | None = None
        auto = setup.autoscaling
        if auto is not None:
            self.scaler = Scaler(auto, ScalingContext(
                ttft_target_ms=auto.ttft_target_ms if auto.ttft_target_ms is not None else setup.ttft_target_ms,
                tpot_target_ms=auto.tpot_target_ms if auto.tpot_target_ms is not None else setup.tpot_target_ms,
                cold_start_s=setup.cold_start.total_s, future_arrivals_s=workload.arrival_s))
        self.interval_s = auto.interval_s if auto is not None else STATIC_INTERVAL_S
        self._window_s = auto.window_s if auto is not None else 60.0
        self._delay_s = auto.metrics_delay_s if auto is not None else 0.0
        self._observations: deque[Observation] = deque()
        self._latency = self.scaler is not None and self.scaler.policy.reads_latency
        """Whether ticks compute the window's latency percentiles (a fraction of a millisecond a tick: only
        for a policy that reads them)."""
        initial = self.base.num_replicas
        if auto is not None:
            initial = min(max(initial, auto.min_replicas), auto.max_replicas)
        for _ in range(initial):
            slot = self._new_slot(0.0)
            self._on_ready(slot)

    # ----- lifecycle ------------------------------------------------------------------------------------

    def _after(self, delay_s: float, action: Callable[[], None]) -> None:
        self.env.timeout(delay_s).callbacks.append(lambda _event: action())

    def _new_slot(self, now: float) -> Slot:
        """A replica asked for now (cost from now on), placed on the first live node with room."""
        base = self.base
        index = len(self.replicas)
        self.levels.append()
        interval = base.sample_interval_s
        series = ReplicaSeries(index, interval, start_s=math.ceil(now / interval) * interval)
        replica = Replica(self.env, index, base.scheduler, base.cost, self.log, series,
                          network_latency_s=base.network_latency_s, fast_path=base.fast_path, loads=self.levels)
        series.kv_probe = _kv_probe(replica)
        replica.may_crash = self.setup.failures is not None
        node = self._place()
        slot = Slot(replica=replica, node=node, state=SlotState.PROVISIONING, started_s=now)
        self._nodes.setdefault(node, []).append(slot)
        self.replicas.append(replica)
        self.slots.append(slot)
        if self.ready_route is not None:
            self.ready_route.replicas.append(replica)
        failures = self.setup.failures
        if failures is not None and failures.mtbf_h is not None:
            at = now + float(self._rng.exponential(failures.mtbf_h * 3600.0))
            self._after(at - now, lambda: self.crash(slot, self.env.now, "mtbf"))
        return slot

    def _place(self) -> int:
        for node in sorted(self._nodes):
            if node not in self._dead_nodes and sum(s.state not in ENDED for s in self._nodes[node]) < self._per_node:
                return node
        return max(self._nodes, default=-1) + 1

    def start(self, now: float) -> Slot:
        """Ask for a replica now: it serves after provisioning, loading its weights and warming up."""
        slot = self._new_slot(now)
        self.day.event(now, "start", slot.replica_id, f"node {slot.node}")
        cold = self.setup.cold_start
        self._after(cold.provision_s, lambda: self._advance(slot, SlotState.PROVISIONING, SlotState.LOADING))
        self._after(cold.provision_s + cold.load_s,
                    lambda: self._advance(slot, SlotState.LOADING, SlotState.WARMING))
        self._after(cold.total_s, lambda: self._advance(slot, SlotState.WARMING, SlotState.READY))
        return slot

    def _advance(self, slot: Slot, expected: SlotState, state: SlotState) -> None:
        if slot.state is not expected:
            return  # cancelled or failed meanwhile
        if state is SlotState.READY:
            self._on_ready(slot)
        else:
            slot.state = state

    def _on_ready(self, slot: Slot) -> None:
        now = self.env.now
        slot.state = SlotState.READY
        slot.ready_s = now
        if now > 0:
            self.day.event(now, "ready", slot.replica_id)
        bisect.insort(self.ready, slot, key=lambda s: s.replica_id)
        self._routable()
        while self.held and self.ready:
            self.dispatch(self.held.popleft(), now)

    def _unroute(self, slot: Slot) -> None:
        if slot in self.ready:
            self.ready.remove(slot)
            self._routable()

    def _routable(self) -> None:
        """The router's views and ids of the ready replicas, rebuilt when they change (rarely)."""
        self._views = [s.replica for s in self.ready]
        self._ready_ids = [s.replica_id for s in self.ready]
        if self.ready_route is not None:  # a crashed replica not yet noticed: ``dispatch`` decides each time
            self.ready_route.ids = [] if any(s.dead for s in self.ready) else list(self._ready_ids)

    def cancel(self, slot: Slot, now: float) -> None:
        """Stop a replica still starting (it never served)."""
        slot.state = SlotState.STOPPED
        slot.ended_s = now
        self.day.event(now, "cancel", slot.replica_id)

    def drain(self, slot: Slot, now: float) -> None:
        """Send it nothing more; it stops once it has finished what it holds."""
        self._unroute(slot)
        slot.state = SlotState.DRAINING
        self.day.event(now, "drain", slot.replica_id)
        if slot.replica.load == 0:
            self._stop(slot, now)
        else:
            slot.replica.on_step_ended = self._check_drained

    def _check_drained(self, replica: Replica) -> None:
        if replica.load == 0:
            replica.on_step_ended = None
            self._stop(self.slots[replica.replica_id], self.env.now)

    def _stop(self, slot: Slot, now: float) -> None:
        slot.state = SlotState.STOPPED
        slot.ended_s = now
        self.day.event(now, "stop", slot.replica_id)

    # ----- requests -------------------------------------------------------------------------------------

    def dispatch(self, spec: RequestSpec, now: float) -> None:
        """Route a request to a ready replica (a crashed one the router has not noticed swallows it until
        detection), or hold it at the router while none is ready."""
        ready = self.ready
        if not ready:
            self.held.append(spec)
            return
        if self._least:  # least_requests: the first replica with the fewest requests, lowest id on ties
            slot = self.slots[least_loaded_of(self.loads, self._ready_ids, self.levels.lowest)]
        else:
            slot = ready[self.router.choose(spec, self._views, now)]
        self.log.on_routed(spec.request_id, slot.replica_id)
        if slot.dead:
            slot.lost.append(spec)
            return
        slot.replica.submit(spec)

    def _retry(self, spec: RequestSpec, now: float) -> None:
        rid = spec.request_id
        day = self.day
        if day.retries[rid] >= self._max_retries:
            self._give_up(spec, now)
            return
        day.retries[rid] += 1
        self.dispatch(spec, now)

    # ----- failures ---------------------------------------------------------------------------------------

    def crash(self, slot: Slot, now: float, cause: str, *, detection_s: float | None = None) -> None:
        """The replica dies now; the router notices after the detection delay (``detection_s``: this
        crash's own), when what it lost is retried."""
        self.crash_all([slot], now, cause, detection_s=detection_s)

    def crash_all(self, slots: list[Slot], now: float, cause: str, *, detection_s: float | None = None) -> None:
        """Replicas that die together (a node): cost stops, what they hold is lost (KV freed through the
        core's abort), and the router notices them all at once after the detection delay, when the lost
        requests are retried on the replicas left."""
        crashed = [slot for slot in slots if slot.state not in ENDED]
        if not crashed:
            return
        replacements = 0
        for slot in crashed:
            self.day.event(now, "crash", slot.replica_id, cause)
            replacements += self._replace and slot.state is not SlotState.DRAINING  # a draining one was replaced
            was_starting = slot.state in STARTING
            slot.state = SlotState.FAILED
            slot.ended_s = now
            if not was_starting:
                self._lose(slot)
        self.last_failure_s = max(self.last_failure_s, now)
        delay = self._detection_s if detection_s is None else detection_s
        self._after(delay, partial(self._detect, crashed, replacements))

    def _lose(self, slot: Slot) -> None:
        """Empty a crashed replica through the core's abort (its KV freed there) and halt it."""
        replica = slot.replica
        replica.sync_before_crash()  # steps that ended before the crash happened, the last one sampled
        scheduler = replica.scheduler
        lost = [request.spec for request in scheduler.requests.values()]
        first_token = self.log.first_token_s
        for spec in lost:
            scheduler.abort(spec.request_id)
            first_token[spec.request_id] = math.nan  # the client starts over: its next first token counts
        self.levels.set(replica.replica_id, 0)
        _halt(replica)
        slot.lost.extend(lost)
        slot.dead = True
        self._routable()

    def _detect(self, slots: list[Slot], replacements: int) -> None:
        now = self.env.now
        lost: list[RequestSpec] = []
        for slot in slots:
            if slot in self.ready:
                self._unroute(slot)
                self.day.event(now, "detected", slot.replica_id)
            lost += slot.lost
            slot.lost = []
        for _ in range(replacements):
            self.start(now)
        for spec in sorted(lost, key=lambda spec: spec.request_id):
            self._retry(spec, now)

    def fail_node(self, node: int, now: float) -> None:
        self.day.event(now, "node_failure", node)
        self._dead_nodes.add(node)
        self.crash_all(list(self._nodes.get(node, [])), now, f"node {node}")

    def interrupt_spot(self, node: int, now: float, notice_s: float) -> None:
        """Notice now: the node's replicas drain (and a static fleet starts replacements); at the end of
        the notice the node goes, with whatever its replicas still hold (retried at once: the router
        already knows)."""
        self.day.event(now, "spot_notice", node, f"{notice_s:g} s")
        self._dead_nodes.add(node)
        for slot in list(self._nodes.get(node, [])):
            if slot.state in STARTING:
                self.cancel(slot, now)
            elif slot.state is SlotState.READY:
                self.drain(slot, now)
                if self._replace:
                    self.start(now)

        def reclaim() -> None:
            self.crash_all(list(self._nodes.get(node, [])), self.env.now, f"spot node {node}", detection_s=0.0)

        self._after(notice_s, reclaim)

    def schedule_failures(self) -> None:
        failures = self.setup.failures
        if failures is None:
            return
        for crash in failures.crashes:
            self._after(crash.at_s, partial(self._crash_id, crash.replica, crash.at_s))
        for failure in failures.node_failures:
            self._after(failure.at_s, partial(self.fail_node, failure.node, failure.at_s))
        for spot in failures.spot_interruptions:
            self._after(spot.at_s, partial(self.interrupt_spot, spot.node, spot.at_s, spot.notice_s))

    def _crash_id(self, replica_id: int, now: float) -> None:
        if replica_id < len(self.slots):
            self.crash(self.slots[replica_id], now, "scripted")

    # ----- decisions --------------------------------------------------------------------------------------

    def observe(self, now: float) -> Observation:
        """The metrics now: replica counts, requests held and waiting, the last window's arrival rate and
        (for a policy that reads them) latency percentiles."""
        workload = self.workload
        arrivals = workload.arrival_s
        window = self._window_s
        first, last = (int(i) for i in np.searchsorted(arrivals, [now - window, now], side="left"))
        ttft_ms = tpot_ms = math.nan
        q = self.setup.autoscaling.percentile if self.setup.autoscaling is not None else 90.0
        if last > first and self._latency:
            arrived = arrivals[first:last]
            # Only tokens the clients have by now count: a time logged ahead of now (a network latency still
            # to pass, or a decode run's first step not yet ended) is not observed yet.
            first_token = self.log.first_token_s[first:last]
            seen = first_token <= now  # NaN compares false: no first token
            waited = np.where(seen, first_token - arrived, now - arrived)
            ttft_ms = percentile(waited, q) * 1e3
            finish = self.log.finish_s[first:last]
            outputs = workload.output_tokens[first:last]
            done = (finish <= now) & (outputs > 1) & seen
            if done.any():
                tpot = (finish[done] - first_token[done]) / (outputs[done] - 1)
                tpot_ms = percentile(tpot, q) * 1e3
        alive = [s for s in self.slots if s.state in (SlotState.READY, SlotState.DRAINING)]
        held = sum(self.loads) + len(self.held)
        waiting = sum(s.replica.num_waiting for s in alive) + len(self.held)
        return Observation(time_s=now, num_ready=len(self.ready),
                           num_starting=sum(s.state in STARTING for s in self.slots), held=held, waiting=waiting,
                           arrival_rps=(last - first) / window, ttft_ms=ttft_ms, tpot_ms=tpot_ms)

    def tick(self) -> None:
        """Every ``interval_s``: record the counts, let the autoscaler decide, act; end a drained run."""
        now = self.env.now
        observation = self.observe(now)
        observations = self._observations
        observations.append(observation)
        while len(observations) > 1 and observations[1].time_s <= now - self._delay_s:
            observations.popleft()
        seen = observations[0]
        draining = sum(s.state is SlotState.DRAINING for s in self.slots)
        self.day.counts.append((now, observation.num_ready, observation.num_starting, draining,
                                observation.held, observation.arrival_rps))
        if self.scaler is not None:
            counted = [s for s in self.slots if s.state in STARTING or s.state is SlotState.READY]
            decision = self.scaler.decide(seen, len(counted), now)
            self.day.decisions.append((now, decision.observed_s, decision.current, decision.wanted,
                                       decision.target, decision.reason))
            self._apply(decision.target, counted, now)
        if self.scaler is None and self.held and not any(s.state not in ENDED for s in self.slots):
            # Every replica is gone and nothing will start one (failures without replacement): what waits
            # at the router can never be served.
            while self.held:
                self._give_up(self.held.popleft(), now)
        if self._drained():
            raise _Drained
        self._after(self.interval_s, self.tick)

    def _give_up(self, spec: RequestSpec, now: float) -> None:
        self.day.failed[spec.request_id] = True
        self.last_failure_s = now

    def _apply(self, target: int, counted: list[Slot], now: float) -> None:
        current = len(counted)
        for _ in range(target - current):
            self.start(now)
        excess = current - target
        if excess <= 0:
            return
        for slot in sorted((s for s in counted if s.state in STARTING), key=lambda s: -s.replica_id)[:excess]:
            self.cancel(slot, now)
            excess -= 1
        loads = self.loads
        serving = sorted((s for s in counted if s.state is SlotState.READY and not s.dead),
                         key=lambda s: (loads[s.replica_id], -s.replica_id))
        for slot in serving[:excess]:
            self.drain(slot, now)

    def _drained(self) -> bool:
        feed = self.feed
        return (feed is not None and feed.num_arrived == self.num_requests and not self.held
                and not any(self.loads) and not any(s.lost for s in self.slots))

    def pending(self) -> list[int]:
        """Requests the fleet itself holds: at the router, or lost with a replica not yet detected."""
        return sorted([spec.request_id for spec in self.held]
                      + [spec.request_id for slot in self.slots for spec in slot.lost])


def _halt(replica: Replica) -> None:
    """A crashed replica does nothing more: its pending step (or decode run) event pops as a no-op and
    nothing of the step in flight is applied."""
    event = replica._event
    if event is not None and event.callbacks:
        event.callbacks = []
    replica._run_state = None
    replica._plan = None
    replica._tail = None
    replica._queued = None
    replica._idle = True
    replica.on_step_ended = None


def run_dynamic_fleet(setup: DynamicSetup, workload: Workload, *, name: str = "base",
                      progress: ProgressFn | None = None, inspect: InspectFn | None = None,
                      prepare: InspectFn | None = None) -> DynamicRun:
    """Replay the workload through a fleet that changes size and breaks, until the horizon (or until
    every request has ended)."""
    env = simpy.Environment()
    num_requests = len(workload)
    log = RequestLog(num_requests)
    day = DayLog(num_requests)
    fleet = DynamicFleet(env, setup, workload, log, day)
    if prepare is not None:
        prepare(name, fleet.replicas)
    horizon_s = setup.base.horizon_s

    def report(arrived: int) -> None:
        if progress is not None:
            progress(name, arrived, num_requests)

    specs = workload.iter_specs(block_hashes=setup.base.scheduler.prefix_caching)
    with cycle_collector_paused():
        feed = ArrivalFeed(env, specs, log, [], dispatch=fleet.dispatch, ready=fleet.ready_route,
                           progress=None if progress is None else report, report_every=max(1, num_requests // 100),
                           log_arrivals=False)
        fleet.feed = feed
        fleet.schedule_failures()
        fleet._after(0.0, fleet.tick)
        with contextlib.suppress(_Drained):  # every request has ended; the timers still queued do not matter
            run_until(env, horizon_s)
    arrived = feed.num_arrived
    log.record_arrivals(workload.arrival_s[:arrived], workload.prompt_tokens[:arrived],
                        workload.output_tokens[:arrived], workload.session_id[:arrived])
    if horizon_s is None:
        n = len(log)
        ends = [fleet.last_failure_s, float(workload.arrival_s[arrived - 1]) if arrived else 0.0]
        finished = log.finish_s[:n]
        if n and not np.isnan(finished).all():
            ends.append(float(np.nanmax(finished)) - setup.base.network_latency_s)
        end_s = max(ends)
    else:
        end_s = horizon_s
    end_s = max(end_s, 1e-9)
    for replica in fleet.replicas:
        replica.stop(end_s)  # a decode run cut by the horizon: the steps that ended count
    if inspect is not None:
        inspect(name, fleet.replicas)
    gpu_hours = sum(slot.gpu_seconds(end_s, setup.tp) for slot in fleet.slots) / 3600.0
    return DynamicRun(FleetRun(log, fleet.replicas, end_s), day, fleet.slots, fleet.pending(), gpu_hours)
