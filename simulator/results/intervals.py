"""Several seeds of one variant: the mean of each summary figure over the seeds, and how uncertain it is.

The unit of the interval is the seed: each seed's figure (its p99 TTFT, its attainment, its cost) is one
sample, and the interval is about their mean. Requests within one run are not independent samples (they
queue behind one another), so resampling requests would claim far more certainty than the seeds give.

- Three or more seeds: a 95 % percentile bootstrap of the mean over seeds (seeds resampled with
  replacement, ``BOOTSTRAP_RESAMPLES`` times, from a fixed generator: the same seeds give the same
  interval). Its ends are means of observed values, so they lie within the seeds' range: a latency, rate
  or cost is never given a negative end, a share never one outside [0, 1]. With few seeds it is narrower
  than the truth (the percentile bootstrap under-covers below about ten samples); ``num_samples`` says
  how many there were.
- Two seeds are too few for an interval: ``low`` and ``high`` are then the two values (``kind`` "range"),
  and every text says it is the seeds' range, not a confidence interval. The Student-t interval used
  before needs t = 12.7 at two seeds and printed "TPOT p99 82.2 [-6.5, 170.8] ms".
- One seed: no spread to show (NaN).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from simulator.results.summary import Summary, round_sig

IntervalKind = Literal["bootstrap", "range", "none"]
"""bootstrap: a 95 % bootstrap interval over seeds; range: the seeds' min and max (two seeds); none."""

MIN_SEEDS_FOR_INTERVAL = 3
"""Fewer seeds than this give their range, labelled so, instead of a confidence interval."""
BOOTSTRAP_RESAMPLES = 4000
"""Resamples of the seeds per interval: the ends move by well under 1 % of the spread between repeats."""
BOOTSTRAP_SEED = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricCI:
    """Mean of one metric over seeds, with ``low`` and ``high`` as ``kind`` says (NaN when ``none``)."""

    mean: float
    low: float
    high: float
    num_samples: int
    kind: IntervalKind = "bootstrap"

    def describe(self) -> str:
        """What ``low`` and ``high`` are, in words ("the 95 % interval over 3 seeds", "the range of the 2
        seeds")."""
        if self.kind == "range":
            return f"the range of the {self.num_samples} seeds"
        if self.kind == "bootstrap":
            return f"the 95 % interval over {self.num_samples} seeds"
        return "no interval"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": round_sig(self.mean),
            "low": round_sig(self.low),
            "high": round_sig(self.high),
            "num_samples": self.num_samples,
            "interval": self.kind,
        }


def summaries_with_ci(summaries: Sequence[Summary], *, confidence: float = 0.95) -> dict[str, MetricCI]:
    """Per numeric metric of ``summaries`` (one per seed of the same variant): mean and interval.

    ``slo_met`` becomes the share of seeds that met the SLO. Seeds where a metric is undefined (NaN) are
    left out of that metric, and ``num_samples`` says how many remained.
    """
    if not summaries:
        raise ValueError("summaries_with_ci needs at least one Summary")
    resamples: dict[int, np.ndarray] = {}  # seed indices per sample size, shared by every metric
    out: dict[str, MetricCI] = {}
    for f in fields(Summary):
        raw = [getattr(s, f.name) for s in summaries]
        if any(value is None for value in raw):
            continue  # a figure that does not apply to these runs (requests_failed without failures)
        values = np.array([float(value) for value in raw])
        out[f.name] = metric_interval(values[np.isfinite(values)], confidence=confidence, resamples=resamples)
    return out


def metric_interval(values: np.ndarray, *, confidence: float = 0.95,
                    resamples: dict[int, np.ndarray] | None = None) -> MetricCI:
    """The mean of one metric's finite per-seed values and its interval (see the module's rules)."""
    n = int(values.size)
    if n == 0:
        return MetricCI(mean=math.nan, low=math.nan, high=math.nan, num_samples=0, kind="none")
    mean = float(values.mean())
    if n == 1:
        return MetricCI(mean=mean, low=math.nan, high=math.nan, num_samples=1, kind="none")
    if n < MIN_SEEDS_FOR_INTERVAL:
        return MetricCI(mean=mean, low=float(values.min()), high=float(values.max()), num_samples=n, kind="range")
    cache = resamples if resamples is not None else {}
    if n not in cache:
        cache[n] = np.random.default_rng(BOOTSTRAP_SEED).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    means = values[cache[n]].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.clip(np.quantile(means, [tail, 1.0 - tail]), values.min(), values.max())  # rounding only
    return MetricCI(mean=mean, low=float(low), high=float(high), num_samples=n, kind="bootstrap")
