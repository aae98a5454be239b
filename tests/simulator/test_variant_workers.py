"""Variants in worker processes give what one after another gives: the same per-request rows, series and
summaries, in the same order, with every variant's progress passed on; ``fleetsim run --jobs`` writes the
same summary.json byte for byte."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pytest

from simulator.cli.main import main
from simulator.scenario import load_scenario
from simulator.simulation import PARALLEL_MIN_REQUESTS, auto_jobs, run
from simulator.variant_workers import VariantTask, WorkerDied, simulate_variants
from simulator.worker_pool import explained

ROOT = Path(__file__).resolve().parents[2]
DAY = ROOT / "scenarios" / "day.yaml"
SHORT_DAY = ["workload.duration_s=2400", "failures.node_failures=[{at_s: 1200, node: 0}]"]
"""The first 40 minutes of the day (four variants: static, two autoscalers, the oracle) with its node failure."""


def test_workers_give_the_same_results_in_the_same_order() -> None:
    loaded = load_scenario(DAY, SHORT_DAY)
    alone = run(loaded)
    reports: list[tuple[str, int, int]] = []
    side_by_side = run(loaded, jobs=2, progress=lambda *report: reports.append(report))
    assert list(side_by_side.variants) == list(alone.variants) == ["static-5", "concurrency", "slo", "oracle"]
    for name, expected in alone.variants.items():
        got = side_by_side.variants[name]
        assert got.summary.to_dict() == pytest.approx(expected.summary.to_dict(), nan_ok=True, rel=0, abs=0)
        for column, values in expected.requests.columns().items():
            np.testing.assert_array_equal(got.requests.columns()[column], values, err_msg=f"{name}: {column}")
        for series, expected_series in zip(got.series, expected.series, strict=True):
            for column, values in expected_series.columns().items():
                np.testing.assert_array_equal(series.columns()[column], values, err_msg=f"{name}: {column}")
        assert got.day is not None and expected.day is not None
        assert got.day.figures == expected.day.figures
        last = max(done for variant, done, _ in reports if variant == name)
        assert last > 0.9 * len(expected.requests), f"{name}: its progress did not come back"
    assert side_by_side.scenario == alone.scenario


def test_cli_jobs_write_the_same_summary_byte_for_byte(tmp_path: Path) -> None:
    outputs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs-{jobs}"
        args = ["run", str(DAY), "--summary-only", "--quiet", "--out", str(out), "--jobs", jobs]
        for item in SHORT_DAY:
            args += ["--set", item]
        assert main(args) == 0
        outputs.append((out / "summary.json").read_bytes())
    assert outputs[0] == outputs[1]


def test_auto_jobs_keeps_small_runs_in_process() -> None:
    loaded = load_scenario(DAY, SHORT_DAY)
    scenario = next(iter(loaded.variants().values()))

    class Sized:
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

    def tasks(n: int, count: int) -> list[VariantTask]:
        return [VariantTask(f"v{i}", scenario, Sized(n)) for i in range(count)]  # type: ignore[arg-type]

    assert auto_jobs(tasks(PARALLEL_MIN_REQUESTS, 1)) == 1  # one variant: nothing to run side by side
    assert auto_jobs(tasks(PARALLEL_MIN_REQUESTS // 4 - 1, 4)) == 1  # too few requests for a worker's start
    assert auto_jobs(tasks(PARALLEL_MIN_REQUESTS, 4)) == min(4, os.cpu_count() or 1)  # a core each, at most
    assert auto_jobs(tasks(PARALLEL_MIN_REQUESTS, 64)) == (os.cpu_count() or 1)


def test_jobs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        run(load_scenario(DAY, SHORT_DAY), jobs=0)


def _die(*args: object, **kwargs: object) -> None:
    """A variant's simulation whose worker is killed (as the kernel's OOM killer would)."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_mid_run_raises_worker_died() -> None:
    loaded = load_scenario(DAY, SHORT_DAY)
    scenario = next(iter(loaded.variants().values()))
    from simulator.workload.generate import generate

    workload = generate(scenario.workload, seed=scenario.seed, block_size=16)
    tasks = [VariantTask(name, scenario, workload) for name in ("a", "b")]
    with pytest.raises(WorkerDied, match="died"):
        simulate_variants(_die, tasks, jobs=2)


def test_a_dead_worker_is_one_line_and_saves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import simulator.simulation

    def killed(*args: object, **kwargs: object) -> None:
        with explained("running a variant", "jobs=1 (--jobs 1)"):
            raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(simulator.simulation, "run", killed)
    out = tmp_path / "out"
    assert main(["run", str(DAY), "--quiet", "--out", str(out), "--jobs", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "worker process" in err and "--jobs 1" in err
    assert not out.exists() or not any(out.iterdir())


def test_a_script_without_a_main_guard_is_told_why_its_workers_died(tmp_path: Path) -> None:
    """Spawned workers import the calling script again: unguarded, each fails as it starts and the pool breaks.
    The caller gets ``WorkerDied`` naming the guard and the one-process way round, not a bare
    ``BrokenProcessPool``."""
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from simulator import api
        from simulator.worker_pool import WorkerDied
        try:
            api.run({str(DAY)!r}, {SHORT_DAY!r}, jobs=2)
        except WorkerDied as err:
            print("WorkerDied:", err)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    told = [line for line in done.stdout.splitlines() if line.startswith("WorkerDied:")]
    assert len(told) == 1, done.stdout[-2000:]
    assert 'if __name__ == "__main__":' in told[0] and "jobs=1" in told[0]
