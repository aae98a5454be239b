"""Scenario files: YAML -> a validated, frozen ``Scenario``, its variants, and per-replica settings.

One strict loader: unknown keys are rejected with a "did you mean", types are checked, cross-field rules
(a model that does not fit the memory, a block size that is not a power of two) are checked, and every
failure is one ``ConfigError`` naming the file and the field. ``--set a.b=c`` overrides apply to the raw
mapping before validation. Nothing mutates a scenario after load; derived values (the KV pool in blocks,
the scheduler configuration) come from functions.
"""

import copy
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator import yaml_text
from simulator.core.config import Batching, KVPolicy, Preemption, QueuePolicy, Role, SchedulerConfig
from simulator.core.presets import PRESETS
from simulator.cost.cost_model import CostModel
from simulator.cost.dtypes import KvDtype, WeightDtype
from simulator.cost.engines import host_coefficients
from simulator.cost.kv_pool import serve_defaults
from simulator.cost.kv_tiers import KVTiersConfig
from simulator.cost.link import TransferModel, get_link, transfer_model
from simulator.cost.moe import Routing
from simulator.cost.profile import (
    FLEETSIM_ENGINE,
    Profile,
    config_error_from_validation,
    get_accelerator,
    list_profiles,
    load_profile,
)
from simulator.cost.reprice import at_dtypes
from simulator.cost.speculation import SpeculativeConfig
from simulator.errors import ConfigError, did_you_mean
from simulator.fleet.config import AutoscalingConfig, DisaggregationConfig, LifecycleConfig
from simulator.fleet.failures import FailuresConfig
from simulator.fleet.router import RouterConfig
from simulator.results.summary import SLO, CostConfig
from simulator.workload.config import WorkloadConfig

if TYPE_CHECKING:
    from simulator.fleet.kv_store import TierGroup

SCHEMA_VERSION = 1
PresetName = Literal["vllm", "tgi", "trtllm", "trtllm-max-util"]


SEED_LIMIT: Final = 2**63
"""Seeds are below this: a 64-bit signed integer, as the run's tables store them."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class KVConfig(_Section):
    """KV memory policy; unset fields come from the preset, then from vLLM's defaults."""

    policy: KVPolicy | None = None
    """paged (blocks on demand), contiguous (max_model_len reserved per request) or reserve (prompt + max
    output reserved at admission)."""
    block_size: int | None = Field(default=None, ge=1, le=4096)
    """Tokens per KV block (a power of two); vLLM's default is 16."""
    memory_fraction: float | None = Field(default=None, gt=0, le=1)
    """Share of device memory the engine may use (vLLM's gpu_memory_utilization); None = the profile's."""
    num_blocks: int | None = Field(default=None, ge=1)
    """Override the KV pool size in blocks (else derived from the profile's KV capacity)."""
    preemption: Preemption | None = None
    """recompute, or swap (host copy priced by the profile's host link bandwidth)."""
    swap_space_gib: float = Field(default=4.0, ge=0)
    """Host memory for swapped-out KV per replica, GiB (vLLM's swap_space default is 4)."""
    dtype: KvDtype | None = None
    """KV cache dtype: bfloat16, float16 or fp8 (vLLM's --kv-cache-dtype); None = the profile's. Another
    dtype reprices the profile (simulator/cost/reprice.py): KV bytes, capacity and the context term."""

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int | None) -> int | None:
        if value is not None and value & (value - 1):
            raise ValueError("block_size must be a power of two, such as 16 (vLLM) or 64 (TensorRT-LLM)")
        return value


class EngineConfig(_Section):
    """The serving engine of every replica. Unset fields come from ``preset`` (else vLLM v1 defaults)."""

    preset: PresetName | None = None
    """Start from an engine's own defaults: vllm, tgi, trtllm, trtllm-max-util."""
    batching: Batching | None = None
    """static, continuous (prefill-first, whole prompts) or chunked (vLLM v1 token budget)."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most sequences in one step."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    """Token budget of one step."""
    long_prefill_token_threshold: int | None = Field(default=None, ge=0)
    """Cap on one request's prefill chunk per step (0 = none)."""
    enable_chunked_prefill: bool | None = None
    """Under chunked batching, split prompts across steps (False: a prompt waits for room for all of it)."""
    queue_policy: QueuePolicy | None = None
    """fcfs or priority."""
    prefix_caching: bool | None = None
    """Share KV blocks of equal prefixes across requests."""
    max_model_len: int | None = Field(default=None, ge=2)
    """Longest prompt + output served; longer requests are rejected. None = the KV capacity (capped at
    the model's 131072 positions)."""
    waiting_served_ratio: float | None = Field(default=None, ge=0)
    """TGI: with a batch running, prefill only when waiting/running reaches this."""
    max_waiting_steps: int | None = Field(default=None, ge=0)
    """TGI's max_waiting_tokens: decode steps after which a prefill is forced."""
    async_scheduling: bool | None = None
    """vLLM v1's async scheduling (on in the vllm preset, as in vLLM): step n+1 is scheduled while step n
    runs, so finishes and arrivals take effect a step later while host work overlaps the device (chunked
    batching, recompute preemption only); false = vLLM's synchronous loop, host work between steps."""
    entry_point: Literal["api_server", "offline"] = "api_server"
    """How vLLM is started, which picks the vllm preset's batch defaults: api_server (``vllm serve``) or
    offline (the ``LLM`` class: 16384 batched tokens on large GPUs, 8192 elsewhere)."""
    kv: KVConfig = KVConfig()
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (simulator/cost/speculation.py): proposals per step, acceptance, the drafter;
    None = off. Runs on synchronous scheduling: the vllm preset's async scheduling yields to it."""


