"""Engine presets: the host (CPU) overhead of one step of a named serving engine, with its sources.

A profile fitted to published GPU kernel timings has device time only; the host term
``h0 + per_seq·B + per_token·N`` (and whether the engine overlaps it with the device) depends on the
serving engine being modelled, not on the GPU. The figures live in ``calibration/engines.yaml``, a data
file found by path (as ``hardware.yaml`` is); this module is its schema and loader.

Device-free: it never imports torch or ``calibration``. Loading errors become one ``ConfigError`` naming
the file and the field.
"""

import functools
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, ValidationInfo, field_validator

from simulator import yaml_text
from simulator.cost.profile import HostCoefficients, config_error_from_validation
from simulator.errors import ConfigError, did_you_mean

_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
"""Free text that must say something (whitespace alone is empty)."""

_EngineName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]*$")]
"""A preset name as scenarios spell it: lower case, digits, '.', '-' (e.g. 'vllm-v1-async')."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Basis(StrEnum):
    """How a coefficient was obtained."""

    MEASURED = "measured"
    """Fitted to published measurements of that engine."""
    DERIVED = "derived"
    """Arithmetic from a published fraction or ratio plus a stated assumption."""
    ASSUMED = "assumed"
    """An architecture-informed assumption; no public measurement behind it."""


class CoefficientBasis(_Frozen):
    """The basis of each host coefficient of a preset."""

    h0_s: Basis
    """Basis of the fixed seconds per step."""
    per_seq_s: Basis
    """Basis of the seconds per sequence."""
    per_token_s: Basis
    """Basis of the seconds per new token."""


class EnginePreset(_Frozen):
    """Host overhead of one step of one serving engine (and mode): ``h0 + per_seq·B + per_token·N``."""

    h0_s: float = Field(ge=0)
    """Fixed host seconds per non-empty step (scheduling, input preparation, launch, output sync)."""
    per_seq_s: float = Field(ge=0)
    """Host seconds per sequence in the step (per-request bookkeeping, output processing)."""
    per_token_s: float = Field(ge=0)
    """Host seconds per new token in the step (per-token input preparation)."""
    overlap_host: bool
    """True when the engine prepares step n+1 while the device runs step n (step = max(device, host));
    False when host work sits between steps (step = device + host)."""
    basis: CoefficientBasis
    """Whether each coefficient is measured, derived or assumed."""
    source: _Text
    """One paragraph: every figure's URL (or repository and path), what it says, and the arithmetic."""
    notes: str = ""
    """Scope, caveats and what would replace an assumption."""

    def host_coefficients(self, name: str) -> HostCoefficients:
        """These figures as a profile's host term, labelled with the preset ``name`` and its source."""
        return HostCoefficients(
            h0_s=self.h0_s, per_seq_s=self.per_seq_s, per_token_s=self.per_token_s, engine=name, source=self.source
        )


class EngineTable(_Frozen):
    """The contents of calibration/engines.yaml."""

    schema_version: Literal[1] = 1
    """Version of this schema."""
    engines: dict[_EngineName, EnginePreset] = Field(min_length=1)
    """Presets by name (e.g. 'vllm-v1-async')."""
    default: str
    """The preset used when a scenario names none (one of ``engines``; validated after them)."""
    default_source: _Text
    """Why that preset is the default: the engine's own configuration or release notes, cited."""

    @field_validator("default")
    @classmethod
    def _default_is_a_preset(cls, value: str, info: ValidationInfo) -> str:
        engines = info.data.get("engines")
        if engines is not None and value not in engines:
            known = list(engines)
            raise ValueError(f"not a preset{did_you_mean(value, known)}; known: {', '.join(known)}")
        return value


def engines_path() -> Path:
    """Where the preset table lives (a data file of the calibration package, found by path)."""
    import simulator

    return Path(simulator.__file__).resolve().parent.parent / "calibration" / "engines.yaml"


def load_engines(path: str | Path | None = None) -> EngineTable:
    """The preset table, validated. A file is read once per version (its size and modification time)."""
    path = Path(path) if path is not None else engines_path()
    try:
        stat = path.stat()
    except OSError as err:
        raise ConfigError(f"cannot read engine table: {err.strerror or err}", file=path) from None
    return _load_engines_file(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _load_engines_file(path: Path, mtime_ns: int, size: int) -> EngineTable:
    try:
        data = yaml_text.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read engine table: {err}", file=path) from None
    if not isinstance(data, dict):
        raise ConfigError(f"an engine table must be a mapping, got {type(data).__name__}", file=path)
    try:
        return EngineTable.model_validate(data)
    except ValidationError as err:
        raise config_error_from_validation(err, EngineTable, file=path) from None


def get_engine(name: str | None = None, table: EngineTable | None = None) -> EnginePreset:
    """One preset by name (the table's default when None); an unknown name is a ConfigError that
    suggests the closest name and lists the known ones."""
    table = table if table is not None else load_engines()
    key = table.default if name is None else name
    if key in table.engines:
        return table.engines[key]
    known = list(table.engines)
    raise ConfigError(f"unknown engine {key!r}{did_you_mean(key, known)}; known: {', '.join(known)}", field="engine")


def host_coefficients(name: str | None = None, table: EngineTable | None = None) -> tuple[HostCoefficients, bool]:
    """(host term, overlap_host) of a preset (the default when None), ready for a Profile's ``host_s`` and
    ``overlap_host``."""
    table = table if table is not None else load_engines()
    key = table.default if name is None else name
    preset = get_engine(key, table)
    return preset.host_coefficients(key), preset.overlap_host
