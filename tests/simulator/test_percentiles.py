"""``percentiles`` gives numpy's ``np.percentile`` doubles exactly, from one partition."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.results.percentiles import percentile, percentiles

QS = (0, 1, 25, 50, 90, 99, 99.9, 100)


def _same(ours: float, theirs: float) -> bool:
    return (math.isnan(ours) and math.isnan(theirs)) or ours == theirs


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=60),
    st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=4),
)
def test_equal_to_numpy_bit_for_bit(values: list[float], qs: list[float]) -> None:
    array = np.array(values, dtype=np.float64)
    before = array.copy()
    for q, ours in zip(qs, percentiles(array, qs), strict=True):
        with np.errstate(invalid="ignore"):  # inf - inf: numpy warns, then answers NaN as we do
            theirs = float(np.percentile(array, q))
        assert _same(ours, theirs), (values, q)
    np.testing.assert_array_equal(array, before)  # the caller's column is not reordered


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000, 10_007])
def test_equal_to_numpy_on_latency_like_columns(n: int) -> None:
    rng = np.random.default_rng(n)
    for values in (rng.lognormal(3.0, 1.2, n), rng.integers(0, 50, n), np.round(rng.exponential(80.0, n), 1)):
        for q, ours in zip(QS, percentiles(values, QS), strict=True):
            assert ours == float(np.percentile(values, q)), (n, q)


def test_empty_and_nan_and_bad_q() -> None:
    assert all(math.isnan(v) for v in percentiles(np.array([]), QS))
    assert math.isnan(percentile(np.array([1.0, math.nan, 3.0]), 50))
    with pytest.raises(ValueError, match="outside"):
        percentile(np.array([1.0]), 101)


def test_a_summary_leaves_numpy_ma_unimported() -> None:
    """The reason this module exists: np.percentile's np.unique imports numpy.ma (~8 ms of start-up)."""
    code = (
        "import sys, numpy as np\n"
        "from simulator.results.percentiles import percentiles\n"
        "percentiles(np.arange(10.0), (50, 90, 99))\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
