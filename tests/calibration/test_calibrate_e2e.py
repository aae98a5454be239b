"""End to end on CPU through the command-line entry points: calibrate (ci grid, tiny model) → fit → a
measured profile with its raw CSV, provenance and plot → validate a few hundred Azure-shaped requests in
lockstep. Asserts structure and honesty, never accuracy or time: no NaN, coefficients >= 0, engine and
simulator take identical decisions step for step, every file written."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

from calibration.cli import register
from simulator.cost.profile import ProfileKind, load_profile
from simulator.workload.traces import traces_dir


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleetsim")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


@pytest.mark.skipif(not traces_dir().is_dir(), reason="shared traces not found (set FLEETSIM_TRACES)")
def test_calibrate_then_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu-tiny-tp1-measured.yaml"
    args = _parse(["calibrate", "--device", "cpu", "--model", "tiny", "--grid", "ci", "--out", str(out),
                   "--kv-gib", "0.01", "--quiet"])
    assert args.func(args) == 0
    assert "held-out MAPE" in capsys.readouterr().out

    profile = load_profile(out)
    assert profile.kind is ProfileKind.MEASURED and profile.hardware == "CPU" and profile.model == "tiny"
    coeffs = [v for v in (*profile.device_s.model_dump().values(), *profile.host_s.model_dump().values())
              if isinstance(v, float)]
    assert len(coeffs) >= 10  # every numeric coefficient, not the optional curves or the host source text
    assert all(math.isfinite(c) and c >= 0 for c in coeffs)
    assert profile.fit_error is not None and math.isfinite(profile.fit_error.mape)
    assert profile.fit_error.num_points >= 20 and profile.fit_error.num_folds == 5
    assert profile.memory.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads, d 16, fp32
    assert profile.memory.kv_capacity_tokens == int(0.01 * 2**30) // 512 // 16 * 16
    prov = profile.provenance
    assert prov.device_name.startswith("CPU") and "torch" in prov.library_versions and prov.raw_timings_sha256
    csv_path, html_path = out.with_suffix(".csv"), out.with_suffix(".html")
    assert html_path.is_file() and out.with_suffix(".provenance.json").is_file()
    raw = pd.read_csv(csv_path)
    assert not raw.isna().any().any() and (raw["device_s"] > 0).all()

    val_dir = tmp_path / "validate"
    args = _parse(["validate", "--profile", str(out), "--num-requests", "200", "--mode", "lockstep",
                   "--prompt-scale", "0.1", "--output-scale", "0.1", "--max-prompt-tokens", "192",
                   "--max-output-tokens", "32", "--max-num-seqs", "16", "--max-num-batched-tokens", "192",
                   "--out", str(val_dir), "--quiet"])
    assert args.func(args) == 0
    fidelity = json.loads((val_dir / "fidelity.json").read_text())
    lock = fidelity["lockstep"]
    assert lock["identical"] is True and lock["identical_share"] == 1.0
    assert lock["engine_steps"] == lock["sim_steps"] > 200
    assert all(v is not None and math.isfinite(v) for v in lock["per_step_cycle"].values())
    steps = pd.read_csv(val_dir / "lockstep_steps.csv")
    assert len(steps) == lock["engine_steps"] and not steps.isna().any().any()

    # Real time, twice, with the host drift probe re-timing the profile's own grid points around each run.
    rt_dir = tmp_path / "realtime"
    args = _parse(["validate", "--profile", str(out), "--num-requests", "12", "--rate", "40", "--mode", "realtime",
                   "--repeat", "--prompt-scale", "0.05", "--output-scale", "0.05", "--max-prompt-tokens", "64",
                   "--max-output-tokens", "8", "--out", str(rt_dir), "--quiet"])
    assert args.func(args) == 0
    drift = json.loads((rt_dir / "fidelity.json").read_text())["host_drift"]
    assert len(drift["probes"]) == 3  # before the run, after it, after the repeat
    for probe in drift["probes"]:
        assert len(probe["points"]) == 8 and math.isfinite(probe["speed_ratio"]) and probe["speed_ratio"] > 0
    assert all(math.isfinite(drift["adjusted"][m]["p50_engine_ms"]) for m in ("ttft", "tpot", "e2e"))
    assert "host drift" in capsys.readouterr().out


def test_shipped_cpu_profile_serves_a_cpu_scenario() -> None:
    """A scenario on hardware 'CPU' finds the shipped measured CPU profile and runs (no price: no cost)."""
    from simulator.cost.profile import list_profiles
    from simulator.scenario import load_mapping
    from simulator.simulation import run

    if "cpu-small-tp1-measured" not in list_profiles():
        pytest.skip("no shipped CPU profile")
    loaded = load_mapping({
        "schema_version": 1, "name": "cpu", "fleet": {"hardware": "CPU", "model": "small"},
        "workload": {"num_requests": 50, "arrival": {"process": "poisson", "rate_rps": 2.0},
                     "prompt_tokens": {"dist": "fixed", "value": 200}, "output_tokens": {"dist": "fixed", "value": 30}},
    })
    result = run(loaded)
    variant = result.variants["base"]
    assert variant.profile.name == "cpu-small-tp1-measured" and variant.profile.kind == "measured"
    assert variant.summary.requests_completed == 50
