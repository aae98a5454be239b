"""The server's own view during a bench, where it publishes one: Prometheus ``/metrics`` sampled on the
run's grid into a ``ReplicaSeries`` (running, waiting, KV use, prefix-cache hits), so a measured run's
report shows the queue and the KV pool as a simulated one does.

Reads fleetsim serve's metrics and vLLM's and SGLang's names for the same figures (parsed by
``prometheus_client``). A server without ``/metrics`` just has no series.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from simulator.results.series import ReplicaSeries

KV_SCALE = 10_000
"""A server that reports KV use as a share only: it is recorded as blocks out of this many."""

NAMES: Mapping[str, tuple[str, ...]] = {
    "running": ("fleetsim:num_requests_running", "vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("fleetsim:num_requests_waiting", "vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_used_blocks": ("fleetsim:kv_cache_used_blocks",),
    "kv_total_blocks": ("fleetsim:kv_cache_total_blocks",),
    "kv_frac": ("fleetsim:kv_cache_usage_perc", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                "sglang:token_usage"),
    "prefix_hits": ("fleetsim:prefix_cache_hits", "vllm:prefix_cache_hits"),
    "prefix_queries": ("fleetsim:prefix_cache_queries", "vllm:prefix_cache_queries"),
}
"""Figure -> metric family names that carry it, first found wins (counters without their _total)."""


def parse_metrics(text: str) -> dict[str, float]:
    """The figures of ``NAMES`` found in a Prometheus text page, summed over label sets."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket", "_count", "_sum")):
                continue
            name = sample.name.removesuffix("_total")
            totals[name] = totals.get(name, 0.0) + sample.value
    out: dict[str, float] = {}
    for figure, names in NAMES.items():
        for name in names:
            if name in totals:
                out[figure] = totals[name]
                break
    return out


class MetricsSampler:
    """Samples ``/metrics`` every ``interval_s`` into a series until stopped."""

    def __init__(self, client: httpx.AsyncClient, clock0: float, interval_s: float) -> None:
        self._client = client
        self._clock0 = clock0
        self.series = ReplicaSeries(0, interval_s)
        self._interval_s = interval_s
        self._base: dict[str, float] | None = None
        self.num_samples = 0

    async def available(self) -> bool:
        try:
            response = await self._client.get("/metrics")
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        figures = parse_metrics(response.text)
        self._base = figures
        return "running" in figures

    async def run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self._interval_s)

    async def sample(self) -> None:
        try:
            response = await self._client.get("/metrics")
        except httpx.HTTPError:
            return
        if response.status_code != 200:
            return
        f = parse_metrics(response.text)
        base = self._base or {}
        if "kv_used_blocks" in f and "kv_total_blocks" in f:
            used, total = int(f["kv_used_blocks"]), int(f["kv_total_blocks"])
        elif "kv_frac" in f and math.isfinite(f["kv_frac"]):
            used, total = round(f["kv_frac"] * KV_SCALE), KV_SCALE
        else:
            used, total = 0, 0
        hits = int(f.get("prefix_hits", 0) - base.get("prefix_hits", 0))
        queries = int(f.get("prefix_queries", 0) - base.get("prefix_queries", 0))
        self.series.maybe_sample(time.perf_counter() - self._clock0, int(f.get("running", 0)),
                                 int(f.get("waiting", 0)), used, total, hits, queries)
        self.num_samples += 1
