"""``fleetsim calibrate --endpoint``: fit a profile to a live server from its clients' timings alone.

The probe schedule, designed so each probe isolates one step shape:

- **Prefill** — one request at a time on an idle server, prompts of ``PROMPT_GRID`` tokens (up to the
  server's limits), two output tokens, ``repeats`` times each: TTFT(P) is one prefill step of P tokens
  plus the HTTP path.
- **Decode** — ``B`` requests sent together for each batch size of ``BATCH_GRID`` and each prompt length
  of ``CONTEXT_GRID``: inside the window where every one of them is streaming (after the last one's first
  token, before the first one's last), every inter-token gap is one decode step of ``B`` sequences at
  the streams' context, so their median is that step's time.
- **HTTP path** — the median TTFT of the shortest prompt less the median single-stream ITL: what a
  request's trip adds beyond a step, taken off every prefill probe before the fit and stored as the
  profile's ``streaming.latency_ms`` (with the tokens per SSE event the probes saw), which a scenario
  takes with ``network.latency_ms: profile``.

The points become step-timing rows and go through the engine calibration's own fitter
(``calibration.fit.fit_timings``: the §4.3 form, relative least squares, k-fold held-out error), so the
profile is one the simulator loads like any measured one; its provenance says it was fitted black-box.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from calibration.endpoint.bench import BenchOptions, discover_model
from calibration.endpoint.client import Api, StreamRecord, request_body, stream_request
from calibration.endpoint.schedule import PROMPT_ID_RANGE
from simulator.errors import ConfigError

PROMPT_GRID = (16, 64, 128, 256, 384, 512)
BATCH_GRID = (1, 2, 4, 8, 16, 32, 48, 64)
CONTEXT_GRID = (32, 512)
DECODE_TOKENS = 48
"""Output tokens of each decode probe's requests: long enough for a steady window."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbePlan:
    prompts: tuple[int, ...] = PROMPT_GRID
    batches: tuple[int, ...] = BATCH_GRID
    contexts: tuple[int, ...] = CONTEXT_GRID
    repeats: int = 3
    decode_tokens: int = DECODE_TOKENS
    seed: int = 0


@dataclass(slots=True)
class ProbeResults:
    prefill: list[tuple[int, float]] = field(default_factory=list)
    """(prompt tokens, TTFT s) per probe."""
    decode: list[tuple[int, float, float]] = field(default_factory=list)
    """(batch, decode context sum, median steady ITL s) per probe."""
    failures: list[str] = field(default_factory=list)
    num_tokens: int = 0
    """Output tokens of the decode probes' streams (the server's count)."""
    num_chunks: int = 0
    """SSE events those tokens came in."""

    @property
    def tokens_per_chunk(self) -> float:
        """Mean tokens per SSE event over the decode probes (1 when none was measured)."""
        return max(self.num_tokens / self.num_chunks, 1.0) if self.num_chunks else 1.0


def _prompt(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(0, PROMPT_ID_RANGE, size=n)]


