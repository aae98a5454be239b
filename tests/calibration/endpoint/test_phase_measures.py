"""The phase measures that tell arrivals on a proxy's flush grid from arrivals at any time."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("httpx")

from calibration.endpoint.proxy import phase_concentration, phase_spread

FLUSH_S = 0.3


def test_arrivals_on_a_grid_have_no_spread_and_even_ones_a_quarter_grid() -> None:
    rng = np.random.default_rng(7)
    on_grid = FLUSH_S * rng.integers(0, 100, 400) + 0.004
    even = rng.uniform(0, 30, 4000)
    assert phase_spread(on_grid, FLUSH_S) < 1e-9
    assert phase_spread(even, FLUSH_S) == pytest.approx(0.25, abs=0.02)


def test_a_minority_of_late_flushes_barely_moves_the_spread_but_sinks_the_concentration() -> None:
    rng = np.random.default_rng(11)
    grid = FLUSH_S * rng.integers(0, 100, 600)
    jitter = rng.exponential(0.003, grid.size)
    late = rng.random(grid.size) < 0.3  # held up: any delay up to a whole interval
    jitter[late] += rng.uniform(0, FLUSH_S, late.sum())
    arrivals = grid + jitter
    assert phase_spread(arrivals, FLUSH_S) < 0.03
    assert phase_concentration(arrivals, FLUSH_S) < 0.8  # the mean vector counts each late one as noise


def test_the_spread_does_not_depend_on_where_the_grid_starts() -> None:
    rng = np.random.default_rng(3)
    arrivals = FLUSH_S * rng.integers(0, 50, 200) + rng.normal(0, 0.005, 200)
    spreads = [phase_spread(arrivals + shift, FLUSH_S) for shift in (0.0, 0.1, 0.149, 0.29)]
    assert max(spreads) - min(spreads) < 1e-9
