"""The Calibration page's data: a profile's predicted step-time curves, measured points and facts.

Predictions come from the simulator's own ``CostModel``; nothing here renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import Profile, list_profiles, load_profile, resolve_profile_path
from simulator.errors import ConfigError

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
