"""Metrics: per-request columns, per-replica time series, the Summary and the RunResult.

Definitions follow vLLM's serving benchmark (DESIGN §5), so a number printed here can be put next to a
number measured with ``vllm bench serve``:

- TTFT = first token delivered − arrival; E2E = last token delivered − arrival.
- TPOT = (E2E − TTFT) / (output_tokens − 1), per request, only for requests with more than one output
  token (a one-token answer has no inter-token time); percentiles are taken across requests.
- Queue delay = first time the request was scheduled − arrival.
- Throughput = completed requests (and their output tokens) / measured duration.
- Goodput = requests meeting every per-request SLO threshold / measured duration (DistServe).
- SLO attainment = requests meeting the SLO / requests that *arrived*. Rejected requests and requests
  still in flight at the end count as failures, so an overloaded fleet shows up as low attainment instead
  of hiding behind the latencies of the few requests it managed to finish.
- Percentiles use numpy's default linear interpolation (as vLLM does) over *completed* requests.

Warm-up: requests that arrived before ``warmup_s`` are left out of every statistic, and the measured
duration is ``duration_s − warmup_s``. Everything else is a cohort of the requests that arrived after it.

The hot path (``RequestLog.on_*``, ``ReplicaSeries.maybe_sample``) takes plain scalars and writes to
preallocated numpy columns or Python lists: no pandas, no allocation per request. This module must never
import simpy or the simulator's replica/fleet modules (they import us).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SLO",
    "CostConfig",
    "MetricCI",
    "ProfileInfo",
    "ReplicaSeries",
    "RequestLog",
    "RequestOutcome",
    "RunResult",
    "Summary",
    "VariantResult",
    "fleet_kv_util_mean",
    "fleet_kv_waste",
    "fleet_running_mean",
    "round_sig",
    "summaries_with_ci",
    "summarize",
]

SIGNIFICANT_DIGITS = 6
"""Floats in summary.json are rounded to this many significant digits: enough for any metric we report,
few enough that last-bit differences between platforms' libm do not change the file."""


def round_sig(value: float, digits: int = SIGNIFICANT_DIGITS) -> float | None:
    """``value`` rounded to ``digits`` significant digits; ``None`` for NaN or ±inf (JSON has neither)."""
    if not math.isfinite(value):
        return None
    # Formatting through %g is exact and identical on every platform, unlike round(x, n - log10(x)).
    return float(f"{value:.{digits}g}")


# --------------------------------------------------------------------------------------------------------
# Per-request log (hot path)
# --------------------------------------------------------------------------------------------------------


class RequestOutcome(StrEnum):
    """Where a request stands at the end of a run; every arrived request is exactly one of these."""

    COMPLETED = "completed"
    IN_FLIGHT = "in_flight"
    REJECTED = "rejected"


_FLOAT_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "rejected_s")
_INT_COLUMNS: dict[str, type[np.integer[Any]]] = {
    "replica": np.int32,
    "prompt_tokens": np.int64,
    "output_tokens": np.int64,
    "cached_tokens": np.int64,
    "preemptions": np.int32,
    "session_id": np.int64,
}
REQUEST_COLUMNS: tuple[str, ...] = (*_FLOAT_COLUMNS, *_INT_COLUMNS, "rejected")
"""Names of the raw columns of a RequestLog, in a fixed order."""


