"""Request state for the serving core, with vLLM v1's catch-up rule.

A request has ``num_tokens`` (prompt plus the outputs produced so far) and ``num_computed_tokens`` (tokens
whose KV is in the cache). Each step the scheduler hands it ``num_new_tokens`` so that the second catches up
with the first: a decode is the case of one new token; a chunked prefill, a prefix-cache hit (computed tokens
start above zero) and a recompute after preemption (computed tokens reset to zero) are all the same rule.

This module must never import anything outside the standard library: the real engine and the simulator
both run it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from simulator.core.block_pool import NOT_PRIVATE, Pin
from simulator.core.mix import splitmix64

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python


class HashTail:
    """The hashes of blocks ``start .. stop - 1`` of a private token stream, not yet derived: block j's hash
    is ``splitmix64(key ^ j)`` (a synthetic stream's key names it and its namespace; ``key`` has j's bits
    clear). A workload hands these out instead of the values, which most requests never need (see
    ``RequestSpec``)."""

    __slots__ = ("key", "start", "stop")

    def __init__(self, key: int, start: int, stop: int) -> None:
        if not 0 <= start <= stop:
            raise ValueError(f"a hash tail needs 0 <= start <= stop, got {start} and {stop}")
        self.key = key
        self.start = start
        self.stop = stop

    def values(self) -> tuple[int, ...]:
        key = self.key
        return tuple([splitmix64(key ^ j) for j in range(self.start, self.stop)])


class RequestSpec:
    """One request as a workload produces it; what the router and the core receive. Read-only by
    contract: nothing changes a spec once built (``with_hashes`` makes a new one). A plain class with
    slots rather than a frozen dataclass: a frozen one's generated ``__init__`` sets each field through
    ``object.__setattr__`` in interpreted Python even in the compiled build, and a workload builds one per
    request.

    Hash tails. A request's blocks from ``private_from`` on hold hashes no other request carries, and
    most requests finish without anything reading them: nothing can look them up (``KVManager`` marks
    those blocks instead of indexing them). A session's blocks past its chain's first (``chain_from``) are
    handed from turn to turn without the index, and are read only where a chain is indexed after all. A
    workload may therefore give either as a ``HashTail`` — a rule that derives them — instead of values:
    ``block_hashes`` derives them on first use (and keeps them), ``known_hashes`` are the values held so
    far (the tail's, once derived). A tail's blocks before ``private_from`` may be cached by other requests
    (a session's earlier turns); those from ``private_from`` on by none before this request's own values
    are derived (``num_lookup_blocks``). A spec with a tail equals the same spec with the values."""

    __slots__ = ("_hashes", "_tail", "arrival_s", "chain_from", "output_tokens", "priority", "private_from",
                 "prompt_tokens", "request_id", "session_id")

    request_id: int
    """Unique id within a run; the order of arrival breaks ties."""
    arrival_s: float
    """Arrival time at the fleet, seconds from the start of the run."""
    prompt_tokens: int
    """Prompt length in tokens (>= 1)."""
    output_tokens: int
    """Exact number of tokens to generate (>= 1); the engine ignores EOS, as vLLM's benchmarks do."""
    session_id: int | None
    """Conversation the request belongs to, if any (session-affinity routing uses it)."""
    priority: int
    """Lower is more urgent, as in vLLM's priority scheduling."""
    private_from: int | None
    """Index of the first block whose hash no other request carries, from there to the end of its token
    stream (its own prompt past a shared system prompt, and its answer): a promise by the workload, which
    lets the KV manager skip indexing those blocks while nobody can look them up (``KVManager``). None:
    any block may be shared (sessions, traces with prefix ids, hashes given by hand)."""
    chain_from: int | None
    """Index of the first block whose hash only the requests of this one's session carry (past its system
    prompt): a promise by the workload that a later turn of the session, and nothing else, carries this
    turn's hashes from there on, as its first hashes after the same ones before. It lets the KV manager
    hand such blocks from turn to turn without indexing them (``KVManager``). None: no such promise."""

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 block_hashes: tuple[int, ...] = (), session_id: int | None = None, priority: int = 0,
                 private_from: int | None = None, hash_tail: HashTail | None = None,
                 chain_from: int | None = None) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self._hashes = block_hashes
        self.session_id = session_id
        self.priority = priority
        self.private_from = private_from
        self.chain_from = chain_from
        if hash_tail is not None and (hash_tail.start != len(block_hashes) or not (
                (private_from is not None and hash_tail.start >= private_from)
                or (chain_from is not None and hash_tail.start > chain_from))):
            raise ValueError(f"request {request_id}: a hash tail starts after the hashes given, at or past "
                             f"private_from or past chain_from")
        self._tail = hash_tail if hash_tail is not None and hash_tail.stop > hash_tail.start else None

    @property
    def block_hashes(self) -> tuple[int, ...]:
        """Chained hash of each full KV block of the token sequence, prompt first. It may cover only the
        prompt (a trace), or also the outputs when the workload knows them (sessions: turn k+1 extends turn
        k's prompt and answer). Blocks without a hash are never shared through the prefix cache. A private
        tail is derived here, once."""
        tail = self._tail
        if tail is not None:
            self._hashes = self._hashes + tail.values()
            self._tail = None
        return self._hashes

    @property
    def known_hashes(self) -> tuple[int, ...]:
        """The hashes held as values: all of them, or those before a private tail not yet derived (no
        cache anywhere can hold one of those: nothing has had the value to index)."""
        return self._hashes

    @property
    def num_hashed_blocks(self) -> int:
        """``len(block_hashes)``, deriving nothing."""
        tail = self._tail
        return len(self._hashes) if tail is None else tail.stop

    @property
    def num_lookup_blocks(self) -> int:
        """Leading blocks whose hashes some cache may hold now: every hashed block, or, with a tail not yet
        derived, those before ``private_from`` (no cache can hold a private hash nobody has derived)."""
        tail = self._tail
        if tail is None:
            return len(self._hashes)
        private = self.private_from
        return tail.stop if private is None else min(tail.stop, max(private, len(self._hashes)))

    def with_hashes(self, block_hashes: tuple[int, ...]) -> RequestSpec:
        """This spec with other block hashes (values, no tail)."""
        return RequestSpec(self.request_id, self.arrival_s, self.prompt_tokens, self.output_tokens, block_hashes,
                           self.session_id, self.priority, self.private_from, chain_from=self.chain_from)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestSpec):
            return NotImplemented
        return (self.request_id == other.request_id and self.arrival_s == other.arrival_s
                and self.prompt_tokens == other.prompt_tokens and self.output_tokens == other.output_tokens
                and self.session_id == other.session_id and self.priority == other.priority
                and self.private_from == other.private_from and self.chain_from == other.chain_from
                and self.block_hashes == other.block_hashes)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        hashes = f"{len(self._hashes)} hashes" + (f" + tail to {self._tail.stop}" if self._tail is not None else "")
        return (f"RequestSpec(request_id={self.request_id}, arrival_s={self.arrival_s}, "
                f"prompt_tokens={self.prompt_tokens}, output_tokens={self.output_tokens}, {hashes}, "
                f"session_id={self.session_id}, priority={self.priority}, private_from={self.private_from}, "
                f"chain_from={self.chain_from})")


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    """Preempted by recompute: back in the waiting queue with no KV."""
    SWAPPED = "swapped"
    """Preempted by swap: its KV lives in host memory until it is swapped back in."""
    WAITING_FOR_KV = "waiting_for_kv"
    """On a decode worker: waiting for blocks to be reserved, or for the KV a prefill worker computes to
    land in them (vLLM's WAITING_FOR_REMOTE_KVS)."""
    FINISHED = "finished"
    REJECTED = "rejected"
    """Can never be served by this replica (longer than max_model_len or than the whole KV pool)."""


