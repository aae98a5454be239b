"""A bench's client-side timings held against the server's own, request by request: what HTTP, the
event loop and SSE framing add on top of the engine.

Joins a bench run folder (``bench.json``'s response ids, ``chunks.parquet``) with the log ``fleetsim serve
--log-dir`` writes (``requests.jsonl``: when each request reached the HTTP handler and when each of its
tokens left an engine step, on the engine's clock). Per request: TTFT as the client saw it (send → first
chunk) against the engine's (handler → first token), the same for E2E, and every inter-token gap at the
client against the same gap in the engine. Durations only, so the two processes' clocks never meet.
Pure arithmetic on files: it runs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


def read_server_log(log_dir: Path) -> dict[int, dict[str, Any]]:
    """``requests.jsonl`` by engine request id."""
    lines = (log_dir / "requests.jsonl").read_text(encoding="utf-8").splitlines()
    return {int(row["request_id"]): row for row in map(json.loads, lines) if row}


def _engine_id(response_id: str | None) -> int | None:
    """fleetsim serve's response ids end in the engine request id (``cmpl-<boot>-<id>``)."""
    if not response_id:
        return None
    tail = response_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _stats(values: np.ndarray) -> dict[str, float | None]:
    if not values.size:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    return {"mean": float(values.mean()), **{f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}}


def client_vs_engine(run_folder: Path, log_dir: Path, *, bench_file: str = "bench.json",
                     chunks_file: str = "chunks.parquet") -> dict[str, Any]:
    """Client minus engine, in ms, for TTFT, E2E and each inter-token gap (with both sides' own figures)."""
    import pandas as pd

    bench = json.loads((run_folder / bench_file).read_text(encoding="utf-8"))
    chunks = pd.read_parquet(run_folder / chunks_file)
    server = read_server_log(log_dir)
    by_request = {int(str(k)): g["since_send_ms"].to_numpy() for k, g in chunks.groupby("request_id")}
    ttft_c: list[float] = []
    ttft_e: list[float] = []
    e2e_c: list[float] = []
    e2e_e: list[float] = []
    gaps_c: list[float] = []
    gaps_e: list[float] = []
    for index, response_id in enumerate(bench["response_ids"]):
        rid = _engine_id(response_id)
        row = server.get(rid) if rid is not None else None
        client = by_request.get(index)
        if row is None or client is None or row["outcome"] != "finish" or len(row["token_s"]) != len(client):
            continue
        token_ms = (np.asarray(row["token_s"]) - row["received_s"]) * 1e3
        ttft_c.append(client[0])
        ttft_e.append(token_ms[0])
        e2e_c.append(client[-1])
        e2e_e.append(token_ms[-1])
        gaps_c.extend(np.diff(client))
        gaps_e.extend(np.diff(token_ms))
    tc, te, ec, ee = map(np.asarray, (ttft_c, ttft_e, e2e_c, e2e_e))
    gc, ge = np.asarray(gaps_c), np.asarray(gaps_e)
    return {
        "num_matched": len(ttft_c),
        "num_requests": len(bench["response_ids"]),
        "ttft_client_ms": _stats(tc), "ttft_engine_ms": _stats(te), "ttft_overhead_ms": _stats(tc - te),
        "e2e_client_ms": _stats(ec), "e2e_engine_ms": _stats(ee), "e2e_overhead_ms": _stats(ec - ee),
        "itl_client_ms": _stats(gc), "itl_engine_ms": _stats(ge), "itl_difference_ms": _stats(gc - ge),
        "itl_abs_difference_ms": _stats(np.abs(gc - ge)),
    }


def format_overhead(o: dict[str, Any]) -> str:
    def row(name: str, key: str) -> str:
        gap = "difference" if key == "itl" else "overhead"
        c, e, d = o[f"{key}_client_ms"], o[f"{key}_engine_ms"], o[f"{key}_{gap}_ms"]
        cells = "  ".join(f"p{q} {c[f'p{q}']:8.2f} {e[f'p{q}']:8.2f} {d[f'p{q}']:+7.2f}" for q in PERCENTILES)
        return f"{name:5s} mean {c['mean']:8.2f} {e['mean']:8.2f} {d['mean']:+7.2f}  {cells}"

    if not o["num_matched"]:
        return "client vs engine: no request matched the server log"
    head = (f"client vs engine, {o['num_matched']} of {o['num_requests']} requests matched "
            "(each cell: client ms, engine ms, client - engine)")
    return "\n".join([head, row("TTFT", "ttft"), row("E2E", "e2e"), row("ITL", "itl")])
