"""The hand-offs of a disaggregated fleet: per request, where its prefill ran, when its decode blocks were
reserved, when its first token was computed, and when its KV was on the wire and landed; and the figures a
run reports from them.

Columns are numpy arrays indexed by request id (NaN / -1 until the event happened), written once per
request by the fleet's hand-off coordinator (``simulator.fleet.disaggregation``). Never imports simpy or
the fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from simulator.results.percentiles import percentile

HANDOFF_COLUMNS = ("prefill_replica", "reserved_s", "prefilled_s", "transfer_start_s", "landed_s", "sent_tokens",
                   "hit_tokens", "sent_bytes")
"""Names of the columns of a HandoffLog, in order."""


class HandoffLog:
    """Per-request hand-off columns (request ids 0..n-1; a request that needed no decode worker, or never
    got as far, keeps NaN / -1 where it did not go)."""

    def __init__(self, capacity: int) -> None:
        n = max(int(capacity), 1)
        self.prefill_replica = np.full(n, -1, dtype=np.int32)
        """The prefill worker's replica id (the request log's ``replica`` is its decode worker's)."""
        self.reserved_s = np.full(n, np.nan)
        """When the decode worker reserved the request's blocks (its prefill could start then)."""
        self.prefilled_s = np.full(n, np.nan)
        """When the prefill worker produced the first token."""
        self.transfer_start_s = np.full(n, np.nan)
        """When the link began carrying the request's KV."""
        self.landed_s = np.full(n, np.nan)
        """When the KV had landed in the decode worker's blocks."""
        self.sent_tokens = np.zeros(n, dtype=np.int64)
        """Tokens of KV sent (whole blocks after the decode worker's own prefix hits)."""
        self.hit_tokens = np.zeros(n, dtype=np.int64)
        """Prompt tokens the decode worker's prefix cache already held (not sent)."""
        self.sent_bytes = np.zeros(n, dtype=np.float64)

    def on_reserved(self, rid: int, t: float, prefill_replica: int, sent_tokens: int, hit_tokens: int) -> None:
        self.reserved_s[rid] = t
        self.prefill_replica[rid] = prefill_replica
        self.sent_tokens[rid] = sent_tokens
        self.hit_tokens[rid] = hit_tokens

    def on_prefilled(self, rid: int, t: float) -> None:
        self.prefilled_s[rid] = t

    def on_transfer(self, rid: int, start_s: float, landed_s: float, num_bytes: float) -> None:
        self.transfer_start_s[rid] = start_s
        self.landed_s[rid] = landed_s
        self.sent_bytes[rid] = num_bytes

    def columns(self, num_requests: int) -> dict[str, np.ndarray]:
        """The columns cut to the first ``num_requests`` ids."""
        return {name: getattr(self, name)[:num_requests] for name in HANDOFF_COLUMNS}


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffFigures:
    """What a disaggregated run's hand-offs add up to, over the requests that arrived after the warm-up."""

    num_reserved: int
    """Requests whose decode blocks were reserved."""
    num_landed: int
    """Requests whose KV landed on their decode worker."""
    num_waited: int
    """Requests that could not be reserved at once (decode memory or slots were short): held back, not lost."""
    reserve_wait_mean_ms: float
    """Mean time from arrival to the reservation, over the requests that waited."""
    reserve_wait_p99_ms: float
    """p99 of the same."""
    num_waiting_at_end: int
    """Requests still waiting for a reservation when the clock stopped (in flight)."""
    transfer_p50_ms: float
    """Median time from the first token to the KV landing: what a transfer adds after the prefill."""
    transfer_p99_ms: float
    sent_gb: float
    """KV bytes sent over the run, GB (decimal)."""
    decode_hit_rate: float
    """Prompt tokens the decode workers' caches already held / prompt tokens reserved: not sent."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value if isinstance(value, int) else (None if not math.isfinite(value) else
                                                                 float(f"{value:.6g}"))
        return out


def handoff_figures(log: HandoffLog, arrival_s: np.ndarray, prompt_tokens: np.ndarray, *, num_waited: int,
                    num_waiting_at_end: int, warmup_s: float = 0.0) -> HandoffFigures:
    """The figures of ``log`` over the requests arriving at or after ``warmup_s`` (``arrival_s`` and
    ``prompt_tokens``: the request log's columns). ``num_waited`` and ``num_waiting_at_end`` come from the
    decode workers' receivers, which count them exactly."""
    n = len(arrival_s)
    columns = log.columns(n)
    cohort = ~np.isnan(arrival_s) & (arrival_s >= warmup_s)
    reserved = cohort & ~np.isnan(columns["reserved_s"])
    landed = cohort & ~np.isnan(columns["landed_s"])
    wait_ms = (columns["reserved_s"] - arrival_s)[reserved] * 1e3
    waited = wait_ms[wait_ms > 0]
    transfer_ms = (columns["landed_s"] - columns["prefilled_s"])[landed] * 1e3
    prompt = float(prompt_tokens[reserved].sum())
    return HandoffFigures(
        num_reserved=int(reserved.sum()),
        num_landed=int(landed.sum()),
        num_waited=num_waited,
        reserve_wait_mean_ms=float(waited.mean()) if waited.size else math.nan,
        reserve_wait_p99_ms=percentile(waited, 99),
        num_waiting_at_end=num_waiting_at_end,
        transfer_p50_ms=percentile(transfer_ms, 50),
        transfer_p99_ms=percentile(transfer_ms, 99),
        sent_gb=float(columns["sent_bytes"][landed].sum()) / 1e9,
        decode_hit_rate=float(columns["hit_tokens"][reserved].sum()) / prompt if prompt else 0.0,
    )