class PoolConfig(_Section):
    """One pool of identical replicas (``fleet.pools.NAME``). Unset fields take the fleet's (hardware,
    model, tp, profile, weight_dtype) and the ``engine`` section's (each field the pool's ``engine`` sets
    overrides it)."""

    role: Role = Role.MIXED
    """mixed (prefill and decode on each replica), prefill or decode (a disaggregated fleet's two sides)."""
    replicas: int = Field(le=100_000)
    """Replicas in this pool (at least one: an empty pool serves nothing)."""
    hardware: str | None = None
    """Accelerator of this pool's replicas; None = fleet.hardware."""
    model: str | None = None
    """Model; None = fleet.model (a prefill and a decode pool must serve the same one)."""
    tp: int | None = Field(default=None, ge=1)
    """Tensor-parallel degree; None = fleet.tp (prefill and decode pools may differ)."""
    profile: str | None = None
    """Cost-model profile; None = fleet.profile when this pool keeps the fleet's hardware, model and tp,
    else the shipped profile for its own."""
    weight_dtype: WeightDtype | None = None
    """Weight dtype; None = fleet.weight_dtype."""
    engine: EngineConfig = EngineConfig()
    """Engine settings of this pool, over the ``engine`` section's (only the fields given here)."""

    @field_validator("replicas")
    @classmethod
    def _not_empty(cls, value: int) -> int:
        if value < 1:
            raise ValueError("a pool needs at least one replica: an empty pool serves nothing (leave the pool out)")
        return value


class FleetConfig(_Section):
    replicas: int = Field(default=1, ge=1, le=100_000)
    """Identical replicas behind the router (unused when ``pools`` are given: each says its own)."""
    hardware: str = "H200"
    """Accelerator short name in calibration/hardware.yaml (H100, H200, A100, L40S, B200)."""
    model: str = "llama-3-8b"
    """Model the replicas serve (llama-3-8b, llama-3-70b, llama-3-405b, the mixtures of experts mixtral-8x7b,
    qwen3-30b-a3b and deepseek-v3, or a calibration model). An MoE model's expert-parallel layout is its
    profile's (``...-tp2-ep2-analytic``; the plain ``-tp2-`` one is chosen by default)."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree: GPUs per replica."""
    profile: str | None = None
    """Cost-model profile (shipped name or path); None = the shipped profile for hardware, model and tp,
    measured preferred over fitted-published over analytic, and one measured on this project's own engine
    (``Profile.measured_on``) only when no other matches."""
    weight_dtype: WeightDtype | None = None
    """Weight dtype: bfloat16, float16, fp8 or int4 (weight-only); None = the profile's. Another dtype
    reprices the profile (simulator/cost/reprice.py): weight bytes, GEMM rate, KV pool."""
    expert_routing: Routing | None = None
    """An MoE model's routing distribution: uniform, or zipf (expert popularity ∝ rank^-zipf_exponent;
    simulator/cost/moe.py); None = the profile's (uniform in every shipped one)."""
    zipf_exponent: float | None = Field(default=None, ge=0)
    """Exponent of zipf routing (0.6: load Gini 0.36 over Qwen3's 128 experts, the most concentrated
    routing DODOCO, arXiv 2605.20982, measured); only with expert_routing zipf."""

    pools: dict[str, PoolConfig] | None = Field(default=None, min_length=1)
    """Several pools by name, each with its own GPUs, model shard, engine settings and replicas: mixed
    pools behind one router (a fleet of mixed GPUs), or prefill and decode pools (disaggregated, see the
    ``disaggregation`` section). None = one pool of ``replicas`` as the fields above describe."""

    @model_validator(mode="after")
    def _zipf_needs_zipf(self) -> Self:
        if self.zipf_exponent is not None and self.expert_routing is not Routing.ZIPF:
            raise ValueError("zipf_exponent needs expert_routing zipf")
        return self


FromProfile = Literal["profile"]
"""A network figure taken from the profile's ``streaming`` block (measured at a client)."""


class NetworkConfig(_Section):
    latency_ms: float | FromProfile = 0.0
    """One-way latency from the replica to the client, added to every token the client sees; ``profile``:
    the profile's measured ``streaming.latency_ms``."""
    flush_interval_ms: float | FromProfile = 0.0
    """A buffering proxy between the replicas and the clients that forwards what it holds every this many
    ms (Go's ReverseProxy FlushInterval, Caddy's flush_interval): the first and last tokens reach the
    client at the next flush. 0 = no proxy; ``profile``: the profile's ``streaming.flush_interval_ms``."""

    @field_validator("latency_ms", "flush_interval_ms", mode="before")
    @classmethod
    def _milliseconds(cls, value: object) -> object:
        if value == "profile":
            return value
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not 0 <= number < math.inf:
            raise ValueError("give milliseconds >= 0, or 'profile' (the profile's measured streaming figure)")
        return number


class SimulationConfig(_Section):
    horizon_s: float | None = Field(default=None, gt=0)
    """Stop the clock here; requests still in flight are counted as such. None = run until all finish."""
    sample_interval_s: float = Field(default=1.0, gt=0)
    """Grid of the per-replica time series (running, waiting, KV use, hit rate)."""
    warmup_s: float = Field(default=0.0, ge=0)
    """Requests arriving before this are simulated but left out of the latency figures."""
    fast_path: bool = True
    """Advance runs of identical decode steps in one event (same results as step by step)."""
    # issue 8 (capacity planning): sensitivity of an answer to cost-model error.
    cost_factor: float = Field(default=1.0, gt=0)
    """Multiply every step time by this (1.1 = the cost model underestimates by 10 %); for sensitivity."""

    @model_validator(mode="after")
    def _warmup_inside_the_horizon(self) -> Self:
        if self.horizon_s is not None and self.warmup_s >= self.horizon_s:
            raise ValueError(f"warmup_s ({self.warmup_s:g}) must be shorter than horizon_s ({self.horizon_s:g}): "
                             "nothing would be measured")
        return self