class Request:
    """Mutable per-request state owned by one scheduler. Plain attributes: the simulator's hot path."""

    __slots__ = (
        "arrival_s",
        "block_hashes",
        "block_table",
        "chain_from",
        "mark_from",
        "max_output_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_hashed_blocks",
        "num_indexed_blocks",
        "num_output_placeholders",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_swapped_tokens",
        "pin",
        "priority",
        "private_from",
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
        # Token counters as machine integers in the compiled build: the per-step paths do arithmetic on them.
        self.num_prompt_tokens: i64 = spec.prompt_tokens
        self.max_output_tokens: i64 = spec.output_tokens
        self.num_output_tokens: i64 = 0
        self.num_computed_tokens: i64 = 0
        self.num_output_placeholders: i64 = 0
        """Async scheduling: tokens that steps in flight will sample for this request, not yet produced
        (vLLM's ``num_output_placeholders``). Always 0 under synchronous scheduling."""
        self.num_cached_tokens = 0
        """Prompt tokens served from the prefix cache at first admission."""
        self.num_preemptions = 0
        self.num_swapped_tokens = 0
        """Tokens of KV held in host memory while SWAPPED."""
        self.block_hashes: tuple[Any, ...] = spec.known_hashes
        """Hash of each full block, as values: all of them, or those before the spec's private tail while
        nothing needs the tail's (``expose_hashes``); the paths that read a hash past ``private_from``
        expose them first."""
        self.num_hashed_blocks: i64 = spec.num_hashed_blocks
        """Blocks with a hash (``len(block_hashes)`` once exposed)."""
        self.status = RequestStatus.WAITING
        self.block_table: list[int] = []
        """Block ids holding this request's KV, in token order: the KV manager's table for it, which only
        the KV manager changes (kept on the request so the per-step paths reach it without a lookup)."""
        self.num_indexed_blocks = 0
        """Leading blocks of the table the KV manager has indexed in the prefix cache."""
        self.private_from: i64 = NOT_PRIVATE if spec.private_from is None else spec.private_from
        """``spec.private_from``, or ``NOT_PRIVATE``."""
        self.chain_from: i64 = NOT_PRIVATE if spec.chain_from is None else spec.chain_from
        """``spec.chain_from``, or ``NOT_PRIVATE``."""
        self.mark_from: i64 = NOT_PRIVATE
        """First block the KV manager marks private instead of indexing, while the request holds KV (set
        as it starts holding it; ``NOT_PRIVATE``: none)."""
        self.pin: Pin | None = None
        """While the request holds KV: the pin through which it holds its table's first blocks (a system
        prompt's, ``BlockPool.hold``), or None."""

    def expose_hashes(self) -> None:
        """Hold every hash as a value (a private tail derived: the request's blocks past ``private_from``
        are about to be indexed, or looked up where they may have been)."""
        if len(self.block_hashes) < self.num_hashed_blocks:
            self.block_hashes = self.spec.block_hashes

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


def specs_from_columns(first_id: int, arrival_s: list[float], prompt_tokens: list[int], output_tokens: list[int],
                       session_id: list[int], block_hashes: list[tuple[int, ...]],
                       private_from: list[int] | None = None, tail_key: list[int] | None = None,
                       tail_stop: list[int] | None = None, chain_from: list[int] | None = None,
                       tail_rule: Callable[[int, int, int], HashTail] = HashTail) -> list[RequestSpec]:
    """The specs of consecutive requests ``first_id``, ``first_id + 1``, ... from a workload's columns (a
    negative session id, ``private_from`` or ``chain_from`` is none; ``private_from`` None: none for all).
    With ``tail_key`` and ``tail_stop``, a request's hashes from where its ``block_hashes`` end (at
    ``private_from``, or past ``chain_from``) to ``tail_stop`` are the tail ``tail_rule(key, start, stop)``
    (a ``HashTail``, or a subclass that derives the same values faster). One compiled loop: a workload
    builds a spec per request."""
    n = len(arrival_s)
    if not len(prompt_tokens) == len(output_tokens) == len(session_id) == len(block_hashes) == n:
        raise ValueError("spec columns must have equal lengths")
    if (private_from is not None and len(private_from) != n) or (chain_from is not None and len(chain_from) != n):
        raise ValueError("spec columns must have equal lengths")
    tails = tail_key is not None and tail_stop is not None
    if tails and not (tail_key is not None and len(tail_key) == n and tail_stop is not None and len(tail_stop) == n):
        raise ValueError("spec columns must have equal lengths")
    specs: list[RequestSpec] = []
    for i in range(n):
        session = session_id[i]
        private = -1 if private_from is None else private_from[i]
        hashes = block_hashes[i]
        tail: HashTail | None = None
        if tails:
            assert tail_key is not None and tail_stop is not None
            stop = tail_stop[i]
            if stop > len(hashes):
                tail = tail_rule(tail_key[i], len(hashes), stop)
        chain = -1 if chain_from is None else chain_from[i]
        specs.append(RequestSpec(first_id + i, arrival_s[i], prompt_tokens[i], output_tokens[i], hashes,
                                 session if session >= 0 else None, 0, private if private >= 0 else None, tail,
                                 chain if chain >= 0 else None))
    return specs
