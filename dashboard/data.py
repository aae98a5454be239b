"""Everything the dashboard pages compute: scenarios from control values, runs, and tables for display.

Plain functions over plain data, importable and testable without a running Streamlit. The few cached
wrappers (``st.cache_data``) only memoise a plain function of the same name without the ``cached_``
prefix. Every user mistake surfaces as one ``ConfigError`` — the same text the CLI prints — raised by the
simulator's own strict loader; nothing here validates a scenario a second way.

This module never renders (no ``st.`` call besides the cache decorators).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import streamlit as st
import yaml

from simulator.core.config import Batching, KVPolicy
from simulator.core.presets import PRESETS
from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import Profile, list_profiles, load_hardware, load_profile, resolve_profile_path
from simulator.errors import ConfigError
from simulator.fleet.fleet import run
from simulator.fleet.router import ROUTERS
from simulator.results.metrics import RunResult, Summary
from simulator.results.report import SUMMARY_ROWS, format_value
from simulator.scenario import LoadedScenario, load_mapping, load_scenario, pick_profile
from simulator.workload.traces import TRACES_TOKEN, TraceFormat, read_trace, traces_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIOS_DIR = REPO_ROOT / "scenarios"

DEFAULT_MAX_REQUESTS = 1500
"""Requests a dashboard run simulates unless the user asks for more: a run then takes a few seconds."""
DEFAULT = "default"
"""Choice meaning "leave this knob to the preset (or vLLM's defaults)": the key is left out of the YAML."""
AUTO_PROFILE = "auto"
"""Profile choice meaning "the shipped profile for this hardware, model and tp"."""
DEFAULT_SCENARIO = "quickstart"
"""The shipped scenario the pages start from."""
FROM_SCRATCH = "(from scratch)"
UPLOAD = "(upload YAML…)"
MAX_VARIANTS = 4

SCRATCH: dict[str, Any] = {
    "schema_version": 1,
    "name": "what-if",
    "description": "Built in the fleetsim dashboard.",
    "seed": 0,
    "workload": {
        "num_requests": 1000,
        "arrival": {"process": "poisson", "rate_rps": 20},
        "prompt_tokens": {"dist": "lognormal", "median": 900, "sigma": 0.9, "min": 16, "max": 8000},
        "output_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "min": 1, "max": 2000},
    },
    "fleet": {"replicas": 2, "hardware": "H200", "model": "llama-3-8b", "tp": 1},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
    "slo": {"ttft_ms": 500, "tpot_ms": 50, "target_attainment": 0.9},
}
"""The scenario "from scratch" starts from: the quickstart question at half the size."""

TRACE_PREFIXES: dict[str, TraceFormat] = {
    "azure": TraceFormat.AZURE,
    "mooncake": TraceFormat.MOONCAKE,
    "vidur": TraceFormat.VIDUR,
}
"""Shipped trace file names start with their format."""

KEY_METRICS: tuple[tuple[str, str, bool], ...] = (
    # (Summary field, label, lower is better)
    ("ttft_p50_ms", "TTFT p50 (ms)", True),
    ("ttft_p99_ms", "TTFT p99 (ms)", True),
    ("tpot_p50_ms", "TPOT p50 (ms)", True),
    ("tpot_p99_ms", "TPOT p99 (ms)", True),
    ("e2e_p99_ms", "E2E p99 (ms)", True),
    ("throughput_tok_s", "output tok/s", False),
    ("goodput_rps", "goodput (req/s)", False),
    ("slo_attainment", "SLO attainment", False),
    ("kv_util_mean", "mean KV use", False),
    ("preemptions", "preemptions", True),
    ("cost_per_mtok_usd", "$ / M output tokens", True),
)
"""The headline metrics of the What-if and Compare pages."""


# ----- where scenarios come from ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Base:
    """The scenario a page starts from: a shipped file, the built-in default, or an uploaded file."""

    key: str
    """Identity of the starting point: changes when the user picks another (resets the controls)."""
    raw: dict[str, Any]
    """The scenario mapping as written (validated once, never mutated)."""
    source: Path | None
    """The file relative trace paths resolve against; None for scratch and uploads."""


def list_scenarios(folder: Path = SCENARIOS_DIR) -> list[str]:
    """Stems of the shipped scenario files, sorted."""
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def scratch_base() -> Base:
    return Base(key=FROM_SCRATCH, raw=copy.deepcopy(SCRATCH), source=None)


def shipped_base(name: str, folder: Path = SCENARIOS_DIR) -> Base:
    """A shipped scenario, through the CLI's own loader (so a broken file fails as it would there)."""
    loaded = load_scenario(folder / f"{name}.yaml")
    return Base(key=f"scenario:{name}", raw=loaded.raw, source=loaded.source)


