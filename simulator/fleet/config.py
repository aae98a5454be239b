"""The fleet's YAML sections that the modules running them read: ``lifecycle`` (``fleet.lifecycle``),
``autoscaling`` (``fleet.autoscaler``) and ``disaggregation`` (``fleet.disaggregation``).

Here, apart from those modules, so that a scenario's schema (``simulator.scenario``) does not import what
runs them: a run without those sections never loads the autoscaling policies, the replica lifecycle or the
disaggregated request path (their classes cost start-up time, a millisecond or so each).
"""

import itertools
from enum import StrEnum
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.fleet.router import RouterPolicy


class LifecycleConfig(BaseModel):
    """The ``lifecycle:`` section of a scenario: how long a new replica takes to serve."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    provision_s: float = Field(default=60.0, ge=0)
    """Seconds from the decision to a running container on a GPU (node scheduling, image pull, engine
    start); 60 s is a warm Kubernetes node with the image cached, a fresh cloud VM takes minutes."""
    load_bandwidth_gb_s: float = Field(default=2.0, gt=0)
    """Bandwidth at which each GPU reads its share of the weights, GB/s (local NVMe 3-7, a network
    volume or object store 0.5-2): the load stage takes the profile's weight bytes per GPU over this."""
    load_s: float | None = Field(default=None, ge=0)
    """Seconds to load the weights, overriding weight bytes / bandwidth (None = computed)."""
    warmup_s: float = Field(default=20.0, ge=0)
    """Seconds of engine warm-up after the weights are in (CUDA graph capture, memory profiling); vLLM
    takes 10-60 s."""
    gpus_per_node: int = Field(default=8, ge=1)
    """GPUs per node: a node failure takes every replica on it (GPUs per node / tp of them)."""


AutoscalerPolicy = Literal["concurrency", "slo", "schedule", "oracle"]
"""Names of the autoscaling policies; the keys of ``AUTOSCALERS``, in the same order."""


class AutoscalingConfig(BaseModel):
    """The ``autoscaling:`` section of a scenario (``fleet.replicas`` is the count at the start)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    policy: AutoscalerPolicy
    """Which policy decides: concurrency, slo, schedule or oracle."""
    min_replicas: int = Field(default=1, ge=1)
    """Never fewer (one keeps the fleet able to answer; scale-to-zero is not modelled)."""
    max_replicas: int = Field(default=64, ge=1, le=100_000)
    """Never more (the quota)."""
    interval_s: float = Field(default=15.0, gt=0)
    """Seconds between decisions (the HPA's sync period is 15 s)."""
    metrics_delay_s: float = Field(default=15.0, ge=0)
    """Age of the metrics a decision sees (a Prometheus scrape interval): decisions lag the load."""
    window_s: float = Field(default=60.0, gt=0)
    """Seconds of history behind an observed rate or latency percentile."""
    scale_up_cooldown_s: float = Field(default=0.0, ge=0)
    """Least time between two scale-ups (the HPA scales up at once by default)."""
    scale_down_window_s: float = Field(default=300.0, ge=0)
    """Scale down only to the highest count recommended over this window (the HPA's 300 s
    stabilisation window), so a dip does not stop replicas a cold start away from being needed again."""
    metric: Literal["concurrency", "queue"] = "concurrency"
    """concurrency policy: requests held per replica (KServe) or requests waiting per replica (KEDA)."""
    target: float = Field(default=32.0, gt=0)
    """concurrency policy: the per-replica value of the metric to hold."""
    ttft_target_ms: float | None = Field(default=None, gt=0)
    """slo policy: TTFT the percentile must stay under; None = the scenario's slo.ttft_ms."""
    tpot_target_ms: float | None = Field(default=None, gt=0)
    """slo policy: TPOT the percentile must stay under; None = the scenario's slo.tpot_ms."""
    percentile: float = Field(default=90.0, gt=0, le=100)
    """slo policy: which percentile of the window is held to the targets."""
    scale_down_below: float = Field(default=0.5, gt=0, lt=1)
    """slo policy: remove a replica while every observed percentile is under this share of its target."""
    schedule: tuple[tuple[float, int], ...] = ()
    """schedule policy: [t_s, replicas] steps, times increasing from 0; each count holds until the next."""
    rps_per_replica: float | None = Field(default=None, gt=0)
    """oracle policy: requests per second one replica serves within the SLO (from ``fleetsim plan``)."""
    lead_s: float | None = Field(default=None, ge=0)
    """oracle policy: how far ahead it looks; None = one cold start (a replica asked for now serves then)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be at most max_replicas ({self.max_replicas})")
        if self.policy == "schedule":
            times = [t for t, _ in self.schedule]
            if not self.schedule or times[0] != 0 or any(b <= a for a, b in itertools.pairwise(times)):
                raise ValueError("schedule policy: give schedule as [t_s, replicas] steps, times increasing from 0")
            if any(n < 1 for _, n in self.schedule):
                raise ValueError("schedule policy: replica counts must be >= 1")
        if self.policy == "oracle" and self.rps_per_replica is None:
            raise ValueError("oracle policy: give rps_per_replica (the load one replica serves within the SLO)")
        return self


class TransferMode(StrEnum):
    AFTER_PREFILL = "after_prefill"
    """The KV moves once the prefill has produced the first token."""
    LAYERWISE = "layerwise"
    """The KV streams layer by layer while the prefill computes it."""


class FirstToken(StrEnum):
    DECODE = "decode"
    """The client's stream comes from the decode worker: TTFT includes the transfer."""
    PREFILL = "prefill"
    """The prefill worker streams the first token as soon as it has it (DistServe's, Splitwise's TTFT)."""


class LinkConfig(BaseModel):
    """The link KV takes from prefill to decode workers: a preset of ``calibration/links.yaml``, or figures."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    preset: str = "nvlink4"
    """A link of calibration/links.yaml: nvlink4, nvlink3, ib_ndr, ib_hdr, ethernet_100g, ethernet_25g,
    in_process; NVLink 4 (H100/H200 in one node) by default, the setting of Splitwise's and DistServe's
    intra-node placements."""
    bandwidth_gb_s: float | None = None
    """Bandwidth of one link in one direction, GB/s (decimal); None = the preset's."""
    latency_us: float | None = Field(default=None, ge=0)
    """Fixed cost of one transfer, microseconds; None = the preset's."""
    per_gpu: bool | None = None
    """Each GPU of a replica has a link of its own (KV shards move in parallel); None = the preset's."""

    @field_validator("bandwidth_gb_s")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(f"a link with {value:g} GB/s never delivers a block: give a bandwidth above 0")
        return value


class DisaggregationConfig(BaseModel):
    """How a fleet of prefill and decode pools serves a request (the ``disaggregation:`` section)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    link: LinkConfig = LinkConfig()
    """The link between prefill and decode workers."""
    transfer: TransferMode = TransferMode.LAYERWISE
    """layerwise (streamed while the prefill computes, Splitwise's and Mooncake's) or after_prefill (vLLM's
    NIXL connector); layerwise by default: the engines that disaggregate in production stream."""
    first_token: FirstToken = FirstToken.DECODE
    """Where the client gets its first token: decode (after the transfer, as vLLM's and SGLang's routers
    stream it) or prefill (as DistServe and Splitwise measure TTFT)."""
    prefill_router: RouterPolicy = "least_requests"
    """Routing policy over the prefill workers (prefix_aware finds their caches)."""
    decode_router: RouterPolicy = "least_kv"
    """Routing policy over the decode workers; least_kv by default: a decode worker is bounded by its KV."""
