"""Host drift probe: it picks points of the profile's own grid spread over their step times, re-times them
with the calibration's policy, and reads a host that runs uniformly slower as exactly that ratio.

A fake runner stands in for the model (its 'time' is a fixed function of the step, times a slowdown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from calibration.drift import plan_probe
from calibration.profiler import RunInfo, get_grid, run_grid, sidecar_path


@dataclass
class _Timing:
    device_s: float
    cycle_s: float


class SlowableRunner:
    def __init__(self, slowdown: float = 1.0, num_blocks: int = 4096) -> None:
        self.slowdown = slowdown
        self.num_blocks = num_blocks
        self.block_size = 16

    def execute_timed(self, seqs: Sequence[Any], input_ids: Sequence[int]) -> tuple[list[int], _Timing]:
        tokens = sum(s.num_new_tokens for s in seqs)
        device = (1e-3 + 1e-5 * tokens + 1e-7 * sum(s.seq_len for s in seqs)) * self.slowdown
        return [0] * len(seqs), _Timing(device_s=device, cycle_s=device * 1.1)


def _profile_with_timings(tmp_path: Path, grid: str = "ci") -> Path:
    profile = tmp_path / "p.yaml"
    info = RunInfo(model="tiny", dtype="float32", backend="fake", device_type="cpu", grid=grid, block_size=16,
                   num_layers=2, cuda_graphs=False, device_name="test")
    run_grid(SlowableRunner(), get_grid(grid), profile.with_suffix(".csv"), info, vocab_size=256, progress=False)
    return profile


def test_a_uniformly_slower_host_reads_as_its_slowdown(tmp_path: Path) -> None:
    profile = _profile_with_timings(tmp_path)
    plan = plan_probe(profile, SlowableRunner(), vocab_size=256, num_points=5)
    assert plan is not None and len(plan.points) == 5
    then = [p.then_s for p in plan.points]
    assert then == sorted(then) and then[0] < then[-1]  # spread from the grid's fastest to its slowest step
    assert plan.measure(SlowableRunner(1.0)).speed_ratio == pytest.approx(1.0)
    slow = plan.measure(SlowableRunner(1.25))
    assert slow.speed_ratio == pytest.approx(1.25)
    assert set(slow.as_dict()["points"]) == {p.point.name for p in plan.points}


def test_points_beyond_the_runners_pool_are_left_out(tmp_path: Path) -> None:
    profile = _profile_with_timings(tmp_path)
    small = SlowableRunner(num_blocks=8)
    plan = plan_probe(profile, small, vocab_size=256)
    assert plan is not None
    assert all(p.point.num_blocks(16) <= 8 for p in plan.points)


def test_no_timings_or_an_unknown_grid_means_no_probe(tmp_path: Path) -> None:
    assert plan_probe(tmp_path / "none.yaml", SlowableRunner(), vocab_size=256) is None
    profile = _profile_with_timings(tmp_path)
    sidecar = sidecar_path(profile.with_suffix(".csv"))
    sidecar.write_text(sidecar.read_text().replace('"grid": "ci"', '"grid": "gone"'))
    assert plan_probe(profile, SlowableRunner(), vocab_size=256) is None
