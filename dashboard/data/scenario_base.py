"""The scenario a page starts from (shipped, uploaded or from scratch) and its text forms (YAML, run key).

Every scenario is read by the CLI's own strict loader; nothing here renders.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dashboard.data.file_access import SCENARIOS_DIR, check_paths
from simulator import yaml_text
from simulator.errors import ConfigError
from simulator.scenario import load_scenario

DEFAULT_SCENARIO = "quickstart"
"""The shipped scenario the pages start from."""
FROM_SCRATCH = "(from scratch)"
UPLOAD = "(upload YAML…)"

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
    """An uploaded scenario, read by the CLI's strict loader; errors name the uploaded file. A file it
    names outside the dashboard's folders is refused before anything opens it (``file_access``)."""
    name = Path(filename).name or "uploaded.yaml"
    with tempfile.TemporaryDirectory(prefix="fleetsim-upload-") as folder:
        path = Path(folder) / name
        path.write_bytes(content)
        try:
            _check_upload_paths(content)
            loaded = load_scenario(path)
        except ConfigError as err:
            raise ConfigError(err.message, file=name if err.file in (str(path), None) else err.file,
                              field=err.field) from None
    digest = hashlib.sha256(content).hexdigest()[:16]
    return Base(key=f"upload:{name}:{digest}", raw=loaded.raw, source=None)


def _check_upload_paths(content: bytes) -> None:
    """``check_paths`` on an upload as YAML, before the loader (which opens the profile it names) runs;
    text that does not parse is left to the loader, whose error says why."""
    try:
        raw = yaml_text.safe_load(content.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        return
    if isinstance(raw, Mapping):
        check_paths(raw, source=None)


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


def raw_key(raw: Mapping[str, Any]) -> str:
    """A canonical JSON text of a scenario mapping: the cache key of a run."""
    return json.dumps(_plain(raw), sort_keys=True)
