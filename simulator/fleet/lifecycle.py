"""A replica's life in a fleet that changes size: provisioning, loading weights, warming up, ready,
draining, stopped (or failed), with the time each stage takes and when GPU cost starts and stops.

The stages (``SlotState``) and their durations (``LifecycleConfig``, ``cold_start``) are all this module
knows: which replicas to start or stop is the autoscaler's (``fleet.autoscaler``), what breaks them the
failures' (``fleet.failures``), and the fleet (``fleet.dynamic``) moves the slots along on the clock. It
never touches a replica's scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from simulator.core.request import RequestSpec
from simulator.fleet.config import LifecycleConfig
from simulator.fleet.replica import Replica


class SlotState(StrEnum):
    """Where a replica is in its life; cost accrues from PROVISIONING until STOPPED or FAILED."""

    PROVISIONING = "provisioning"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    """Routable: the router only sends to ready replicas."""
    DRAINING = "draining"
    """Takes no new requests and finishes those it holds, then stops."""
    STOPPED = "stopped"
    FAILED = "failed"


STARTING = (SlotState.PROVISIONING, SlotState.LOADING, SlotState.WARMING)
"""States of a replica that costs money but does not serve yet."""
ENDED = (SlotState.STOPPED, SlotState.FAILED)


@dataclass(frozen=True, slots=True)
class ColdStart:
    """How long each stage of a cold start takes, seconds."""

    provision_s: float
    load_s: float
    warmup_s: float

    @property
    def total_s(self) -> float:
        return self.provision_s + self.load_s + self.warmup_s


def cold_start(config: LifecycleConfig, weight_bytes_per_gpu: float) -> ColdStart:
    """The stages of a cold start of a replica whose GPUs each hold ``weight_bytes_per_gpu`` (all GPUs of
    a replica read their shards at once)."""
    load_s = config.load_s if config.load_s is not None else weight_bytes_per_gpu / (config.load_bandwidth_gb_s * 1e9)
    return ColdStart(provision_s=config.provision_s, load_s=load_s, warmup_s=config.warmup_s)


@dataclass(slots=True, kw_only=True)
class Slot:
    """One replica of the fleet and its life: state, node, and the times cost started and stopped."""

    replica: Replica
    node: int
    """The node the replica's GPUs are on (a node failure takes all its replicas)."""
    state: SlotState
    started_s: float
    """When it was asked for: cost accrues from here."""
    ready_s: float | None = None
    ended_s: float | None = None
    """When it stopped or failed: cost stops here."""
    dead: bool = False
    """Crashed, and the router has not noticed yet (its requests go nowhere until detection)."""
    lost: list[RequestSpec] = field(default_factory=list)
    """Requests lost with it (held at the crash, or sent to it before detection), to retry at detection."""

    @property
    def replica_id(self) -> int:
        return self.replica.replica_id

    def gpu_seconds(self, end_s: float, tp: int) -> float:
        """GPU-seconds this slot cost up to ``end_s``."""
        stop = self.ended_s if self.ended_s is not None else end_s
        return max(0.0, min(stop, end_s) - self.started_s) * tp