async def _probe(options: BenchOptions, plan: ProbePlan, progress: bool) -> tuple[str, ProbeResults, int | None]:
    rng = np.random.default_rng(plan.seed)  # distinct prompts: no prefix-cache hit between probes
    results = ProbeResults()
    timeout = httpx.Timeout(options.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(base_url=options.base_url, timeout=timeout) as client:
        model = options.model or await discover_model(client, options.base_url)
        kv_blocks = await _kv_blocks(client)
        clock0 = time.perf_counter()

        async def send(prompt_tokens: int, max_tokens: int, index: int) -> StreamRecord:
            record = StreamRecord(index, 0.0, prompt_tokens, max_tokens)
            body = request_body(Api.COMPLETIONS, model, _prompt(rng, prompt_tokens), max_tokens, ignore_eos=True)
            await stream_request(client, Api.COMPLETIONS, body, record, clock0)
            return record

        total = len(plan.prompts) * plan.repeats + len(plan.batches) * len(plan.contexts)
        done = 0
        for _ in range(plan.repeats):
            for p in plan.prompts:
                record = await send(p, 2, 0)
                if record.ok:
                    results.prefill.append((p, record.chunk_s[0] - record.sent_s))
                else:
                    results.failures.append(f"prefill {p}: {record.error}")
                done += 1
                _tick(progress, done, total)
        for c in plan.contexts:
            for b in plan.batches:
                records = await asyncio.gather(*(send(c, plan.decode_tokens, i) for i in range(b)))
                for record in records:
                    if record.ok:
                        results.num_tokens += record.output_tokens
                        results.num_chunks += len(record.chunk_s)
                step = steady_step(records)
                if step is None:
                    results.failures.append(f"decode batch {b} context {c}: no steady window")
                else:
                    results.decode.append((b, step[1], step[0]))
                done += 1
                _tick(progress, done, total)
    return model, results, kv_blocks


async def _kv_blocks(client: httpx.AsyncClient) -> int | None:
    """The server's KV pool in blocks, when its /metrics says (fleetsim serve does)."""
    from calibration.endpoint.scrape import parse_metrics

    try:
        response = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    blocks = parse_metrics(response.text).get("kv_total_blocks")
    return int(blocks) if blocks else None


def _tick(progress: bool, done: int, total: int) -> None:
    if progress:
        print(f"\rprobes {done}/{total}", end="" if done < total else "\n", flush=True)


def steady_step(records: list[StreamRecord]) -> tuple[float, float] | None:
    """(median gap, context sum at the window's middle) over the window where every stream is decoding."""
    if not records or not all(r.ok and len(r.chunk_s) > 2 for r in records):
        return None
    start = max(r.chunk_s[0] for r in records)
    end = min(r.chunk_s[-1] for r in records)
    gaps = [b - a for r in records for a, b in zip(r.chunk_s, r.chunk_s[1:], strict=False) if a >= start and b <= end]
    if len(gaps) < len(records):
        return None
    middle = (start + end) / 2
    context = sum(r.prompt_tokens + sum(1 for t in r.chunk_s if t <= middle) for r in records)
    return float(np.median(gaps)), float(context)


def timing_rows(results: ProbeResults, overhead_s: float) -> Any:
    """The probes as the engine calibration's step-timing table (one row per step shape)."""
    import pandas as pd

    rows = []
    for p, ttft in results.prefill:
        rows.append({"num_seqs": 1, "num_new_tokens": p, "num_decode_seqs": 0, "decode_context_sum": 0,
                     "num_prefill_tokens": p, "prefill_attention_pairs": p * p / 2.0,
                     "device_s": max(ttft - overhead_s, 1e-6)})
    for b, ctx, itl in results.decode:
        rows.append({"num_seqs": b, "num_new_tokens": b, "num_decode_seqs": b, "decode_context_sum": ctx,
                     "num_prefill_tokens": 0, "prefill_attention_pairs": 0.0, "device_s": itl})
    return pd.DataFrame(rows)


def http_overhead_s(results: ProbeResults) -> float:
    """Median TTFT of the shortest prompt less the median single-stream step: the request's trip."""
    if not results.prefill or not results.decode:
        return 0.0
    shortest = min(p for p, _ in results.prefill)
    ttft = float(np.median([t for p, t in results.prefill if p == shortest]))
    single = [itl for b, _, itl in results.decode if b == 1]
    return max(ttft - float(np.median(single)), 0.0) if single else 0.0


@dataclass(frozen=True, slots=True)
class BlackBoxFit:
    profile: Any
    overhead_s: float
    results: ProbeResults
    path: Path


def calibrate_endpoint(options: BenchOptions, *, out: Path, like: str | None, hardware: str, dtype: str,
                       kv_capacity_tokens: int | None, block_size: int = 16, plan: ProbePlan = ProbePlan(),
                       folds: int = 5) -> BlackBoxFit:
    """Probe, fit, write the profile YAML (and the probe table beside it as CSV)."""
    from calibration.engine.configs import get_model
    from calibration.fit import fit_timings
    from calibration.profiler import git_revision
    from simulator.cost.profile import MemoryFigures, Provenance, StreamingFigures

    if out.suffix not in (".yaml", ".yml"):
        raise ConfigError("--out must name a .yaml file", field="out")
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}.get(dtype)
    if dtype_bytes is None:
        raise ConfigError(f"unknown dtype {dtype!r}; choose float32, bfloat16, float16 or fp8", field="dtype")
    model, results, kv_blocks = asyncio.run(_probe(options, plan, options.progress))
    if kv_capacity_tokens is None and kv_blocks is not None:
        kv_capacity_tokens = kv_blocks * block_size
    shape_name = like or model
    try:
        shape = get_model(shape_name)
    except ValueError:
        raise ConfigError(f"the served model {shape_name!r} is not in the catalogue: give --like MODEL for its "
                          "KV size", field="like") from None
    if len(results.prefill) < 3 or len(results.decode) < 3:
        raise ConfigError(f"too few probes succeeded to fit ({'; '.join(results.failures[:3])})")
    overhead = http_overhead_s(results)
    rows = timing_rows(results, overhead)
    fit = fit_timings(rows, num_folds=folds, seed=plan.seed, multi_token=True)
    kv_per_token = shape.kv_bytes_per_token(dtype_bytes)
    capacity = kv_capacity_tokens if kv_capacity_tokens is not None else 0
    weights = shape.num_params * dtype_bytes
    memory = MemoryFigures(kv_bytes_per_token=kv_per_token, kv_capacity_tokens=capacity, weight_bytes=weights,
                           device_memory_bytes=max(weights + capacity * kv_per_token, 1), memory_fraction=1.0)
    source = (f"Black-box: fitted to client-side timings of {model} at {options.base_url} by fleetsim calibrate "
              f"--endpoint ({len(results.prefill)} prefill probes: TTFT of one request at a time, prompts "
              f"{list(plan.prompts)}; {len(results.decode)} decode probes: median steady inter-token gap of B "
              f"streams, B in {list(plan.batches)}, prompts {list(plan.contexts)}); HTTP path "
              f"{overhead * 1e3:.2f} ms taken off TTFT; host overhead is inside the device terms; KV size from "
              f"the catalogue shape {shape.name}; KV capacity {capacity} tokens "
              f"({'from the server or --kv-capacity-tokens' if capacity else 'unknown'}); host link unmeasured")
    name = out.stem
    profile = fit.to_profile(
        name=name, hardware=hardware, model=shape.name, tp=1, memory=memory, host_link_Bps=1e10, dtype=dtype,
        provenance=Provenance(device_name=f"endpoint {options.base_url}", date=datetime.date.today().isoformat(),
                              git_revision=git_revision(), source=source),
    )
    streaming = StreamingFigures(latency_ms=overhead * 1e3, tokens_per_chunk=results.tokens_per_chunk,
                                 source=f"calibrate --endpoint {options.base_url}, {datetime.date.today()}")
    profile = profile.model_copy(update={"streaming": streaming})
    out.parent.mkdir(parents=True, exist_ok=True)
    rows.assign(held_out_s=fit.held_out_s).to_csv(out.with_suffix(".probes.csv"), index=False)
    profile.save(out)
    return BlackBoxFit(profile=profile, overhead_s=overhead, results=results, path=out)


def print_fit(fit: BlackBoxFit) -> None:
    err = fit.profile.fit_error
    print(f"profile  {fit.path}  ({fit.profile.label})")
    print(f"held-out MAPE {err.mape:.2%}  max {err.max_error:.2%}  R² {err.r2:.4f}  "
          f"({err.num_points} probes, {err.num_folds} folds)")
    print(f"HTTP path {fit.overhead_s * 1e3:.2f} ms, stored as the profile's streaming.latency_ms: a scenario "
          "takes it with network.latency_ms: profile")
    for failure in fit.results.failures[:5]:
        print(f"skipped  {failure}")