def uploaded_base(filename: str, content: bytes) -> Base:
    """An uploaded scenario, read by the CLI's strict loader; errors name the uploaded file."""
    name = Path(filename).name or "uploaded.yaml"
    with tempfile.TemporaryDirectory(prefix="fleetsim-upload-") as folder:
        path = Path(folder) / name
        path.write_bytes(content)
        try:
            loaded = load_scenario(path)
        except ConfigError as err:
            raise ConfigError(err.message, file=name if err.file == str(path) else err.file, field=err.field) from None
    digest = hashlib.sha256(content).hexdigest()[:16]
    return Base(key=f"upload:{name}:{digest}", raw=loaded.raw, source=None)


def base_for(choice: str) -> Base:
    """The starting point of a "Start from" choice other than an upload."""
    return scratch_base() if choice == FROM_SCRATCH else shipped_base(choice)


def to_yaml(raw: Mapping[str, Any]) -> str:
    """A scenario mapping as the YAML ``fleetsim run`` reads."""
    return yaml.safe_dump(_plain(raw), sort_keys=False, width=110, allow_unicode=True)


def _plain(value: Any) -> Any:
    """Tuples as lists, so safe_dump writes plain YAML sequences."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# ----- choices the controls offer --------------------------------------------------------------------


@cache
def hardware_names() -> list[str]:
    return list(load_hardware())


def _profile_parts() -> list[tuple[str, str, int]]:
    """(hardware, model, tp) of each shipped profile, from its name '{hw}-{model}-tp{tp}-{kind}'."""
    out = []
    for name in list_profiles():
        head, sep, _kind = name.rpartition("-")
        hw_model, tp_sep, tp = head.rpartition("-tp")
        hardware, dash, model = hw_model.partition("-")
        if sep and tp_sep and dash and tp.isdigit():
            out.append((hardware, model, int(tp)))
    return out


def model_names() -> list[str]:
    return sorted({model for _, model, _ in _profile_parts()})


def tp_choices() -> list[int]:
    return sorted({1, 2, 4, 8} | {tp for _, _, tp in _profile_parts()})


def profile_choices() -> list[str]:
    return [AUTO_PROFILE, *list_profiles()]


PRESET_CHOICES: tuple[str, ...] = (DEFAULT, *PRESETS)
BATCHING_CHOICES: tuple[str, ...] = (DEFAULT, *(b.value for b in Batching))
KV_POLICY_CHOICES: tuple[str, ...] = (DEFAULT, *(k.value for k in KVPolicy))
PREFIX_CHOICES: tuple[str, ...] = (DEFAULT, "on", "off")
ROUTER_CHOICES: tuple[str, ...] = tuple(ROUTERS)


def list_traces(folder: Path | None = None) -> list[str]:
    """Trace files (names) in the traces folder whose format the name reveals."""
    folder = folder if folder is not None else traces_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_file() and guess_trace_format(p.name) is not None)


AUTO_FORMAT = "auto"
"""Trace-format choice meaning "as the file name says"."""


def guess_trace_format(filename: str) -> TraceFormat | None:
    """The format of a shipped trace, from the start of its name; None when the name does not tell."""
    stem = Path(filename).name.lower()
    return next((fmt for prefix, fmt in TRACE_PREFIXES.items() if stem.startswith(prefix)), None)


# ----- What-if controls <-> scenario mapping ---------------------------------------------------------

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
        profile=_profile_control(fleet.get("profile"), hardware, model, tp),
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


def _profile_control(profile: Any, hardware: str, model: str, tp: int) -> str:
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
    if "points" not in arrival:  # a rate curve keeps its own rates; every other process has one rate
        arrival["rate_rps"] = controls.rate_rps
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


# ----- Compare: variants as overrides of one base -----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantControls:
    """One column of the Compare page: a name and the overrides it applies to the base scenario."""

    name: str
    replicas: int | None = None
    """None = as the base."""
    hardware: str = DEFAULT
    preset: str = DEFAULT
    batching: str = DEFAULT
    kv_policy: str = DEFAULT
    max_num_batched_tokens: int | None = None
    prefix_caching: str = DEFAULT
    router: str = DEFAULT
    other: tuple[tuple[str, Any], ...] = ()
    """Overrides from the scenario's own variants that no control covers, kept as dotted keys."""


