"""The simulator's proxy model and a real buffering proxy: `fleetsim bench` through a proxy that forwards what
it holds every ``FLUSH_S`` (as Go's ReverseProxy FlushInterval or Caddy's flush_interval do) sees every SSE
event on the proxy's flush grid, and the simulator with ``network.flush_interval_ms`` delays first tokens by
half a flush on average. How close the measured delay comes to the simulated one is a timing:
``benchmarks/proxy_flush.py`` prints it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from calibration.endpoint.proxy import buffering_proxy, chunk_arrivals_s, phase_spread  # noqa: E402
from calibration.serve.server import AppThread, ServeOptions, ServerThread  # noqa: E402
from simulator.cli.main import main  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.simulation import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "serve_cpu.yaml"
FLUSH_S = 0.3
NUM_REQUESTS = 24


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    with ServerThread(ServeOptions(model="tiny", scenario=SCENARIO)) as server, \
            AppThread(buffering_proxy(server.url, FLUSH_S)) as proxy:
        yield server.url, proxy.url


def bench(url: str, out: Path) -> dict[str, Any]:
    code = main(["bench", "--endpoint", f"{url}/v1", "--scenario", str(SCENARIO), "--num-requests",
                 str(NUM_REQUESTS), "--rate", "8", "--out", str(out), "--quiet"])
    assert code == 0
    return dict(json.loads((out / "bench.json").read_text()))


def simulated_ttft_ms(flush_ms: float) -> float:
    loaded = load_scenario(SCENARIO, [f"workload.num_requests={NUM_REQUESTS * 8}", "workload.arrival.rate_rps=8",
                                      f"network.flush_interval_ms={flush_ms}"])
    c = run(loaded).variants["base"].requests.columns()
    return float(np.mean(c["first_token_s"] - c["arrival_s"]) * 1e3)


def test_a_buffering_proxy_puts_arrivals_on_its_flush_grid(servers: tuple[str, str], tmp_path: Path) -> None:
    direct_url, proxy_url = servers
    direct = bench(direct_url, tmp_path / "direct")
    proxied = bench(proxy_url, tmp_path / "proxied")
    assert direct["completed"] == proxied["completed"] == NUM_REQUESTS
    # The proxy holds SSE events back and lets them through on its flush grid: arrivals at the client have
    # the same phase on that grid (up to the loop's jitter), where direct arrivals have any phase. Measured
    # robustly (the median distance from the common phase): on a loaded 2-core machine a minority of
    # flushes run late, and the mean-vector length counted each of those as a random phase.
    direct_spread = phase_spread(chunk_arrivals_s(tmp_path / "direct"), FLUSH_S)
    proxied_spread = phase_spread(chunk_arrivals_s(tmp_path / "proxied"), FLUSH_S)
    assert proxied_spread < 0.08 < 0.15 < direct_spread, (proxied_spread, direct_spread)
    # In the simulator a first token waits for the next flush: half an interval on average.
    modelled_ms = simulated_ttft_ms(FLUSH_S * 1e3) - simulated_ttft_ms(0.0)
    assert abs(modelled_ms - FLUSH_S * 1e3 / 2) < FLUSH_S * 1e3 / 6, modelled_ms