class Scenario(_Section):
    """A whole scenario file."""

    schema_version: Literal[1]
    """Version of this file format (1)."""
    name: str = Field(min_length=1, max_length=128)
    """The run's name, and the folder it is saved in under ``runs/``: a name, never a path."""
    description: str = ""
    seed: int = Field(default=0, ge=0, lt=SEED_LIMIT)
    """Seed of the workload and of randomised routers; the same seed gives identical results."""
    workload: WorkloadConfig
    fleet: FleetConfig = FleetConfig()
    engine: EngineConfig = EngineConfig()
    router: RouterConfig = RouterConfig()
    slo: SLO | None = None
    cost: CostConfig = CostConfig()
    network: NetworkConfig = NetworkConfig()
    simulation: SimulationConfig = SimulationConfig()
    disaggregation: DisaggregationConfig | None = None
    """How prefill and decode pools hand a request over (the link, streaming or not, where the first
    token comes from, the two routers); None = the defaults, where ``fleet.pools`` has prefill and decode
    pools."""
    kv_tiers: KVTiersConfig | None = None
    """KV tiers below every replica's GPU pool (host, disk) and a store shared by the replicas; None = none
    (an evicted prefix block is gone)."""
    lifecycle: LifecycleConfig | None = None
    """How long a new replica takes to serve (provisioning, weights, warm-up); set (or ``autoscaling`` or
    ``failures`` set) makes the fleet one whose replicas come and go (``fleet/dynamic.py``)."""
    autoscaling: AutoscalingConfig | None = None
    """An autoscaler in the loop (``fleet.replicas`` replicas at the start); None = a fixed fleet."""
    failures: FailuresConfig | None = None
    """Replica crashes, node failures and spot interruptions; None = nothing fails."""
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Named overrides of the sections above, run side by side on the identical request stream."""

    @property
    def is_dynamic(self) -> bool:
        """Replicas come and go (a lifecycle, an autoscaler or failures): the fleet of ``fleet/dynamic.py``."""
        return self.lifecycle is not None or self.autoscaling is not None or self.failures is not None

    @model_validator(mode="after")
    def _dynamic_fleet_is_one_pool(self) -> Self:
        if self.is_dynamic and self.fleet.pools is not None:
            raise ValueError("lifecycle, autoscaling and failures apply to a fleet of one pool (fleet.replicas), "
                             "not to fleet.pools")
        if self.is_dynamic and self.kv_tiers is not None:
            raise ValueError("kv_tiers apply to a fixed fleet: not yet with lifecycle, autoscaling or failures")
        auto = self.autoscaling
        if auto is not None and auto.policy == "slo" and auto.ttft_target_ms is None and auto.tpot_target_ms is None \
                and (self.slo is None or (self.slo.ttft_ms is None and self.slo.tpot_ms is None)):
            raise ValueError("the slo autoscaler needs a TTFT or TPOT target: set autoscaling.ttft_target_ms or "
                             "autoscaling.tpot_target_ms, or slo.ttft_ms or slo.tpot_ms")
        failures = self.failures
        if failures is not None and failures.mtbf_h is not None and self.simulation.horizon_s is None:
            lifecycle = self.lifecycle if self.lifecycle is not None else LifecycleConfig()
            starting_s = lifecycle.provision_s + lifecycle.warmup_s  # a cold start's least, without the load stage
            if failures.mtbf_h * 3600.0 < starting_s:
                raise ValueError(
                    f"failures.mtbf_h: replicas fail every {failures.mtbf_h * 3600.0:.3g} s on average, sooner than "
                    f"one starts (at least {starting_s:.3g} s): most replacements never get ready and a run without "
                    "a horizon may not end; set simulation.horizon_s, or a longer mtbf_h")
        return self

    @field_validator("name")
    @classmethod
    def _a_name_not_a_path(cls, value: str) -> str:
        if any(sep in value for sep in ("/", "\\")) or value.startswith(".") or not value.isprintable():
            raise ValueError("name must be a plain name (no '/', '\\', leading '.', or control characters): "
                             "it becomes the folder runs/NAME")
        return value


MAX_RING_POINTS = 10_000_000
"""Most points of the session-affinity hash ring (virtual nodes x replicas; ~1 GB as Python tuples): 100 per
replica (the default) keeps shares within about 10 %, so this allows 100,000 replicas at the default."""


@dataclass(frozen=True, slots=True)
class LoadedScenario:
    """A validated scenario with where it came from (relative trace paths resolve against its folder)."""

    scenario: Scenario
    source: Path | None
    raw: dict[str, Any]
    """The mapping after --set overrides, before validation (for the record and for variants)."""

    @property
    def base_dir(self) -> Path | None:
        return self.source.parent if self.source is not None else None

    def variants(self) -> dict[str, Scenario]:
        """Each named variant as a whole scenario; a scenario without variants is its own one variant."""
        if not self.scenario.variants:
            return {"base": self.scenario}
        out = {}
        base = {k: v for k, v in self.raw.items() if k != "variants"}
        for name, override in self.scenario.variants.items():
            try:
                expanded = expand_dotted(override)
            except ConfigError as err:
                raise ConfigError(err.message, file=self.source, field=f"variants.{name}") from None
            merged = deep_merge(base, expanded)
            out[name] = validate(merged, file=self.source, field_prefix=f"variants.{name}")
        return out

    def only(self, names: Sequence[str]) -> "LoadedScenario":
        """The scenario with only the variants ``names`` (in the scenario's order; ``base`` names a scenario
        without variants; a name with ``*``, ``?`` or ``[`` is a shell-style pattern, ``doc_*``); a name or
        pattern that picks none is a ConfigError listing the variants it has."""
        from fnmatch import fnmatchcase

        known = list(self.scenario.variants) or ["base"]
        chosen: set[str] = set()
        for name in names:
            picked = [k for k in known if fnmatchcase(k, name)] if any(c in name for c in "*?[") else (
                [name] if name in known else [])
            if not picked:
                raise ConfigError(f"no variant {name!r}{did_you_mean(name, known)}; the scenario's variants: "
                                  f"{', '.join(known)}", file=self.source, field="variants")
            chosen.update(picked)
        if not self.scenario.variants:
            return self
        raw = {**self.raw, "variants": {k: v for k, v in self.raw["variants"].items() if k in chosen}}
        return load_mapping(raw, source=self.source)


# ----- loading ---------------------------------------------------------------------------------------


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *,
                  seed: int | None = None) -> LoadedScenario:
    """Read, override and validate a scenario file; every failure is one ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read scenario: {err.strerror}", file=path) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"not a text file (byte {err.start} is not UTF-8): a scenario is YAML text",
                          file=path) from None
    try:
        raw = yaml_text.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{where}not valid YAML ({problem})", file=path) from None
    if not isinstance(raw, dict):
        raise ConfigError("a scenario must be a YAML mapping", file=path)
    return load_mapping(raw, overrides, seed=seed, source=path)