VARIANT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(VariantControls) if f.name != "other")

_VARIANT_KEYS: dict[str, str] = {
    "replicas": "fleet.replicas",
    "hardware": "fleet.hardware",
    "preset": "engine.preset",
    "batching": "engine.batching",
    "kv_policy": "engine.kv.policy",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "prefix_caching": "engine.prefix_caching",
    "router": "router.policy",
}


def _dotted(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_dotted(value, path + "."))
        else:
            out[path] = value
    return out


def variant_from_override(name: str, override: Mapping[str, Any]) -> VariantControls:
    """Controls for one of a scenario's own variants (keys no control covers go to ``other``)."""
    flat = _dotted(override)
    values: dict[str, Any] = {}
    for field_name, key in _VARIANT_KEYS.items():
        if key in flat:
            value = flat.pop(key)
            if field_name == "prefix_caching":
                value = "on" if value else "off"
            values[field_name] = value
    return VariantControls(name=name, other=tuple(sorted(flat.items())), **values)


def default_variants(base_raw: Mapping[str, Any]) -> list[VariantControls]:
    """The Compare page's first columns: the scenario's own variants, else the base against a change of
    engine preset (a question every user of the page asks first)."""
    own = base_raw.get("variants") or {}
    if own:
        return [variant_from_override(n, o or {}) for n, o in list(own.items())[:MAX_VARIANTS]]
    preset = (base_raw.get("engine") or {}).get("preset") or "vllm"
    other = "tgi" if preset != "tgi" else "vllm"
    return [VariantControls(name="base"), VariantControls(name=other, preset=other)]


def variant_override(variant: VariantControls) -> dict[str, Any]:
    """The dotted-key override of one variant, as a scenario's ``variants:`` entry holds it."""
    override: dict[str, Any] = dict(variant.other)
    values = asdict(variant)
    for field_name, key in _VARIANT_KEYS.items():
        value = values[field_name]
        if value is None or value == DEFAULT:
            continue
        if field_name == "prefix_caching":
            value = value == "on"
        override[key] = value
    return override


def compare_raw(base_raw: Mapping[str, Any], variants: Sequence[VariantControls], num_requests: int) -> dict[str, Any]:
    """The base scenario with the given variants (replacing its own), run on one request stream."""
    names = [v.name.strip() for v in variants]
    if not 2 <= len(names) <= MAX_VARIANTS:
        raise ConfigError(f"compare 2 to {MAX_VARIANTS} variants, got {len(names)}", field="variants")
    empty = [i + 1 for i, n in enumerate(names) if not n]
    if empty:
        raise ConfigError(f"variant {empty[0]} has no name", field="variants")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"variant names must differ; {duplicates[0]!r} is used twice", field="variants")
    raw = copy.deepcopy(dict(base_raw))
    fleet = dict(raw.get("fleet") or {})
    if fleet.get("profile") is not None and _profile_control(
        fleet["profile"], str(fleet.get("hardware", "H200")), str(fleet.get("model", "llama-3-8b")),
        int(fleet.get("tp", 1)),
    ) == AUTO_PROFILE:  # the base's profile is the automatic one: let a variant change the hardware
        fleet.pop("profile")
        raw["fleet"] = fleet
    workload = dict(raw.get("workload") or {})
    workload["num_requests"] = num_requests
    raw["workload"] = workload
    raw["variants"] = {name: variant_override(v) for name, v in zip(names, variants, strict=True)}
    return raw


# ----- validating and running ------------------------------------------------------------------------

ProgressFn = Callable[[float, str], None]
"""progress(fraction done in [0, 1], text)."""


