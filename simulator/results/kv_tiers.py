"""KV tiers' figures of a run: hits per tier, bytes moved per tier, load vs recompute decisions, TTFT split
into queue / load / compute, hit rate per tier over time; and the unbounded-cache ideal hit rate.

Data only (the report plots ``TierFigures.rate_series``). Never imports simpy or the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.core.kv_tiers import KVTiers
from simulator.results.request_log import RequestLog
from simulator.results.summary import Summary, round_sig


def ideal_hit_rate(block_hashes: Iterable[Sequence[int]], prompt_tokens: Iterable[int], block_size: int) -> float:
    """The prefix hit rate of an unbounded cache shared by everyone: requests in arrival order, each hitting
    the longest prefix of its block hashes that any earlier request had (capped, as the engine's lookup,
    at whole blocks before its last prompt token), then adding all of its own. Prompt tokens hit / prompt
    tokens."""
    seen: set[int] = set()
    hit = 0
    total = 0
    for hashes, prompt in zip(block_hashes, prompt_tokens, strict=True):
        cap = min(len(hashes), (int(prompt) - 1) // block_size)
        n = 0
        while n < cap and hashes[n] in seen:
            n += 1
        hit += n * block_size
        total += int(prompt)
        seen.update(hashes)
    return hit / total if total else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TierReplica:
    """One replica's tiers as its run left them, with its hit samples over time."""

    tiers: KVTiers
    device_hit_tokens: int
    lookup_tokens: int
    block_bytes: int
    times_s: list[float]
    hit_tokens: list[list[int]]
    """Cumulative [device, tier 0, ...] hit tokens at each of ``times_s``."""
    lookup_samples: list[int]


@dataclass(frozen=True, slots=True, kw_only=True)
class TierFigures:
    """A variant's KV-tier figures (the ``kv_tiers`` section of summary.json)."""

    names: list[str]
    hit_rate: dict[str, float]
    """Prompt tokens served per place (``device`` and each tier) / prompt tokens looked up; ``total``."""
    read_bytes: dict[str, int]
    """Per tier: bytes loaded into GPU memory (re-admissions included)."""
    written_bytes: dict[str, int]
    """Per tier: bytes stored into it."""
    write_busy: dict[str, float]
    """Per tier: the share of the run its write links spent writing (bytes / (write bandwidth x GPUs x
    duration)). Writes are not charged to steps (they leave asynchronously); above 1 the links could not
    have kept up, and the run is optimistic."""
    num_loads: int
    num_recomputes: int
    num_recomputed_blocks: int
    num_device_evictions: int
    num_dropped: int
    ttft_split_ms: dict[str, float]
    """Mean over completed measured requests: queue, load, compute (TTFT = their sum)."""
    usd_per_hour: float
    """What the tiers' capacity costs an hour (their ``usd_per_gib_hour``; 0 when not priced)."""
    cost_per_mtok_usd: float
    """The GPUs' and the tiers' cost per million output tokens (the summary's counts only the GPUs)."""
    rate_series: dict[str, list[float]]
    """``time_s`` and, per place, the hit rate of the prompts admitted in each interval (for the report)."""
    load_s: dict[int, float]
    """Request id -> seconds its loads from tiers added to its steps (the requests table's ``load_ms``)."""

    def load_ms(self, request_ids: np.ndarray) -> np.ndarray:
        """Each request's load milliseconds (0 for none), in the order of ``request_ids``."""
        load = self.load_s
        return np.array([load.get(int(rid), 0.0) * 1e3 for rid in request_ids], dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tiers": self.names,
            "hit_rate": {k: round_sig(v) for k, v in self.hit_rate.items()},
            "read_bytes": self.read_bytes,
            "written_bytes": self.written_bytes,
            "write_busy": {k: round_sig(v) for k, v in self.write_busy.items()},
            "num_loads": self.num_loads,
            "num_recomputes": self.num_recomputes,
            "num_recomputed_blocks": self.num_recomputed_blocks,
            "num_device_evictions": self.num_device_evictions,
            "num_dropped": self.num_dropped,
            "ttft_split_ms": {k: round_sig(v) for k, v in self.ttft_split_ms.items()},
            "usd_per_hour": round_sig(self.usd_per_hour),
            "cost_per_mtok_usd": round_sig(self.cost_per_mtok_usd),
        }


