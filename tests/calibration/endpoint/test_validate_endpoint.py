"""`fleetsim validate --endpoint`: a bench and a simulation of the same requests in one run folder, the
errors per metric and a verdict; with --repeat, the server's own noise floor beside them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from calibration.serve.server import ServeOptions, ServerThread
from simulator.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "serve_cpu.yaml"


@pytest.fixture(scope="module")
def tiny() -> Iterator[ServerThread]:
    # The tiny model under the scenario's scheduler settings (the profile is the small model's: this test
    # checks the procedure, not the profile's accuracy).
    with ServerThread(ServeOptions(model="tiny", scenario=SCENARIO)) as server:
        yield server


def test_validate_endpoint_writes_both_runs_and_a_verdict(tiny: ServerThread, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "v"
    code = main(["validate", "--endpoint", tiny.url, "--profile", "cpu-small-tp1-measured", "--scenario",
                 str(SCENARIO), "--num-requests", "12", "--rate", "20", "--repeat", "--out", str(out), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "verdict:" in printed and "noise floor" in printed
    fidelity = json.loads((out / "fidelity.json").read_text())
    assert fidelity["completed"] == 12 and fidelity["profile"] == "cpu-small-tp1-measured"
    for metric in ("ttft", "tpot", "e2e"):
        assert fidelity[metric]["p50_engine_ms"] > 0 and fidelity[metric]["p50_sim_ms"] > 0
        assert "p99_err" in fidelity["repeat"]["engine_vs_engine"][metric]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["variants"]) == {"measured", "simulated", "measured-repeat"}
    assert summary["variants"]["simulated"]["requests_completed"] == 12
    assert {"report.html", "bench-measured.json", "bench-measured-repeat.json"} <= {p.name for p in out.iterdir()}


def test_validate_endpoint_needs_a_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["validate", "--endpoint", "http://127.0.0.1:9", "--profile", "cpu-small-tp1-measured",
                 "--out", str(tmp_path / "x")])
    assert code == 2 and "--scenario" in capsys.readouterr().err