def validate(raw: Mapping[str, Any], source: Path | None = None) -> LoadedScenario:
    """The CLI's strict loader on a mapping: a ConfigError with the CLI's message, or the scenario."""
    return load_mapping(dict(raw), source=source)


def simulate(raw: Mapping[str, Any], source: Path | None = None, progress: ProgressFn | None = None) -> RunResult:
    """Validate and run every variant; ``progress`` sees the fraction of all variants' requests."""
    loaded = validate(raw, source)
    names = list(loaded.variants())

    def on_progress(variant: str, done: int, total: int) -> None:
        if progress is not None and total:
            index = names.index(variant) if variant in names else 0
            fraction = (index + done / total) / len(names)
            progress(min(1.0, fraction), f"simulating {variant}: {done:,} / {total:,} requests")

    return run(loaded, progress=on_progress)


RUN_CACHE_SIZE = 16
"""Runs kept in memory, so re-running unchanged settings (or returning to a page) is instant."""
_runs: OrderedDict[str, RunResult] = OrderedDict()
_runs_lock = threading.Lock()


def cached_simulate(raw_json: str, source: str | None, progress: ProgressFn | None = None) -> RunResult:
    """``simulate`` memoised on the scenario's JSON and source (least recently used dropped first).

    Not ``st.cache_data``: its replay of Streamlit elements forbids a progress bar drawn from inside."""
    key = f"{source}\n{raw_json}"
    with _runs_lock:
        if key in _runs:
            _runs.move_to_end(key)
            return _runs[key]
    result = simulate(json.loads(raw_json), Path(source) if source else None, progress)
    with _runs_lock:
        _runs[key] = result
        while len(_runs) > RUN_CACHE_SIZE:
            _runs.popitem(last=False)
    return result


def raw_key(raw: Mapping[str, Any]) -> str:
    """A canonical JSON text of a scenario mapping: the cache key of a run."""
    return json.dumps(_plain(raw), sort_keys=True)


# ----- shaping results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    met: bool | None
    """None when the scenario sets no SLO."""
    text: str


def slo_verdict(summary: Summary, raw: Mapping[str, Any]) -> Verdict:
    """Whether the run met its SLO, in one sentence."""
    slo = raw.get("slo")
    if not slo:
        return Verdict(None, "No SLO set: add a TTFT or TPOT target to get a verdict.")
    targets = ", ".join(f"{label} ≤ {slo[key]:g} ms" for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))
                        if slo.get(key) is not None)
    attainment = f"{100 * summary.slo_attainment:.1f} %"
    target = f"{100 * summary.slo_target_attainment:.0f} %"
    if summary.slo_met:
        return Verdict(True, f"SLO met: {attainment} of requests within {targets} (target {target}).")
    return Verdict(False, f"SLO missed: {attainment} of requests within {targets}, below the target {target}.")


def summary_table(result: RunResult) -> pd.DataFrame:
    """The report's summary rows, formatted as the report formats them; one column per variant."""
    data = {
        name: [format_value(getattr(v.summary, attr), kind) for attr, _, kind in SUMMARY_ROWS]
        + [f"{v.profile.name} ({v.profile.kind})"]
        for name, v in result.variants.items()
    }
    index = [label for _, label, _ in SUMMARY_ROWS] + ["profile"]
    return pd.DataFrame(data, index=pd.Index(index, name="metric"))


def delta_table(result: RunResult) -> pd.DataFrame:
    """Headline metrics per variant with the relative change against the first variant.

    Columns: ``metric``, then per variant its value, and for each variant after the first
    ``Δ <name> %`` (positive = larger than the baseline, whether that is better or worse)."""
    names = list(result.variants)
    baseline = result.variants[names[0]].summary
    rows = []
    for attr, label, _ in KEY_METRICS:
        row: dict[str, Any] = {"metric": label}
        base_value = float(getattr(baseline, attr))
        for name in names:
            row[name] = float(getattr(result.variants[name].summary, attr))
        for name in names[1:]:
            row[f"Δ {name} %"] = relative_change(base_value, row[name])
        rows.append(row)
    return pd.DataFrame(rows).set_index("metric")