def tier_figures(names: list[str], replicas: Sequence[TierReplica], load_s: dict[int, float], log: RequestLog,
                 summary: Summary, *, usd_per_hour: float, write_Bps: Sequence[float], warmup_s: float,
                 end_s: float, num_points: int = 40) -> TierFigures:
    """``write_Bps``: each tier's write bandwidth over the whole fleet (per GPU x GPUs)."""
    num_tiers = len(names)
    hit_blocks = [0] * num_tiers
    read = [0] * num_tiers
    written = [0] * num_tiers
    loads = recomputes = recomputed = evictions = dropped = 0
    device = lookups = 0
    seen_shared: set[int] = set()
    for rep in replicas:
        counters = rep.tiers.counters
        bs = rep.tiers.block_size
        device += rep.device_hit_tokens
        lookups += rep.lookup_tokens
        loads += counters.num_loads
        recomputes += counters.num_recomputes
        recomputed += counters.num_recomputed_blocks
        evictions += counters.num_device_evictions
        dropped += counters.num_dropped
        for i, store in enumerate(rep.tiers.stores):
            hit_blocks[i] += counters.num_hit_blocks[i] * bs
            read[i] += counters.num_read_blocks[i] * rep.block_bytes
            if store.shared:
                if id(store) in seen_shared:
                    continue
                seen_shared.add(id(store))
            written[i] += store.num_stored * rep.block_bytes
    rate = {"device": device / lookups if lookups else 0.0}
    for name, tokens in zip(names, hit_blocks, strict=True):
        rate[name] = tokens / lookups if lookups else 0.0
    rate["total"] = (device + sum(hit_blocks)) / lookups if lookups else 0.0
    return TierFigures(
        names=names, hit_rate=rate, read_bytes=dict(zip(names, read, strict=True)),
        written_bytes=dict(zip(names, written, strict=True)),
        write_busy={name: w / (bw * end_s) for name, w, bw in zip(names, written, write_Bps, strict=True)},
        num_loads=loads, num_recomputes=recomputes,
        num_recomputed_blocks=recomputed, num_device_evictions=evictions, num_dropped=dropped,
        ttft_split_ms=ttft_split_ms(log, load_s, warmup_s=warmup_s),
        usd_per_hour=usd_per_hour, cost_per_mtok_usd=cost_per_mtok_usd(summary, usd_per_hour),
        rate_series=_rate_series(names, replicas, end_s=end_s, num_points=num_points), load_s=dict(load_s),
    )


def cost_per_mtok_usd(summary: Summary, tier_usd_per_hour: float) -> float:
    """The summary's GPU cost per million output tokens with the tiers' hourly cost over the same duration."""
    if summary.output_tokens <= 0:
        return math.nan
    gpu_usd = summary.gpu_hours * summary.usd_per_gpu_hour
    return (gpu_usd + tier_usd_per_hour * summary.duration_s / 3600.0) / (summary.output_tokens / 1e6)


def ttft_split_ms(log: RequestLog, load_s: dict[int, float], *, warmup_s: float) -> dict[str, float]:
    """Mean queue, load and compute milliseconds of the TTFT of completed requests arrived after warm-up."""
    c = log.columns()
    arrival, scheduled, first = c["arrival_s"], c["first_scheduled_s"], c["first_token_s"]
    done = np.isfinite(first) & np.isfinite(scheduled) & (arrival >= warmup_s)
    if not done.any():
        return {"queue": 0.0, "load": 0.0, "compute": 0.0}
    ids = np.flatnonzero(done)
    queue = scheduled[ids] - arrival[ids]
    load = np.array([load_s.get(int(i), 0.0) for i in ids])
    compute = first[ids] - scheduled[ids] - load
    return {"queue": float(queue.mean() * 1e3), "load": float(load.mean() * 1e3),
            "compute": float(compute.mean() * 1e3)}


def _rate_series(names: list[str], replicas: Sequence[TierReplica], *, end_s: float,
                 num_points: int) -> dict[str, list[float]]:
    """Hit rate per place of the prompts admitted in each of ``num_points`` intervals, fleet-wide."""
    grid = np.linspace(0.0, end_s, num_points + 1)
    places = ["device", *names]
    hits = np.zeros((num_points + 1, len(places)))
    lookups = np.zeros(num_points + 1)
    for rep in replicas:
        if not rep.times_s:
            continue
        times = np.asarray(rep.times_s)
        samples = np.asarray(rep.hit_tokens, dtype=float)
        looked = np.asarray(rep.lookup_samples, dtype=float)
        at = np.searchsorted(times, grid, side="right") - 1  # the last sample at or before each grid point
        valid = at >= 0
        hits[valid] += samples[at[valid]]
        lookups[valid] += looked[at[valid]]
    d_hits = np.diff(hits, axis=0)
    d_lookups = np.diff(lookups)
    out: dict[str, list[float]] = {"time_s": [float(t) for t in grid[1:]]}
    with np.errstate(invalid="ignore", divide="ignore"):
        for j, place in enumerate(places):
            out[place] = [float(v) if np.isfinite(v) else float("nan") for v in d_hits[:, j] / d_lookups]
    return out
