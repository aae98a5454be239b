"""The base of every ``workload:`` configuration section: frozen, unknown keys rejected, field
docstrings kept as descriptions."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
