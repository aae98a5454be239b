"""The simulator's proxy model against a real buffering proxy: `fleetsim bench` through a proxy that forwards
what it holds every ``FLUSH_S`` (as Go's ReverseProxy FlushInterval or Caddy's flush_interval do) sees SSE
events arrive in bursts and first tokens late by half a flush on average; the simulator with
``network.flush_interval_ms`` predicts the same delay."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from calibration.serve.server import AppThread, ServeOptions, ServerThread  # noqa: E402
from simulator.cli.main import main  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.simulation import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "serve_cpu.yaml"
FLUSH_S = 0.3
NUM_REQUESTS = 24


def buffering_proxy(upstream: str, flush_s: float) -> Any:
    """An HTTP proxy that buffers event streams and forwards them on a fixed flush grid."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=60.0)
    t0 = time.monotonic()

    async def forward(request: Request) -> Response:
        upstream_request = client.build_request(request.method, request.url.path, content=await request.body(),
                                                headers={"content-type": request.headers.get("content-type", "")})
        response = await client.send(upstream_request, stream=True)
        media = response.headers.get("content-type", "")
        if "text/event-stream" not in media:
            content = await response.aread()
            await response.aclose()
            return Response(content, status_code=response.status_code, media_type=media)

        async def flushed() -> AsyncIterator[bytes]:
            held = bytearray()
            done = asyncio.Event()

            async def pump() -> None:
                async for chunk in response.aiter_raw():
                    held.extend(chunk)
                done.set()

            task = asyncio.create_task(pump())
            try:
                while not (done.is_set() and not held):
                    await asyncio.sleep(flush_s - (time.monotonic() - t0) % flush_s)
                    if held:
                        yield bytes(held)
                        held.clear()
            finally:
                task.cancel()
                await response.aclose()

        return StreamingResponse(flushed(), status_code=response.status_code, media_type=media)

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


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


def phase_concentration(run_folder: Path) -> float:
    """How alike the phases of every chunk's arrival on a ``FLUSH_S`` grid are: 1 = all the same, ~0 = spread
    (the length of the mean unit vector of the phases)."""
    import pandas as pd

    sent = pd.read_parquet(run_folder / "requests.parquet")["arrival_s"].to_numpy()
    chunks = pd.read_parquet(run_folder / "chunks.parquet")
    arrivals = sent[chunks["request_id"].to_numpy()] + chunks["since_send_ms"].to_numpy() / 1e3
    return float(abs(np.mean(np.exp(2j * np.pi * arrivals / FLUSH_S))))


def simulated_ttft_ms(flush_ms: float) -> float:
    loaded = load_scenario(SCENARIO, [f"workload.num_requests={NUM_REQUESTS * 8}", "workload.arrival.rate_rps=8",
                                      f"network.flush_interval_ms={flush_ms}"])
    c = run(loaded).variants["base"].requests.columns()
    return float(np.mean(c["first_token_s"] - c["arrival_s"]) * 1e3)


def test_a_buffering_proxy_delays_first_tokens_as_the_model_says(servers: tuple[str, str], tmp_path: Path) -> None:
    direct_url, proxy_url = servers
    direct = bench(direct_url, tmp_path / "direct")
    proxied = bench(proxy_url, tmp_path / "proxied")
    assert direct["completed"] == proxied["completed"] == NUM_REQUESTS
    # The proxy holds SSE events back and lets them through on its flush grid: every arrival at the client
    # has the same phase on that grid (up to the loop's jitter), where direct arrivals have any phase.
    direct_phase, proxied_phase = phase_concentration(tmp_path / "direct"), phase_concentration(tmp_path / "proxied")
    assert direct_phase < 0.5 < 0.9 < proxied_phase
    measured_ms = proxied["mean_ttft_ms"] - direct["mean_ttft_ms"]
    modelled_ms = simulated_ttft_ms(FLUSH_S * 1e3) - simulated_ttft_ms(0.0)
    half = FLUSH_S * 1e3 / 2
    print(f"first-token delay of a {FLUSH_S * 1e3:.0f} ms flush: measured {measured_ms:.1f} ms, "
          f"simulated {modelled_ms:.1f} ms")
    # A first token waits for the next flush: half an interval on average, in the simulator and through
    # the real proxy (24 requests: the mean's spread is about a seventeenth of the interval).
    assert abs(modelled_ms - half) < FLUSH_S * 1e3 / 6, modelled_ms
    assert abs(measured_ms - modelled_ms) < FLUSH_S * 1e3 / 3, (measured_ms, modelled_ms)
