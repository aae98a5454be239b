"""The plan's two searches, pure and over monotone predicates: the smallest passing replica count
(exponential probing, then bisection) and the largest passing load factor (doubling or halving to a
bracket, then geometric bisection). Why monotone, and what it assumes: ``plan``'s docstring."""

from __future__ import annotations

import math
from collections.abc import Callable

KNEE_REL_TOL = 0.05
"""Bisection on the knee stops when the bracket's upper end is within 5 % of its lower end."""


KNEE_FACTOR_RANGE = (1 / 1024, 1024.0)
"""Time-compression factors the knee search explores; outside it the knee is reported as a bound."""


def smallest_passing(passes: Callable[[int], bool], *, max_n: int, start: int = 1) -> int | None:
    """Smallest ``n`` in [1, max_n] with ``passes(n)``, assuming passes is monotone (False.. then True..).

    Exponential probing from ``start`` — upward at start + 1, start + 3, start + 7, ... (from 1: 2, 4, 8,
    16), or downward when ``start`` already passes — then binary search between the largest failing and
    the smallest passing count. ``None`` when even ``max_n`` fails. Calls ``passes`` O(log n) times.
    """
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    start = min(max(start, 1), max_n)
    lo, hi = 0, start  # lo: largest count known to fail (0 = none); hi: smallest known to pass
    k = 0
    if passes(start):
        while hi > lo + 1:
            k += 1
            n = max(start - (2**k - 1), lo + 1)
            if n >= hi:
                break
            if passes(n):
                hi = n
            else:
                lo = n
                break
    else:
        lo = start
        while True:
            if lo >= max_n:
                return None
            k += 1
            n = min(start + 2**k - 1, max_n)
            if passes(n):
                hi = n
                break
            lo = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi


def largest_passing_factor(passes: Callable[[float], bool], *, start: float = 1.0, rel_tol: float = KNEE_REL_TOL,
                           bounds: tuple[float, float] = KNEE_FACTOR_RANGE) -> tuple[float, float | None]:
    """(largest factor known to pass, smallest known to fail) for a predicate that holds below a knee.

    Doubles or halves from ``start`` until the knee is bracketed, then bisects geometrically until
    ``fail / pass <= 1 + rel_tol``. (0.0, low bound) when even the lowest factor fails; (high bound, None)
    when even the highest passes.
    """
    low, high = bounds
    f = min(max(start, low), high)
    ok: float | None = None
    bad: float | None = None
    if passes(f):
        ok = f
        while bad is None:
            if ok >= high:
                return ok, None
            f = min(ok * 2, high)
            if passes(f):
                ok = f
            else:
                bad = f
    else:
        bad = f
        while ok is None:
            if bad <= low:
                return 0.0, bad
            f = max(bad / 2, low)
            if passes(f):
                ok = f
            else:
                bad = f
    while bad / ok > 1 + rel_tol:
        mid = math.sqrt(ok * bad)
        if passes(mid):
            ok = mid
        else:
            bad = mid
    return ok, bad
