"""The What-if page's controls (``Controls``) and the scenario mapping they read from and write to.

``controls_from_raw`` reads a scenario into control values (requests capped for a quick run);
``apply_controls`` writes control values back into a scenario mapping. Nothing here renders.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from dashboard.data.choices import AUTO_PROFILE, DEFAULT
from dashboard.data.scenario_base import SCRATCH
from dashboard.data.trace_files import guess_trace_format
from simulator.errors import ConfigError
from simulator.scenario import pick_profile
from simulator.workload.traces import TRACES_TOKEN, TraceFormat

DEFAULT_MAX_REQUESTS = 2000
"""Requests a dashboard run simulates unless the user asks for more: a run then takes a few seconds. As
large as every shipped scenario, so the dashboard opens each on the same requests ``fleetsim run`` uses."""

LoadSource = Literal["synthetic", "trace"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Controls:
    """Values of the What-if page's controls; each widget holds one field (key ``<page prefix><field>``)."""

    load_source: LoadSource = "synthetic"
    """synthetic (the scenario's arrival process and lengths) or trace (replay a shipped trace)."""
    rate_rps: float | None = 20.0
    """Arrival rate, requests/s (None when the scenario's arrival process has no single rate, e.g. a curve);
    for a length-only (vidur) trace, the rate of its Poisson arrivals."""
    num_requests: int = DEFAULT_MAX_REQUESTS
    """Requests simulated; capped at DEFAULT_MAX_REQUESTS when taken from a scenario, so a run is quick."""
    trace_file: str | None = None
    """A file in the traces folder, or a scenario's own trace path as written."""
    time_scale: float = 1.0
    """Multiply every trace arrival time by this (0.5 doubles the load)."""
    replicas: int = 1
    hardware: str = "H200"
    model: str = "llama-3-8b"
    tp: int = 1
    profile: str = AUTO_PROFILE
    preset: str = DEFAULT
    batching: str = DEFAULT
    max_num_batched_tokens: int | None = None
    """Token budget of one step; None = the preset's."""
    kv_policy: str = DEFAULT
    block_size: int | None = None
    """Tokens per KV block; None = the preset's."""
    prefix_caching: str = DEFAULT
    router: str = "round_robin"
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    target_attainment: float = 0.9


CONTROL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Controls))


def controls_from_raw(raw: Mapping[str, Any]) -> Controls:
    """The control values that reproduce a (valid) scenario mapping, requests capped for a quick run."""
    workload = raw.get("workload") or {}
    fleet = raw.get("fleet") or {}
    engine = raw.get("engine") or {}
    kv = engine.get("kv") or {}
    slo = raw.get("slo") or {}
    trace = workload.get("trace")
    arrival = workload.get("arrival") or {}
    num_requests = workload.get("num_requests")
    num_requests = min(int(num_requests), DEFAULT_MAX_REQUESTS) if num_requests else DEFAULT_MAX_REQUESTS
    trace_file = None
    if trace:
        path = str(trace.get("path", ""))
        trace_file = path[len(TRACES_TOKEN):].lstrip("/\\") if path.startswith(TRACES_TOKEN) else path
    rate = arrival.get("rate_rps")
    if rate is None and not arrival:  # a timestamped trace: the rate control is unused; keep a sane value
        rate = 20.0
    hardware = str(fleet.get("hardware", "H200"))
    model = str(fleet.get("model", "llama-3-8b"))
    tp = int(fleet.get("tp", 1))
    prefix = engine.get("prefix_caching")
    return Controls(
        load_source="trace" if trace else "synthetic",
        rate_rps=float(rate) if rate is not None else None,
        num_requests=num_requests,
        trace_file=trace_file,
        time_scale=float(trace.get("time_scale") or 1.0) if trace else 1.0,
        replicas=int(fleet.get("replicas", 1)),
        hardware=hardware,
        model=model,
        tp=tp,
        profile=profile_control(fleet.get("profile"), hardware, model, tp),
        preset=str(engine.get("preset") or DEFAULT),
        batching=str(engine.get("batching") or DEFAULT),
        max_num_batched_tokens=engine.get("max_num_batched_tokens"),
        kv_policy=str(kv.get("policy") or DEFAULT),
        block_size=kv.get("block_size"),
        prefix_caching=DEFAULT if prefix is None else ("on" if prefix else "off"),
        router=str((raw.get("router") or {}).get("policy", "round_robin")),
        ttft_ms=_float_or_none(slo.get("ttft_ms")),
        tpot_ms=_float_or_none(slo.get("tpot_ms")),
        target_attainment=float(slo.get("target_attainment", 0.9)),
    )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def profile_control(profile: Any, hardware: str, model: str, tp: int) -> str:
    """A named profile that is the one "auto" would pick reads as auto, so changing the hardware works."""
    if profile is None:
        return AUTO_PROFILE
    from simulator.scenario import FleetConfig

    try:
        auto = pick_profile(FleetConfig(hardware=hardware, model=model, tp=tp)).name
    except (ConfigError, ValueError):
        return str(profile)
    return AUTO_PROFILE if auto == profile else str(profile)


