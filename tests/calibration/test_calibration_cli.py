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


@pytest.mark.parametrize(("flag", "value", "named"), [("--seed", "1", "seed 0 there, 1 now"),
                                                      ("--threads", "2", "torch_threads 1 there, 2 now"),
                                                      ("--tp", "2", "tp 1 there, 2 now"),
                                                      ("--hardware", "EPYC", "hardware 'CPU' there, 'EPYC' now")])
def test_calibrate_refuses_to_resume_a_csv_of_other_settings_before_loading_the_model(
        flag: str, value: str, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    import torch
    from fake_runner import FakeRunner

    from calibration import calibrate as pipeline
    from calibration.profiler import Clock, run_grid, sidecar_path

    out = tmp_path / "p.yaml"
    threads = torch.get_num_threads()
    try:  # the timings a first `fleetsim calibrate --device cpu --model tiny --grid ci --threads 1` left
        settings = pipeline.resolve_settings(
            device="cpu", model="tiny", out=out, tp=1, grid="ci", dtype=None, backend=None, cuda_graphs=None,
            kv_gib=1.0, memory_fraction=0.9, threads=1, hardware=None, folds=5, seed=0, progress=False,
            host_from="engine", clock="runner", multi_token=None, pass_aggregate="mean", command=None)
        run_grid(FakeRunner(), settings.grid, settings.csv_path, pipeline.run_info(settings, Clock.RUNNER),
                 vocab_size=256, progress=False, max_points=2)
        before = settings.csv_path.read_bytes(), sidecar_path(settings.csv_path).read_bytes()

        def no_model(*args: object) -> None:
            raise AssertionError("the model was loaded before the CSV's settings were checked")

        monkeypatch.setattr(pipeline, "build_runner", no_model)
        argv = ["calibrate", "--device", "cpu", "--model", "tiny", "--grid", "ci", "--threads", "1",
                "--clock", "runner", "--out", str(out), "--quiet", flag, value]
        assert main(argv) == EXIT_USAGE
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured with other settings" in err and named in err, err
    assert (settings.csv_path.read_bytes(), sidecar_path(settings.csv_path).read_bytes()) == before
    assert not out.exists()


def test_python_m_calibration_runs_the_commands_from_a_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m calibration`` is ``fleetsim`` with the calibration commands registered by hand (a lent GPU's
    bare copy has no entry points); installed as well, they register once, not twice."""
    import subprocess
    import sys

    from calibration.cli import register

    with pytest.raises(SystemExit) as done:
        main(["validate", "--help"], plugins=(register,))
    assert done.value.code == 0 and "--profile" in capsys.readouterr().out
    ran = subprocess.run([sys.executable, "-m", "calibration", "validate", "--profile", "no-such-profile"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == EXIT_USAGE
    assert ran.stderr.count("\n") == 1 and "no-such-profile" in ran.stderr


def test_validate_refuses_an_out_folder_holding_files_before_replaying(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious\n")
    assert main(["validate", "--profile", "cpu-small-tp1-measured", "--out", str(out), "--quiet"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err, err
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "precious\n"
