"""The base of every ``workload:`` configuration section: frozen, unknown keys rejected, field
docstrings kept as descriptions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
