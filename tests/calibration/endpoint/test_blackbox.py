"""`fleetsim calibrate --endpoint`: the probe arithmetic on made-up streams, and a short probe schedule
against the tiny server ending in a profile the simulator loads, with its held-out error."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.endpoint.blackbox import ProbePlan, ProbeResults, http_overhead_s, steady_step, timing_rows
from calibration.endpoint.client import StreamRecord


def _stream(first: float, gap: float, n: int, prompt: int = 10) -> StreamRecord:
    r = StreamRecord(0, 0.0, prompt, n, sent_s=0.0, finished=True)
    r.chunk_s = [first + i * gap for i in range(n)]
    return r


def test_steady_window_is_where_every_stream_decodes() -> None:
    # Two streams, the second starts late and the first ends early: only gaps inside the overlap count.
    a, b = _stream(0.0, 0.01, 50), _stream(0.1, 0.02, 30)
    step, context = steady_step([a, b])  # type: ignore[misc]
    assert step == pytest.approx(0.01)  # the median of 39 gaps of 10 ms and 19 of 20 ms
    middle = (0.1 + 0.49) / 2
    assert context == 20 + sum(t <= middle for t in a.chunk_s) + sum(t <= middle for t in b.chunk_s)
    broken = _stream(0.0, 0.01, 5)
    broken.error = "x"
    assert steady_step([a, broken]) is None


def test_overhead_and_rows() -> None:
    results = ProbeResults(prefill=[(16, 0.030), (16, 0.032), (64, 0.05)], decode=[(1, 40.0, 0.020), (4, 200.0, 0.03)])
    overhead = http_overhead_s(results)
    assert overhead == pytest.approx(0.031 - 0.020)
    rows = timing_rows(results, overhead)
    assert rows["device_s"].iloc[0] == pytest.approx(0.030 - overhead)
    assert rows["prefill_attention_pairs"].iloc[2] == 64 * 64 / 2 and rows["decode_context_sum"].iloc[4] == 200.0


def test_probe_a_live_server_and_fit(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    from calibration.endpoint.bench import BenchOptions
    from calibration.endpoint.blackbox import calibrate_endpoint
    from calibration.serve.server import ServeOptions, ServerThread
    from simulator.core.step import StepShape
    from simulator.cost.cost_model import CostModel
    from simulator.cost.profile import load_profile

    plan = ProbePlan(prompts=(16, 64, 128, 256), batches=(1, 2, 4, 8), contexts=(32,), repeats=2, decode_tokens=24)
    with ServerThread(ServeOptions(model="tiny", kv_gib=0.004)) as server:
        options = BenchOptions(endpoint=server.url, progress=False)
        fit = calibrate_endpoint(options, out=tmp_path / "tiny-bb.yaml", like=None, hardware="CPU", dtype="float32",
                                 kv_capacity_tokens=None, plan=plan, folds=3)
        blocks = server.loop.engine.config.num_blocks
    profile = load_profile(fit.path)
    assert profile.model == "tiny" and profile.kind.value == "measured" and "Black-box" in profile.provenance.source
    assert profile.fit_error is not None and profile.fit_error.num_points == 4 * 2 + 4
    assert profile.memory.kv_capacity_tokens == blocks * 16  # read from the server's /metrics
    assert CostModel(profile).step_time(StepShape(4, 4, 4, 200, 0, 0.0)) > 0
    assert (tmp_path / "tiny-bb.probes.csv").is_file()
    # The client's view travels with the profile: fleetsim serve sends one token per SSE event.
    assert profile.streaming is not None and profile.streaming.tokens_per_chunk == 1.0
    assert profile.streaming.latency_ms == pytest.approx(fit.overhead_s * 1e3)
