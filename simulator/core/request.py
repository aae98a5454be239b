"""Request state for the serving core, with vLLM v1's catch-up rule.

A request has ``num_tokens`` (prompt plus the outputs produced so far) and ``num_computed_tokens`` (tokens
whose KV is in the cache). Each step the scheduler hands it ``num_new_tokens`` so that the second catches up
with the first: a decode is the case of one new token; a chunked prefill, a prefix-cache hit (computed tokens
start above zero) and a recompute after preemption (computed tokens reset to zero) are all the same rule.

This module must never import anything outside the standard library: the real engine and the simulator
both run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as a workload produces it; what the router and the core receive."""

    request_id: int
    """Unique id within a run; the order of arrival breaks ties."""
    arrival_s: float
    """Arrival time at the fleet, seconds from the start of the run."""
    prompt_tokens: int
    """Prompt length in tokens (>= 1)."""
    output_tokens: int
    """Exact number of tokens to generate (>= 1); the engine ignores EOS, as vLLM's benchmarks do."""
    block_hashes: tuple[int, ...] = ()
    """Chained hash of each full KV block of the token sequence, prompt first. It may cover only the
    prompt (a trace), or also the outputs when the workload knows them (sessions: turn k+1 extends turn
    k's prompt and answer). Blocks without a hash are never shared through the prefix cache."""
    session_id: int | None = None
    """Conversation the request belongs to, if any (session-affinity routing uses it)."""
    priority: int = 0
    """Lower is more urgent, as in vLLM's priority scheduling."""


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    """Preempted by recompute: back in the waiting queue with no KV."""
    SWAPPED = "swapped"
    """Preempted by swap: its KV lives in host memory until it is swapped back in."""
    FINISHED = "finished"
    REJECTED = "rejected"
    """Can never be served by this replica (longer than max_model_len or than the whole KV pool)."""


class Request:
    """Mutable per-request state owned by one scheduler. Plain attributes: the simulator's hot path."""

    __slots__ = (
        "arrival_s",
        "block_hashes",
        "max_output_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_swapped_tokens",
        "priority",
        "request_id",
        "session_id",
        "spec",
        "status",
    )

    def __init__(self, spec: RequestSpec) -> None:
        if spec.prompt_tokens < 1 or spec.output_tokens < 1:
            raise ValueError(
                f"request {spec.request_id}: prompt_tokens and output_tokens must be >= 1, got "
                f"{spec.prompt_tokens} and {spec.output_tokens}"
            )
        self.spec = spec
        self.request_id = spec.request_id
        self.arrival_s = spec.arrival_s
        self.priority = spec.priority
        self.session_id = spec.session_id
        self.num_prompt_tokens = spec.prompt_tokens
        self.max_output_tokens = spec.output_tokens
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        """Prompt tokens served from the prefix cache at first admission."""
        self.num_preemptions = 0
        self.num_swapped_tokens = 0
        """Tokens of KV held in host memory while SWAPPED."""
        self.block_hashes: list[int] = list(spec.block_hashes)
        """Hash of each full block, extended by the engine as outputs are produced if it wants."""
        self.status = RequestStatus.WAITING

    @property
    def num_tokens(self) -> int:
        """Prompt plus outputs produced so far: what the computed tokens must catch up with."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def max_total_tokens(self) -> int:
        """Prompt plus every output token: the length this request reaches when it finishes."""
        return self.num_prompt_tokens + self.max_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED or self.status is RequestStatus.REJECTED

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id}, {self.status}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}/{self.max_output_tokens}, computed={self.num_computed_tokens})"
        )
