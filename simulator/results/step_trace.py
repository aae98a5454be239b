"""Step traces: every step a replica ran, as the numbers that make a latency (its decode rows, its prompt
tokens, its time), and what they add up to per group of replicas.

What a decode token waits for is the step it rides in: a decode-only step takes a few milliseconds, a step
that also carries a prompt chunk takes as long as that chunk's compute. ``StepFigures`` says, for a group
of replicas, how many of the decode tokens rode with a prompt chunk and what a decode token's step took on
average: the time per output token the requests saw, taken apart. Attach with ``StepTrace.recorder`` as a
replica's ``on_plan`` on the step-by-step path (``simulation.fast_path`` false: a decode run makes no
plans); never on the hot path of an ordinary run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simulator.core.step import StepPlan, StepShape


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFigures:
    """A group of replicas' steps, summed up."""

    num_steps: int
    num_decode_tokens: int
    """Decode rows over all steps: output tokens computed one at a time."""
    decode_tokens_with_prefill: float
    """Share of the decode tokens computed in a step that also ran prompt tokens."""
    decode_step_ms: float
    """Mean time of the step a decode token rode in (decode-token weighted): what TPOT is made of."""
    decode_only_step_ms: float
    """Mean time of the steps without prompt tokens."""
    prefill_step_ms: float
    """Mean time of the steps with prompt tokens."""
    busy_s: float
    """Time spent in steps."""


class StepTrace:
    """Steps recorded per replica: (replica id, decode rows, prompt tokens, seconds)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, float]] = []

    def recorder(self, replica_id: int, price: Callable[[StepShape], float]) -> Callable[[StepPlan], None]:
        """An ``on_plan`` for one replica: records each non-empty plan with its time by ``price``."""
        rows = self.rows

        def record(plan: StepPlan) -> None:
            if plan.is_empty:
                return
            shape = plan.shape
            rows.append((replica_id, shape.num_decode_seqs, shape.num_prefill_tokens, price(shape)))

        return record

    def figures(self, replica_ids: Sequence[int]) -> StepFigures:
        """The figures of the steps of these replicas."""
        chosen = set(replica_ids)
        steps = [row for row in self.rows if row[0] in chosen]
        decode_tokens = sum(row[1] for row in steps)
        with_prefill = sum(row[1] for row in steps if row[2])
        decode_time = sum(row[1] * row[3] for row in steps)
        plain = [row[3] for row in steps if not row[2]]
        mixed = [row[3] for row in steps if row[2]]
        return StepFigures(
            num_steps=len(steps),
            num_decode_tokens=decode_tokens,
            decode_tokens_with_prefill=with_prefill / decode_tokens if decode_tokens else math.nan,
            decode_step_ms=1e3 * decode_time / decode_tokens if decode_tokens else math.nan,
            decode_only_step_ms=1e3 * sum(plain) / len(plain) if plain else math.nan,
            prefill_step_ms=1e3 * sum(mixed) / len(mixed) if mixed else math.nan,
            busy_s=sum(row[3] for row in steps),
        )