class RequestLog:
    """Preallocated numpy columns indexed by request id (ids are 0..n-1, assigned in arrival order).

    Times are seconds from the start of the run and NaN until the event happened. ``replica`` is -1 until
    the request is routed and ``session_id`` is -1 when there is none: sentinels rather than ``None``
    because these are fixed-width numpy columns written a million times; DataFrames built from them turn
    the sentinels into missing values. Capacity grows by doubling if an id beyond it arrives, so a
    workload whose size is not known ahead (Poisson over a horizon) still costs amortised O(1).
    """

    arrival_s: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    rejected_s: np.ndarray
    replica: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    cached_tokens: np.ndarray
    preemptions: np.ndarray
    session_id: np.ndarray
    rejected: np.ndarray

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = max(int(capacity), 1)
        self._size = 0
        """One past the largest request id seen: the length of the exported columns."""
        self._allocate(self._capacity)

    def _allocate(self, capacity: int) -> None:
        for name in _FLOAT_COLUMNS:
            setattr(self, name, np.full(capacity, np.nan))
        for name, dtype in _INT_COLUMNS.items():
            fill = -1 if name in ("replica", "session_id") else 0
            setattr(self, name, np.full(capacity, fill, dtype=dtype))
        self.rejected = np.zeros(capacity, dtype=bool)

    def _grow(self, min_capacity: int) -> None:
        old = {name: getattr(self, name) for name in REQUEST_COLUMNS}
        capacity = max(min_capacity, 2 * self._capacity)
        self._allocate(capacity)
        for name, column in old.items():
            getattr(self, name)[: len(column)] = column
        self._capacity = capacity

    def __len__(self) -> int:
        return self._size

    # Hot-path hooks: plain scalars in, one or two numpy item writes each.

    def on_arrival(self, rid: int, t: float, prompt: int, output: int, session: int | None) -> None:
        """Request ``rid`` arrived at the fleet at ``t`` asking for ``output`` tokens after ``prompt``."""
        if rid >= self._capacity:
            self._grow(rid + 1)
        if rid >= self._size:
            self._size = rid + 1
        self.arrival_s[rid] = t
        self.prompt_tokens[rid] = prompt
        self.output_tokens[rid] = output
        if session is not None:
            self.session_id[rid] = session

    def on_routed(self, rid: int, replica: int) -> None:
        self.replica[rid] = replica

    def on_scheduled(self, rid: int, t: float) -> None:
        """First time the request got tokens in a step; later calls (after a preemption) are ignored so
        the queue delay is the wait before service started, as vLLM reports it."""
        if math.isnan(self.first_scheduled_s[rid]):
            self.first_scheduled_s[rid] = t

    def on_first_token(self, rid: int, t: float) -> None:
        """First token delivered to the client (network latency already added by the caller). Only the
        first call counts: a recompute after preemption does not deliver the first token again."""
        if math.isnan(self.first_token_s[rid]):
            self.first_token_s[rid] = t

    def on_finish(self, rid: int, t: float, cached_tokens: int, preemptions: int) -> None:
        """Last token delivered at ``t``; ``cached_tokens`` prompt tokens came from the prefix cache.
        A one-token answer whose first token was not reported separately gets ``t`` as its first token."""
        self.finish_s[rid] = t
        if math.isnan(self.first_token_s[rid]):
            self.first_token_s[rid] = t
        self.cached_tokens[rid] = cached_tokens
        self.preemptions[rid] = preemptions

    def on_rejected(self, rid: int, t: float) -> None:
        """The fleet will never serve this request (too long for any replica, or admission refused)."""
        self.rejected[rid] = True
        self.rejected_s[rid] = t

    # Export.

    def columns(self) -> dict[str, np.ndarray]:
        """The raw columns trimmed to the ids seen, as views (copy them before the run goes on)."""
        n = self._size
        return {name: getattr(self, name)[:n] for name in REQUEST_COLUMNS}

    @classmethod
    def from_columns(cls, columns: Mapping[str, np.ndarray]) -> RequestLog:
        """A log holding copies of ``columns`` (as given by ``columns()``); missing columns stay empty."""
        n = len(columns["arrival_s"])
        log = cls(n)
        for name, values in columns.items():
            if name not in REQUEST_COLUMNS:
                raise ValueError(f"unknown request column {name!r}; expected one of {REQUEST_COLUMNS}")
            if len(values) != n:
                raise ValueError(f"column {name!r} has {len(values)} rows, arrival_s has {n}")
            getattr(log, name)[:n] = values
        log._size = n
        return log

    def trimmed(self) -> RequestLog:
        """A compact copy holding only the ids seen (drops the spare preallocated capacity)."""
        return RequestLog.from_columns(self.columns())

    def outcomes(self) -> dict[RequestOutcome, np.ndarray]:
        """Boolean masks over ids: each arrived request is in exactly one mask; unseen ids in none."""
        c = self.columns()
        arrived = ~np.isnan(c["arrival_s"])
        rejected = arrived & c["rejected"]
        finished = arrived & ~rejected & ~np.isnan(c["finish_s"])
        return {
            RequestOutcome.COMPLETED: finished,
            RequestOutcome.IN_FLIGHT: arrived & ~rejected & ~finished,
            RequestOutcome.REJECTED: rejected,
        }

    def latencies_ms(self) -> dict[str, np.ndarray]:
        """``queue_ms``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` per id, NaN where undefined (the event did not
        happen, or TPOT of a one-token answer). Raw per event: mask with ``outcomes()`` as needed."""
        return {f"{k}_ms": v * 1e3 for k, v in _latencies_s(self.columns()).items()}

    def to_frame(self) -> pd.DataFrame:
        """One row per arrived request with derived ``queue_ms``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms``.

        Latencies are NaN where undefined (not finished, or TPOT of a one-token answer); ``replica`` and
        ``session_id`` are nullable integers, missing when not routed or not in a session.
        """
        c = self.columns()
        keep = ~np.isnan(c["arrival_s"])
        ids = np.flatnonzero(keep)
        c = {name: col[keep] for name, col in c.items()}
        masks = {k: v[keep] for k, v in self.outcomes().items()}
        # Codes index RequestOutcome's members in declaration order (COMPLETED, IN_FLIGHT, REJECTED).
        codes = np.ones(len(ids), dtype=np.int8)
        codes[masks[RequestOutcome.COMPLETED]] = 0
        codes[masks[RequestOutcome.REJECTED]] = 2
        lat = {k: v[keep] for k, v in self.latencies_ms().items()}
        return pd.DataFrame(
            {
                "request_id": ids.astype(np.int64),
                "arrival_s": c["arrival_s"],
                "replica": pd.arrays.IntegerArray(c["replica"].astype(np.int32), c["replica"] < 0),
                "session_id": pd.arrays.IntegerArray(c["session_id"].astype(np.int64), c["session_id"] < 0),
                "outcome": pd.Categorical.from_codes(codes, categories=pd.Index([o.value for o in RequestOutcome])),
                "prompt_tokens": c["prompt_tokens"],
                "output_tokens": c["output_tokens"],
                "cached_tokens": c["cached_tokens"],
                "preemptions": c["preemptions"],
                "first_scheduled_s": c["first_scheduled_s"],
                "first_token_s": c["first_token_s"],
                "finish_s": c["finish_s"],
                "queue_ms": lat["queue_ms"],
                "ttft_ms": lat["ttft_ms"],
                "tpot_ms": lat["tpot_ms"],
                "e2e_ms": lat["e2e_ms"],
            }
        )