def relative_change(base: float, value: float) -> float:
    """100 · (value − base) / |base|; NaN where undefined (base 0 or not finite)."""
    if not (math.isfinite(base) and math.isfinite(value)) or base == 0:
        return math.nan if value != base else 0.0
    return 100.0 * (value - base) / abs(base)


def metric_delta(attr: str, base: Summary, other: Summary) -> tuple[str, str | None]:
    """(value text, delta text) of one headline metric for st.metric; no delta when equal to base."""
    kind = next((k for a, _, k in SUMMARY_ROWS if a == attr), "num")
    value = float(getattr(other, attr))
    change = relative_change(float(getattr(base, attr)), value)
    delta = None if other is base or not math.isfinite(change) else f"{change:+.1f} %"
    return format_value(value, kind), delta


def lower_is_better(attr: str) -> bool:
    return next((lower for a, _, lower in KEY_METRICS if a == attr), True)


# ----- Calibration ----------------------------------------------------------------------------------

TIMINGS_SUFFIXES: tuple[str, ...] = (".csv", ".timings.csv", "-timings.csv")
"""Where a measured profile's raw timings may sit next to its YAML: <stem><suffix>."""


def timings_path(profile_name_or_path: str | Path) -> Path | None:
    """The raw timings CSV shipped beside a profile, if any."""
    path = resolve_profile_path(profile_name_or_path)
    for suffix in TIMINGS_SUFFIXES:
        candidate = path.with_name(path.stem + suffix)
        if candidate.is_file():
            return candidate
    return None


def default_profile_index(names: Sequence[str]) -> int:
    """The profile the Calibration page opens on: the quickstart fleet's (H200, Llama-3-8B, tp 1),
    a measured one first."""
    matches = [i for i, n in enumerate(names) if n.startswith("h200-llama-3-8b-tp1-")]
    measured = [i for i in matches if not names[i].endswith("-analytic")]
    return (measured or matches or [0])[0]


def list_profiles_with_timings() -> list[str]:
    """Shipped profiles that have raw timings beside them."""
    return [n for n in list_profiles() if timings_path(n) is not None]


