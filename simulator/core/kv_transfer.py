"""The hand-off of a request's KV from a prefill worker to a decode worker: the serving core's decisions.

A disaggregated request is served by two schedulers, a ``prefill`` one and a ``decode`` one
(``SchedulerConfig.role``), in Dynamo's order (the decode worker allocates before the prefill worker
writes; vLLM's NIXL connector and SGLang's disaggregation keep the same two rules, reservation before
transfer and prefill blocks held until read):

1. **Reserve** (decode side, ``KVReceiver.reserve``). Before any of the prompt's KV is sent, the decode
   worker takes the blocks it will land in: its own prefix-cache hits (those blocks are not sent), then
   fresh blocks for the rest. Offers are reserved in arrival order, never ahead of requests the decode
   worker preempted, only while a sequence slot is free, and the queue stops at the first that does not
   fit (head-of-line, as admission does). A request that cannot be reserved waits, and is counted: that
   is the back-pressure that holds its prefill until decode memory frees.
2. **Prefill to the first token** (prefill side). A prefill worker runs each request to its first token
   with its own scheduler (chunked or not, prefix cache and all), then, instead of freeing the request's
   blocks, holds them (``KVSender``) until the transfer has read them; then they are freed as any
   finished request's are (full blocks stay in its prefix cache).
3. **Land** (decode side, ``KVReceiver.complete``). When the KV has arrived, the request joins the decode
   worker's running batch with its prompt computed and its first token produced, so the next step
   decodes it; the full blocks it received are indexed in the decode worker's prefix cache then, not at
   reservation (nothing may hit blocks whose KV has not landed: vLLM's ``delay_cache_blocks``).

A request with a single output token is finished by its first token: it needs no decode worker
(``needs_decode``). What moves the bytes, and when, is the fleet's (a link model) or the engine's (a copy
between pools); what is decided here is the same for both.

Standard library only: the real engine and the simulator both run it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sized
from dataclasses import dataclass
from typing import Protocol

from simulator.core.config import SchedulerConfig
from simulator.core.kv_manager import KVManager
from simulator.core.request import Request, RequestSpec, RequestStatus


class ServingCore(Protocol):
    """What the hand-off reads and changes of a scheduler (``core.scheduler.Scheduler``, which owns a sender
    or a receiver by its role: a protocol, so that this module sits below it)."""

    num_receiving: int

    @property
    def config(self) -> SchedulerConfig: ...
    @property
    def kv(self) -> KVManager: ...
    @property
    def running(self) -> list[Request]: ...
    @property
    def requests(self) -> dict[int, Request]: ...
    @property
    def waiting(self) -> Sized: ...
    @property
    def swapped(self) -> Sized: ...

    def can_serve(self, request: Request) -> bool: ...
    def _reserve_tokens(self, request: Request) -> int: ...


def needs_decode(spec: RequestSpec) -> bool:
    """Whether a request needs a decode worker: one with a single output token ends at the prefill."""
    return spec.output_tokens > 1


def can_hand_off(prefill: ServingCore, decode: ServingCore, spec: RequestSpec) -> bool:
    """Whether a prefill and a decode worker could ever serve the request between them: the prefill
    worker its prompt and first token, the decode worker all of it (their own ``can_serve`` rules)."""
    request = Request(spec)
    if not decode.can_serve(request):
        return False
    request.max_output_tokens = 1
    return prefill.can_serve(request)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Blocks a decode worker reserved for one request's prompt KV, before the transfer."""

    request_id: int
    """The request the blocks are for."""
    block_ids: tuple[int, ...]
    """The decode worker's blocks holding the prompt, in token order (the table the KV lands in)."""
    num_hit_blocks: int
    """Leading blocks the decode worker's prefix cache already held: their KV is not sent."""
    num_prompt_tokens: int
    """Tokens of the prompt whose KV the blocks hold once it has landed."""

    @property
    def num_sent_blocks(self) -> int:
        """Blocks whose KV travels: the prompt's blocks after the local hits."""
        return len(self.block_ids) - self.num_hit_blocks


class KVSender:
    """A prefill worker's finished requests whose KV blocks wait for the decode worker to read them."""

    __slots__ = ("held", "kv")

    def __init__(self, kv: KVManager) -> None:
        self.kv = kv
        kv.chains_on = False  # its requests leave at their first token: every block is indexed
        self.held: dict[int, Request] = {}
        """Finished at their first token, blocks still referenced, by request id."""

    def hold(self, request: Request) -> None:
        """The request produced its first token: keep its blocks for the transfer (``Scheduler._finish``)."""
        self.held[request.request_id] = request

    def block_ids(self, request_id: int, num_blocks: int, skip: int = 0) -> list[int]:
        """The prefill worker's blocks a transfer reads: ``num_blocks`` of the request's table after ``skip``
        (the decode worker's own hits), in token order."""
        table = self.held[request_id].block_table
        return table[skip:skip + num_blocks]

    def release(self, request_id: int) -> Request:
        """The transfer has read the request's KV: free its blocks (cached ones stay in the prefix cache)."""
        request = self.held.pop(request_id)
        self.kv.free(request)
        return request