def load_mapping(raw: dict[str, Any], overrides: list[str] | tuple[str, ...] = (), *,
                 seed: int | None = None, source: Path | None = None) -> LoadedScenario:
    """Validate a scenario given as a mapping (the dashboard and notebooks build them in code)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        raw = apply_override(raw, item, file=source)
    if seed is not None:
        raw["seed"] = seed
    scenario = validate(raw, file=source)
    loaded = LoadedScenario(scenario, source, raw)
    variants = loaded.variants()  # a broken variant is a load error, not a surprise halfway through a run
    for name, sc in variants.items():
        try:
            if sc.fleet.pools is None:
                client_path(sc, [resolve_replica(sc).profile])
            else:
                client_path(sc, [pool.setup.profile for pool in resolve_pools(sc)])
            check_memory(sc)
            check_hash_ring(sc)
            tier_groups(sc)
        except ConfigError as err:  # name the file (and the variant) the impossible setting came from
            prefix = f"variants.{name}" if scenario.variants else ""
            field = ".".join(p for p in (prefix, err.field) if p) or None
            raise ConfigError(err.message, file=err.file or source, field=field) from None
    return loaded


def validate(raw: dict[str, Any], *, file: Path | None, field_prefix: str = "") -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as err:
        error = config_error_from_validation(err, Scenario, file=file)
        if field_prefix:
            error = ConfigError(error.message, file=file, field=f"{field_prefix}.{error.field or ''}".rstrip("."))
        raise error from None


def apply_override(raw: dict[str, Any], item: str, *, file: Path | None = None) -> dict[str, Any]:
    """``a.b.c=value`` with the value parsed as YAML (numbers, booleans, lists)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key.path=value, got {item!r}", file=file)
    try:
        value = yaml_text.safe_load(text)
    except yaml.YAMLError:
        value = text
    return deep_merge(raw, expand_dotted({key.strip(): value}))


def expand_dotted(mapping: dict[str, Any]) -> dict[str, Any]:
    """{"engine.batching": "static"} -> {"engine": {"batching": "static"}} (nested maps pass through).

    A key with an empty part (``""``, ``"engine."``), or a dotted key that needs a section where an earlier
    key put a value (``{"engine": 1, "engine.batching": ...}``), is a ConfigError naming the key."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError(f"key {str(key)!r} has an empty part (keys are names, dotted paths of names)")
        node = out
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"key {str(key)!r} needs a section at {'.'.join(parts[:depth + 1])!r}, "
                                  "where another key put a value")
        node[parts[-1]] = expand_dotted(value) if isinstance(value, dict) else value
    return out


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ----- what one replica runs -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaSetup:
    """Everything a replica of one variant needs, derived from the scenario and its profile."""

    profile: Profile
    scheduler: SchedulerConfig


def pick_profile(fleet: FleetConfig) -> Profile:
    """The fleet's profile: as named, or the shipped one for its hardware, model and tp."""
    if fleet.profile is not None:
        try:
            profile = load_profile(fleet.profile)
        except ConfigError as err:
            # The profile file's own field, if the error names one: "fleet.profile (device_s.weight_s)".
            where = "fleet.profile" if err.field is None else f"fleet.profile ({err.field})"
            raise ConfigError(err.message, file=err.file, field=where) from None
        mismatches = [
            f"{name} {mine!r} vs profile's {theirs!r}"
            for name, mine, theirs in (
                ("hardware", fleet.hardware.lower(), profile.hardware.lower()),
                ("model", fleet.model, profile.model),
                ("tp", fleet.tp, profile.tp),
            )
            if mine != theirs
        ]
        if mismatches:
            raise ConfigError(f"profile {fleet.profile!r} does not match the fleet: {'; '.join(mismatches)}",
                              field="fleet.profile")
        return profile
    stem = f"{fleet.hardware.lower()}-{fleet.model}-tp{fleet.tp}"
    candidates = [n for n in list_profiles() if n.startswith(stem + "-")]
    if not candidates:
        _check_weights_fit(fleet)
        raise ConfigError(_no_profile_message(fleet), field="fleet.tp" if fleet.tp & (fleet.tp - 1) else "fleet")
    # Measured on a serving engine first, then fitted to published measurements, then analytic; a profile of
    # this project's own engine last (it prices that engine's Python host loop, not a serving engine's).
    rank = {"measured": 0, "fitted-published": 1, "analytic": 2}
    profiles = {name: load_profile(name) for name in candidates}
    candidates.sort(key=lambda n: (profiles[n].measured_on == FLEETSIM_ENGINE,
                                   min((r for kind, r in rank.items() if n.endswith("-" + kind)), default=3), n))
    return profiles[candidates[0]]


def _no_profile_message(fleet: FleetConfig) -> str:
    """Why no shipped profile matches: the TP degrees there are for this model, here and on other GPUs,
    and, for a TP degree that cannot split the heads, that rule first."""
    import re

    degrees: dict[str, set[int]] = {}
    for name in list_profiles():
        match = re.fullmatch(rf"([a-z0-9]+)-{re.escape(fleet.model)}-tp(\d+)-.*", name)
        if match:
            degrees.setdefault(match.group(1), set()).add(int(match.group(2)))
    here = sorted(degrees.get(fleet.hardware.lower(), set()))
    elsewhere = sorted(set().union(*degrees.values()) - set(here)) if degrees else []
    shipped = (f"shipped tp for {fleet.model} on {fleet.hardware}: {', '.join(map(str, here)) or 'none'}"
               + (f"; on other GPUs also {', '.join(map(str, elsewhere))}" if elsewhere else ""))
    if fleet.tp & (fleet.tp - 1):
        return (f"tp {fleet.tp} cannot split {fleet.model}'s attention heads evenly (tensor parallelism needs "
                f"tp to divide the head count, a power of two for every catalogue model); {shipped}")
    return (f"no shipped profile for {fleet.hardware} / {fleet.model} / tp {fleet.tp}; {shipped} (name one with "
            f"fleet.profile, or make one: fleetsim calibrate, --from-published vidur for A100 and H100)")


