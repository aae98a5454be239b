"""``fleetsim bench``: replay a request stream in real time against an OpenAI-compatible endpoint and
record what its client sees, as a run folder ``fleetsim run`` would write.

Requests are sent at their arrival times (at most ``max_concurrency`` in flight when set: later ones wait,
as in vLLM's benchmark), each stream is read to its end (``client``), and the run stops sending at
``max_duration_s`` and gives up on streams still open a grace period later. The records become the
simulator's own ``RequestLog`` (arrival = when sent, first token = first text chunk, finish = last text
chunk: vLLM's TTFT and E2E), a ``Summary`` and a ``RunResult`` variant named ``measured`` — so
``requests.parquet``, ``summary.json`` and ``report.html`` read exactly like a simulated run's — plus
``bench.json`` with vLLM's serving-benchmark figures (TTFT, TPOT, ITL, E2EL) and ``chunks.parquet``, one
row per text chunk.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from calibration.endpoint.client import Api, StreamRecord, request_body, stream_request
from calibration.endpoint.schedule import BenchRequest
from calibration.endpoint.scrape import MetricsSampler
from simulator.errors import ConfigError
from simulator.results.request_log import RequestLog
from simulator.results.run_result import ProfileInfo, VariantResult
from simulator.results.series import ReplicaSeries, fleet_kv_util_mean, fleet_running_mean
from simulator.results.summary import SLO, summarize

GRACE_S = 30.0
"""After ``max_duration_s``, streams still open get this long to finish before they are cut."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    """How to drive the endpoint."""

    endpoint: str
    """Base URL of the server (``http://host:port``; a trailing ``/v1`` is accepted)."""
    model: str | None = None
    """The ``model`` field of every request; None = the first one ``/v1/models`` lists."""
    api: Api = Api.COMPLETIONS
    max_concurrency: int | None = None
    """Most requests in flight; None = no limit (every request is sent at its arrival time)."""
    max_duration_s: float = 600.0
    """Send nothing after this many seconds; open streams get ``GRACE_S`` more."""
    ignore_eos: bool = True
    """Ask for exactly the workload's output lengths (vLLM's ``ignore_eos``)."""
    request_timeout_s: float = 300.0
    """Longest silence on one stream before it counts as failed."""
    sample_interval_s: float = 1.0
    """Grid of the server-metrics series (when the server has ``/metrics``)."""
    progress: bool = True

    @property
    def base_url(self) -> str:
        url = self.endpoint.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(slots=True)
class BenchRun:
    """What one bench recorded."""

    options: BenchOptions
    model: str
    records: list[StreamRecord]
    """One per request of the workload, in arrival order; unsent ones have no ``sent_s``."""
    end_s: float
    """Bench clock when the last stream ended (or was cut)."""
    series: list[ReplicaSeries] = field(default_factory=list)
    """The server's metrics, sampled (empty when it publishes none)."""


def run_bench(requests: list[BenchRequest], options: BenchOptions) -> BenchRun:
    """Replay ``requests`` against the endpoint (blocking) and return what the client saw."""
    if not requests:
        raise ConfigError("nothing to send: the workload is empty")
    if options.max_concurrency is not None and options.max_concurrency < 1:
        raise ConfigError("--max-concurrency must be >= 1", field="max_concurrency")
    if not options.max_duration_s > 0:
        raise ConfigError("--max-duration must be > 0", field="max_duration")
    return asyncio.run(_run(requests, options))


async def _run(requests: list[BenchRequest], options: BenchOptions) -> BenchRun:
    limits = httpx.Limits(max_connections=options.max_concurrency, max_keepalive_connections=options.max_concurrency)
    timeout = httpx.Timeout(options.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(base_url=options.base_url, timeout=timeout, limits=limits) as client:
        model = options.model or await discover_model(client, options.base_url)
        clock0 = time.perf_counter()
        sampler = MetricsSampler(client, clock0, options.sample_interval_s)
        sampling = asyncio.create_task(sampler.run()) if await sampler.available() else None
        records = [StreamRecord(r.index, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests]
        bar = _bar(len(requests), options.progress)
        gate = asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None

        async def one(request: BenchRequest, record: StreamRecord) -> None:
            body = request_body(options.api, model, request.prompt, request.output_tokens,
                                ignore_eos=options.ignore_eos)
            if gate is None:
                await stream_request(client, options.api, body, record, clock0)
            else:
                async with gate:
                    await stream_request(client, options.api, body, record, clock0)
            if bar is not None:
                bar.update(1)

        tasks: list[asyncio.Task[None]] = []
        try:
            for request, record in zip(requests, records, strict=True):
                delay = request.arrival_s - (time.perf_counter() - clock0)
                if request.arrival_s >= options.max_duration_s:
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(request, record)))
            if tasks:
                left = options.max_duration_s + GRACE_S - (time.perf_counter() - clock0)
                _done, pending = await asyncio.wait(tasks, timeout=max(left, 0.0))
                for task in pending:
                    task.cancel()
                for record in records[: len(tasks)]:
                    if not record.finished and record.error is None:
                        record.error = "cut: still streaming at --max-duration plus the grace period"
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            end_s = time.perf_counter() - clock0
            if sampling is not None:
                sampling.cancel()
                await asyncio.gather(sampling, return_exceptions=True)
                await sampler.sample()
            if bar is not None:
                bar.close()
        series = [sampler.series] if sampling is not None else []
        for s in series:
            s.close(end_s)
        return BenchRun(options=options, model=model, records=records, end_s=end_s, series=series)


async def discover_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model the server lists (one line of error when there is no server, or no list)."""
    try:
        response = await client.get("/v1/models")
    except httpx.HTTPError as err:
        raise ConfigError(f"no OpenAI-compatible server at {url}: {type(err).__name__}: {err}") from None
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigError(f"{url}/v1/models lists no model (HTTP {response.status_code}); give --model") from None


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="req", file=sys.stderr, mininterval=0.5)


# ----- the records as the simulator's results ------------------------------------------------------------


def request_log(run: BenchRun) -> RequestLog:
    """The records as a ``RequestLog``: request i arrived when it was sent; its first token at its first
    text chunk, its finish at its last; an HTTP error is a rejection; a broken or cut stream stays in
    flight (never finished). Unsent requests did not arrive."""
    sent = [r for r in run.records if not math.isnan(r.sent_s)]
    log = RequestLog(len(sent))
    for i, record in enumerate(sent):
        output = record.output_tokens if record.ok else record.max_tokens
        log.on_arrival(i, record.sent_s, record.prompt_tokens, output, None)
        if (record.status is not None and record.status != 200) or (record.status is None and not record.chunk_s):
            log.on_rejected(i, record.sent_s)
            continue
        if record.chunk_s:
            log.on_first_token(i, record.chunk_s[0])
        if record.ok:
            log.on_finish(i, record.chunk_s[-1], 0, 0, record.output_tokens)
    log.record_produced({})  # the server's streams are over: the unfinished ones count no tokens
    return log


def measured_variant(run: BenchRun, *, name: str = "measured", slo: SLO | None = None) -> VariantResult:
    """The bench as one variant of a ``RunResult`` (a measurement: no cost model, no price)."""
    log = request_log(run)
    series = run.series
    sent = [r.sent_s for r in run.records if not math.isnan(r.sent_s)]
    hits = sum(int(s.columns()["prefix_hit_tokens_cum"][-1]) for s in series if len(s))
    lookups = sum(int(s.columns()["prompt_tokens_cum"][-1]) for s in series if len(s))
    summary = summarize(
        log, duration_s=max(run.end_s, max(sent, default=0.0), 1e-9), slo=slo, num_gpus=1, usd_per_gpu_hour=None,
        kv_util_mean=fleet_kv_util_mean(series) if series else math.nan,
        prefix_hit_rate=hits / lookups if lookups else math.nan, preemptions=0,
        running_mean=fleet_running_mean(series) if series else math.nan,
        running_peak=max((s.peak_running for s in series), default=0),
    )
    label = f"measured: {run.model} at {run.options.base_url}, as its client saw it (fleetsim bench)"
    return VariantResult(name=name, requests=log, series=series, summary=summary,
                         profile=ProfileInfo(name=f"endpoint {run.options.base_url}", kind="measured", label=label))


# ----- vLLM's serving-benchmark figures ---------------------------------------------------------------------


PERCENTILES = (50, 90, 99)


def bench_metrics(run: BenchRun) -> dict[str, Any]:
    """The figures of vLLM's ``benchmark_serving`` under its names: TTFT (first text chunk − send), TPOT
    ((E2EL − TTFT) / (output tokens − 1), requests of more than one token), ITL (every gap between text
    chunks, pooled), E2EL (last text chunk − send); throughputs over the run's duration. Plus how the
    stream was chunked, which the simulator's delivery model needs."""
    done = [r for r in run.records if r.ok]
    sent = [r for r in run.records if not math.isnan(r.sent_s)]
    ttft = np.array([(r.chunk_s[0] - r.sent_s) * 1e3 for r in done])
    e2el = np.array([(r.chunk_s[-1] - r.sent_s) * 1e3 for r in done])
    tpot = np.array([(e - t) / (r.output_tokens - 1) for r, t, e in zip(done, ttft, e2el, strict=True)
                     if r.output_tokens > 1])
    itl = np.array([gap * 1e3 for r in done for gap in np.diff(r.chunk_s)])
    duration = max(run.end_s, 1e-9)
    input_tokens = sum(r.usage_prompt_tokens or r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    out: dict[str, Any] = {
        "endpoint": run.options.base_url, "model": run.model, "api": run.options.api.value,
        "max_concurrency": run.options.max_concurrency,
        "num_prompts": len(run.records), "num_sent": len(sent), "completed": len(done),
        "failed": len(sent) - len(done),
        "duration": duration, "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration, "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "max_in_flight": _max_in_flight(sent),
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        out[f"mean_{name}_ms"] = float(values.mean()) if values.size else None
        out[f"median_{name}_ms"] = float(np.median(values)) if values.size else None
        out[f"std_{name}_ms"] = float(values.std()) if values.size else None
        for q in PERCENTILES:
            out[f"p{q}_{name}_ms"] = float(np.percentile(values, q)) if values.size else None
    chunks = sum(len(r.chunk_s) for r in done)
    out["mean_tokens_per_chunk"] = output_tokens / chunks if chunks else None
    out["usage_reported"] = all(r.usage_output_tokens is not None for r in done) if done else None
    out["errors"] = sorted({r.error for r in sent if r.error})[:20]
    out["response_ids"] = [r.response_id for r in run.records]
    return out


def _max_in_flight(records: list[StreamRecord]) -> int:
    """Most streams open at once (sent, last chunk not yet arrived)."""
    events = sorted([(r.sent_s, 1) for r in records] + [(r.chunk_s[-1] if r.chunk_s else r.sent_s, -1)
                                                        for r in records])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def chunks_frame(run: BenchRun) -> Any:
    """One row per text chunk: request, its index in the stream, arrival since send (ms), characters."""
    import pandas as pd

    rows = [(r.index, j, (t - r.sent_s) * 1e3, c) for r in run.records for j, (t, c) in
            enumerate(zip(r.chunk_s, r.chunk_chars, strict=True))]
    return pd.DataFrame(rows, columns=["request_id", "chunk", "since_send_ms", "chars"])
