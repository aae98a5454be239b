"""What a fleet that changes size recorded over a run: its lifecycle and failure events, the autoscaler's
decisions, the replica counts over time, each request's retries; and the figures read from them
(``DayFigures``: GPU-hours and dollars per day, scale events, cold starts, failures, retries, SLO
attainment per hour and SLO-minutes lost).

Written by ``fleet.dynamic`` a few times per decision or failure, never per step; never imports the fleet.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.results.percentiles import percentile
from simulator.results.request_log import RequestLog, latencies_s
from simulator.results.summary import SLO, round_sig, slo_mask

if TYPE_CHECKING:
    import pandas as pd

EVENT_KINDS = ("start", "ready", "cancel", "drain", "stop", "crash", "node_failure", "spot_notice", "detected")
"""Kinds of lifecycle and failure events, as the events table names them."""


@dataclass(slots=True)
class DayLog:
    """The run's records; ``retries`` and ``failed`` are per request id."""

    num_requests: int
    events: list[tuple[float, str, int, str]] = field(default_factory=list)
    """(time_s, kind, replica id or node id, detail)."""
    decisions: list[tuple[float, float, int, int, int, str]] = field(default_factory=list)
    """(time_s, observed_s, current, wanted, target, reason)."""
    counts: list[tuple[float, int, int, int, int, float]] = field(default_factory=list)
    """(time_s, ready, starting, draining, held requests, arrivals per second over the window)."""
    retries: np.ndarray = field(init=False)
    failed: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.retries = np.zeros(self.num_requests, dtype=np.int32)
        self.failed = np.zeros(self.num_requests, dtype=bool)

    def event(self, time_s: float, kind: str, who: int, detail: str = "") -> None:
        self.events.append((time_s, kind, who, detail))

    def events_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.events, columns=["time_s", "kind", "id", "detail"])

    def decisions_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.decisions, columns=["time_s", "observed_s", "current", "wanted", "target", "reason"])

    def counts_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.counts, columns=["time_s", "ready", "starting", "draining", "held", "arrival_rps"])


@dataclass(frozen=True, slots=True, kw_only=True)
class DayFigures:
    """Headline figures of a fleet that changed size (summary.json's ``day`` section)."""

    policy: str
    """The autoscaling policy, or ``static``."""
    gpu_hours: float
    """GPU-hours paid for, from each replica's provisioning to its stop (or failure), to the run's end."""
    cost_usd: float
    cost_per_day_usd: float
    """The cost scaled to 24 hours of this run's rate."""
    replicas_mean: float
    """Replicas paid for (starting, ready or draining), time-averaged over the decision grid."""
    replicas_peak: int
    num_scale_ups: int
    num_scale_downs: int
    num_cold_starts: int
    """Replicas started during the run (each pays a cold start)."""
    num_crashes: int
    """Replicas lost to crashes, node failures and spot interruptions."""
    requests_retried: int
    """Requests that lost their replica at least once and were sent again."""
    num_retries: int
    requests_failed: int
    retried_ttft_p50_ms: float
    """Median TTFT of the retried requests that completed (the retry's cost to the user)."""
    slo_minutes_lost: int
    """Minutes (by arrival) in which fewer requests met the SLO than its target attainment."""
    slo_attainment_by_hour: tuple[float, ...]
    """Share of each hour's arrivals meeting the SLO (NaN for an hour without arrivals)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, str | bool | int):
                out[key] = value
            elif isinstance(value, tuple | list):
                out[key] = [round_sig(float(v)) for v in value]
            else:
                out[key] = round_sig(float(value))
        return out


def slo_by_minute(log: RequestLog, slo: SLO | None, *, bin_s: float = 60.0) -> tuple[np.ndarray, np.ndarray]:
    """(arrivals, arrivals meeting the SLO) in each ``bin_s`` bin of arrival time (a request that did not
    complete meets nothing)."""
    c = log.columns()
    arrived = ~np.isnan(c["arrival_s"])
    lat = {k: v * 1e3 for k, v in latencies_s(c).items()}
    done = arrived & ~np.isnan(c["finish_s"]) & ~c["rejected"]
    meets = done & slo_mask(lat, slo if slo is not None else SLO())
    bins = np.floor(c["arrival_s"][arrived] / bin_s).astype(np.int64)
    size = int(bins.max()) + 1 if bins.size else 0
    return (np.bincount(bins, minlength=size), np.bincount(bins, weights=meets[arrived], minlength=size))


def day_figures(day: DayLog, log: RequestLog, *, policy: str, gpu_hours: float, usd_per_gpu_hour: float | None,
                duration_s: float, slo: SLO | None) -> DayFigures:
    """The figures of one run from its records (``duration_s``: the run's length, for the cost per day)."""
    target = slo.target_attainment if slo is not None else 0.9
    arrivals, met = slo_by_minute(log, slo)
    with np.errstate(invalid="ignore", divide="ignore"):
        lost = int(((arrivals > 0) & (met < target * arrivals)).sum())
        hours_arrived, hours_met = slo_by_minute(log, slo, bin_s=3600.0)
        shares = np.where(hours_arrived > 0, hours_met / np.maximum(hours_arrived, 1), math.nan)
    by_hour = tuple(float(x) for x in shares)
    counts = np.array([(t, ready + starting + draining) for t, ready, starting, draining, _, _ in day.counts]
                      ).reshape(-1, 2)
    decisions = day.decisions
    ups = sum(1 for d in decisions if d[4] > d[2])
    downs = sum(1 for d in decisions if d[4] < d[2])
    c = log.columns()
    retried = day.retries[: len(c["arrival_s"])] > 0
    ttft_ms = (c["first_token_s"] - c["arrival_s"]) * 1e3
    retried_done = retried & ~np.isnan(c["finish_s"])
    price = math.nan if usd_per_gpu_hour is None else usd_per_gpu_hour
    cost = gpu_hours * price
    return DayFigures(
        policy=policy,
        gpu_hours=gpu_hours,
        cost_usd=cost,
        cost_per_day_usd=cost * 86_400.0 / duration_s if duration_s > 0 else math.nan,
        replicas_mean=float(counts[:, 1].mean()) if len(counts) else math.nan,
        replicas_peak=int(counts[:, 1].max()) if len(counts) else 0,
        num_scale_ups=ups,
        num_scale_downs=downs,
        num_cold_starts=sum(1 for e in day.events if e[1] == "start"),
        num_crashes=sum(1 for e in day.events if e[1] == "crash"),
        requests_retried=int(retried.sum()),
        num_retries=int(day.retries.sum()),
        requests_failed=int(day.failed.sum()),
        retried_ttft_p50_ms=percentile(ttft_ms[retried_done], 50),
        slo_minutes_lost=lost,
        slo_attainment_by_hour=by_hour,
    )


@dataclass(frozen=True, slots=True)
class DayResult:
    """A variant's day: its figures and the records they came from (tables in the run folder)."""

    figures: DayFigures
    log: DayLog