def parse_int_list(text: str, *, field: str, minimum: int = 1) -> list[int]:
    """'512, 2048' -> [512, 2048] (sorted, unique, each >= minimum); else a ConfigError naming the field."""
    items = [t.strip() for t in text.replace(";", ",").split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        raise ConfigError(f"expected whole numbers >= {minimum} separated by commas, got {text!r}", field=field)
    return sorted(set(values))


def decode_shape(batch: int, context: int) -> StepShape:
    """A decode-only step: ``batch`` sequences, each attending ``context`` tokens."""
    return StepShape(num_seqs=batch, num_new_tokens=batch, num_decode_seqs=batch, decode_context_sum=batch * context,
                     num_prefill_tokens=0, prefill_attention_pairs=0.0)


def prefill_shape(chunk: int, prefix: int) -> StepShape:
    """One prefill chunk of ``chunk`` tokens after ``prefix`` computed tokens."""
    return StepShape(num_seqs=1, num_new_tokens=chunk, num_decode_seqs=0, decode_context_sum=0,
                     num_prefill_tokens=chunk, prefill_attention_pairs=chunk * (prefix + chunk / 2))


def _grid(largest: int, num_points: int = 48) -> np.ndarray:
    return np.unique(np.geomspace(1, max(1, largest), num_points).round().astype(np.int64))


def decode_curves(profile: Profile, contexts: Sequence[int], max_batch: int | None = None) -> pd.DataFrame:
    """Device and whole-step time of decode steps vs batch size, one curve per context length.

    Columns: context, batch, device_ms, step_ms."""
    model = CostModel(profile)
    largest = max_batch or (profile.valid_range.max_batch if profile.valid_range else 512)
    rows = [
        (c, int(b), 1e3 * model.device_time(decode_shape(int(b), c)), 1e3 * model.step_time(decode_shape(int(b), c)))
        for c in contexts
        for b in _grid(largest)
    ]
    return pd.DataFrame(rows, columns=["context", "batch", "device_ms", "step_ms"])


def prefill_curves(profile: Profile, prefixes: Sequence[int], max_chunk: int | None = None) -> pd.DataFrame:
    """Device and whole-step time of one prefill chunk vs its length, one curve per cached prefix.

    Columns: prefix, chunk, device_ms, step_ms."""
    model = CostModel(profile)
    largest = max_chunk or (profile.valid_range.max_chunk if profile.valid_range else 8192)
    rows = [
        (p, int(n), 1e3 * model.device_time(prefill_shape(int(n), p)), 1e3 * model.step_time(prefill_shape(int(n), p)))
        for p in prefixes
        for n in _grid(largest)
    ]
    return pd.DataFrame(rows, columns=["prefix", "chunk", "device_ms", "step_ms"])


TIMING_COLUMNS: tuple[str, ...] = (
    "num_seqs", "num_new_tokens", "num_decode_seqs", "decode_context_sum", "num_prefill_tokens",
    "prefill_attention_pairs", "device_s",
)
"""Columns of a raw timings CSV (calibration/fit.py's grid points) the Calibration page reads."""


def measured_points(profile: Profile, csv_path: Path) -> pd.DataFrame:
    """The profiled grid points with the profile's prediction for each.

    Columns: the timing columns, regime (decode / prefill / mixed), context (per decode sequence),
    prefix (cached tokens before a single prefill chunk), batch, chunk, measured_ms, predicted_ms,
    error_pct."""
    try:
        frame = pd.read_csv(csv_path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read timings: {err}", file=csv_path) from None
    missing = [c for c in TIMING_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(f"timings table lacks columns: {', '.join(missing)}", file=csv_path, field=missing[0])
    model = CostModel(profile)
    ints = frame[list(TIMING_COLUMNS[:5])].to_numpy(dtype=np.int64).tolist()
    pairs = frame["prefill_attention_pairs"].to_numpy(dtype=np.float64).tolist()
    shapes = (
        StepShape(num_seqs=b, num_new_tokens=n, num_decode_seqs=d, decode_context_sum=c, num_prefill_tokens=f,
                  prefill_attention_pairs=q)
        for (b, n, d, c, f), q in zip(ints, pairs, strict=True)
    )
    out = frame.copy()
    out["predicted_ms"] = [1e3 * model.device_time(s) for s in shapes]
    out["measured_ms"] = out["device_s"] * 1e3
    out["error_pct"] = 100 * (out["predicted_ms"] / out["measured_ms"] - 1)
    decode = out["num_prefill_tokens"] == 0
    prefill = (out["num_decode_seqs"] == 0) & (out["num_seqs"] == 1) & (out["num_prefill_tokens"] > 0)
    out["regime"] = np.where(decode, "decode", np.where(out["num_decode_seqs"] == 0, "prefill", "mixed"))
    with np.errstate(divide="ignore", invalid="ignore"):
        out["context"] = np.where(decode, out["decode_context_sum"] / out["num_seqs"].clip(lower=1), np.nan)
        n = out["num_prefill_tokens"].astype(float)
        out["prefix"] = np.where(prefill, (out["prefill_attention_pairs"] / n - n / 2).round(), np.nan)
    out["batch"] = out["num_seqs"]  # the decode plot's x
    out["chunk"] = out["num_prefill_tokens"]  # the prefill plot's x
    return out


def common_values(column: pd.Series, limit: int = 4) -> list[int]:
    """The ``limit`` most frequent values of a column (NaN ignored), sorted: the grid's main levels."""
    counts = column.dropna().round().astype(np.int64).value_counts()
    return sorted(int(v) for v in counts.index[:limit])


def profile_facts(profile: Profile) -> pd.DataFrame:
    """What a user checks before trusting a profile: kind, provenance, error and range, as rows."""
    prov = profile.provenance
    rows: list[tuple[str, str]] = [
        ("kind", profile.kind.value),
        ("hardware / model / tp", f"{profile.hardware} / {profile.model} / {profile.tp}"),
        ("dtype", profile.dtype),
        ("device", prov.device_name),
        ("date", prov.date),
        ("git revision", prov.git_revision or "—"),
        ("raw timings sha256", prov.raw_timings_sha256 or "—"),
        ("libraries", ", ".join(f"{k} {v}" for k, v in prov.library_versions.items()) or "—"),
        ("KV capacity (tokens)", f"{profile.memory.kv_capacity_tokens:,}"),
        ("KV bytes per token", f"{profile.memory.kv_bytes_per_token:,}"),
    ]
    if profile.derived_from:
        rows.append(("efficiencies from", profile.derived_from))
    if profile.fit_error is not None:
        err = profile.fit_error
        rows += [
            ("held-out MAPE", f"{100 * err.mape:.2f} %"),
            ("held-out max error", f"{100 * err.max_error:.2f} %"),
            ("held-out R²", f"{err.r2:.4f}"),
            ("grid points / folds", f"{err.num_points} / {err.num_folds}"),
        ]
    else:
        rows.append(("fit error", "none: not fitted to timings"))
    if profile.valid_range is not None:
        vr = profile.valid_range
        rows.append(("profiled range", f"batch ≤ {vr.max_batch}, context ≤ {vr.max_context}, chunk ≤ {vr.max_chunk}"))
    return pd.DataFrame(rows, columns=["field", "value"]).set_index("field")


@st.cache_data(max_entries=32, show_spinner=False)
def cached_profile(name_or_path: str) -> Profile:
    return load_profile(name_or_path)


# ----- Trace explorer -------------------------------------------------------------------------------


def load_trace_frame(filename: str, trace_format: TraceFormat | str | None = None,
                     folder: Path | None = None) -> pd.DataFrame:
    """A trace file (name in the traces folder, or a path) as arrival_s, prompt_tokens, output_tokens."""
    path = Path(filename)
    if not path.is_absolute():
        path = (folder if folder is not None else traces_dir()) / filename
    fmt = trace_format or guess_trace_format(path.name)
    if fmt is None:
        raise ConfigError("cannot tell the trace format from the file name; pick one", file=path)
    frame = read_trace(fmt, path)
    return frame.drop(columns=["hash_ids"], errors="ignore")


@st.cache_data(max_entries=8, show_spinner=False)
def cached_trace_frame(filename: str, trace_format: str | None) -> pd.DataFrame:
    return load_trace_frame(filename, trace_format)


def arrival_rate(frame: pd.DataFrame, bin_s: float, time_scale: float = 1.0) -> pd.DataFrame:
    """Arrivals per second in bins of ``bin_s`` seconds (after scaling times); empty without timestamps.

    Columns: time_s (bin start), rate_rps."""
    if bin_s <= 0:
        raise ConfigError(f"bin width must be > 0 s, got {bin_s}", field="bin_s")
    times = frame["arrival_s"].to_numpy(dtype=np.float64) * time_scale
    times = times[np.isfinite(times)]
    if times.size == 0:
        return pd.DataFrame({"time_s": [], "rate_rps": []})
    num_bins = max(1, math.ceil((times.max() + 1e-9) / bin_s))
    counts = np.bincount((times // bin_s).astype(np.int64), minlength=num_bins)
    return pd.DataFrame({"time_s": np.arange(counts.size) * bin_s, "rate_rps": counts / bin_s})


def trace_stats(frame: pd.DataFrame, time_scale: float = 1.0) -> pd.DataFrame:
    """Rows, span, mean rate, inter-arrival CV and length percentiles of a trace, as display rows."""
    rows: list[tuple[str, str]] = [("requests", f"{len(frame):,}")]
    times = frame["arrival_s"].to_numpy(dtype=np.float64) * time_scale
    times = times[np.isfinite(times)]
    if times.size > 1:
        span = float(times.max() - times.min())
        gaps = np.diff(np.sort(times))
        cv = float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else math.nan
        rows += [("span (s)", f"{span:,.1f}"), ("mean rate (req/s)", f"{(times.size - 1) / span:.2f}" if span else "—"),
                 ("inter-arrival CV", f"{cv:.2f}")]
    else:
        rows.append(("timestamps", "none (lengths only: arrivals come from a scenario's arrival process)"))
    for column in ("prompt_tokens", "output_tokens"):
        values = frame[column].to_numpy()
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        text = f"mean {values.mean():,.0f} · p50 {p50:,.0f} · p90 {p90:,.0f} · p99 {p99:,.0f} · max {values.max():,}"
        rows.append((column.replace("_", " "), text))
    return pd.DataFrame(rows, columns=["statistic", "value"]).set_index("statistic")
