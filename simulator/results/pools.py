"""What each pool of a fleet did, and the fleet's figures per GPU: goodput per GPU (DistServe's measure of
a placement), dollars per hour, and a disaggregated fleet's hand-offs.

Data only: the simulation computes these from its replicas (``fleet_figures``); the run folder writes them
into summary.json, the CLI prints them. Never imports simpy or the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simulator.results.handoffs import HandoffFigures
from simulator.results.series import ReplicaSeries, fleet_kv_util_mean
from simulator.results.summary import Summary, round_sig


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolFigures:
    """One pool's settings and what its replicas did over the run."""

    name: str
    """The pool's name (``fleet`` for a fleet given without pools)."""
    role: str
    """mixed, prefill or decode."""
    hardware: str
    model: str
    tp: int
    """GPUs per replica."""
    replicas: int
    num_gpus: int
    """replicas x tp."""
    profile: str
    """The cost-model profile its replicas run."""
    usd_per_gpu_hour: float
    """Price of one of its GPUs for an hour; NaN when the hardware has no price."""
    busy_frac: float
    """Share of the run its replicas spent running steps."""
    kv_util_mean: float
    """Time-averaged share of its KV blocks in use."""
    prefill_tokens: int
    """Tokens its replicas ran as prompt chunks (first computations and recomputes)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "role": self.role, "hardware": self.hardware, "model": self.model, "tp": self.tp,
            "replicas": self.replicas, "num_gpus": self.num_gpus, "profile": self.profile,
            "usd_per_gpu_hour": round_sig(self.usd_per_gpu_hour), "busy_frac": round_sig(self.busy_frac),
            "kv_util_mean": round_sig(self.kv_util_mean), "prefill_tokens": self.prefill_tokens,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetFigures:
    """A variant's fleet as pools, with the per-GPU figures that compare placements."""

    pools: tuple[PoolFigures, ...]
    """Each pool, in the scenario's order."""
    num_gpus: int
    """GPUs of the whole fleet."""
    goodput_per_gpu_rps: float
    """Requests per second meeting the SLO, per GPU of the fleet."""
    usd_per_hour: float
    """What the whole fleet costs an hour (NaN when a pool's hardware has no price)."""
    handoffs: HandoffFigures | None
    """A disaggregated fleet's hand-offs; None for a fleet of mixed pools."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pools": [pool.to_dict() for pool in self.pools],
            "num_gpus": self.num_gpus,
            "goodput_per_gpu_rps": round_sig(self.goodput_per_gpu_rps),
            "usd_per_hour": round_sig(self.usd_per_hour),
            "handoffs": None if self.handoffs is None else self.handoffs.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolRecord:
    """What ``fleet_figures`` needs of one pool: its settings and its replicas' counters and series."""

    name: str
    role: str
    hardware: str
    model: str
    tp: int
    profile: str
    usd_per_gpu_hour: float | None
    busy_s: Sequence[float]
    """Each replica's seconds spent in steps."""
    prefill_tokens: int
    series: Sequence[ReplicaSeries]


def fleet_figures(pools: Sequence[PoolRecord], summary: Summary, *, duration_s: float, warmup_s: float,
                  handoffs: HandoffFigures | None) -> FleetFigures:
    """The fleet's figures from its pools and the variant's summary (``duration_s``: the run from t = 0)."""
    figures = []
    for pool in pools:
        replicas = len(pool.busy_s)
        figures.append(PoolFigures(
            name=pool.name, role=pool.role, hardware=pool.hardware, model=pool.model, tp=pool.tp, replicas=replicas,
            num_gpus=replicas * pool.tp, profile=pool.profile,
            usd_per_gpu_hour=math.nan if pool.usd_per_gpu_hour is None else pool.usd_per_gpu_hour,
            busy_frac=sum(pool.busy_s) / (replicas * duration_s) if replicas and duration_s > 0 else math.nan,
            kv_util_mean=fleet_kv_util_mean(pool.series, warmup_s=warmup_s),
            prefill_tokens=pool.prefill_tokens,
        ))
    num_gpus = sum(f.num_gpus for f in figures)
    return FleetFigures(
        pools=tuple(figures),
        num_gpus=num_gpus,
        goodput_per_gpu_rps=summary.goodput_rps / num_gpus if num_gpus else math.nan,
        usd_per_hour=sum(f.num_gpus * f.usd_per_gpu_hour for f in figures),
        handoffs=handoffs,
    )


def blended_price(pools: Sequence[tuple[int, float | None]]) -> float | None:
    """The price per GPU-hour of a fleet of pools given as (GPUs, price): GPU-weighted, so that GPU-hours
    times it is the fleet's cost; None when any pool's price is unknown."""
    if any(price is None for _, price in pools):
        return None
    gpus = sum(n for n, _ in pools)
    return sum(n * price for n, price in pools if price is not None) / gpus if gpus else None
