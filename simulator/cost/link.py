"""KV transfer links: how long moving a request's KV from a prefill replica to a decode replica takes.

A link preset (``calibration/links.yaml``, every figure with its source) gives one GPU's bandwidth in one
direction, a fixed per-transfer latency, and whether each GPU of a replica has a link of its own. A
transfer of n tokens then takes::

    latency + n * KV bytes per token (whole replica) / (bandwidth * parallel links)

where the parallel links are min(tp of the prefill replica, tp of the decode replica) for per-GPU links
(each rank's KV shard moves over its own) and 1 otherwise. When a transfer starts, and what it waits
for (the link being busy, streaming layer by layer with the prefill), is the fleet's
(``simulator.fleet.disaggregation``); this module only prices bytes.

Device-free: it never imports torch or ``calibration``; loading errors are one ``ConfigError`` naming the
file and the field.
"""

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simulator import yaml_text
from simulator.cost.profile import config_error_from_validation, hardware_path
from simulator.errors import ConfigError, did_you_mean


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class LinkPreset(_Frozen):
    """One kind of link, as ``calibration/links.yaml`` states it."""

    description: str
    """What the link is, in words."""
    bandwidth_Bps: float = Field(gt=0)
    """One direction of one GPU's link (or of the replica's, when not ``per_gpu``), bytes/s."""
    latency_s: float = Field(ge=0)
    """Fixed cost of one transfer, seconds."""
    per_gpu: bool
    """Every GPU of a replica has such a link of its own (its KV shard moves in parallel with the others)."""
    sources: dict[str, str]
    """Source of each figure, keyed by field name."""

    @model_validator(mode="after")
    def _every_figure_sourced(self) -> Self:
        missing = [name for name in ("bandwidth_Bps", "latency_s") if name not in self.sources]
        if missing:
            raise ValueError(f"figures without a source: {', '.join(missing)}")
        return self


class LinkTable(_Frozen):
    """The contents of ``calibration/links.yaml``."""

    schema_version: Literal[1] = 1
    """Version of this schema."""
    links: dict[str, LinkPreset]
    """Link presets by name (e.g. 'nvlink4')."""


def links_path() -> Path:
    """Where the link table lives: beside the datasheet table, a data file of the calibration package."""
    return hardware_path().parent / "links.yaml"


@functools.lru_cache(maxsize=4)
def _load_links(path: Path, mtime_ns: int) -> dict[str, LinkPreset]:
    try:
        data = yaml_text.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read the link table: {err}", file=path) from None
    try:
        return dict(LinkTable.model_validate(data).links)
    except ValidationError as err:
        raise config_error_from_validation(err, LinkTable, file=path) from None


def load_links(path: str | Path | None = None) -> dict[str, LinkPreset]:
    """Every link preset, by name."""
    path = Path(path) if path is not None else links_path()
    return _load_links(path, path.stat().st_mtime_ns if path.is_file() else -1)


def get_link(name: str) -> LinkPreset:
    """One preset by name; an unknown name is a ConfigError listing the known ones."""
    links = load_links()
    if name in links:
        return links[name]
    raise ConfigError(f"unknown link {name!r}{did_you_mean(name, list(links))}; known: {', '.join(links)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferModel:
    """The time to move KV from one prefill replica to one decode replica (see the module docstring)."""

    bandwidth_Bps: float
    """One link, one direction, bytes/s."""
    latency_s: float
    """Fixed seconds per transfer."""
    num_links: int
    """Links carrying the replica's KV shards in parallel."""
    kv_bytes_per_token: float
    """KV bytes of one token over every rank of the replica."""

    def __post_init__(self) -> None:
        if not self.bandwidth_Bps > 0:
            raise ValueError(f"a link needs a positive bandwidth, got {self.bandwidth_Bps}")
        if self.latency_s < 0 or self.num_links < 1 or not self.kv_bytes_per_token > 0:
            raise ValueError("latency_s must be >= 0, num_links >= 1 and kv_bytes_per_token > 0")

    def num_bytes(self, num_tokens: int) -> float:
        return num_tokens * self.kv_bytes_per_token

    def wire_s(self, num_tokens: int) -> float:
        """Seconds the link is busy carrying ``num_tokens`` tokens of KV (the latency aside)."""
        return num_tokens * self.kv_bytes_per_token / (self.bandwidth_Bps * self.num_links)


def transfer_model(link: LinkPreset, *, kv_bytes_per_token_per_rank: int, prefill_tp: int,
                   decode_tp: int) -> TransferModel:
    """The transfer model between replicas of these tensor-parallel degrees over ``link``."""
    return TransferModel(
        bandwidth_Bps=link.bandwidth_Bps,
        latency_s=link.latency_s,
        num_links=min(prefill_tp, decode_tp) if link.per_gpu else 1,
        kv_bytes_per_token=float(kv_bytes_per_token_per_rank * prefill_tp),
    )
