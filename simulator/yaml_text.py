"""YAML text to Python values for scenario, profile, sweep and plan files: PyYAML's safe loader, run by
libyaml's C parser when PyYAML was built with it (the pure-Python parser is several times slower, and a
run reads its scenario and profile files every time), else by the pure-Python one. Same values, same
errors (``yaml.YAMLError``)."""

from __future__ import annotations

from typing import Any

import yaml

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, in C where available."""
    return yaml.load(text, Loader=_LOADER)  # a safe loader (C or Python)