def _latencies_s(c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-request latencies in seconds, NaN where undefined. The one place the §5 formulas live."""
    arrival = c["arrival_s"]
    ttft = c["first_token_s"] - arrival
    e2e = c["finish_s"] - arrival
    out = c["output_tokens"]
    # A one-token answer has no inter-token gap: TPOT is undefined there, not zero (vLLM skips it too).
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    return {"queue": c["first_scheduled_s"] - arrival, "ttft": ttft, "tpot": tpot, "e2e": e2e}


# --------------------------------------------------------------------------------------------------------
# Per-replica time series (hot path)
# --------------------------------------------------------------------------------------------------------


SERIES_COLUMNS: tuple[str, ...] = (
    "time_s",
    "running",
    "waiting",
    "kv_used_blocks",
    "kv_total_blocks",
    "prefix_hit_tokens_cum",
    "prompt_tokens_cum",
)


class ReplicaSeries:
    """State of one replica sampled on a fixed grid ``start_s + k * sample_interval_s``.

    The replica calls ``maybe_sample`` after every step with its state *after* that step. State only
    changes at steps, so between two calls it is the state reported at the earlier call: a grid point
    that falls strictly between two calls records the earlier state, one that falls exactly on a call
    records that call's state. Grid points are therefore identical across replicas (the fleet view sums
    them), a long idle gap is filled with the idle state, and the cost is one comparison per step plus
    one tuple store, with memory O(duration / interval). Call ``close(end_s)`` once at the end to fill
    the grid up to the end of the run.

    Cache hit rate is reported two ways from the cumulative counters: ``prefix_hit_rate`` is *windowed*
    (hit tokens / prompt tokens admitted since the previous grid point; NaN when no prompt was admitted),
    which shows the cache warming up and thrashing; ``prefix_hit_rate_cum`` is cumulative since the start.

    Two figures for the Summary ride along: ``peak_running``, the most requests running after any step
    (one comparison per call), and, when a ``kv_probe`` is set, the KV slots allocated and the slots
    allocated but holding no token, summed over the first call at or after each grid point (the probe
    walks the running requests, so it runs once per grid point, never per step). ``close`` drops the
    probe so a finished series keeps no reference to the replica.
    """

    def __init__(self, replica: int, sample_interval_s: float, start_s: float = 0.0) -> None:
        if not sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        self.replica = replica
        self.sample_interval_s = float(sample_interval_s)
        self.start_s = float(start_s)
        self._next_index = 0
        self.next_sample_s = self.start_s
        """The next grid point: a call before it only replaces the state the grid will be filled with
        (an attribute, not a property: decode runs read it on every sample check)."""
        # A replica starts empty; kv_total 0 makes kv_util read 0 until the first real report.
        self._last: tuple[float, int, int, int, int, int, int] = (self.start_s, 0, 0, 0, 0, 0, 0)
        self._rows: list[tuple[float, int, int, int, int, int, int]] = []
        self.peak_running = 0
        """Most requests running after any one step."""
        self.kv_probe: Callable[[], tuple[int, int]] | None = None
        """Returns (KV slots allocated, of which reserved but holding no token) of the replica now."""
        self.kv_allocated_slots_sum = 0
        self.kv_unused_slots_sum = 0

    def maybe_sample(
        self,
        t: float,
        running: int,
        waiting: int,
        kv_used_blocks: int,
        kv_total_blocks: int,
        prefix_hit_tokens_cum: int,
        prompt_tokens_cum: int,
    ) -> None:
        row = (t, running, waiting, kv_used_blocks, kv_total_blocks, prefix_hit_tokens_cum, prompt_tokens_cum)
        if running > self.peak_running:
            self.peak_running = running
        if t >= self.next_sample_s:
            if self.kv_probe is not None:
                allocated, unused = self.kv_probe()
                self.kv_allocated_slots_sum += allocated
                self.kv_unused_slots_sum += unused
            self._fill_before(t)  # grid points before t saw the previous state
            self._last = row
            if t == self.next_sample_s:
                self._fill_one()
            return
        self._last = row

    def close(self, end_s: float) -> None:
        """Fill every grid point up to and including ``end_s`` with the last reported state."""
        self.kv_probe = None
        self._fill_before(end_s)
        if end_s == self.next_sample_s:
            self._fill_one()

    def _advance(self) -> None:
        self._next_index += 1
        # Multiply rather than accumulate: every replica computes bit-identical grid times.
        self.next_sample_s = self.start_s + self._next_index * self.sample_interval_s

    def _fill_one(self) -> None:
        self._rows.append((self.next_sample_s, *self._last[1:]))
        self._advance()

    def _fill_before(self, t: float) -> None:
        while self.next_sample_s < t:
            self._fill_one()

    def __len__(self) -> int:
        return len(self._rows)

    def columns(self) -> dict[str, np.ndarray]:
        """Raw sampled columns (see ``SERIES_COLUMNS``)."""
        if not self._rows:
            return {name: np.zeros(0, dtype=np.float64 if name == "time_s" else np.int64) for name in SERIES_COLUMNS}
        table = np.array(self._rows, dtype=np.float64)
        out = {"time_s": table[:, 0]}
        for i, name in enumerate(SERIES_COLUMNS[1:], start=1):
            out[name] = table[:, i].astype(np.int64)
        return out

    def to_frame(self) -> pd.DataFrame:
        """Sampled rows with derived ``kv_util`` and windowed / cumulative prefix hit rates."""
        c = self.columns()
        with np.errstate(divide="ignore", invalid="ignore"):
            kv_util = np.where(c["kv_total_blocks"] > 0, c["kv_used_blocks"] / c["kv_total_blocks"], 0.0)
            hit, prompt = c["prefix_hit_tokens_cum"], c["prompt_tokens_cum"]
            d_hit = np.diff(hit, prepend=0)
            d_prompt = np.diff(prompt, prepend=0)
            windowed = np.where(d_prompt > 0, d_hit / d_prompt, np.nan)
            cumulative = np.where(prompt > 0, hit / prompt, np.nan)
        frame = pd.DataFrame(c)
        frame.insert(0, "replica", np.full(len(frame), self.replica, dtype=np.int32))
        frame["kv_util"] = kv_util
        frame["prefix_hit_rate"] = windowed
        frame["prefix_hit_rate_cum"] = cumulative
        return frame


def fleet_kv_util_mean(series: Sequence[ReplicaSeries], *, warmup_s: float = 0.0) -> float:
    """Mean KV utilisation over replicas and grid points at or after ``warmup_s`` (a time average,
    because the grid is regular). NaN when there is no sample."""
    values: list[np.ndarray] = []
    for s in series:
        c = s.columns()
        keep = (c["time_s"] >= warmup_s) & (c["kv_total_blocks"] > 0)
        values.append(c["kv_used_blocks"][keep] / c["kv_total_blocks"][keep])
    allv = np.concatenate(values) if values else np.zeros(0)
    return float(allv.mean()) if allv.size else math.nan


def fleet_running_mean(series: Sequence[ReplicaSeries], *, warmup_s: float = 0.0) -> float:
    """Mean number of running requests per replica over grid points at or after ``warmup_s`` (a time
    average, because the grid is regular). NaN when there is no sample."""
    values = []
    for s in series:
        c = s.columns()
        values.append(c["running"][c["time_s"] >= warmup_s])
    allv = np.concatenate(values) if values else np.zeros(0)
    return float(allv.mean()) if allv.size else math.nan


def fleet_kv_waste(series: Sequence[ReplicaSeries]) -> float:
    """Share of allocated KV slots that held no token (reserved ahead, or the unfilled tail of a block),
    over the probed grid points of every replica. NaN when nothing was ever allocated at a probe."""
    allocated = sum(s.kv_allocated_slots_sum for s in series)
    unused = sum(s.kv_unused_slots_sum for s in series)
    return unused / allocated if allocated else math.nan


# --------------------------------------------------------------------------------------------------------
# Configuration: SLO and cost
# --------------------------------------------------------------------------------------------------------


class SLO(BaseModel):
    """Service-level objective. A request meets it when it meets every per-request threshold that is set
    (no threshold set: every completed request meets it). The run meets it (``slo_met``) when the share
    of arrived requests meeting it reaches ``target_attainment`` *and* every percentile threshold set
    holds for the run's percentiles."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    ttft_ms: float | None = Field(default=None, gt=0)
    """Per request: time to first token must be at most this many milliseconds."""
    tpot_ms: float | None = Field(default=None, gt=0)
    """Per request: time per output token at most this (requests with one output token pass: no gap)."""
    e2e_ms: float | None = Field(default=None, gt=0)
    """Per request: end-to-end latency at most this many milliseconds."""
    target_attainment: float = Field(default=0.9, ge=0.0, le=1.0)
    """Share of arrived requests that must meet the per-request thresholds; 0.9 as in DistServe."""
    ttft_p99_ms: float | None = Field(default=None, gt=0)
    """Run-level: p99 TTFT over completed requests must be at most this."""
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    """Run-level: p99 TPOT over completed requests must be at most this."""
    e2e_p99_ms: float | None = Field(default=None, gt=0)
    """Run-level: p99 E2E over completed requests must be at most this."""


