"""Autoscaling policies: how many replicas a fleet should have, decided every ``interval_s`` from what
the metrics showed ``metrics_delay_s`` ago (as a real autoscaler sees a scrape).

Every policy is a small class behind one protocol, ``Autoscaler.desired(observation, current, now_s)``,
registered by name in ``AUTOSCALERS`` so a scenario picks it in YAML (``autoscaling: {policy: slo}``):

- ``concurrency``: KServe / Knative's target concurrency, as the Kubernetes HPA computes it
  (desired = ceil(current · per-replica metric / target), within a 10 % tolerance); the metric is
  requests held (running + waiting) or, with ``metric: queue``, waiting requests (KEDA on vLLM's
  ``num_requests_waiting``).
- ``slo``: the Dynamo planner's idea, on observed latency: the TTFT and TPOT percentiles of the last
  window against their targets; over target, add replicas in proportion; well under, remove one.
- ``schedule``: a fixed plan of replica counts by time of day.
- ``oracle``: knows the future arrivals: the replicas the load one cold start ahead needs at
  ``rps_per_replica``; the lower bound a reactive policy is measured against.

Min and max replicas, the scale-up cooldown and the scale-down stabilisation window (the HPA's: the
highest recommendation of the last window) are the fleet's (``Scaler.decide``), the same for every policy.
This module never touches a replica.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, Protocol, get_args

import numpy as np

from simulator.fleet.config import AutoscalerPolicy, AutoscalingConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What the metrics showed at ``time_s`` (a decision sees one ``metrics_delay_s`` old)."""

    time_s: float
    num_ready: int
    num_starting: int
    """Provisioning, loading or warming up."""
    held: int
    """Requests held by ready and draining replicas plus those waiting at the router."""
    waiting: int
    """Requests not running: queued at replicas or at the router."""
    arrival_rps: float
    """Arrivals over the last window, per second."""
    ttft_ms: float
    """The window's TTFT percentile (requests that arrived in it; one still waiting counts its wait so
    far, a lower bound); NaN with no arrival, and when the policy reads no latency (not computed)."""
    tpot_ms: float
    """The window's TPOT percentile over the requests of the window that finished; NaN with none, and
    when the policy reads no latency."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingContext:
    """What a policy may know beyond the metrics: its targets and, for the oracle, the future."""

    ttft_target_ms: float | None
    tpot_target_ms: float | None
    cold_start_s: float
    future_arrivals_s: np.ndarray
    """Every arrival time of the run, sorted: only the oracle reads it."""


class Autoscaler(Protocol):
    """An autoscaling policy: the replica count it wants now, and why (one short phrase)."""

    name: ClassVar[str]
    reads_latency: ClassVar[bool]
    """Whether ``desired`` reads the window's TTFT and TPOT percentiles (the fleet computes them only then)."""

    @classmethod
    def from_config(cls, config: AutoscalingConfig, context: ScalingContext) -> Autoscaler: ...

    def desired(self, observation: Observation, current: int, now_s: float) -> tuple[int, str]: ...


HPA_TOLERANCE = 0.1
"""The HPA leaves the count alone while the metric is within 10 % of its target."""


class ConcurrencyAutoscaler:
    """Hold requests (or waiting requests) per replica at a target, by the HPA's formula."""

    name: ClassVar[str] = "concurrency"
    reads_latency: ClassVar[bool] = False

    def __init__(self, *, metric: str, target: float) -> None:
        self._metric = metric
        self._target = target

    @classmethod
    def from_config(cls, config: AutoscalingConfig, context: ScalingContext) -> Autoscaler:
        return cls(metric=config.metric, target=config.target)

    def desired(self, observation: Observation, current: int, now_s: float) -> tuple[int, str]:
        value = observation.held if self._metric == "concurrency" else observation.waiting
        serving = max(observation.num_ready, 1)
        ratio = value / serving / self._target
        if abs(ratio - 1.0) <= HPA_TOLERANCE:
            return current, f"{self._metric} {value / serving:.1f}/replica within tolerance"
        return math.ceil(serving * ratio), f"{self._metric} {value / serving:.1f}/replica vs {self._target:g}"


class SLOAutoscaler:
    """Scale on the observed latency percentiles against their targets (the Dynamo planner's goal, on
    feedback): over target by a factor r, grow to ceil(current · r) (at least one more); under
    ``scale_down_below`` of every target, shrink by one."""

    name: ClassVar[str] = "slo"
    reads_latency: ClassVar[bool] = True

    def __init__(self, *, ttft_ms: float | None, tpot_ms: float | None, scale_down_below: float) -> None:
        if ttft_ms is None and tpot_ms is None:
            raise ValueError("the slo autoscaler needs a TTFT or TPOT target (autoscaling.ttft_target_ms or "
                             "slo.ttft_ms)")
        self._ttft_ms = ttft_ms
        self._tpot_ms = tpot_ms
        self._down = scale_down_below

    @classmethod
    def from_config(cls, config: AutoscalingConfig, context: ScalingContext) -> Autoscaler:
        return cls(ttft_ms=context.ttft_target_ms, tpot_ms=context.tpot_target_ms,
                   scale_down_below=config.scale_down_below)

    def desired(self, observation: Observation, current: int, now_s: float) -> tuple[int, str]:
        ratios = [value / target for value, target in ((observation.ttft_ms, self._ttft_ms),
                                                          (observation.tpot_ms, self._tpot_ms))
                  if target is not None and math.isfinite(value)]
        if not ratios:
            return current, "no latency observed"
        worst = max(ratios)
        if worst > 1.0:
            return max(current + 1, math.ceil(current * min(worst, 2.0))), f"latency at {worst:.2f}x target"
        if worst < self._down:
            return current - 1, f"latency at {worst:.2f}x target"
        return current, f"latency at {worst:.2f}x target"


