"""Scheduler configuration: the knobs of the one scheduling and KV policy, as closed choices.

Frozen and standard-library only; the scenario loader (pydantic, YAML) builds one of these per replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from simulator.core.speculation import Speculation


class Batching(StrEnum):
    STATIC = "static"
    """Request-level batching: a batch forms only when the replica is idle and runs to its last completion."""
    CONTINUOUS = "continuous"
    """Iteration-level, prefill-first, whole prompts; prefill and decode in separate steps (Orca, vLLM v0)."""
    CHUNKED = "chunked"
    """vLLM v1 / Sarathi: token budget, running requests first, prompts split across steps."""


class KVPolicy(StrEnum):
    PAGED = "paged"
    """Blocks allocated on demand as tokens are computed."""
    CONTIGUOUS = "contiguous"
    """A max_model_len slot reserved per request at admission: the naive allocation."""
    RESERVE = "reserve"
    """Prompt plus max output reserved at admission; never preempts."""


class Preemption(StrEnum):
    RECOMPUTE = "recompute"
    """Free the victim's blocks; it goes back to the head of the queue and recomputes its KV."""
    SWAP = "swap"
    """Copy the victim's KV to host memory; it resumes (ahead of new arrivals) by copying it back."""


class Role(StrEnum):
    """What a replica does with a request: all of it, or one side of a disaggregated fleet (Splitwise,
    DistServe; vLLM's and SGLang's prefill/decode workers, Dynamo's)."""

    MIXED = "mixed"
    """Prefill and decode on one replica: every engine's default."""
    PREFILL = "prefill"
    """Computes a request's prompt KV and first token, then holds the KV blocks until the decode worker
    has read them (``core.kv_transfer.KVSender``); the request ends here at its first token."""
    DECODE = "decode"
    """Takes requests whose prompt KV a prefill worker computes into blocks it reserved before the
    transfer started (``core.kv_transfer.KVReceiver``), and generates the rest of their tokens."""


class QueuePolicy(StrEnum):
    FCFS = "fcfs"
    PRIORITY = "priority"
    """(priority, arrival) order for admission; preemption takes the least urgent running request."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """One replica's scheduling and KV-paging policy."""

    num_blocks: int
    """KV blocks on the device (from the profile's KV capacity, or measured free memory on the engine)."""
    block_size: int = 16
    """Tokens per KV block; vLLM's default is 16."""
    batching: Batching = Batching.CHUNKED
    kv_policy: KVPolicy = KVPolicy.PAGED
    preemption: Preemption = Preemption.RECOMPUTE
    queue_policy: QueuePolicy = QueuePolicy.FCFS
    max_num_seqs: int = 256
    """Most sequences in one step (vLLM v1 default 256 below 70 GiB GPUs, 1024 on H100/H200)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step (vLLM v1 API-server default 8192 on H100/H200)."""
    enable_chunked_prefill: bool = True
    """Under ``chunked`` batching, split a prompt across steps when it exceeds the remaining budget;
    False makes a prompt wait for a step with room for all of it (TensorRT-LLM without chunked context)."""
    long_prefill_token_threshold: int = 0
    """Cap on one request's prefill chunk per step (0 = no cap), as vLLM's option of that name."""
    max_model_len: int = 131072
    """Longest prompt plus output a request may reach; longer requests are rejected."""
    enable_prefix_caching: bool = True
    """Share full KV blocks with equal chained hashes across requests (ignored under contiguous)."""
    num_host_blocks: int = 0
    """Host-memory blocks available to swap preemption; when full, preemption falls back to recompute."""
    waiting_served_ratio: float = 0.0
    """TGI: with requests running, start a prefill only when waiting/running reaches this ratio
    (0 = always prefill when something waits, as Orca/vLLM v0)."""
    max_waiting_steps: int = 0
    """TGI's max_waiting_tokens: decode steps after which a prefill is forced even below the ratio
    (0 = no forcing)."""
    unhashed_blocks_first: bool = True
    """Freed blocks without a hash go to the front of the free queue (handed out first, so cached
    prefixes live longer), as vLLM v1 does since 2025 (block_pool.py ``prepend_n``); False = every freed
    block to the tail (the older order)."""
    async_scheduling: bool = False
    """vLLM v1's async scheduling (``--async-scheduling``, the default of recent vLLM): step n+1 is
    scheduled while step n runs, before step n's output is processed. The scheduler counts the tokens a
    step in flight will sample as placeholders, so each step's decisions see the previous step's tokens as
    computed but its finishes (freed blocks and seats) and new arrivals only one step later
    (vllm/v1/core/sched/async_scheduler.py and vllm/v1/engine/core.py ``step_with_batch_queue`` at
    vllm-project/vllm 014b235 / 00080ee). Chunked batching with recompute preemption only, as in vLLM v1."""
    role: Role = Role.MIXED
    """mixed (prefill and decode here, the default), or one side of a disaggregated fleet: prefill or decode."""
    speculation: Speculation | None = None
    """Speculative decoding (``core.speculation``): each decode is scheduled with its proposals; None = off.
    Chunked batching and synchronous scheduling only (vLLM v1's scheduler, which this follows)."""

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.async_scheduling and (self.batching is not Batching.CHUNKED
                                      or self.preemption is not Preemption.RECOMPUTE):
            raise ValueError("async_scheduling needs chunked batching and recompute preemption (vLLM v1's)")
        if self.speculation is not None and (self.async_scheduling or self.batching is not Batching.CHUNKED):
            raise ValueError("speculation needs chunked batching and synchronous scheduling")

    @property
    def prefix_caching(self) -> bool:
        """Prefix caching as actually applied: a contiguous slot per request cannot be shared."""
        return self.enable_prefix_caching and self.kv_policy is not KVPolicy.CONTIGUOUS