class CostConfig(BaseModel):
    """How GPU time is priced. GPUs per replica are the replica's tensor-parallel degree."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    usd_per_gpu_hour: float | None = Field(default=None, ge=0)
    """Price of one GPU for one hour in USD; None takes the hardware's list price from hardware.yaml."""

    def resolve_price(self, hardware_usd_per_gpu_hour: float | None) -> float | None:
        """The price to use: the configured one, else the hardware's (None when neither is known)."""
        return self.usd_per_gpu_hour if self.usd_per_gpu_hour is not None else hardware_usd_per_gpu_hour


# --------------------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """Headline numbers of one run of one variant. Floats are NaN where undefined (no completed request,
    no price); ``to_dict`` turns those into ``None`` and rounds to 6 significant digits."""

    requests_arrived: int
    requests_completed: int
    requests_in_flight: int
    requests_rejected: int
    ttft_mean_ms: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_mean_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    e2e_mean_ms: float
    e2e_p50_ms: float
    e2e_p90_ms: float
    e2e_p99_ms: float
    queue_p50_ms: float
    queue_p90_ms: float
    queue_p99_ms: float
    throughput_rps: float
    throughput_tok_s: float
    output_tokens: int
    goodput_rps: float
    slo_attainment: float
    slo_target_attainment: float
    slo_met: bool
    kv_util_mean: float
    prefix_hit_rate: float
    preemptions: int
    num_gpus: int
    gpu_hours: float
    usd_per_gpu_hour: float
    cost_per_mtok_usd: float
    duration_s: float
    """Measured duration: the run's duration minus the warm-up."""
    warmup_s: float
    running_mean: float = math.nan
    """Requests running (holding KV) per replica, time-averaged over the sampling grid."""
    running_peak: int = 0
    """Most requests running at once on one replica after any step: how many the KV memory fits."""
    kv_waste_mean: float = math.nan
    """Share of allocated KV slots holding no token (reservations ahead of use and partial blocks),
    sampled once per grid point: near 0 for paged allocation, large for contiguous."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe and deterministic: NaN → None, floats rounded to 6 significant digits."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool | int):
                out[f.name] = value
            else:
                out[f.name] = round_sig(float(value))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """Inverse of ``to_dict`` (None → NaN), e.g. to read a saved summary.json back."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data and f.default is not MISSING:
                continue  # a summary.json written before this figure existed
            value = data[f.name]
            if f.type in ("int", "bool"):
                kwargs[f.name] = value
            else:
                kwargs[f.name] = math.nan if value is None else float(value)
        return cls(**kwargs)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def summarize(
    log: RequestLog,
    *,
    duration_s: float,
    slo: SLO | None,
    num_gpus: int,
    usd_per_gpu_hour: float | None,
    kv_util_mean: float,
    prefix_hit_rate: float,
    preemptions: int,
    warmup_s: float = 0.0,
    running_mean: float = math.nan,
    running_peak: int = 0,
    kv_waste_mean: float = math.nan,
) -> Summary:
    """Summary of one run (definitions in the module docstring).

    ``duration_s`` is the run's length from t=0 (through the drain, if the run drained: vLLM's benchmark
    divides by the time until the last completion too). KV utilisation, prefix hit rate and preemptions
    come from the replicas, which know them exactly.
    """
    measured_s = duration_s - warmup_s
    if not measured_s > 0:
        raise ValueError(f"duration_s ({duration_s}) must exceed warmup_s ({warmup_s})")
    slo = slo if slo is not None else SLO()
    c = log.columns()
    cohort = ~np.isnan(c["arrival_s"]) & (c["arrival_s"] >= warmup_s)
    masks = {k: v & cohort for k, v in log.outcomes().items()}
    done = masks[RequestOutcome.COMPLETED]
    lat_ms = {k: v[done] * 1e3 for k, v in _latencies_s(c).items()}
    tpot_ms = lat_ms["tpot"][~np.isnan(lat_ms["tpot"])]
    # Requests that started service but are not finished are excluded, like the latencies.
    queue_ms = lat_ms["queue"][~np.isnan(lat_ms["queue"])]

    meets = np.ones(int(done.sum()), dtype=bool)
    if slo.ttft_ms is not None:
        meets &= lat_ms["ttft"] <= slo.ttft_ms
    if slo.tpot_ms is not None:
        # NaN TPOT (one output token) compares False: count it as meeting the threshold explicitly.
        meets &= np.isnan(lat_ms["tpot"]) | (lat_ms["tpot"] <= slo.tpot_ms)
    if slo.e2e_ms is not None:
        meets &= lat_ms["e2e"] <= slo.e2e_ms
    num_met = int(meets.sum())
    arrived = int(cohort.sum())
    attainment = num_met / arrived if arrived else math.nan

    p99 = {"ttft": _pct(lat_ms["ttft"], 99), "tpot": _pct(tpot_ms, 99), "e2e": _pct(lat_ms["e2e"], 99)}
    verdict = arrived > 0 and attainment >= slo.target_attainment
    for name, limit in (("ttft", slo.ttft_p99_ms), ("tpot", slo.tpot_p99_ms), ("e2e", slo.e2e_p99_ms)):
        # A NaN percentile (nothing completed) fails the check: ``nan <= x`` is False.
        if limit is not None and not p99[name] <= limit:
            verdict = False

    output_tokens = int(c["output_tokens"][done].sum())
    gpu_hours = num_gpus * measured_s / 3600.0
    price = math.nan if usd_per_gpu_hour is None else float(usd_per_gpu_hour)
    cost = gpu_hours * price / (output_tokens / 1e6) if output_tokens > 0 else math.nan

    return Summary(
        requests_arrived=arrived,
        requests_completed=int(done.sum()),
        requests_in_flight=int(masks[RequestOutcome.IN_FLIGHT].sum()),
        requests_rejected=int(masks[RequestOutcome.REJECTED].sum()),
        ttft_mean_ms=_mean(lat_ms["ttft"]),
        ttft_p50_ms=_pct(lat_ms["ttft"], 50),
        ttft_p90_ms=_pct(lat_ms["ttft"], 90),
        ttft_p99_ms=p99["ttft"],
        tpot_mean_ms=_mean(tpot_ms),
        tpot_p50_ms=_pct(tpot_ms, 50),
        tpot_p90_ms=_pct(tpot_ms, 90),
        tpot_p99_ms=p99["tpot"],
        e2e_mean_ms=_mean(lat_ms["e2e"]),
        e2e_p50_ms=_pct(lat_ms["e2e"], 50),
        e2e_p90_ms=_pct(lat_ms["e2e"], 90),
        e2e_p99_ms=p99["e2e"],
        queue_p50_ms=_pct(queue_ms, 50),
        queue_p90_ms=_pct(queue_ms, 90),
        queue_p99_ms=_pct(queue_ms, 99),
        throughput_rps=int(done.sum()) / measured_s,
        throughput_tok_s=output_tokens / measured_s,
        output_tokens=output_tokens,
        goodput_rps=num_met / measured_s,
        slo_attainment=attainment,
        slo_target_attainment=slo.target_attainment,
        slo_met=bool(verdict),
        kv_util_mean=float(kv_util_mean),
        prefix_hit_rate=float(prefix_hit_rate),
        preemptions=int(preemptions),
        num_gpus=int(num_gpus),
        gpu_hours=gpu_hours,
        usd_per_gpu_hour=price,
        cost_per_mtok_usd=cost,
        duration_s=measured_s,
        warmup_s=float(warmup_s),
        running_mean=float(running_mean),
        running_peak=int(running_peak),
        kv_waste_mean=float(kv_waste_mean),
    )


