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

The hot-path recorders live in their own modules, which ``fleetsim build-native`` compiles with the rest
of the per-step path: ``request_log.RequestLog`` (per-request columns) and ``series.ReplicaSeries``
(per-replica samples); both are re-exported here. This module must never import simpy or the simulator's
replica/fleet modules (they import us).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from simulator.results.request_log import RequestLog, RequestOutcome, latencies_s
from simulator.results.series import (
    SERIES_COLUMNS,
    ReplicaSeries,
    fleet_kv_util_mean,
    fleet_kv_waste,
    fleet_running_mean,
)

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
    lat_ms = {k: v[done] * 1e3 for k, v in latencies_s(c).items()}
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
        from simulator.results.report import render_report  # report imports this module

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
    if not _has_pyarrow():
        path = stem.with_suffix(".csv")
        frame.to_csv(path, index=False)
        return path
    path = stem.with_suffix(".parquet")
    frame.to_parquet(path, index=False)
    return path


def _has_pyarrow() -> bool:
    return importlib.util.find_spec("pyarrow") is not None


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