def _check_weights_fit(fleet: FleetConfig) -> None:
    """Explain a missing profile when the reason is that the model's weights exceed the GPU's memory at
    this tp (weights per GPU scaled from any shipped profile of the model at another tp)."""
    for name in list_profiles():
        profile = load_profile(name)
        if profile.model != fleet.model:
            continue
        try:
            hbm_bytes = get_accelerator(fleet.hardware).device_memory_bytes  # as the device reports it
        except ConfigError as err:
            raise ConfigError(err.message, field="fleet.hardware") from None
        weight_bytes = profile.memory.weight_bytes * profile.tp / fleet.tp
        usable = hbm_bytes * profile.memory.memory_fraction
        if weight_bytes >= usable:
            raise ConfigError(
                f"{fleet.model} does not fit on {fleet.hardware} at tp {fleet.tp}: its weights need "
                f"{weight_bytes / 2**30:.0f} GiB per GPU, the engine may use {usable / 2**30:.0f} GiB of its "
                f"{hbm_bytes / 2**30:.0f} GiB; raise fleet.tp",
                field="fleet.tp",
            )
        return


def vllm_gpu_defaults(scenario: Scenario, profile: Profile) -> tuple[int, int] | None:
    """(max_num_batched_tokens, max_num_seqs) vLLM picks on the profile's GPU for the scenario's entry point,
    when the ``vllm`` preset applies them (neither field set in the scenario): ``vllm serve`` 8192 / 1024 on a
    GPU of at least 70 GiB that is not an A100, else 2048 / 256; the offline ``LLM`` class 16384 / 1024, else
    8192 / 256 (vLLM's ``EngineArgs.get_batch_defaults``, vllm/engine/arg_utils.py;
    ``simulator.cost.kv_pool.serve_defaults``). None where the preset is not ``vllm``, a field is set, or the
    hardware is not in the datasheet table (a CPU profile)."""
    engine = scenario.engine
    if engine.preset != "vllm" or engine.max_num_batched_tokens is not None or engine.max_num_seqs is not None:
        return None
    try:
        accelerator = get_accelerator(profile.hardware)
    except ConfigError:
        return None
    settings = serve_defaults(accelerator.device_memory_bytes, accelerator.full_name,
                              entry_point=engine.entry_point)
    return settings.max_num_batched_tokens, settings.max_num_seqs