# --------------------------------------------------------------------------------------------------------
# Several seeds: mean and confidence interval
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricCI:
    """Mean of one metric over seeds with a two-sided 95 % Student-t confidence interval. ``low`` and
    ``high`` are NaN with fewer than two finite samples (no spread to estimate)."""

    mean: float
    low: float
    high: float
    num_samples: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": round_sig(self.mean),
            "low": round_sig(self.low),
            "high": round_sig(self.high),
            "num_samples": self.num_samples,
        }


def summaries_with_ci(summaries: Sequence[Summary], *, confidence: float = 0.95) -> dict[str, MetricCI]:
    """Per numeric metric of ``summaries`` (one per seed of the same variant): mean and t-interval.

    ``slo_met`` becomes the share of seeds that met the SLO. Seeds where a metric is undefined (NaN) are
    left out of that metric, and ``num_samples`` says how many remained.
    """
    # Student-t quantile; scipy.special imports in a fraction of scipy.stats' time and only we need it.
    from scipy.special import stdtrit

    if not summaries:
        raise ValueError("summaries_with_ci needs at least one Summary")
    out: dict[str, MetricCI] = {}
    for f in fields(Summary):
        values = np.array([float(getattr(s, f.name)) for s in summaries])
        values = values[np.isfinite(values)]
        n = int(values.size)
        if n == 0:
            out[f.name] = MetricCI(mean=math.nan, low=math.nan, high=math.nan, num_samples=0)
            continue
        mean = float(values.mean())
        if n < 2:
            low = high = math.nan
        else:
            half = float(stdtrit(n - 1, 0.5 + confidence / 2)) * float(values.std(ddof=1)) / math.sqrt(n)
            low, high = mean - half, mean + half
        out[f.name] = MetricCI(mean=mean, low=low, high=high, num_samples=n)
    return out


