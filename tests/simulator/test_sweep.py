"""Sweeps: grid -> tasks, a failing task reported without losing the others, identical results on the
local pool and on a real Ray instance, the merged table, the Pareto view, and ``fleetsim sweep``."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main as cli
from simulator.errors import ConfigError
from simulator.planning.sweep import build_tasks, load_grid, pareto_front, run_task, run_tasks, save_sweep, sweep
from simulator.worker_pool import WorkerDied

SCENARIO: dict[str, Any] = {
    "schema_version": 1,
    "name": "tiny",
    "seed": 0,
    "workload": {
        "num_requests": 40,
        "arrival": {"process": "poisson", "rate_rps": 20},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max": 2000},
        "output_tokens": {"dist": "uniform", "low": 5, "high": 60},
    },
    "fleet": {"replicas": 1, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "slo": {"ttft_ms": 500, "tpot_ms": 50},
}


def write_grid(folder: Path, grid: dict[str, Any], **extra: Any) -> Path:
    (folder / "scenarios").mkdir(exist_ok=True)
    (folder / "scenarios" / "tiny.yaml").write_text(yaml.safe_dump(SCENARIO))
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump({"scenario": "scenarios/tiny.yaml", "grid": grid, **extra}))
    return path


def test_tasks_are_the_cartesian_product_times_seeds() -> None:
    tasks = build_tasks(SCENARIO, {"a.b": [1, 2], "c": ["x", "y", "z"]}, [0, 7])
    assert len(tasks) == 12 and [t.task_id for t in tasks] == list(range(12))
    assert tasks[0].overrides == {"a.b": 1, "c": "x"} and [t.seed for t in tasks[:2]] == [0, 7]
    assert tasks[-1].overrides == {"a.b": 2, "c": "z"}


def test_grid_file_errors_name_the_field(tmp_path: Path) -> None:
    path = write_grid(tmp_path, {"fleet.replicas": [1]}, sedes=[1])
    with pytest.raises(ConfigError, match="sedes"):
        load_grid(path)
    path = write_grid(tmp_path, {"fleet.replicas": []})
    with pytest.raises(ConfigError, match=r"grid\.fleet\.replicas"):
        load_grid(path)
    for seed in (-1, 2**63):  # a scenario's seeds: 0 to 2**63 - 1 (the tables store them as int64)
        with pytest.raises(ConfigError, match=r"seeds\.0"):
            load_grid(write_grid(tmp_path, {"fleet.replicas": [1]}, seeds=[seed]))


def test_a_sweep_whose_every_task_failed_prints_no_front(capsys: pytest.CaptureFixture[str]) -> None:
    """Each failed task has said so: no Pareto front, and no error printing it (a KeyError once)."""
    from simulator.cli.plan import _print_front

    frame = pd.DataFrame({"fleet.replicas": [1, 2], "variant": ["base", "base"], "seed": [0, 0],
                          "error": ["boom", "boom"]})
    _print_front(frame, ["fleet.replicas"], "e2e_p99_ms")
    assert capsys.readouterr().out == ""


def test_pareto_front() -> None:
    x = np.array([1.0, 2.0, 3.0, 1.5, np.nan, 3.0])
    y = np.array([9.0, 5.0, 1.0, 9.5, 0.1, 1.0])
    assert pareto_front(x, y).tolist() == [True, True, True, False, False, False]


def test_failing_task_is_reported_and_the_others_survive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_grid(tmp_path, {"engine.max_num_seqs": [8, -1, 64]}, seeds=[0])
    frame = sweep(path, workers=2, show_progress=False)  # a real spawn pool
    assert list(frame["engine.max_num_seqs"]) == [8, -1, 64]
    bad = frame[frame["error"].notna()]
    assert list(bad["engine.max_num_seqs"]) == [-1] and "max_num_seqs" in bad["error"].iloc[0]
    good = frame[frame["error"].isna()]
    assert len(good) == 2 and (good["requests_completed"] == 40).all()
    err = capsys.readouterr().err
    assert "task 1 (engine.max_num_seqs=-1; seed 0) failed" in err


def test_ray_executor_matches_local(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'fleetsim[ray]')")
    path = write_grid(tmp_path, {"fleet.replicas": [1, 2]}, seeds=[0, 1])
    local = sweep(path, workers=1, show_progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = sweep(path, executor="ray", show_progress=False)
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(local, remote)
    assert local["seed"].tolist() == [0, 1, 0, 1] and local["error"].isna().all()
    assert local["ttft_p99_ms"].iloc[0] != local["ttft_p99_ms"].iloc[1]  # seeds really differ


def test_save_writes_table_and_pareto_html(tmp_path: Path) -> None:
    grid = {"fleet.replicas": [1, 2], "engine.max_num_batched_tokens": [512, 8192]}
    tasks = build_tasks(SCENARIO, grid, [0])
    frame = pd.DataFrame([row for t in tasks for row in run_task(t)])
    paths = save_sweep(frame, list(grid), tmp_path)
    back = pd.read_parquet(paths["parquet"])
    assert len(back) == 4 and {"fleet.replicas", "cost_per_mtok_usd", "e2e_p99_ms", "error"} <= set(back.columns)
    assert len(pd.read_csv(paths["csv"])) == 4
    html = paths["html"].read_text()
    assert "Pareto front" in html and "plotly" in html


def test_cli_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.PLUGINS, "plan", "simulator.cli.plan")
    path = write_grid(tmp_path, {"fleet.replicas": [1, 2]}, seeds=[0], set={"workload.num_requests": 20})
    out = tmp_path / "out"
    assert cli.main(["sweep", str(path), "--workers", "1", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "2 rows from 2 tasks; 0 failed" in printed and "Pareto front" in printed
    assert (out / "sweep.parquet").exists() and (out / "pareto.html").exists()
    # Never over an existing result.
    assert cli.main(["sweep", str(path), "--out", str(out), "--quiet"]) == cli.EXIT_USAGE


def _fails_on_one(x: int) -> int:
    if x == 1:
        raise RuntimeError("boom")
    return x


def test_run_tasks_records_a_raising_task_and_keeps_the_rest() -> None:
    assert run_tasks(_fails_on_one, [0, 1, 2], workers=1, on_error=lambda item, err: -10 * item) == [0, -10, 2]
    with pytest.raises(RuntimeError, match="boom"):
        run_tasks(_fails_on_one, [0, 1, 2], workers=1)


def test_a_grid_key_typo_is_one_line_before_any_task_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.planning import sweep as sweep_module

    scenario = tmp_path / "s.yaml"
    scenario.write_text((Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml").read_text())
    grid = tmp_path / "g.yaml"
    grid.write_text("scenario: s.yaml\nseeds: [0]\ngrid:\n  fleet.replica: [1, 2]\n")
    ran: list[Any] = []
    monkeypatch.setattr(sweep_module, "run_task", lambda task: ran.append(task) or [])
    assert cli.main(["sweep", str(grid), "--out", str(tmp_path / "out"), "--quiet"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "grid.fleet.replica" in err and "did you mean 'replicas'" in err
    assert ran == [] and not (tmp_path / "out").exists()


def _dies_on_one(item: int) -> int:
    if item == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return item


def test_a_worker_that_dies_is_an_explained_error_and_the_tasks_done_keep_their_results() -> None:
    errors: list[BaseException] = []

    def on_error(item: int, err: BaseException) -> int:
        errors.append(err)
        return -1

    out = run_tasks(_dies_on_one, [0, 1, 2, 3], workers=2, on_error=on_error)
    assert out[1] == -1 and all(x in (i, -1) for i, x in enumerate(out))
    assert errors and all(isinstance(err, WorkerDied) and "--workers 1" in str(err) for err in errors)
    with pytest.raises(WorkerDied, match="died"):
        run_tasks(_dies_on_one, [0, 1, 2, 3], workers=2)