class KVReceiver:
    """A decode worker's incoming requests: offered (waiting for blocks), then reserved (waiting for KV)."""

    __slots__ = ("_num_counted", "num_waited", "pending", "receiving", "scheduler")

    def __init__(self, scheduler: ServingCore) -> None:
        self.scheduler = scheduler
        scheduler.kv.chains_on = False  # blocks arrive from another replica and are indexed as they land
        self.pending: deque[Request] = deque()
        """Offered requests without blocks yet, in arrival order."""
        self.receiving: dict[int, Request] = {}
        """Reserved requests whose KV is on its way, by request id."""
        self.num_waited = 0
        """Requests that could not be reserved when first tried: held back because decode memory (or a
        sequence slot) was short."""
        self._num_counted = 0
        """Leading requests of ``pending`` already counted in ``num_waited``."""

    def offer(self, spec: RequestSpec) -> Request:
        """A request a prefill worker will compute: queue it for a reservation (``reserve``). One this
        worker could never hold (longer than max_model_len, or than the whole KV pool) comes back REJECTED
        and is not queued. Its first token counts as produced: the prefill worker makes it."""
        scheduler = self.scheduler
        request = Request(spec)
        request.num_output_tokens = 1
        if not scheduler.can_serve(request):
            request.status = RequestStatus.REJECTED
            return request
        request.status = RequestStatus.WAITING_FOR_KV
        scheduler.requests[request.request_id] = request
        self.pending.append(request)
        return request

    def reserve(self) -> list[Reservation]:
        """Reserve blocks for offered requests, in order, while they fit (see the module docstring)."""
        scheduler = self.scheduler
        kv = scheduler.kv
        pending = self.pending
        seats = scheduler.config.max_num_seqs
        out: list[Reservation] = []
        while pending:
            if len(scheduler.waiting) or len(scheduler.swapped):
                break  # requests this worker preempted come back first
            if len(scheduler.running) + len(self.receiving) >= seats:
                break
            request = pending[0]
            hits = kv.get_computed_blocks(request)
            num_sent_tokens = request.num_prompt_tokens - len(hits) * kv.block_size
            num_hashed = request.num_hashed_blocks
            request.num_hashed_blocks = 0  # no block is indexed before its KV has landed (``complete``)
            allocated = kv.allocate(request, num_sent_tokens, hits, scheduler._reserve_tokens(request))
            request.num_hashed_blocks = num_hashed
            if allocated is None:
                break
            pending.popleft()
            if self._num_counted:
                self._num_counted -= 1
            self.receiving[request.request_id] = request
            scheduler.num_receiving += 1
            table = request.block_table
            num_prompt_blocks = -(-request.num_prompt_tokens // kv.block_size)
            out.append(Reservation(request.request_id, tuple(table[:num_prompt_blocks]), len(hits),
                                   request.num_prompt_tokens))
        self.num_waited += len(pending) - self._num_counted
        self._num_counted = len(pending)
        return out

    def complete(self, request_id: int, *, num_cached_tokens: int = 0, num_preemptions: int = 0) -> Request:
        """The request's KV has landed: it joins the running batch with its prompt computed and its first
        token produced, and the full blocks it received are indexed in the prefix cache. The prefill
        worker's figures (prompt tokens it served from its cache, its preemptions) carry over."""
        scheduler = self.scheduler
        request = self.receiving.pop(request_id)
        scheduler.num_receiving -= 1
        request.num_computed_tokens = request.num_prompt_tokens
        request.num_cached_tokens = num_cached_tokens
        request.num_preemptions += num_preemptions
        request.status = RequestStatus.RUNNING
        scheduler.kv.cache_known_blocks(request)
        scheduler.running.append(request)
        return request

    def abort(self, request: Request) -> None:
        """Drop an offered or reserved request (``Scheduler.abort``), releasing any blocks it holds."""
        if request.request_id in self.receiving:
            del self.receiving[request.request_id]
            self.scheduler.num_receiving -= 1
            self.scheduler.kv.free(request)
        else:
            index = self.pending.index(request)
            del self.pending[index]
            if index < self._num_counted:
                self._num_counted -= 1
