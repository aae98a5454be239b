"""Speculative decoding: the setting the scheduler reads, and the acceptance draws the simulator makes.

A decode request of a speculative replica is scheduled with ``1 + s`` new tokens (its last sampled token
plus ``s <= k`` proposals of a drafter), so its computed tokens run ``s`` past its tokens for the step
(vLLM v1's ``num_tokens_with_spec``); the KV manager reserves slots for all of them. ``Scheduler.update``
then takes, per row, how many proposals the verifier accepted: the request gains ``1 + accepted`` output
tokens and its computed tokens fall back by the rejected ones (vLLM v1's ``update_from_output``:
``num_computed_tokens -= num_rejected``). The blocks a rejected slot sits in stay with the request, as in
vLLM (``allocate_slots`` counts "new tokens, including unverified draft tokens" and never shrinks a table
for them): they are the next step's proposal slots, the next step overwrites the rejected KV, and finishing
or preemption frees them with the rest. The prefix cache indexes only blocks of known tokens (the KV
manager caps at ``num_tokens``, as vLLM caps "at request.num_tokens"), so a block holding a rejected
proposal is never shared (vllm/v1/core/sched/scheduler.py and kv_cache_manager.py at vllm-project/vllm
003df29).

The real engine verifies proposals with its model; the simulator draws the accepted count here, from a
configured acceptance model, per request and per step, keyed by (seed, request id, outputs so far, draft
position) through a counter-based hash: a request's draws do not depend on who else is in the batch, on
the order of steps, or on which path (step by step or not) runs it, and the same seed gives the same run.

Standard library only: the real engine and the simulator both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from simulator.core.mix import COMPILED, add_halves, mix_halves, splitmix64, times
from simulator.core.step import StepPlan

_UNIT: Final = 1.0 / (1 << 53)


@dataclass(frozen=True, slots=True, kw_only=True)
class Speculation:
    """One replica's speculative decoding: how many proposals per step, how often they are accepted (for the
    simulator; the engine verifies for real) and what drafting costs (for the cost model)."""

    num_speculative_tokens: int
    """k: proposals per decode step (vLLM's ``num_speculative_tokens``); a request near its end gets fewer
    (never more than its remaining outputs minus the one the verifier always samples)."""
    acceptance_rates: tuple[float, ...]
    """Per draft position i (len k): the probability position i is accepted given positions before it were
    (a fixed rate α is (α,) * k). Expected tokens per step: 1 + sum over i of the product of the first i+1."""
    draft_cost_fraction: float = 0.0
    """Seconds of one drafting pass as a fraction of a target decode step of the same rows (n-gram ~0, an
    EAGLE head ~one layer, a draft model its size ratio); the cost model reads it, the scheduler does not."""
    seed: int = 0
    """Seed of the acceptance draws (the scenario's)."""

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if len(self.acceptance_rates) != self.num_speculative_tokens:
            raise ValueError(f"acceptance_rates needs one rate per draft position ({self.num_speculative_tokens}), "
                             f"got {len(self.acceptance_rates)}")
        if not all(0.0 <= rate <= 1.0 for rate in self.acceptance_rates):
            raise ValueError(f"acceptance rates must lie in [0, 1], got {self.acceptance_rates}")
        if not self.draft_cost_fraction >= 0:
            raise ValueError(f"draft_cost_fraction must be >= 0, got {self.draft_cost_fraction}")

    @property
    def expected_tokens_per_step(self) -> float:
        """Mean tokens a decode row produces per step with all k proposals scheduled: 1 + E[accepted]."""
        total, survive = 1.0, 1.0
        for rate in self.acceptance_rates:
            survive *= rate
            total += survive
        return total

    def num_accepted(self, request_id: int, num_output_tokens: int, num_drafts: int) -> int:
        """Proposals accepted of ``num_drafts`` scheduled for the request when it had ``num_output_tokens``
        outputs: leading positions accepted, each with its rate, until the first rejection. Position i is
        accepted when ``splitmix64(base + i)``'s top 53 bits, as a fraction, fall below its rate, with
        ``base = splitmix64(splitmix64(seed * GOLDEN + request_id) + num_output_tokens)`` (mod 2**64)."""
        if COMPILED:
            return self.accepted_on_halves(request_id, num_output_tokens, num_drafts)
        return self.accepted_on_big_ints(request_id, num_output_tokens, num_drafts)

    def accepted_on_halves(self, request_id: int, num_output_tokens: int, num_drafts: int) -> int:
        """``num_accepted`` with every 64-bit value as two 32-bit halves: machine integers once compiled (the
        big-int arithmetic between mixes was 37 % of a speculative run's instructions compiled)."""
        seed = self.seed
        high, low = times((seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF, 0x9E37, 0x79B9, 0x7F4A, 0x7C15)
        high, low = add_halves(high, low, request_id)
        high, low = mix_halves(high, low)
        high, low = add_halves(high, low, num_output_tokens)
        high, low = mix_halves(high, low)
        rates = self.acceptance_rates
        for position in range(num_drafts):
            h, lo = add_halves(high, low, position)
            h, lo = mix_halves(h, lo)
            if float((h << 21) | (lo >> 11)) * _UNIT >= rates[position]:
                return position
        return num_drafts

    def accepted_on_big_ints(self, request_id: int, num_output_tokens: int, num_drafts: int) -> int:
        """``num_accepted`` on Python ints: the fast way interpreted."""
        rates = self.acceptance_rates
        base = splitmix64(splitmix64(self.seed * 0x9E3779B97F4A7C15 + request_id) + num_output_tokens)
        for position in range(num_drafts):
            if _uniform(base + position) >= rates[position]:
                return position
        return num_drafts

    def draw(self, plan: StepPlan) -> list[int]:
        """Accepted proposals per row of a scheduled plan (0 for rows without proposals): the simulator's
        stand-in for the verifier's output, to hand to ``Scheduler.update``."""
        spec = plan.num_spec_tokens
        if spec is None:
            return [0] * len(plan.requests)
        rows = plan.requests
        return [self.num_accepted(rows[i].request_id, rows[i].num_output_tokens, spec[i]) if spec[i] else 0
                for i in range(len(rows))]


def _uniform(value: int) -> float:
    """A uniform draw in [0, 1) from an integer key."""
    return (splitmix64(value) >> 11) * _UNIT


def expected_tokens(rate: float, k: int) -> float:
    """1 + E[accepted] for a fixed rate α and k proposals: (1 - α^(k+1)) / (1 - α) (k + 1 at α = 1)."""
    if rate >= 1.0:
        return float(k + 1)
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


def mark_proposals(plan: StepPlan) -> None:
    """Set the plan's per-row proposals: how far each row's computed tokens run past its tokens (0 for a
    prompt chunk, which ends at or before them)."""
    rows = plan.requests
    new = plan.num_new_tokens
    computed = plan.num_computed_tokens
    plan.num_spec_tokens = [max(0, computed[i] + new[i] - rows[i].num_tokens) for i in range(len(rows))]


def verify_shape_fields(plan: StepPlan) -> tuple[int, int, int, int, int, float, int]:
    """``step.shape_fields`` of a plan with proposals, a row that verifies s proposals counted as a decode
    row of 1 + s new tokens reading its context once (the 1 + s queries of one sequence share its KV read,
    as a verification kernel does), not as a prompt chunk of 1 + s tokens."""
    spec = plan.num_spec_tokens
    if spec is None:
        raise ValueError(f"plan {plan.step_id} has no proposals")
    num_decode = decode_ctx = tokens = prefill_tokens = 0
    pairs = 0.0
    rows = plan.num_rows()
    for i in range(rows):
        n = plan.num_new_tokens[i]
        p = plan.num_computed_tokens[i]
        tokens += n
        if n == 1 or spec[i]:
            num_decode += 1
            decode_ctx += p + n
        else:
            prefill_tokens += n
            pairs += n * (p + n / 2)
    swap = sum(op.num_tokens for op in plan.swapped_out) + sum(op.num_tokens for op in plan.swapped_in)
    return rows, tokens, num_decode, decode_ctx, prefill_tokens, pairs, swap
