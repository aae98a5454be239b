"""Trace files: which ones ship and their format, and the Trace explorer's frame, arrival rate and stats.

Files are read by the simulator's own trace readers; nothing here renders.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from dashboard.data.file_access import check_paths
from simulator.errors import ConfigError
from simulator.workload.trace_sources import TRACES_TOKEN, resolve_trace_path, trace_folders
from simulator.workload.traces import TraceFormat, quoted, read_trace

TRACE_PREFIXES: dict[str, TraceFormat] = {
    "azure": TraceFormat.AZURE,
    "mooncake": TraceFormat.MOONCAKE,
    "vidur": TraceFormat.VIDUR,
}
"""Shipped trace file names start with their format."""


def list_traces(folder: Path | None = None) -> list[str]:
    """Trace files (names) in the traces folders (or ``folder``) whose format the name reveals."""
    folders = (folder,) if folder is not None else trace_folders()
    return sorted({p.name for f in folders if f.is_dir() for p in f.iterdir()
                   if p.is_file() and guess_trace_format(p.name) is not None})


AUTO_FORMAT = "auto"
"""Trace-format choice meaning "as the file name says"."""


def guess_trace_format(filename: str) -> TraceFormat | None:
    """The format of a shipped trace, from the start of its name; None when the name does not tell."""
    stem = Path(filename).name.lower()
    return next((fmt for prefix, fmt in TRACE_PREFIXES.items() if stem.startswith(prefix)), None)


def trace_path(filename: str, folder: Path | None = None) -> Path:
    """Where a trace file name resolves: in ``folder``, else in the traces folders, as a scenario's
    ``${traces}/NAME`` does. Only a plain name in those folders: a path is refused (``file_access``)."""
    if folder is not None:
        if Path(filename).name != filename or filename in ("", ".", ".."):
            raise ConfigError(f"a trace is a file name in {folder}, got {quoted(filename)}", field="trace")
        return folder / filename
    text = f"{TRACES_TOKEN}/{filename}"
    check_paths({"path": text}, source=None)
    return resolve_trace_path(text)


def load_trace_frame(filename: str, trace_format: TraceFormat | str | None = None,
                     folder: Path | None = None) -> pd.DataFrame:
    """A trace file (a name in the traces folders, or in ``folder``) as arrival_s, prompt_tokens,
    output_tokens."""
    path = trace_path(filename, folder)
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
