"""StepPlan: what the scheduler decided for one engine step, and its shape.

A runner (the real engine) turns a plan into tensors; a cost model looks only at ``plan.shape``. Nothing
else crosses that seam, so the engine and the simulator see exactly the same decisions.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple, TypeVar, cast

from simulator.core.kv_tiers import LoadOp
from simulator.core.request import Request

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python


class StepShape(NamedTuple):
    """Everything a cost model may look at for one step. Immutable; a named tuple rather than a frozen
    dataclass because the simulator builds one per step and a tuple is built several times faster."""

    num_seqs: int
    """Sequences in the step (decodes plus prefill chunks)."""
    num_new_tokens: int
    """Tokens run through the model this step (one per decode, the chunk length per prefill)."""
    num_decode_seqs: int
    """Sequences with exactly one new token."""
    decode_context_sum: int
    """Sum over decode rows of the context attended (computed tokens before the step + 1)."""
    num_prefill_tokens: int
    """New tokens of rows with more than one new token."""
    prefill_attention_pairs: float
    """Sum over prefill rows of n * (p + n / 2): causal attention pairs of a chunk of n over a prefix p."""
    num_swap_tokens: int = 0
    """Tokens of KV moved between device and host memory this step (out plus in); a cost model prices
    them with the profile's KV bytes per token and the host link bandwidth."""

    @property
    def num_prefill_seqs(self) -> int:
        return self.num_seqs - self.num_decode_seqs

    @property
    def is_empty(self) -> bool:
        return self.num_seqs == 0 and self.num_swap_tokens == 0


@dataclass(frozen=True, slots=True)
class SwapOp:
    """Blocks of one request copied between device and host memory."""

    request_id: int
    num_tokens: int
    block_ids: tuple[int, ...]
    """Device blocks read (swap-out, before they are freed) or written (swap-in)."""


@dataclass(slots=True, init=False)
class StepPlan:
    """One step: per scheduled request, the new tokens and the computed tokens before the step.

    A dataclass for its repr and equality; ``__init__`` is written out because the scheduler builds one
    per step and the generated one runs as interpreted Python even in the compiled build."""

    step_id: int
    requests: list[Request]
    """Scheduled requests, in the order the scheduler chose them (running first, then admissions)."""
    num_new_tokens: list[int]
    num_computed_tokens: list[int]
    """Computed tokens of each scheduled request before this step (a prefix hit counts as computed)."""
    preempted_ids: Sequence[int]
    """Requests preempted while building this plan (recompute or swap).

    This and the next four are each an empty tuple until the first entry is noted (``note_preempted``
    and the like), then a list: most steps note none, and a plan is built per step (five lists made and
    freed per step were 1.3 % of a simulated day's instructions)."""
    swapped_out: Sequence[SwapOp]
    swapped_in: Sequence[SwapOp]
    admitted_ids: Sequence[int]
    """Requests that left the waiting queue in this step (new, or resumed after recompute)."""
    finished_ids: Sequence[int]
    """Filled by ``Scheduler.update``: requests that produced their last token in this step."""
    loads: list[LoadOp] | None
    """Blocks copied from KV tiers into device memory before the step computes (None: none)."""
    sampled: list[bool] | None
    """Async scheduling: per row, whether the step samples a token for it (its computed tokens reach
    its tokens), fixed when the plan is scheduled; None under synchronous scheduling, where ``update``
    reads it off the request."""
    num_spec_tokens: list[int] | None
    """Speculative decoding: per row, the proposals scheduled after its one sampled token (its computed
    tokens run that far past its tokens); None without speculation."""
    _shape: StepShape | None

    def __init__(self, step_id: int, requests: list[Request] | None = None, num_new_tokens: list[int] | None = None,
                 num_computed_tokens: list[int] | None = None) -> None:
        """An empty plan, or one with its rows given (three lists of one length, taken as they are)."""
        self.step_id = step_id
        self.requests = [] if requests is None else requests
        self.num_new_tokens = [] if num_new_tokens is None else num_new_tokens
        self.num_computed_tokens = [] if num_computed_tokens is None else num_computed_tokens
        self.preempted_ids = ()
        self.swapped_out = ()
        self.swapped_in = ()
        self.admitted_ids = ()
        self.finished_ids = ()
        self.sampled = None
        self.num_spec_tokens = None
        self.loads = None
        self._shape = None

    def note_preempted(self, request_id: int) -> None:
        self.preempted_ids = _appended(self.preempted_ids, request_id)

    def note_swapped_out(self, op: SwapOp) -> None:
        self.swapped_out = _appended(self.swapped_out, op)

    def note_swapped_in(self, op: SwapOp) -> None:
        self.swapped_in = _appended(self.swapped_in, op)

    def note_admitted(self, request_id: int) -> None:
        self.admitted_ids = _appended(self.admitted_ids, request_id)

    def note_finished(self, request_id: int) -> None:
        self.finished_ids = _appended(self.finished_ids, request_id)

    def num_rows(self) -> int:
        """Scheduled rows; checks that the per-row lists agree (``add`` and ``remove`` keep them so)."""
        n = len(self.requests)
        if len(self.num_new_tokens) != n or len(self.num_computed_tokens) != n:
            raise ValueError(f"plan {self.step_id} has {n} requests but {len(self.num_new_tokens)} new-token "
                             f"and {len(self.num_computed_tokens)} computed-token counts")
        return n

    def add(self, request: Request, num_new_tokens: int) -> None:
        self.requests.append(request)
        self.num_new_tokens.append(num_new_tokens)
        self.num_computed_tokens.append(request.num_computed_tokens)

    def remove(self, request: Request) -> int:
        """Drop a request scheduled earlier in this plan (a priority preemption victim); returns its
        tokens so the caller can give them back to the budget."""
        index = self.requests.index(request)
        del self.requests[index]
        del self.num_computed_tokens[index]
        return self.num_new_tokens.pop(index)

    @property
    def is_empty(self) -> bool:
        return not self.requests and not self.swapped_in and not self.swapped_out

    @property
    def changes_nothing(self) -> bool:
        """Empty and without preemptions: the scheduler stands as it was, so deciding again gives the same
        plan until a request arrives or leaves (the replica then waits for one). A plan that only preempted
        (the running request short of a block was the one to go, which ends vLLM's pass over the running
        requests and skips the waiting ones) is a step, as the engine runs it: the next decision schedules
        the others."""
        return self.is_empty and not self.preempted_ids

    @property
    def shape(self) -> StepShape:
        if self._shape is None:
            self._shape = compute_shape(self)
        return self._shape


