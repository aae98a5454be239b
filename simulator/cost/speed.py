"""How fast a replica is, as one number: tokens per second of a reference step for its role, priced by its
cost model. A fleet of mixed GPUs divides each replica's load by its speed relative to the fastest pool
(``fleet.router``'s speed-weighted policy).

The reference steps stand for each role's work: a prefill worker's is a prompt chunk of
``PREFILL_TOKENS`` tokens; a decode worker's, a decode of ``DECODE_SEQS`` sequences at ``DECODE_CONTEXT``
tokens of context; a mixed replica's, vLLM v1's typical mixed step, both in one. The numbers are
representative, not fitted: a speed is a ratio between pools, and each reference step exercises the term
(compute or memory bandwidth) its role is bound by.
"""

from __future__ import annotations

from typing import Final

from simulator.core.config import Role
from simulator.cost.cost_model import CostModel

PREFILL_TOKENS: Final = 2048
"""Tokens of the reference prompt chunk (vLLM's chunked-prefill budget on smaller GPUs)."""
DECODE_SEQS: Final = 64
"""Sequences of the reference decode step."""
DECODE_CONTEXT: Final = 2048
"""Context tokens of each sequence of the reference decode step."""


def reference_tokens_per_s(cost: CostModel, role: Role) -> float:
    """Tokens per second of ``role``'s reference step on ``cost``'s replica."""
    prefill = PREFILL_TOKENS if role is not Role.DECODE else 0
    decodes = DECODE_SEQS if role is not Role.PREFILL else 0
    pairs = prefill * (prefill / 2)
    tokens = prefill + decodes
    seconds = cost.time_of(decodes + (1 if prefill else 0), tokens, decodes, decodes * (DECODE_CONTEXT + 1),
                           prefill, pairs, 0)
    return tokens / seconds


def relative_speeds(costs: list[tuple[CostModel, Role]]) -> list[float]:
    """Each (cost model, role)'s reference tokens per second over the fastest of them (which gets 1.0)."""
    rates = [reference_tokens_per_s(cost, role) for cost, role in costs]
    fastest = max(rates)
    return [rate / fastest for rate in rates]
