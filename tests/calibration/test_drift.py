"""Host drift probe: it picks points of the profile's own grid spread over their step times, re-times them
with the calibration's policy, and reads a host that runs uniformly slower as exactly that ratio.

The profiler tests' fake runner stands in for the model (its 'time' is a fixed function of the step, times
a slowdown).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from fake_runner import FakeRunner

from calibration.drift import plan_probe
from calibration.grid import get_grid
from calibration.profiler import RunInfo, run_grid, sidecar_path


def _profile_with_timings(tmp_path: Path, grid: str = "ci") -> Path:
    profile = tmp_path / "p.yaml"
    info = RunInfo(model="tiny", dtype="float32", backend="fake", device_type="cpu", grid=grid, block_size=16,
                   num_layers=2, cuda_graphs=False, device_name="test")
    run_grid(FakeRunner(), get_grid(grid), profile.with_suffix(".csv"), info, vocab_size=256, progress=False)
    return profile


def test_a_uniformly_slower_host_reads_as_its_slowdown(tmp_path: Path) -> None:
    profile = _profile_with_timings(tmp_path)
    plan = plan_probe(profile, FakeRunner(), vocab_size=256, num_points=5)
    assert plan is not None and len(plan.points) == 5
    then = [p.then_s for p in plan.points]
    assert then == sorted(then) and then[0] < then[-1]  # spread from the grid's fastest to its slowest step
    assert plan.measure(FakeRunner(slowdown=1.0)).speed_ratio == pytest.approx(1.0)
    slow = plan.measure(FakeRunner(slowdown=1.25))
    assert slow.speed_ratio == pytest.approx(1.25)
    assert set(slow.as_dict()["points"]) == {p.point.name for p in plan.points}


def test_points_beyond_the_runners_pool_are_left_out(tmp_path: Path) -> None:
    profile = _profile_with_timings(tmp_path)
    small = FakeRunner(num_blocks=8)
    plan = plan_probe(profile, small, vocab_size=256)
    assert plan is not None
    assert all(p.point.num_blocks(16) <= 8 for p in plan.points)


def test_no_timings_or_an_unknown_grid_means_no_probe(tmp_path: Path) -> None:
    assert plan_probe(tmp_path / "none.yaml", FakeRunner(), vocab_size=256) is None
    profile = _profile_with_timings(tmp_path)
    sidecar = sidecar_path(profile.with_suffix(".csv"))
    sidecar.write_text(sidecar.read_text().replace('"grid": "ci"', '"grid": "gone"'))
    assert plan_probe(profile, FakeRunner(), vocab_size=256) is None