class ScheduleAutoscaler:
    """A fixed plan: the count of the last step at or before now."""

    name: ClassVar[str] = "schedule"
    reads_latency: ClassVar[bool] = False

    def __init__(self, steps: tuple[tuple[float, int], ...]) -> None:
        self._times = np.array([t for t, _ in steps])
        self._counts = [n for _, n in steps]

    @classmethod
    def from_config(cls, config: AutoscalingConfig, context: ScalingContext) -> Autoscaler:
        return cls(config.schedule)

    def desired(self, observation: Observation, current: int, now_s: float) -> tuple[int, str]:
        index = int(np.searchsorted(self._times, now_s, side="right")) - 1
        return self._counts[max(index, 0)], "scheduled"


class OracleAutoscaler:
    """Knows every future arrival: holds what the busiest window of the load from now to one cold start
    (and one decision) ahead needs at ``rps_per_replica``: replicas asked for now serve from then on, and
    none is stopped that the load before then still needs."""

    name: ClassVar[str] = "oracle"
    reads_latency: ClassVar[bool] = False

    def __init__(self, *, arrivals_s: np.ndarray, rps_per_replica: float, lead_s: float, window_s: float,
                 interval_s: float) -> None:
        self._arrivals = arrivals_s
        self._rps = rps_per_replica
        self._lead_s = lead_s
        self._window_s = window_s
        self._interval_s = interval_s

    @classmethod
    def from_config(cls, config: AutoscalingConfig, context: ScalingContext) -> Autoscaler:
        assert config.rps_per_replica is not None  # the config's validator requires it
        lead = config.lead_s if config.lead_s is not None else context.cold_start_s
        return cls(arrivals_s=context.future_arrivals_s, rps_per_replica=config.rps_per_replica, lead_s=lead,
                   window_s=config.window_s, interval_s=config.interval_s)

    def rate_between(self, start_s: float, end_s: float) -> float:
        """Arrivals per second in [start_s, end_s)."""
        first, last = np.searchsorted(self._arrivals, [start_s, end_s], side="left")
        return float(last - first) / (end_s - start_s)

    def desired(self, observation: Observation, current: int, now_s: float) -> tuple[int, str]:
        # A replica asked for now serves from one cold start on, but one stopped now is gone at once: hold
        # what the busiest window from now to a cold start and one decision ahead needs.
        window = self._window_s
        # Windows starting after the last arrival hold none: the grid stops there (a cold start of years
        # would otherwise make an array of billions of windows, every decision).
        ahead = self._lead_s + self._interval_s
        arrivals = self._arrivals
        if len(arrivals):
            ahead = min(ahead, max(0.0, float(arrivals[-1]) - now_s))
        starts = now_s + np.arange(0.0, ahead + window / 2, window / 2)
        counts = np.searchsorted(self._arrivals, starts + window) - np.searchsorted(self._arrivals, starts)
        rate = float(counts.max()) / window
        return max(1, math.ceil(rate / self._rps)), f"{rate:.1f} rps ahead"


AUTOSCALERS: dict[str, type[Autoscaler]] = {
    cls.name: cls for cls in (ConcurrencyAutoscaler, SLOAutoscaler, ScheduleAutoscaler, OracleAutoscaler)
}
"""Autoscaling policies by name, in the order of ``AutoscalerPolicy``."""

if tuple(AUTOSCALERS) != get_args(AutoscalerPolicy):  # pragma: no cover - a programming error, caught at import
    raise RuntimeError(f"AutoscalerPolicy {get_args(AutoscalerPolicy)} and AUTOSCALERS {tuple(AUTOSCALERS)} disagree")


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One decision: what the policy saw and wanted, and the count the fleet aims for after the limits."""

    time_s: float
    observed_s: float
    """When the metrics it saw were taken."""
    current: int
    """Replicas serving or starting (not draining) when it decided."""
    wanted: int
    """The policy's count, before limits and cooldowns."""
    target: int
    """The count the fleet moves to."""
    reason: str


class Scaler:
    """A policy with the limits every policy shares: min/max replicas, the scale-up cooldown, and the
    scale-down stabilisation window."""

    def __init__(self, config: AutoscalingConfig, context: ScalingContext) -> None:
        self.config = config
        self.policy = AUTOSCALERS[config.policy].from_config(config, context)
        self._recent: deque[tuple[float, int]] = deque()
        """(time, bounded recommendation) over the scale-down window."""
        self._last_up_s = -math.inf

    def decide(self, observation: Observation, current: int, now_s: float) -> Decision:
        config = self.config
        wanted, reason = self.policy.desired(observation, current, now_s)
        bounded = min(max(wanted, config.min_replicas), config.max_replicas)
        recent = self._recent
        recent.append((now_s, bounded))
        while recent and recent[0][0] < now_s - config.scale_down_window_s:
            recent.popleft()
        target = current
        if bounded > current:
            if now_s - self._last_up_s >= config.scale_up_cooldown_s:
                target = bounded
                self._last_up_s = now_s
        elif bounded < current:
            target = max(n for _, n in recent)  # the highest recommendation of the window
            target = min(target, current)
        return Decision(time_s=now_s, observed_s=observation.time_s, current=current, wanted=wanted,
                        target=target, reason=reason)