_T = TypeVar("_T")


def _appended(items: Sequence[_T], item: _T) -> list[_T]:
    """``items`` with ``item`` at the end: the list itself, appended to, or a new list for the empty tuple
    a plan starts with."""
    if isinstance(items, list):
        items.append(item)
        return items
    return [*items, item]


def compute_shape(plan: StepPlan) -> StepShape:
    # Built with tuple.__new__: a named tuple's own __new__ is generated Python code, interpreted even when
    # this module is compiled.
    return cast(StepShape, _TUPLE_NEW(_STEP_SHAPE, shape_fields(plan)))


def shape_fields(plan: StepPlan) -> tuple[int, int, int, int, int, float, int]:
    """The plan's ``StepShape`` fields, in order, as a plain tuple: compiled, returned by value with
    nothing allocated (the simulator prices each step from them: ``CostModel.time_of``)."""
    num_decode: i64 = 0
    decode_ctx: i64 = 0
    prefill_tokens: i64 = 0
    pairs = 0.0
    new = plan.num_new_tokens
    computed = plan.num_computed_tokens
    rows: i64 = plan.num_rows()
    i: i64 = 0
    while i < rows:  # indexed: compiled, zip(strict=True) is a slow generic call
        n: i64 = new[i]
        p: i64 = computed[i]
        if n == 1:
            num_decode += 1
            decode_ctx += p
        else:
            prefill_tokens += n
            tokens = float(n)  # the float arithmetic n * (p + n / 2) does, spelled out for machine integers
            pairs += tokens * (float(p) + tokens / 2)
        i += 1
    swap = 0
    if plan.swapped_out or plan.swapped_in:
        swap = sum(op.num_tokens for op in plan.swapped_out) + sum(op.num_tokens for op in plan.swapped_in)
    # Each decode row attends to its computed tokens plus the new one.
    return (len(plan.requests), num_decode + prefill_tokens, num_decode, decode_ctx + num_decode, prefill_tokens,
            pairs, swap)


# Final: compiled, each is a constant rather than a lookup in the module's globals per call.
_TUPLE_NEW: Final = tuple.__new__
_STEP_SHAPE: Final = StepShape
