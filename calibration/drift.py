"""Host drift: how much faster or slower the host runs now than when a profile was measured.

A measured profile is only as true as the host is steady. On a shared VM the same step can take 15 %
longer an hour (or a minute) later, and a validation run would then charge the cost model with the
host's drift. The probe re-times a handful of the profile's own grid points — the same compositions,
repeat policy and clock as the calibration, on the engine's runner — and compares them with the timings
file beside the profile. The median ratio (now ÷ then) is the host's speed change, an independent
measurement taken outside the replayed workload, so validation can report it next to the simulator's
error (and the error with the simulator's clock scaled by it, labelled as such).

Never changes a profile; needs the profile's raw timings (``PROFILE.csv`` and its provenance sidecar).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.grid import GridPoint, get_grid
from calibration.profiler import (
    Clock,
    TimedRunner,
    aggregate_passes,
    load_sidecar,
    measure_point,
    read_timings,
)
from simulator.errors import ConfigError

NUM_PROBE_POINTS = 8
"""Grid points re-timed per probe: spread over the grid's range of step times (a few seconds in all)."""


@dataclass(frozen=True, slots=True)
class ProbePoint:
    point: GridPoint
    then_s: float
    """The point's cycle time in the profile's timings (mean of its passes)."""


@dataclass(frozen=True, slots=True)
class DriftProbe:
    """One probe: each point's cycle time now against the profile's."""

    names: tuple[str, ...]
    then_s: tuple[float, ...]
    now_s: tuple[float, ...]

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(now / then for now, then in zip(self.now_s, self.then_s, strict=True))

    @property
    def speed_ratio(self) -> float:
        """Median of now ÷ then: > 1 when the host runs slower than when the profile was measured."""
        return statistics.median(self.ratios)

    def as_dict(self) -> dict[str, Any]:
        return {"speed_ratio": self.speed_ratio,
                "points": {n: {"then_s": t, "now_s": w} for n, t, w in zip(self.names, self.then_s, self.now_s,
                                                                           strict=True)}}


@dataclass(frozen=True, slots=True)
class DriftPlan:
    """The points a probe re-times, and how (the calibration's repeat policy and clock)."""

    points: tuple[ProbePoint, ...]
    grid_name: str
    clock: Clock
    vocab_size: int

    def measure(self, runner: TimedRunner) -> DriftProbe:
        """Time every point on ``runner``. It writes KV blocks from 0 up: call it on an engine with no live
        requests and no prefix cache to keep (validation runs without one)."""
        policy = get_grid(self.grid_name).policy
        now = [measure_point(runner, p.point, policy, vocab_size=self.vocab_size, clock=self.clock).cycle.median_s
               for p in self.points]
        return DriftProbe(tuple(p.point.name for p in self.points), tuple(p.then_s for p in self.points),
                          tuple(now))


def plan_probe(profile_path: Path, runner: TimedRunner, *, vocab_size: int,
               num_points: int = NUM_PROBE_POINTS) -> DriftPlan | None:
    """Choose the points from the timings beside ``profile_path``: evenly spaced in cycle time over the
    ones the runner's KV pool holds. None when there are no timings, or they name a grid this version
    does not know (then there is nothing to compare with)."""
    csv_path = profile_path.with_suffix(".csv")
    sidecar = load_sidecar(csv_path) if csv_path.is_file() else None
    if sidecar is None:
        return None
    try:
        grid = get_grid(str(sidecar.get("grid")))
    except ConfigError:  # a grid from another version: no probe rather than a wrong one
        return None
    by_name = {p.name: p for p in grid.points}
    points = aggregate_passes(read_timings(csv_path), "mean")
    rows = [(by_name[name], float(cycle_s))
            for name, cycle_s in zip(points["point"].astype(str), points["cycle_s"].to_numpy(), strict=True)
            if name in by_name and by_name[name].num_blocks(runner.block_size) <= runner.num_blocks]
    if not rows:
        return None
    rows.sort(key=lambda row: row[1])
    count = min(num_points, len(rows))
    picks = sorted({round(i * (len(rows) - 1) / max(count - 1, 1)) for i in range(count)})
    return DriftPlan(tuple(ProbePoint(rows[i][0], rows[i][1]) for i in picks), grid.name,
                     Clock(sidecar.get("clock", Clock.RUNNER.value)), vocab_size)
