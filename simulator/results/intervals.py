"""Several seeds of one variant: the mean of each summary figure with a Student-t confidence interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from simulator.results.summary import Summary, round_sig


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


