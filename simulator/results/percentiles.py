"""Percentiles as numpy's ``np.percentile`` computes them (method "linear", Hyndman & Fan's 7th, what vLLM's
serving benchmark reports), bit for bit, several from one partition of the values.

Why not ``np.percentile`` itself: it finds its partition points with ``np.unique``, whose first call
imports ``numpy.ma`` (about 8 ms, a fortieth of a short run's whole start-up), and it partitions the values
once per call where a summary wants three percentiles of each column. The arithmetic below is numpy's own
(``numpy/lib/_function_base_impl.py``: ``_quantile``, ``_get_indexes``, ``_lerp``) on float64, so the
figures are the same doubles; ``tests/simulator/test_percentiles.py`` compares them with ``np.percentile``.
Values are taken as float64 (the request log's columns are; integers below 2**53 convert exactly): numpy
would take a float32 column's neighbour difference in float32, and its last bits could differ from these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """``[float(np.percentile(values, q)) for q in qs]`` for a 1-D array and ``q`` in [0, 100]; NaN for each
    ``q`` when ``values`` is empty (numpy would raise) or holds a NaN (numpy's answer)."""
    n = int(values.size)
    if n == 0:
        return [math.nan] * len(qs)
    points = []
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError(f"percentile {q} is outside [0, 100]")
        virtual = (n - 1) * (q / 100)
        if virtual >= n - 1:
            # numpy's index -1 for both neighbours, so its gamma is virtual - (-1).
            points.append((n - 1, n - 1, virtual + 1))
        else:
            below = math.floor(virtual)
            points.append((below, below + 1, virtual - below))
    kth = sorted({0, n - 1, *(p[0] for p in points), *(p[1] for p in points)})
    ordered = np.partition(np.asarray(values, dtype=np.float64), kth)
    if math.isnan(ordered[n - 1]):
        return [math.nan] * len(qs)
    result = []
    for below, above, gamma in points:
        a = float(ordered[below])
        b = float(ordered[above])
        diff = b - a
        result.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    return result


def percentile(values: np.ndarray, q: float) -> float:
    """``float(np.percentile(values, q))`` (see ``percentiles``); NaN for no values."""
    return percentiles(values, (q,))[0]
