"""``fleetsim calibrate`` / ``validate`` without PyTorch: one line naming the extra, exit 2, no traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from simulator.cli.main import EXIT_USAGE, main


@pytest.mark.parametrize("argv", [["calibrate", "--model", "tiny", "--out", "P.yaml"],
                                  ["validate", "--profile", "cpu-small-tp1-measured"]])
def test_without_torch_the_command_says_which_extra(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "torch" else real(name, *args)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e '.[engine]'" in err
    assert list(tmp_path.iterdir()) == []


def errors(p50: float, p99: float) -> dict[str, Any]:
    return {m: {"p50_err": p50, "p90_err": 0.0, "p99_err": p99} for m in ("ttft", "tpot", "e2e")}


def test_validate_prints_a_verdict_against_the_design_target() -> None:
    from calibration.validate import verdict

    assert verdict({"fidelity_target": 0.10, "realtime": {}, **errors(0.02, -0.08)}).startswith(
        "verdict: PASS: p50 and p99 TTFT, TPOT and E2E within 10%")
    failing = verdict({"fidelity_target": 0.05, "realtime": {}, **errors(0.02, -0.08)})
    assert failing.startswith("verdict: FAIL: outside 5%: ttft p99 -8.0%") and "--repeat" in failing
    noisy = verdict({"fidelity_target": 0.05, "realtime": {}, **errors(0.02, -0.08),
                     "repeat": {"engine_vs_engine": errors(0.01, 0.2)}})
    assert "the engine against itself also misses it at ttft p99" in noisy
    assert "not judged" in verdict({"fidelity_target": 0.05, "lockstep": {}})
