"""A trace's arrival rate as a curve: per-bin rates of recorded arrival times, stretched to another span
(an hour of the Azure trace played as a day), for ``workload.arrival`` ``process: curve``.

Never draws arrivals itself: the curve process does (by thinning), so a fitted day runs at any length.
"""

from __future__ import annotations

import numpy as np


def rate_points(arrival_s: np.ndarray, *, num_bins: int, span_s: float | None = None,
                mean_rps: float | None = None) -> tuple[tuple[float, float], ...]:
    """``[t_s, rate_rps]`` points of a piecewise-linear curve through the trace's per-bin rate: the
    arrivals counted in ``num_bins`` equal bins over the trace, each rate placed at its bin's middle,
    times stretched to ``span_s`` (None: as recorded) and rates scaled to average ``mean_rps`` (None: the
    rate the stretched trace has)."""
    times = np.sort(np.asarray(arrival_s, dtype=np.float64))
    if times.size < 2 or num_bins < 1:
        raise ValueError("a rate curve needs at least two arrivals and one bin")
    start, end = float(times[0]), float(times[-1])
    if not end > start:
        raise ValueError("the arrivals span no time")
    counts, edges = np.histogram(times, bins=num_bins, range=(start, end))
    bin_s = (end - start) / num_bins
    stretch = 1.0 if span_s is None else span_s / (end - start)
    rates = counts / (bin_s * stretch)
    if mean_rps is not None:
        rates = rates * (mean_rps / rates.mean()) if rates.mean() > 0 else rates
    middles = (edges[:-1] + edges[1:]) / 2 - start
    return tuple((float(t * stretch), float(r)) for t, r in zip(middles, rates, strict=True))
