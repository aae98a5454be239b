"""Validation machinery: error arithmetic, step agreement, and that a lockstep replay on the real engine
(tiny model) takes exactly the simulator's decisions, step for step, with a profile that need not be
accurate (decisions in lockstep do not depend on its accuracy)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from calibration.fidelity import per_step_errors, relative_errors, step_agreement
from calibration.replay import run_engine_lockstep, simulate_recorded
from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import (
    DeviceCoefficients,
    HostCoefficients,
    MemoryFigures,
    Profile,
    ProfileKind,
    Provenance,
)
from simulator.results.request_log import RequestLog
from simulator.workload.traces import traces_dir


def _log(ttft: list[float], e2e: list[float], out: list[int]) -> RequestLog:
    log = RequestLog(len(ttft))
    for i, (a, b, n) in enumerate(zip(ttft, e2e, out, strict=True)):
        log.on_arrival(i, float(i), 10, n, None)
        log.on_first_token(i, i + a)
        log.on_finish(i, i + b, 0, 0)
    return log


def test_relative_errors() -> None:
    engine = _log([1.0] * 10, [2.0] * 10, [11] * 10)
    sim = _log([1.1] * 10, [2.2] * 10, [11] * 10)
    err = relative_errors(engine, sim)
    assert err["ttft"]["p50_err"] == pytest.approx(0.1)
    assert err["e2e"]["p99_err"] == pytest.approx(0.1)
    assert err["tpot"]["p90_err"] == pytest.approx(0.1)
    assert err["ttft"]["p50_engine_ms"] == pytest.approx(1000.0)
    # Same tokens, spans 9 + 2 vs 9 + 2.2 seconds.
    assert err["throughput_err"] == pytest.approx(11.0 / 11.2 - 1.0)


def test_step_agreement_and_per_step() -> None:
    a = [((0, 5),), ((0, 1), (1, 3))]
    assert step_agreement(a, a) == {"engine_steps": 2, "sim_steps": 2, "identical_share": 1.0,
                                    "first_difference": None}
    b = [((0, 5),), ((0, 1),), ((1, 3),)]
    agreement = step_agreement(a, b)
    assert agreement["identical_share"] == pytest.approx(1 / 3) and agreement["first_difference"] == 1
    errors = per_step_errors([1.1, 0.9], [1.0, 1.0])
    assert errors["mape"] == pytest.approx(0.1) and errors["total_time_err"] == pytest.approx(0.0)


def _profile() -> Profile:
    return Profile(
        name="cpu-tiny-tp1-measured", hardware="CPU", model="tiny", tp=1, dtype="float32", kind=ProfileKind.MEASURED,
        device_s=DeviceCoefficients(a0_s=1e-3, weight_s=5e-4, per_token_s=2e-5, per_ctx_token_s=1e-7,
                                    per_attn_pair_s=1e-8, per_seq_s=5e-5),
        host_s=HostCoefficients(h0_s=2e-4),
        memory=MemoryFigures(kv_bytes_per_token=512, kv_capacity_tokens=4096, weight_bytes=1, device_memory_bytes=1),
        host_link_Bps=1e9,
        provenance=Provenance(device_name="test", date="2026-01-01", source="synthetic, for a decision test"),
    )


def test_lockstep_engine_matches_simulator() -> None:
    import torch

    from calibration.engine.configs import get_model
    from calibration.engine.engine import Engine
    from calibration.validate import _prompts

    torch.set_num_threads(1)
    rng = np.random.default_rng(3)
    n = 40
    arrivals = np.cumsum(rng.exponential(0.001, n))
    specs = [RequestSpec(i, float(arrivals[i]), int(rng.integers(5, 90)), int(rng.integers(1, 40))) for i in range(n)]
    # A pool small enough to force preemptions: decisions must still agree.
    config = SchedulerConfig(num_blocks=24, block_size=16, max_num_seqs=8, max_num_batched_tokens=64,
                             enable_prefix_caching=False, max_model_len=384)
    cost = CostModel(_profile())
    engine = Engine(get_model("tiny"), config, dtype=torch.float32)
    run = run_engine_lockstep(engine, specs, _prompts(specs, 256, 0), cost, progress=False)
    sim = simulate_recorded(config, cost, specs)
    assert run.steps == sim
    assert len(run.steps) > n  # chunked prompts and decodes, not one step per request
    assert engine.scheduler.num_preemptions > 0
    assert all(math.isfinite(t) and t > 0 for t in run.cycle_s)
    done = ~np.isnan(run.log.columns()["finish_s"])
    assert done.all()


@pytest.mark.skipif(not traces_dir().is_dir(), reason="shared traces not found (set FLEETSIM_TRACES)")
def test_realtime_smoke(tmp_path: Path) -> None:
    """Real-time replay end to end through ``validate`` (structure only: no timing is asserted)."""
    import json

    from calibration.validate import ValidationOptions, validate

    profile_path = tmp_path / "cpu-tiny-tp1-measured.yaml"
    _profile().model_copy(update={"memory": MemoryFigures(kv_bytes_per_token=512, kv_capacity_tokens=16384,
                                                          weight_bytes=1, device_memory_bytes=1)}).save(profile_path)
    options = ValidationOptions(profile=str(profile_path), num_requests=12, rate_rps=60.0, prompt_scale=0.05,
                                output_scale=0.05, max_prompt_tokens=64, max_output_tokens=8, max_num_seqs=8,
                                max_num_batched_tokens=64, repeat_realtime=True)
    report = validate(options, out_dir=tmp_path / "out", progress=False)
    data = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert data["lockstep"]["identical"] is True
    for metric in ("ttft", "tpot", "e2e"):
        assert set(data[metric]) >= {"p50_err", "p90_err", "p99_err"}
    assert "throughput_err" in data and 0 <= data["realtime"]["identical_share"] <= 1
    assert (tmp_path / "out" / "fidelity.html").is_file()
    assert report.fidelity["num_requests"] == 12
    repeat = data["repeat"]  # the engine's second run: same workload, fresh engine
    for side in ("engine_vs_engine", "sim_vs_engine"):
        for metric in ("ttft", "tpot", "e2e"):
            assert repeat[side][metric]["p50_engine_ms"] > 0
    assert (tmp_path / "out" / "realtime_repeat_steps.csv").is_file()
