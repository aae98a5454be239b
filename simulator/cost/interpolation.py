"""Piecewise-linear interpolation over knot lists: the one spelling of the arithmetic that measured cost
curves use (``PiecewiseLinear.at`` and the cost model's curved terms), so every caller gets the same bits.

On the per-step path of profiles with measured curves (several calls per step), so ``fleetsim
build-native`` compiles it. Standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python


def interpolate(xs: list[float], ys: list[float], value: float) -> float:
    """The curve through knots (xs, ys) at ``value``: interpolated between knots, extrapolated along the
    last segment, flat before the first knot. ``xs`` strictly increasing, not empty."""
    # bisect_right by hand: the first knot above value (a native loop over machine floats when compiled)
    lo: i64 = 0
    hi: i64 = len(xs)
    while lo < hi:
        mid: i64 = (lo + hi) >> 1
        if value < xs[mid]:
            hi = mid
        else:
            lo = mid + 1
    i: i64 = lo
    if i == 0:
        return ys[0]
    last: i64 = len(xs) - 1
    if i > last:
        if last == 0:
            return ys[0]
        i = last
    x0 = xs[i - 1]
    y0 = ys[i - 1]
    return y0 + (ys[i] - y0) * (value - x0) / (xs[i] - x0)