def resolve_replica(scenario: Scenario) -> ReplicaSetup:
    """The profile and the scheduler configuration every replica of this scenario runs."""
    profile = pick_profile(scenario.fleet)
    engine = scenario.engine
    kv = engine.kv
    weight_dtype = scenario.fleet.weight_dtype
    if weight_dtype is not None or kv.dtype is not None:
        where = "fleet.weight_dtype" if weight_dtype is not None else "engine.kv.dtype"
        try:
            accelerator = get_accelerator(profile.hardware)
        except ConfigError as err:
            raise ConfigError(f"cannot reprice {profile.name} for other dtypes: {err.message}", field=where) from None
        profile = at_dtypes(profile, accelerator, weight_dtype=weight_dtype, kv_dtype=kv.dtype)
    profile = with_routing(profile, scenario.fleet)
    config = SchedulerConfig(num_blocks=1)
    if engine.preset is not None:
        config = PRESETS[engine.preset].apply(config)
    gpu_defaults = vllm_gpu_defaults(scenario, profile)
    if gpu_defaults is not None:
        config = replace(config, max_num_batched_tokens=gpu_defaults[0], max_num_seqs=gpu_defaults[1])
    explicit: dict[str, Any] = {
        "batching": engine.batching,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "long_prefill_token_threshold": engine.long_prefill_token_threshold,
        "enable_chunked_prefill": engine.enable_chunked_prefill,
        "queue_policy": engine.queue_policy,
        "enable_prefix_caching": engine.prefix_caching,
        "waiting_served_ratio": engine.waiting_served_ratio,
        "max_waiting_steps": engine.max_waiting_steps,
        "kv_policy": kv.policy,
        "block_size": kv.block_size,
        "preemption": kv.preemption,
        "async_scheduling": engine.async_scheduling,
    }
    settings = {**{f: getattr(config, f) for f in explicit}, **{k: v for k, v in explicit.items() if v is not None}}
    speculation = None if engine.speculative is None else engine.speculative.resolve(profile, scenario.seed)
    if speculation is not None:
        _check_speculation(engine, settings, explicit)
    if settings["async_scheduling"] and (settings["batching"] is not Batching.CHUNKED
                                         or settings["preemption"] is not Preemption.RECOMPUTE):
        if engine.async_scheduling:
            raise ConfigError(
                f"async scheduling is vLLM v1's: it needs batching chunked and preemption recompute, not "
                f"{settings['batching']} and {settings['preemption']}",
                field="engine.async_scheduling",
            )
        # Only the preset asked for it: off, as vLLM turns it off when an option is incompatible.
        explicit["async_scheduling"] = False
    config = replace(config, **{k: v for k, v in explicit.items() if v is not None})
    block_size = config.block_size
    num_blocks = kv.num_blocks or profile.kv_capacity_blocks(block_size, kv.memory_fraction)
    most_blocks = profile.kv_capacity_blocks(block_size, 1.0)
    if kv.num_blocks is not None and kv.num_blocks > most_blocks:
        raise ConfigError(
            f"{kv.num_blocks} blocks of {block_size} tokens exceed what {profile.hardware} memory holds beside "
            f"{profile.model}'s weights at tp {profile.tp} ({most_blocks} blocks, all of its memory given to KV)",
            field="engine.kv.num_blocks",
        )
    if num_blocks < 1:
        raise ConfigError(
            f"{profile.model} on {profile.hardware} (tp {profile.tp}) leaves no memory for KV cache "
            f"({profile.memory.weight_bytes / 2**30:.1f} GiB of weights): the model does not fit",
            field="fleet",
        )
    capacity_tokens = num_blocks * block_size
    max_model_len = engine.max_model_len or min(capacity_tokens, 131072)
    if config.kv_policy is KVPolicy.CONTIGUOUS and max_model_len > capacity_tokens:
        raise ConfigError(
            f"a contiguous slot of max_model_len={max_model_len} tokens exceeds the KV pool of {capacity_tokens} "
            "tokens; lower engine.max_model_len",
            field="engine.max_model_len",
        )
    host_blocks = int(kv.swap_space_gib * 2**30 // (profile.memory.kv_bytes_per_token * block_size))
    config = replace(config, num_blocks=num_blocks, max_model_len=max_model_len, num_host_blocks=host_blocks,
                     speculation=speculation)
    return ReplicaSetup(profile=with_engine_host(profile, engine.preset, config.async_scheduling), scheduler=config)


def _check_speculation(engine: EngineConfig, settings: dict[str, Any], explicit: dict[str, Any]) -> None:
    """Speculation runs on vLLM v1's chunked, synchronous scheduler here: async scheduling the preset
    turned on yields to it (``explicit`` updated), one asked for explicitly is an error."""
    if settings["batching"] is not Batching.CHUNKED:
        raise ConfigError(f"speculative decoding needs batching chunked (vLLM v1's scheduler), not "
                          f"{settings['batching']}", field="engine.speculative")
    if settings["async_scheduling"]:
        if engine.async_scheduling:
            raise ConfigError("speculative decoding runs on synchronous scheduling here: set "
                              "engine.async_scheduling false or leave it to the preset",
                              field="engine.async_scheduling")
        explicit["async_scheduling"] = False


def with_routing(profile: Profile, fleet: FleetConfig) -> Profile:
    """The profile with the fleet's expert routing, when it names one; a dense profile cannot take one."""
    if fleet.expert_routing is None:
        return profile
    if profile.moe is None:
        raise ConfigError(f"{profile.model} is not a mixture of experts: it has no routing to set",
                          field="fleet.expert_routing")
    exponent = fleet.zipf_exponent if fleet.expert_routing is Routing.ZIPF else 0.0
    if fleet.expert_routing is Routing.ZIPF and exponent is None:
        raise ConfigError("expert_routing zipf needs fleet.zipf_exponent", field="fleet.zipf_exponent")
    moe = profile.moe.model_copy(update={"routing": fleet.expert_routing, "zipf_exponent": exponent})
    return profile.model_copy(update={"moe": moe})


@dataclass(frozen=True, slots=True)
class ResolvedPool:
    """One pool of a scenario's fleet, resolved: its settings and what each of its replicas runs."""

    name: str
    role: Role
    replicas: int
    fleet: FleetConfig
    """The pool's own fleet fields (hardware, model, tp, profile), the fleet's filled in."""
    setup: ReplicaSetup

    @property
    def gpus(self) -> int:
        return self.replicas * self.fleet.tp


def pool_scenario(scenario: Scenario, name: str) -> Scenario:
    """Pool ``name`` of ``scenario.fleet.pools`` as a scenario of that one pool: its fleet fields with the
    fleet's filled in, and the engine section with the pool's engine fields over it."""
    fleet = scenario.fleet
    if fleet.pools is None or name not in fleet.pools:
        raise KeyError(name)
    pool = fleet.pools[name]
    hardware = pool.hardware or fleet.hardware
    model = pool.model or fleet.model
    tp = pool.tp or fleet.tp
    keeps = (hardware.lower(), model, tp) == (fleet.hardware.lower(), fleet.model, fleet.tp)
    profile = pool.profile if pool.profile is not None else fleet.profile if keeps else None
    pool_fleet = FleetConfig(replicas=pool.replicas, hardware=hardware, model=model, tp=tp, profile=profile,
                             weight_dtype=pool.weight_dtype or fleet.weight_dtype)
    engine = EngineConfig.model_validate(deep_merge(scenario.engine.model_dump(exclude_unset=True),
                                                    pool.engine.model_dump(exclude_unset=True)))
    return scenario.model_copy(update={"fleet": pool_fleet, "engine": engine})


def resolve_pools(scenario: Scenario) -> list[ResolvedPool]:
    """Every pool of the fleet, resolved (a fleet without ``pools`` is one mixed pool named ``fleet``), with
    the rules that tie pools together checked: roles, one block size, and a decode pool able to take its
    prefill pools' KV as it is."""
    if scenario.fleet.pools is None:
        return [ResolvedPool("fleet", Role.MIXED, scenario.fleet.replicas, scenario.fleet, resolve_replica(scenario))]
    pools = []
    for name, pool in scenario.fleet.pools.items():
        try:
            setup = resolve_replica(pool_scenario(scenario, name))
        except ConfigError as err:
            raise ConfigError(f"pool {name}: {err.message}", file=err.file,
                              field=_pool_field(name, err.field)) from None
        setup = ReplicaSetup(profile=setup.profile, scheduler=replace(setup.scheduler, role=pool.role))
        pools.append(ResolvedPool(name, pool.role, pool.replicas, pool_scenario(scenario, name).fleet, setup))
    _check_pools(scenario, pools)
    return pools


def _pool_field(pool: str, field: str | None) -> str:
    """A field of the one-pool scenario as the pool's own field (``fleet.tp`` -> ``fleet.pools.P.tp``)."""
    base = f"fleet.pools.{pool}"
    if not field or field == "fleet":
        return base
    if field.startswith("fleet."):
        return f"{base}.{field.removeprefix('fleet.')}"
    return f"{base}.{field}"


def _check_pools(scenario: Scenario, pools: list[ResolvedPool]) -> None:
    roles = {pool.role for pool in pools}
    if roles & {Role.PREFILL, Role.DECODE}:
        if Role.MIXED in roles:
            mixed = next(p.name for p in pools if p.role is Role.MIXED)
            raise ConfigError(f"pool {mixed} is mixed in a fleet of prefill and decode pools: a disaggregated "
                              "fleet's pools are each prefill or decode", field=f"fleet.pools.{mixed}.role")
        missing = Role.DECODE if Role.DECODE not in roles else Role.PREFILL if Role.PREFILL not in roles else None
        if missing is not None:
            raise ConfigError(f"a fleet with {'prefill' if missing is Role.DECODE else 'decode'} pools needs a "
                              f"{missing} pool too: requests go from one to the other", field="fleet.pools")
    first = pools[0]
    for pool in pools[1:]:
        if pool.setup.scheduler.block_size != first.setup.scheduler.block_size:
            raise ConfigError(
                f"pool {pool.name} has KV blocks of {pool.setup.scheduler.block_size} tokens and pool {first.name} "
                f"of {first.setup.scheduler.block_size}: one fleet has one block size (KV moves between pools "
                "block by block, and prefix hashes are per block)",
                field=f"fleet.pools.{pool.name}.engine.kv.block_size")
    prefill = [p for p in pools if p.role is Role.PREFILL]
    for pool in (p for p in pools if p.role is Role.DECODE):
        if pool.setup.scheduler.batching is Batching.STATIC:
            raise ConfigError(f"pool {pool.name} is a decode pool with static batching: a decode worker takes each "
                              "request into its running batch as its KV lands",
                              field=f"fleet.pools.{pool.name}.engine.batching")
        for other in prefill:
            _check_kv_compatible(other, pool)
            link_transfer(scenario, other, pool)  # the link exists and carries their KV


def _check_kv_compatible(prefill: ResolvedPool, decode: ResolvedPool) -> None:
    """A decode pool takes the KV its prefill pools compute, as it is: the same model and KV dtype."""
    p, d = prefill.setup.profile, decode.setup.profile
    if p.model != d.model:
        raise ConfigError(f"pool {decode.name} serves {d.model} but prefill pool {prefill.name} serves {p.model}: "
                          "a decode worker continues the prefill worker's KV", field=f"fleet.pools.{decode.name}.model")
    if (p.kv_dtype or p.dtype) != (d.kv_dtype or d.dtype):
        raise ConfigError(f"pool {decode.name} keeps KV as {d.kv_dtype or d.dtype} but prefill pool {prefill.name} "
                          f"as {p.kv_dtype or p.dtype}: the KV moves as it is",
                          field=f"fleet.pools.{decode.name}.engine.kv.dtype")
    if p.memory.kv_bytes_per_token * p.tp != d.memory.kv_bytes_per_token * d.tp:
        raise ConfigError(f"pool {decode.name}'s KV takes {d.memory.kv_bytes_per_token * d.tp} bytes per token and "
                          f"prefill pool {prefill.name}'s {p.memory.kv_bytes_per_token * p.tp}: their profiles "
                          "describe different KV layouts", field=f"fleet.pools.{decode.name}.profile")


def disaggregation_of(scenario: Scenario) -> DisaggregationConfig:
    """The scenario's hand-off settings (its section, or the defaults)."""
    return scenario.disaggregation if scenario.disaggregation is not None else DisaggregationConfig()


def link_transfer(scenario: Scenario, prefill: ResolvedPool, decode: ResolvedPool) -> TransferModel:
    """The link's transfer model between a replica of ``prefill`` and one of ``decode``."""
    config = disaggregation_of(scenario).link
    try:
        preset = get_link(config.preset)
    except ConfigError as err:
        raise ConfigError(err.message, field="disaggregation.link.preset") from None
    link = preset.model_copy(update={
        k: v for k, v in (("bandwidth_Bps", None if config.bandwidth_gb_s is None else config.bandwidth_gb_s * 1e9),
                          ("latency_s", None if config.latency_us is None else config.latency_us * 1e-6),
                          ("per_gpu", config.per_gpu)) if v is not None})
    return transfer_model(link, kv_bytes_per_token_per_rank=prefill.setup.profile.memory.kv_bytes_per_token,
                          prefill_tp=prefill.fleet.tp, decode_tp=decode.fleet.tp)


@dataclass(frozen=True, slots=True)
class ClientPath:
    """The path from the replicas to the clients, resolved: what the fleet adds to every token a client sees
    (``latency_s``) and the flush grid of a buffering proxy in between (``flush_interval_s``, 0: none)."""

    latency_s: float = 0.0
    flush_interval_s: float = 0.0


def client_path(scenario: Scenario, profiles: list[Profile]) -> ClientPath:
    """The scenario's network section with ``profile`` figures taken from the replicas' profiles (which must
    carry the same measured ``streaming`` block)."""
    network = scenario.network
    values: dict[str, float] = {}
    for name in ("latency_ms", "flush_interval_ms"):
        value = getattr(network, name)
        if value != "profile":
            values[name] = float(value)
            continue
        figures = {p.streaming for p in profiles}
        if None in figures:
            missing = next(p.name for p in profiles if p.streaming is None)
            raise ConfigError(f"profile {missing} carries no measured streaming figures: give network.{name} in "
                              f"milliseconds, or fit a profile with 'fleetsim calibrate --endpoint'",
                              field=f"network.{name}")
        if len(figures) > 1:
            raise ConfigError(f"the pools' profiles carry different streaming figures: give network.{name} in "
                              f"milliseconds", field=f"network.{name}")
        values[name] = float(getattr(next(iter(figures)), name))
    return ClientPath(latency_s=values["latency_ms"] / 1000.0, flush_interval_s=values["flush_interval_ms"] / 1000.0)


def tier_groups(scenario: Scenario) -> "list[TierGroup]":
    """The replicas KV tiers attach to, by model and block size (one group per pool); checks that tiers can
    attach (a prefix cache on every replica, one model and block size where a store is shared); none without
    a ``kv_tiers`` section."""
    config = scenario.kv_tiers
    if config is None:
        return []
    from simulator.fleet.kv_store import TierGroup, check_groups  # a plain run does not import the tiers

    if scenario.fleet.pools is None:
        setups = [(resolve_replica(scenario), scenario.fleet.replicas, "engine.prefix_caching")]
    else:
        setups = [(pool.setup, pool.replicas, f"fleet.pools.{pool.name}.engine.prefix_caching")
                  for pool in resolve_pools(scenario)]
    groups = []
    for setup, replicas, where in setups:
        if not setup.scheduler.prefix_caching:
            raise ConfigError("KV tiers hold evicted prefix-cache blocks: they need the prefix cache on "
                              "(and a paged or reserve KV policy)", field=where)
        groups.append(TierGroup(model=setup.profile.model, block_size=setup.scheduler.block_size,
                                cost=CostModel(setup.profile, factor=scenario.simulation.cost_factor),
                                num_replicas=replicas))
    check_groups(config, groups)
    return groups


def fleet_block_size(scenario: Scenario) -> int:
    """Tokens per KV block of the scenario's fleet (one for all its pools): what its workload hashes by."""
    if scenario.fleet.pools is None:
        return resolve_replica(scenario).scheduler.block_size
    return resolve_pools(scenario)[0].setup.scheduler.block_size


HOST_ENGINE_OF_PRESET: dict[str, str] = {"tgi": "tgi", "trtllm": "trtllm", "trtllm-max-util": "trtllm"}
"""The host-overhead preset (calibration/engines.yaml) of each scheduler preset other than vLLM's, whose host
preset follows its scheduling mode: vllm-v1-async under async scheduling, vllm-v1 without."""


def host_engine(preset: str | None, async_scheduling: bool) -> str:
    """The engines.yaml preset whose host overhead a replica of this scheduler preset pays per step."""
    if preset in HOST_ENGINE_OF_PRESET:
        return HOST_ENGINE_OF_PRESET[preset]
    return "vllm-v1-async" if async_scheduling else "vllm-v1"


def with_engine_host(profile: Profile, preset: str | None, async_scheduling: bool) -> Profile:
    """``profile`` with the host term of the engine the scenario runs, when the profile's host term is an
    engine preset's (fitted-published and analytic profiles); a measured profile keeps its measured host
    term. An engine that overlaps host work with the device does so only when it schedules ahead."""
    if profile.host_s.engine is None:
        return profile
    name = host_engine(preset, async_scheduling)
    if name == profile.host_s.engine:
        return profile
    coefficients, overlap = host_coefficients(name)
    return profile.model_copy(update={"host_s": coefficients, "overlap_host": overlap})


BYTES_PER_REQUEST = 2_200
"""Peak memory a simulated request costs a whole run, workload to report (measured: 16 H200 replicas, 20 k
and 200 k chat requests peaked at 485 MB and 856 MB; about 2.1 KB per request)."""
BYTES_PER_REPLICA = 16_000
"""Peak memory one more replica costs (measured: 16 and 1,024 replicas at 2,000 requests, 208 and 223 MB)."""
BASE_BYTES = 250_000_000
"""What a run holds before its first request: the interpreter, numpy, pandas, pyarrow, plotly."""


def memory_estimate_bytes(scenario: Scenario) -> int | None:
    """Peak memory a run of ``scenario`` will need, from its request and replica counts; None when the
    request count is only known once a trace is read (a trace's rows bound it then)."""
    workload = scenario.workload
    num_requests: float | None = workload.num_requests
    if workload.arrival is not None and workload.duration_s is not None:
        by_duration = min(workload.arrival.peak_rate_rps * workload.duration_s, 1e18)  # finite (1e308 rps...)
        num_requests = by_duration if num_requests is None else min(num_requests, by_duration)
    if num_requests is None:
        return None
    pools = scenario.fleet.pools
    replicas = sum(pool.replicas for pool in pools.values()) if pools is not None else scenario.fleet.replicas
    return int(BASE_BYTES + num_requests * BYTES_PER_REQUEST + replicas * BYTES_PER_REPLICA)


def available_memory_bytes() -> int | None:
    """Memory this machine can give a new process now (Linux's MemAvailable), else its physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_hash_ring(scenario: Scenario) -> None:
    """Refuse a session-affinity hash ring too large to build (``MAX_RING_POINTS``)."""
    points = scenario.router.virtual_nodes * scenario.fleet.replicas
    if points > MAX_RING_POINTS:
        raise ConfigError(f"{scenario.router.virtual_nodes:,} virtual nodes x {scenario.fleet.replicas:,} replicas "
                          f"= {points:,} hash-ring points, more than {MAX_RING_POINTS:,}", field="router.virtual_nodes")


def check_memory(scenario: Scenario) -> None:
    """Refuse, before anything is allocated, a run that cannot fit in this machine's memory."""
    need = memory_estimate_bytes(scenario)
    have = available_memory_bytes()
    if need is None or have is None or need <= have:
        return
    field = "workload.num_requests" if scenario.workload.num_requests is not None else "workload.duration_s"
    raise ConfigError(
        f"this run would need about {need / 2**30:,.1f} GiB of memory (about {BYTES_PER_REQUEST / 1000:.1f} KB per "
        f"request, {BYTES_PER_REPLICA / 1000:.0f} KB per replica) and this machine has {have / 2**30:,.1f} GiB "
        "available: simulate fewer requests, or split the run",
        field=field,
    )


OPTIONAL_SECTIONS = (("disaggregation",), ("fleet", "pools"), ("lifecycle",), ("autoscaling",), ("failures",))
"""Sections of features a run may not use: left out of its record when unset, so the record of a run
without them reads as it did before they existed."""


def scenario_record(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario as plain JSON data, for summary.json and exports."""
    data: dict[str, Any] = json.loads(scenario.model_dump_json(exclude={"variants"}))
    for path in OPTIONAL_SECTIONS:
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if parent.get(path[-1], ...) is None:
            del parent[path[-1]]
    return data
