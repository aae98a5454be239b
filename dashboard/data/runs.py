"""Validating and running a scenario mapping, with a small in-memory cache of finished runs.

The key of a cached run is ``scenario_base.raw_key``; nothing here renders.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dashboard.data.file_access import check_paths
from simulator.results.run_result import RunResult
from simulator.scenario import LoadedScenario, load_mapping
from simulator.simulation import run

ProgressFn = Callable[[float, str], None]
"""progress(fraction done in [0, 1], text)."""


def validate(raw: Mapping[str, Any], source: Path | None = None) -> LoadedScenario:
    """The CLI's strict loader on a mapping: a ConfigError with the CLI's message, or the scenario. Files
    outside the dashboard's folders are refused first (``file_access``)."""
    check_paths(raw, source)
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
