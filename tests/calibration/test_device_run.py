"""The device script's dry run: the same code path as the GPU run, on CPU with tiny shapes, in seconds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from calibration.device_run import main
from simulator.cost.profile import load_profile


def test_dry_run_writes_every_stage(tmp_path: Path) -> None:
    assert main(["--dry-run", "--out", str(tmp_path), "--quiet"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    stages = summary["stages"]
    assert set(stages) == {"ceilings", "correctness", "grid", "layers-tiny", "scaling", "validate"}
    assert all(s["status"] == "ok" for s in stages.values()), stages
    assert stages["ceilings"]["copy_Bps"] > 0 and stages["ceilings"]["gemm_flops"] > 0
    assert stages["correctness"]["ok"] and stages["correctness"]["argmax_agreement_vs_dense"] == 1.0
    assert stages["grid"]["points"] > 10 and math.isfinite(stages["grid"]["mape"])
    assert all(v >= 0 for v in stages["grid"]["device_s"].values())
    layers = stages["layers-tiny"]
    assert set(layers["per_k"]) == {"1", "2"} and layers["full_layers"] == 2
    assert len(stages["scaling"]["rows"]) == 3 and stages["scaling"]["per_layer_s"] >= 0
    for name in ("cpu-tiny-tp1-measured.yaml", "cpu-tiny-tp1-measured.csv", "cpu-tiny-tp1-measured.html",
                 "layers-tiny-tp2-k1.csv", "layers-tiny-tp2-k2.csv", "cpu-tiny-tp2-measured.yaml",
                 "layer-scaling-tiny.csv", "ceilings.json", "correctness.json"):
        assert (tmp_path / name).is_file(), name
    composed = load_profile(tmp_path / "cpu-tiny-tp2-measured.yaml")
    assert composed.is_measured and composed.tp == 2 and composed.comm is not None
    validated = stages["validate"]
    assert validated["requests"] == 6 and math.isfinite(validated["tpot"]["p50_err"])
    for name in ("fidelity.json", "requests.csv", "lockstep_steps.csv", "realtime_steps.csv"):
        assert (tmp_path / "validation" / name).is_file(), name


def test_rescore_of_a_recorded_validation_reproduces_its_simulator_side(tmp_path: Path) -> None:
    """``calibration.rescore`` rebuilds the workload and the scenario from what a validation recorded: with
    the same profile, the simulator's errors it finds are the ones the validation reported (the simulator
    is deterministic; only the engine's side was measured)."""
    from calibration.device_run import run
    from calibration.rescore import rescore

    run(tmp_path, dry_run=True, progress=False, stages=("grid", "validate"))
    recorded = json.loads((tmp_path / "validation" / "fidelity.json").read_text())
    again = rescore(tmp_path / "validation", str(tmp_path / "cpu-tiny-tp1-measured.yaml"))
    for metric in ("ttft", "tpot", "e2e"):
        for q in (50, 90, 99):
            key = f"p{q}_err"
            assert again["sim_vs_engine"][metric][key] == pytest.approx(recorded[metric][key], rel=1e-9, abs=1e-12)
    assert again["sim_vs_engine"]["throughput_err"] == pytest.approx(recorded["throughput_err"], rel=1e-9)
    assert again["lockstep_steps"]["steps"] == recorded["lockstep"]["engine_steps"]
    assert again["lockstep_steps"]["per_step_device"] == pytest.approx(recorded["lockstep"]["per_step_device"])


def test_deadline_skips_later_stages(tmp_path: Path) -> None:
    from calibration.device_run import run

    result = run(tmp_path, dry_run=True, deadline_s=-1.0, progress=False)
    assert {s["status"] for s in result["stages"].values()} == {"skipped"}