def apply_controls(base_raw: Mapping[str, Any], controls: Controls) -> dict[str, Any]:
    """The scenario the controls describe: the base mapping with every controlled field replaced.

    The result is a single-variant scenario (the What-if page runs one configuration; the base's
    variants belong to the Compare page). Fields no control covers (sessions, system prompts, network,
    simulation) are kept as the base has them.
    """
    raw = copy.deepcopy(dict(base_raw))
    raw.pop("variants", None)
    raw["workload"] = _workload(raw.get("workload") or {}, controls)
    fleet = dict(raw.get("fleet") or {})
    fleet.update(replicas=controls.replicas, hardware=controls.hardware, model=controls.model, tp=controls.tp)
    _set(fleet, "profile", None if controls.profile == AUTO_PROFILE else controls.profile)
    raw["fleet"] = fleet
    engine = dict(raw.get("engine") or {})
    _set(engine, "preset", _choice(controls.preset))
    _set(engine, "batching", _choice(controls.batching))
    _set(engine, "max_num_batched_tokens", controls.max_num_batched_tokens)
    _set(engine, "prefix_caching", None if controls.prefix_caching == DEFAULT else controls.prefix_caching == "on")
    kv = dict(engine.get("kv") or {})
    _set(kv, "policy", _choice(controls.kv_policy))
    _set(kv, "block_size", controls.block_size)
    _set(engine, "kv", kv or None)
    raw["engine"] = engine
    router = dict(raw.get("router") or {})
    router["policy"] = controls.router
    raw["router"] = router
    if controls.ttft_ms is None and controls.tpot_ms is None:
        raw.pop("slo", None)
    else:
        slo = {"ttft_ms": controls.ttft_ms, "tpot_ms": controls.tpot_ms}
        raw["slo"] = {k: v for k, v in slo.items() if v is not None} | {"target_attainment": controls.target_attainment}
    return raw


def _workload(base: Mapping[str, Any], controls: Controls) -> dict[str, Any]:
    workload: dict[str, Any] = {"num_requests": controls.num_requests}
    if base.get("duration_s") is not None:
        workload["duration_s"] = base["duration_s"]
    if controls.load_source == "trace":
        if not controls.trace_file:
            raise ConfigError("pick a trace file (none found in the traces folder)", field="workload.trace.path")
        path = controls.trace_file
        fmt = guess_trace_format(path)
        old = dict(base.get("trace") or {})
        if Path(path).name == path:  # a bare file name is one of the shipped traces
            path = f"{TRACES_TOKEN}/{path}"
        if fmt is None:
            fmt = TraceFormat(old["format"]) if old.get("format") else None
        if fmt is None:
            raise ConfigError(f"cannot tell the format of trace {path!r} from its name", field="workload.trace")
        trace: dict[str, Any] = dict(old) if old.get("path") == path else {}
        trace.update(format=fmt.value, path=path)
        trace.pop("rate_rps", None)
        if fmt is TraceFormat.VIDUR:
            trace.pop("time_scale", None)
            trace.pop("start_s", None)
            workload["arrival"] = {"process": "poisson", "rate_rps": controls.rate_rps}
        else:
            _set(trace, "time_scale", None if controls.time_scale == 1.0 else controls.time_scale)
        workload["trace"] = trace
        return workload
    synthetic = base if base.get("trace") is None else SCRATCH["workload"]
    for key in ("prompt_tokens", "output_tokens", "system_prompts", "sessions"):
        if synthetic.get(key) is not None:
            workload[key] = copy.deepcopy(synthetic[key])
    arrival = dict(synthetic.get("arrival") or {"process": "poisson"})
    if "points" not in arrival and arrival.get("process") != "diurnal":
        arrival["rate_rps"] = controls.rate_rps  # a rate curve or a day's cycle keeps its own rates
    workload["arrival"] = arrival
    return workload


def _choice(value: str) -> str | None:
    return None if value == DEFAULT else value


def _set(mapping: dict[str, Any], key: str, value: Any) -> None:
    """Set, or remove when None (absent keys fall back to presets and defaults)."""
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value
