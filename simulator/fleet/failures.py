"""What breaks in a fleet and when: replica crashes (scripted, or drawn from a per-replica MTBF), node
failures that take every replica on the node, and spot interruptions that give notice first.

``FailuresConfig`` is the ``failures:`` section; ``failure_times`` turns the MTBF into seeded crash times.
What a failure does to requests (retried elsewhere after the detection delay, up to ``max_retries``,
then failed) is the fleet's (``fleet.dynamic``); removing them from the replica goes through the core's
own ``Scheduler.abort``. This module never touches a replica.
"""

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ReplicaCrash(_Event):
    """One replica crashes at a given time."""

    at_s: float = Field(ge=0)
    """When, seconds from the start of the run."""
    replica: int = Field(ge=0)
    """Which replica, by id (the fleet's first replicas are 0 .. fleet.replicas - 1)."""


class NodeFailure(_Event):
    """A node goes down at a given time with every replica on it."""

    at_s: float = Field(ge=0)
    """When, seconds from the start of the run."""
    node: int = Field(ge=0)
    """Which node (replicas fill nodes in order: node 0 holds the first gpus_per_node / tp replicas)."""


class SpotInterruption(_Event):
    """A spot node is reclaimed: notice first (its replicas drain), then it goes down."""

    at_s: float = Field(ge=0)
    """When the notice arrives, seconds from the start of the run."""
    node: int = Field(ge=0)
    """Which node."""
    notice_s: float = Field(default=30.0, ge=0)
    """Seconds from the notice to the node going down (GCP gives 30 s, AWS 120 s)."""


class FailuresConfig(BaseModel):
    """The ``failures:`` section of a scenario."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    crashes: tuple[ReplicaCrash, ...] = ()
    """Scripted replica crashes."""
    node_failures: tuple[NodeFailure, ...] = ()
    """Scripted node failures."""
    spot_interruptions: tuple[SpotInterruption, ...] = ()
    """Scripted spot interruptions."""
    mtbf_h: float | None = Field(default=None, gt=0)
    """Mean time between failures of one replica, hours (exponential, seeded); None = no random crashes.
    Meta reported one GPU-related interruption per ~3 h on 16,384 GPUs, about 50,000 GPU-hours each."""
    detection_s: float = Field(default=10.0, ge=0)
    """Seconds until the router notices a crashed replica (health-check period x failures to mark it
    down); requests sent to it meanwhile are lost too and retried at detection."""
    max_retries: int = Field(default=2, ge=0)
    """Times a request is retried after losing its replica; one more loss and it fails."""
    replace: bool = True
    """Without an autoscaler, start a replacement for each replica lost (a static fleet keeps N)."""


def failure_times(mtbf_h: float, rng: np.random.Generator, *, start_s: float, end_s: float) -> list[float]:
    """Crash times of one replica alive from ``start_s``, before ``end_s``: the first is all that matters
    (a crashed replica stays down), so at most one."""
    at = start_s + float(rng.exponential(mtbf_h * 3600.0))
    return [at] if at < end_s else []
