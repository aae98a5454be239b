"""`fleetsim serve --model tiny` in its own process and `fleetsim bench` against it, end to end: the run
folder is a valid one (the simulator's files read back, bench.json in vLLM's names), every request
completed with the workload's output length, and the server's metrics became the run's series."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from simulator.cli.main import main  # noqa: E402
from simulator.results.summary import Summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
START_S = 90.0
"""Longest wait for the server to answer /health (a bound, not a timing check)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    port = _free_port()
    log_dir = tmp_path_factory.mktemp("serve-log")
    command = [sys.executable, "-m", "simulator.cli.main", "serve", "--model", "tiny", "--port", str(port),
               "--kv-gib", "0.01", "--log-dir", str(log_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert server.poll() is None, server.stdout.read() if server.stdout else "server exited"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "fleetsim serve did not come up"
            time.sleep(0.2)
        yield url, log_dir
    finally:
        server.terminate()
        server.wait(30)


def test_bench_writes_a_run_folder_like_fleetsim_run(endpoint: tuple[str, Path], tmp_path: Path) -> None:
    url, log_dir = endpoint
    out = tmp_path / "bench"
    code = main(["bench", "--endpoint", f"{url}/v1", "--scenario", str(ROOT / "scenarios" / "serve_cpu.yaml"),
                 "--num-requests", "24", "--rate", "30", "--max-concurrency", "16", "--sample-interval", "0.05",
                 "--out", str(out), "--quiet"])
    assert code == 0
    assert {"requests.parquet", "series.parquet", "summary.json", "report.html", "bench.json",
            "chunks.parquet"} <= {p.name for p in out.iterdir()}
    import pandas as pd

    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 24 and (requests["outcome"] == "completed").all()
    summary = Summary.from_dict(json.loads((out / "summary.json").read_text())["variants"]["measured"])
    assert summary.requests_completed == 24 and summary.ttft_p50_ms > 0 and summary.tpot_p50_ms > 0
    bench = json.loads((out / "bench.json").read_text())
    assert bench["completed"] == 24 and bench["failed"] == 0 and bench["max_in_flight"] <= 16
    assert bench["mean_tokens_per_chunk"] == 1.0 and bench["usage_reported"]
    for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2el_ms", "output_throughput"):
        assert bench[key] > 0
    chunks = pd.read_parquet(out / "chunks.parquet")
    assert len(chunks) == int(requests["output_tokens"].sum()) == bench["total_output_tokens"]
    series = pd.read_parquet(out / "series.parquet")
    assert len(series) > 0 and series["running"].max() >= 1  # the server's /metrics, sampled
    # Output lengths are the workload's: ignore_eos and max_tokens were sent.
    from simulator.scenario import load_scenario
    from simulator.workload.generate import generate

    scenario = load_scenario(ROOT / "scenarios" / "serve_cpu.yaml", ["workload.num_requests=24"]).scenario
    expected = generate(scenario.workload, seed=scenario.seed, block_size=16).output_tokens
    assert requests["output_tokens"].tolist() == expected.tolist()
    # Every request's client timings join the engine's own log; the client never sees a token before the
    # engine made it, so the differences are the HTTP path's cost, never negative at TTFT.
    from calibration.endpoint.overhead import client_vs_engine

    deadline = time.monotonic() + START_S
    while len((log_dir / "requests.jsonl").read_text().splitlines()) < 24 and time.monotonic() < deadline:
        time.sleep(0.2)  # the server flushes its log about once a second
    overhead = client_vs_engine(out, log_dir)
    assert overhead["num_matched"] == 24
    assert overhead["ttft_overhead_ms"]["p50"] > 0 and overhead["e2e_overhead_ms"]["p50"] > 0


def test_bench_against_no_server_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--endpoint", f"http://127.0.0.1:{_free_port()}", "--scenario",
                 str(ROOT / "scenarios" / "serve_cpu.yaml"), "--num-requests", "2", "--out", str(tmp_path / "x")])
    assert code == 2 and "no OpenAI-compatible server" in capsys.readouterr().err
