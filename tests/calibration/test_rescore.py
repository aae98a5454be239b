"""Re-scoring the recorded H200 validation: the engine's side as recorded, the simulator's run again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.fidelity import relative_errors
from calibration.rescore import engine_log, main, rescore

RECORDED = (Path(__file__).resolve().parents[2] / "calibration" / "measured"
            / "h200-llama-3-8b-tp1-validation-2026-12-04")


@pytest.fixture(scope="module")
def result() -> dict:
    return rescore(RECORDED, "h200-llama-3-8b-tp1-measured")


def test_engine_side_is_the_recorded_one(result: dict) -> None:
    """The engine's percentiles rebuilt from requests.csv are those the GPU run reported, and every recorded
    step is priced (the step counts the run reported)."""
    import pandas as pd

    recorded = json.loads((RECORDED / "fidelity.json").read_text())
    engine = engine_log(pd.read_csv(RECORDED / "requests.csv"))
    again = relative_errors(engine, engine)
    for metric in ("ttft", "tpot", "e2e"):
        for q in (50, 90, 99):
            key = f"p{q}_engine_ms"
            assert again[metric][key] == pytest.approx(recorded[metric][key], rel=1e-9)
            assert result["sim_vs_engine"][metric][key] == pytest.approx(recorded[metric][key], rel=1e-9)
    assert result["lockstep_steps"]["steps"] == recorded["lockstep"]["engine_steps"]
    assert result["realtime_steps"]["steps"] == recorded["realtime"]["engine_steps"]
    assert result["engine_vs_engine"] == recorded["repeat"]["engine_vs_engine"]


def test_shipped_profile_tracks_the_recorded_gpu_replay(result: dict) -> None:
    """Deterministic figures (the recorded engine, the simulator run again): the shipped profile keeps the
    simulator within these bounds of the recorded H200 replay. A refit that loosens them shows here."""
    errors = result["sim_vs_engine"]
    assert abs(errors["throughput_err"]) < 0.01
    for q in (50, 90, 99):
        assert abs(errors["tpot"][f"p{q}_err"]) < 0.10
        assert abs(errors["e2e"][f"p{q}_err"]) < 0.25
    assert abs(errors["ttft"]["p50_err"]) < 0.25
    for stem in ("lockstep_steps", "realtime_steps", "realtime_repeat_steps"):
        assert result[stem]["decode_device"]["mape"] < 0.10
        assert result[stem]["per_step_device"]["mape"] < 0.10


def test_bad_folder_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--profile", "h200-llama-3-8b-tp1-measured"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "fidelity.json" in err
    (tmp_path / "fidelity.json").write_text("{}")
    assert main([str(tmp_path), "--profile", "h200-llama-3-8b-tp1-measured"]) == 2
    assert "requests.csv" in capsys.readouterr().err
