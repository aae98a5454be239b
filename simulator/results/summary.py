"""The summary of a run: SLO and cost settings, the ``Summary`` of one variant and how it is computed.

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

The hot-path recorders this reads live in their own modules, which ``fleetsim build-native`` compiles
with the rest of the per-step path: ``request_log.RequestLog`` (per-request columns) and
``series.ReplicaSeries`` (per-replica samples). Never imports simpy or the fleet.
"""

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.results.percentiles import percentile, percentiles
from simulator.results.request_log import RequestLog, RequestOutcome, latencies_s

SIGNIFICANT_DIGITS = 6
"""Floats in summary.json are rounded to this many significant digits: enough for any metric we report,
few enough that last-bit differences between platforms' libm do not change the file."""


def round_sig(value: float, digits: int = SIGNIFICANT_DIGITS) -> float | None:
    """``value`` rounded to ``digits`` significant digits; ``None`` for NaN or ±inf (JSON has neither)."""
    if not math.isfinite(value):
        return None
    # Formatting through %g is exact and identical on every platform, unlike round(x, n - log10(x)).
    return float(f"{value:.{digits}g}")




class SLO(BaseModel):
    """Service-level objective. A request meets it when it meets every per-request threshold that is set
    (no threshold set: every completed request meets it). The run meets it (``slo_met``) when the share
    of arrived requests meeting it reaches ``target_attainment`` *and* every percentile threshold set
    holds for the run's percentiles."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

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

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    usd_per_gpu_hour: float | None = Field(default=None, ge=0)
    """Price of one GPU for one hour in USD; None takes the hardware's list price from hardware.yaml."""

    def resolve_price(self, hardware_usd_per_gpu_hour: float | None) -> float | None:
        """The price to use: the configured one, else the hardware's (None when neither is known)."""
        return self.usd_per_gpu_hour if self.usd_per_gpu_hour is not None else hardware_usd_per_gpu_hour




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
    spec_tokens_per_step: float = math.nan
    """Speculative decoding: mean tokens a decode row produced per verification (1 + accepted proposals)."""
    spec_acceptance_rate: float = math.nan
    """Speculative decoding: accepted share of the proposals verified."""
    requests_failed: int | None = None
    """Requests that lost their replica more often than retries allow (a run with a ``failures``
    section); None, and left out of summary.json, for a run that models no failures."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe and deterministic: NaN → None, floats rounded to 6 significant digits; a figure that
        does not apply to the run is left out (None; the speculative decoding figures where a run had
        none)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name in _SPECULATIVE and math.isnan(value)):
                continue
            if isinstance(value, bool | int):
                out[f.name] = value
            else:
                out[f.name] = round_sig(float(value))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Inverse of ``to_dict`` (None → NaN), e.g. to read a saved summary.json back."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data and f.default is not MISSING:
                continue  # a summary.json written before this figure existed
            value = data[f.name]
            if f.type in ("int", "bool", "int | None"):
                kwargs[f.name] = value
            else:
                kwargs[f.name] = math.nan if value is None else float(value)
        return cls(**kwargs)


_SPECULATIVE = frozenset({"spec_tokens_per_step", "spec_acceptance_rate"})
"""Figures a summary without speculative decoding leaves out (its summary.json stays as it was)."""


_QUANTILES = (50, 90, 99)
"""The percentiles a Summary reports of each latency."""


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
    failed: np.ndarray | None = None,
    gpu_hours: float | None = None,
) -> Summary:
    """Summary of one run (definitions in the module docstring).

    ``duration_s`` is the run's length from t=0 (through the drain, if the run drained: vLLM's benchmark
    divides by the time until the last completion too). KV utilisation, prefix hit rate and preemptions
    come from the replicas, which know them exactly. ``failed`` marks the requests a fleet with failures
    gave up on (counted apart from those in flight); ``gpu_hours``: what a fleet that changed size paid
    for (else every GPU over the measured duration).
    """
    measured_s = duration_s - warmup_s
    if not measured_s > 0:
        raise ValueError(f"duration_s ({duration_s}) must exceed warmup_s ({warmup_s})")
    slo = slo if slo is not None else SLO()
    c = log.columns()
    cohort = ~np.isnan(c["arrival_s"]) & (c["arrival_s"] >= warmup_s)
    masks = {k: v & cohort for k, v in log.outcomes().items()}
    failed_mask = None if failed is None else failed[: len(cohort)] & cohort
    if failed_mask is not None:
        masks[RequestOutcome.IN_FLIGHT] = masks[RequestOutcome.IN_FLIGHT] & ~failed_mask
    done = masks[RequestOutcome.COMPLETED]
    lat_ms = {k: v[done] * 1e3 for k, v in latencies_s(c).items()}
    tpot_ms = lat_ms["tpot"][~np.isnan(lat_ms["tpot"])]
    # Requests that started service but are not finished are excluded, like the latencies.
    queue_ms = lat_ms["queue"][~np.isnan(lat_ms["queue"])]

    arrived = int(cohort.sum())
    num_met, attainment, verdict = _slo_outcome(lat_ms, tpot_ms, slo, arrived)

    output_tokens = int(c["output_tokens"][done].sum())
    if gpu_hours is None:
        gpu_hours = num_gpus * measured_s / 3600.0
    price = math.nan if usd_per_gpu_hour is None else float(usd_per_gpu_hour)
    cost = gpu_hours * price / (output_tokens / 1e6) if output_tokens > 0 else math.nan

    return Summary(
        requests_arrived=arrived,
        requests_completed=int(done.sum()),
        requests_in_flight=int(masks[RequestOutcome.IN_FLIGHT].sum()),
        requests_rejected=int(masks[RequestOutcome.REJECTED].sum()),
        **_latency_figures(lat_ms, tpot_ms, queue_ms),
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
        requests_failed=None if failed_mask is None else int(failed_mask.sum()),
    )


def _slo_outcome(lat_ms: dict[str, np.ndarray], tpot_ms: np.ndarray, slo: SLO, arrived: int) -> tuple[int, float, bool]:
    """(requests meeting every per-request threshold, attainment over arrived requests, the run's verdict)."""
    meets = slo_mask(lat_ms, slo)
    num_met = int(meets.sum())
    attainment = num_met / arrived if arrived else math.nan
    p99 = {"ttft": percentile(lat_ms["ttft"], 99), "tpot": percentile(tpot_ms, 99),
           "e2e": percentile(lat_ms["e2e"], 99)}
    verdict = arrived > 0 and attainment >= slo.target_attainment
    for name, limit in (("ttft", slo.ttft_p99_ms), ("tpot", slo.tpot_p99_ms), ("e2e", slo.e2e_p99_ms)):
        # A NaN percentile (nothing completed) fails the check: ``nan <= x`` is False.
        if limit is not None and not p99[name] <= limit:
            verdict = False
    return num_met, attainment, bool(verdict)


def slo_mask(lat_ms: Mapping[str, np.ndarray], slo: SLO) -> np.ndarray:
    """Which requests meet every per-request threshold, from their ``ttft``, ``tpot`` and ``e2e`` in ms
    (a request that did not complete has NaN latencies and meets none that is set)."""
    meets = np.ones(len(lat_ms["ttft"]), dtype=bool)
    if slo.ttft_ms is not None:
        meets &= lat_ms["ttft"] <= slo.ttft_ms
    if slo.tpot_ms is not None:
        # NaN TPOT (one output token) compares False: count it as meeting the threshold explicitly.
        meets &= np.isnan(lat_ms["tpot"]) | (lat_ms["tpot"] <= slo.tpot_ms)
    if slo.e2e_ms is not None:
        meets &= lat_ms["e2e"] <= slo.e2e_ms
    return meets


def _latency_figures(lat_ms: dict[str, np.ndarray], tpot_ms: np.ndarray, queue_ms: np.ndarray) -> dict[str, float]:
    """The Summary's latency fields: mean and percentiles of TTFT, TPOT and E2E, percentiles of queueing."""
    figures: dict[str, float] = {}
    for name, values in (("ttft", lat_ms["ttft"]), ("tpot", tpot_ms), ("e2e", lat_ms["e2e"])):
        figures[f"{name}_mean_ms"] = _mean(values)
        for q, value in zip(_QUANTILES, percentiles(values, _QUANTILES), strict=True):
            figures[f"{name}_p{q}_ms"] = value
    for q, value in zip(_QUANTILES, percentiles(queue_ms, _QUANTILES), strict=True):
        figures[f"queue_p{q}_ms"] = value
    return figures


def goodput_per_gpu(summary: Summary) -> float:
    """Requests per second meeting the SLO, per GPU: how DistServe compares placements."""
    return summary.goodput_rps / summary.num_gpus if summary.num_gpus else math.nan
