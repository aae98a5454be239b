"""A buffering HTTP proxy, as some deployments put between clients and an inference server (Go's
ReverseProxy FlushInterval, Caddy's flush_interval): event streams are held and forwarded on a fixed flush
grid. In front of ``fleetsim serve`` it checks the simulator's ``network.flush_interval_ms`` against a real
client's view (``benchmarks/proxy_flush.py``, ``tests/calibration/endpoint/test_buffering_proxy.py``); run it
with ``calibration.serve.server.AppThread``. Needs the ``serve`` extra.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np


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


def chunk_arrivals_s(run_folder: Path) -> np.ndarray:
    """When each SSE chunk of a ``fleetsim bench`` run folder reached the client, on the bench's clock."""
    import pandas as pd

    sent = pd.read_parquet(run_folder / "requests.parquet")["arrival_s"].to_numpy()
    chunks = pd.read_parquet(run_folder / "chunks.parquet")
    return np.asarray(sent[chunks["request_id"].to_numpy()] + chunks["since_send_ms"].to_numpy() / 1e3)


def phase_concentration(arrival_s: np.ndarray, flush_s: float) -> float:
    """How alike the phases of arrival times on a ``flush_s`` grid are: 1 = all the same (they left a
    flushing proxy), ~0 = spread (the length of the mean unit vector of the phases)."""
    return float(abs(np.mean(np.exp(2j * np.pi * np.asarray(arrival_s) / flush_s))))


def phase_spread(arrival_s: np.ndarray, flush_s: float) -> float:
    """How far arrival times on a ``flush_s`` grid stray from their common phase, robustly: the median
    distance of a phase from the circular mean phase, as a fraction of the grid (0 = all the same, about
    0.25 = spread evenly). Unlike ``phase_concentration`` it ignores a minority of late arrivals (an event
    loop held up on a loaded machine), which would otherwise each count as a random phase."""
    phases = np.exp(2j * np.pi * np.asarray(arrival_s, dtype=float) / flush_s)
    centre = np.mean(phases)
    deviation = np.angle(phases * np.conj(centre)) if abs(centre) > 0 else np.angle(phases)
    return float(np.median(np.abs(deviation)) / (2 * np.pi))
