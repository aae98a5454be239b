"""Speculative decoding's settings and price: the draft passes and the (1 + k)-token verification step.

A step with proposals costs the target model's forward over every row's new tokens (B·(1 + s) for B
decode rows with s proposals each; ``core.speculation.verify_shape_fields``) plus the drafting: s passes of
the drafter over the rows that draft, each priced as a fraction of the target's decode step of those rows
(``draft_cost_fraction``): an n-gram lookup ~0, an EAGLE head about one layer of the target (1 / layers),
a separate draft model its share of the target's step (about its weight bytes over the target's at small
batch). **Analytic**: no draft was measured on a GPU; the engine's self-draft measures acceptance and its own
step times (``benchmarks/speculative.py``).

The scenario's ``engine.speculative`` section (``SpeculativeConfig``) resolves to the core's
``Speculation`` here; the scheduler reads k, the replica draws acceptance and prices steps with it
(``cost.speculative_step``, compiled with the per-step path).
"""

from enum import StrEnum
from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator import yaml_text
from simulator.core.speculation import Speculation
from simulator.cost.profile import Profile
from simulator.errors import ConfigError


class DraftMethod(StrEnum):
    NGRAM = "ngram"
    """Prompt lookup (vLLM's ``ngram``): proposals copied from earlier text, no model run (cost ~0)."""
    EAGLE = "eagle"
    """An EAGLE / MTP head: about one decoder layer of the target per proposal (1 / layers by default; its
    LM head, as large as 2.4 of Llama-3-8B's layers, is not counted: give ``draft_cost_fraction`` to)."""
    DRAFT_MODEL = "draft_model"
    """A separate small model: its share of the target's decode step per proposal (give it)."""


class SpeculativeConfig(BaseModel):
    """Speculative decoding of every replica (``engine.speculative``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    method: DraftMethod = DraftMethod.EAGLE
    """ngram, eagle or draft_model: what proposes (and so what drafting costs)."""
    num_speculative_tokens: int = Field(ge=0, le=64)
    """k: proposals per decode step (vLLM's ``num_speculative_tokens``); 0 = off."""
    acceptance_rate: float | None = Field(default=None, ge=0, le=1)
    """α: every proposal accepted with this probability given the ones before it were."""
    acceptance_rates: tuple[float, ...] | None = None
    """Per draft position, the probability it is accepted given the earlier ones were (EAGLE's fall with
    depth); at most k, the last repeated."""
    acceptance_table: str | None = None
    """A measured table: a YAML or JSON file whose ``acceptance_rates`` lists per-position rates (as
    ``benchmarks/speculative.py --rates-out`` writes the engine's), read like ``acceptance_rates``; a path
    from the working directory, as ``fleet.profile``."""
    draft_cost_fraction: float | None = Field(default=None, ge=0, le=10)
    """One drafting pass as a fraction of the target's decode step of the same rows; None = the method's
    (ngram 0, eagle 1 / the model's layers; draft_model has none: give it)."""

    @model_validator(mode="after")
    def _rates(self) -> Self:
        given = [self.acceptance_rate, self.acceptance_rates, self.acceptance_table]
        if sum(value is not None for value in given) != 1:
            raise ValueError("give exactly one of acceptance_rate (α), acceptance_rates (per position) and "
                             "acceptance_table (a file of measured rates)")
        if self.acceptance_rates is not None:
            check_rates(self.acceptance_rates, self.num_speculative_tokens)
        if self.method is DraftMethod.DRAFT_MODEL and self.draft_cost_fraction is None:
            raise ValueError("method draft_model needs draft_cost_fraction (the draft's share of a target step)")
        return self

    def resolve(self, profile: Profile, seed: int) -> Speculation | None:
        """The core's setting for replicas running ``profile`` (None when k is 0)."""
        k = self.num_speculative_tokens
        if k == 0:
            return None
        if self.acceptance_rates is not None or self.acceptance_table is not None:
            given = self.acceptance_rates if self.acceptance_rates is not None else self.table_rates()
            rates = tuple(given[min(i, len(given) - 1)] for i in range(k))
        else:
            assert self.acceptance_rate is not None
            rates = (self.acceptance_rate,) * k
        return Speculation(num_speculative_tokens=k, acceptance_rates=rates,
                           draft_cost_fraction=self.draft_fraction(profile), seed=seed)

    def table_rates(self) -> tuple[float, ...]:
        """The rates of ``acceptance_table``; a file that cannot be read or holds no valid list is a
        ConfigError naming it."""
        assert self.acceptance_table is not None
        path = Path(self.acceptance_table)
        where = "engine.speculative.acceptance_table"
        try:
            data = yaml_text.safe_load(path.read_text())
        except OSError as err:
            raise ConfigError(f"cannot read acceptance table: {err.strerror or err}", file=path, field=where) from None
        except yaml.YAMLError:
            raise ConfigError("acceptance table is not valid YAML or JSON", file=path, field=where) from None
        rates = data.get("acceptance_rates") if isinstance(data, dict) else None
        if not isinstance(rates, list) or not all(isinstance(r, int | float) for r in rates):
            raise ConfigError("acceptance table needs acceptance_rates: a list of numbers", file=path, field=where)
        try:
            check_rates(tuple(float(r) for r in rates), self.num_speculative_tokens)
        except ValueError as err:
            raise ConfigError(str(err), file=path, field=where) from None
        return tuple(float(r) for r in rates)

    def draft_fraction(self, profile: Profile) -> float:
        if self.draft_cost_fraction is not None:
            return self.draft_cost_fraction
        if self.method is DraftMethod.NGRAM:
            return 0.0
        return 1.0 / num_layers(profile)


def check_rates(rates: tuple[float, ...], k: int) -> None:
    """Per-position rates a setting of k proposals can take: one to k of them, each in [0, 1]."""
    if not rates:
        raise ValueError("acceptance_rates needs at least one rate")
    if len(rates) > k:
        raise ValueError(f"acceptance_rates has {len(rates)} rates for num_speculative_tokens {k}")
    bad = [r for r in rates if not 0.0 <= r <= 1.0]
    if bad:
        raise ValueError(f"acceptance rates must lie in [0, 1], got {bad[0]}")


def num_layers(profile: Profile) -> int:
    """The model's decoder layers (from its all-reduce figures, else the engine catalogue), 32 if unknown."""
    if profile.comm is not None:
        return profile.comm.num_layers
    return _CATALOGUE_LAYERS.get(profile.model, 32)


_CATALOGUE_LAYERS = {"llama-3-8b": 32, "llama-3-70b": 80, "llama-3-405b": 126, "mixtral-8x7b": 32,
                     "qwen3-30b-a3b": 48, "deepseek-v3": 61, "llama-2-7b": 32, "codellama-34b": 48,
                     "internlm-20b": 60, "phi-2": 32, "tiny": 2, "small": 4}
"""Decoder layers of catalogue models (calibration/engine/configs.py), for profiles without ``comm``."""