# --------------------------------------------------------------------------------------------------------
# RunResult
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileInfo:
    """Which cost-model profile produced the step times, and whether it was measured on an engine."""

    name: str
    kind: Literal["measured", "analytic"]

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind}


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantResult:
    """Everything one variant of a scenario produced."""

    name: str
    requests: RequestLog
    series: list[ReplicaSeries]
    summary: Summary
    profile: ProfileInfo
    """Variants may override hardware or model, so each carries its own profile."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """The outcome of a scenario run: one ``VariantResult`` per variant, in the scenario's order."""

    scenario_name: str
    variants: dict[str, VariantResult]
    scenario: dict[str, Any] = field(default_factory=dict)
    """The resolved scenario (after variants and --set overrides), kept for the record."""

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError("a RunResult needs at least one variant")
        for key, v in self.variants.items():
            if key != v.name:
                raise ValueError(f"variant stored under {key!r} is named {v.name!r}")

    @property
    def analytic(self) -> bool:
        """True when any variant's step times come from an analytic (not measured) profile."""
        return any(v.profile.kind == "analytic" for v in self.variants.values())

    def _select(self, variant: str | None) -> list[VariantResult]:
        if variant is None:
            return list(self.variants.values())
        if variant not in self.variants:
            raise KeyError(f"no variant {variant!r}; variants are {sorted(self.variants)}")
        return [self.variants[variant]]

    def requests_df(self, variant: str | None = None) -> pd.DataFrame:
        """One row per request of ``variant`` (all variants when None) with a leading ``variant`` column
        and derived ``queue_ms``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms``."""
        frames = []
        for v in self._select(variant):
            frame = v.requests.to_frame()
            frame.insert(0, "variant", v.name)
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)

    def series_df(self, variant: str | None = None) -> pd.DataFrame:
        """Sampled replica state of ``variant`` (all variants when None), one row per replica and time."""
        frames = []
        for v in self._select(variant):
            for s in v.series:
                frame = s.to_frame()
                frame.insert(0, "variant", v.name)
                frames.append(frame)
        if not frames:
            columns = [
                "variant",
                "replica",
                *SERIES_COLUMNS,
                "kv_util",
                "prefix_hit_rate",
                "prefix_hit_rate_cum",
            ]
            return pd.DataFrame(columns=columns)
        return pd.concat(frames, ignore_index=True)

    def summary_df(self) -> pd.DataFrame:
        """One row per variant, indexed by variant name, columns as in ``Summary.to_dict``."""
        rows = {name: v.summary.to_dict() for name, v in self.variants.items()}
        frame = pd.DataFrame.from_dict(rows, orient="index")
        frame.index.name = "variant"
        return frame

    def to_pandas(self) -> pd.DataFrame:
        """Requests of all variants, with a ``variant`` column: the table notebooks start from."""
        return self.requests_df()

    def summary_json(self) -> str:
        """The text of summary.json: sorted keys, two-space indent, byte-identical for identical runs."""
        base = next(iter(self.variants.values()))
        doc = {
            "scenario_name": self.scenario_name,
            "scenario": _json_safe(self.scenario),
            "profile": base.profile.to_dict(),
            "profiles": {name: v.profile.to_dict() for name, v in self.variants.items()},
            "variants": {name: v.summary.to_dict() for name, v in self.variants.items()},
        }
        return json.dumps(doc, sort_keys=True, indent=2, allow_nan=False) + "\n"

    def save(self, out_dir: Path, *, overwrite: bool = False) -> Path:
        """Write requests, series, summary.json and report.html into ``out_dir``; returns ``out_dir``.

        A non-empty ``out_dir`` is refused unless ``overwrite``; with it, only the files written here are
        replaced and any other file in the folder is left alone (we never delete a user's files). Files
        are written to a temporary folder beside ``out_dir`` first and moved in when all are complete, so
        an interrupted save leaves no half-written report behind.
        """
        from simulator.report import render_report  # report imports this module

        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise FileExistsError(f"cannot save results to {out_dir}: it exists and is not a directory")
        if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
            raise FileExistsError(
                f"cannot save results to {out_dir}: the directory is not empty "
                "(choose another directory or pass --overwrite)"
            )
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the renamed folder should read like any other
        try:
            _write_table(self.requests_df(), tmp / "requests")
            _write_table(self.series_df(), tmp / "series")
            (tmp / "summary.json").write_text(self.summary_json(), encoding="utf-8")
            (tmp / "report.html").write_text(render_report(self), encoding="utf-8")
            if not out_dir.exists():
                os.replace(tmp, out_dir)  # one atomic rename on the same filesystem
            else:
                out_dir.mkdir(exist_ok=True)
                for item in sorted(tmp.iterdir()):
                    os.replace(item, out_dir / item.name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)  # our own temporary folder, never the user's
        return out_dir


def _write_table(frame: pd.DataFrame, stem: Path) -> Path:
    """Parquet when pyarrow is installed (typed, compact), CSV otherwise."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        path = stem.with_suffix(".csv")
        frame.to_csv(path, index=False)
        return path
    path = stem.with_suffix(".parquet")
    frame.to_parquet(path, index=False)
    return path


def _json_safe(value: Any) -> Any:
    """``value`` made JSON-serialisable: numpy scalars and arrays, paths, enums, tuples and sets
    converted, non-finite floats turned into None. Keys become strings."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, BaseModel):
        return _json_safe(value.model_dump(mode="json"))
    if isinstance(value, Enum):
        return _json_safe(value.value)
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return [_json_safe(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=repr)
    return str(value)
