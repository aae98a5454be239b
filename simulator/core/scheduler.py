"""The scheduler: which requests run in the next step, and with how many new tokens.

One rule (vLLM v1's): every request has ``num_tokens`` and ``num_computed_tokens``, and each step hands
out new tokens so the second catches up with the first. The batching policies differ only in *when* a
request may be handed tokens:

- ``chunked`` (vLLM v1, Sarathi): running requests first, in admission order, then waiting ones, all
  under one token budget; prompts are split across steps; no admissions in a step that preempted.
- ``continuous`` (Orca, vLLM v0, TGI): a step either admits whole prompts (prefill-first) or decodes
  every running request, never both; TGI's waiting-served ratio can hold prefills back.
- ``static``: a batch forms only when the replica is idle and runs until its last request finishes.

The KV policy (paged / contiguous / reserve) is a reservation size passed to the KV manager; preemption
(recompute / swap) is what happens to a victim when the KV manager answers ``None``.

A disaggregated fleet's workers run this same class with a role (``SchedulerConfig.role``): a prefill
worker runs each request to its first token and holds its blocks for the transfer; a decode worker takes
requests whose KV lands in blocks it reserved. What that adds is in ``kv_transfer``; the hooks here are
the hold at a finish and the seats reserved requests take.

This is the only copy of these policies: the real engine and the simulator both run this class.
Standard library only.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from typing import Any, Final

from simulator.core import speculation
from simulator.core.block_pool import shared_ints
from simulator.core.config import Batching, KVPolicy, Preemption, QueuePolicy, Role, SchedulerConfig
from simulator.core.kv_manager import KVManager, KVStats
from simulator.core.kv_tiers import KVTiers, TierLoad
from simulator.core.kv_transfer import KVReceiver, KVSender
from simulator.core.request import Request, RequestSpec, RequestStatus
from simulator.core.step import StepPlan, SwapOp

_SHARED_COUNTS: Final = 8192
"""Token counts below this are handed to step plans as the process's shared int objects (``_schedule_chunked``)."""


class WaitingQueue:
    """Requests not running: FCFS (a deque; preempted requests go back to the head) or priority
    (a heap on (priority, arrival, id))."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self._fifo: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)  # one of the two is always empty

    def __bool__(self) -> bool:
        return bool(self._fifo) or bool(self._heap)

    def push(self, request: Request) -> None:
        if self.policy is QueuePolicy.FCFS:
            self._fifo.append(request)
        else:
            heapq.heappush(self._heap, (request.priority, request.arrival_s, request.request_id, request))

    def push_front(self, request: Request) -> None:
        """A preempted request: first in line again under FCFS; under priority its key decides."""
        if self.policy is QueuePolicy.FCFS:
            self._fifo.appendleft(request)
        else:
            self.push(request)

    def peek(self) -> Request:
        return self._fifo[0] if self.policy is QueuePolicy.FCFS else self._heap[0][3]

    def pop(self) -> Request:
        return self._fifo.popleft() if self.policy is QueuePolicy.FCFS else heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        if self.policy is QueuePolicy.FCFS:
            self._fifo.remove(request)
        else:
            self._heap = [e for e in self._heap if e[3] is not request]
            heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[Request]:
        if self.policy is QueuePolicy.FCFS:
            return iter(self._fifo)
        return (e[3] for e in sorted(self._heap))


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.kv = KVManager(config.num_blocks, config.block_size, enable_caching=config.prefix_caching,
                            unhashed_first=config.unhashed_blocks_first)
        self.waiting = WaitingQueue(config.queue_policy)
        self._paged = config.kv_policy is KVPolicy.PAGED
        """Paged KV: no tokens reserved ahead (``_reserve_tokens`` is 0, read without a call on hot paths)."""
        self.swapped: deque[Request] = deque()
        """Swap-preempted requests, resumed in preemption order before any waiting request."""
        self.running: list[Request] = []
        """Requests holding KV, in admission order (the order the chunked policy serves them)."""
        self.requests: dict[int, Request] = {}
        self.num_steps = 0
        """Steps scheduled so far (the next plan's step_id)."""
        self.num_host_blocks_used = 0
        self.num_preemptions = 0
        self._steps_since_prefill = 0
        self.sender: KVSender | None = KVSender(self.kv) if config.role is Role.PREFILL else None
        """Prefill worker: requests finished at their first token whose blocks the transfer still reads."""
        self.receiver: KVReceiver | None = KVReceiver(self) if config.role is Role.DECODE else None
        """Decode worker: requests offered by the fleet, waiting for blocks or for their KV to land."""
        self.num_receiving = 0
        """Reserved requests whose KV has not landed: they hold sequence slots (``_admit``)."""
        self.num_spec_rows = 0
        """Speculative decoding: rows verified with at least one proposal, over the scheduler's life."""
        self.num_draft_tokens = 0
        """Proposals verified (vLLM's ``num_draft_tokens``)."""
        self.num_accepted_tokens = 0
        """Proposals accepted (vLLM's ``num_accepted_tokens``)."""
        self.tiers: KVTiers | None = None
        """KV tiers below the device pool (``attach_tiers``); None: an evicted block is gone."""

    def attach_tiers(self, tiers: KVTiers) -> None:
        """Evicted prefix blocks move down into ``tiers``; admissions look them up there; swap preemption
        takes its room from their host tier (when they have one) instead of ``num_host_blocks``."""
        if not self.kv.enable_caching:
            raise ValueError("KV tiers need the prefix cache")
        if tiers.block_size != self.block_size:
            raise ValueError(f"tiers of {tiers.block_size}-token blocks on a pool of {self.block_size}-token blocks")
        self.tiers = tiers
        self.kv.pool.on_evict = tiers.on_evict
        if tiers.written_on_compute:
            self.kv.pool.on_cache = tiers.on_compute

    # ----- queue -----------------------------------------------------------------------------------

    def add_request(self, spec: RequestSpec) -> Request:
        """Queue a request. One that could never be served (longer than max_model_len, or needing more
        KV than the whole pool) comes back REJECTED and is not queued."""
        request = Request(spec)
        if self.sender is not None:
            request.max_output_tokens = 1  # a prefill worker's request ends at its first token
        if not self.can_serve(request):
            request.status = RequestStatus.REJECTED
            return request
        self.requests[request.request_id] = request
        self.waiting.push(request)
        return request

    def can_serve(self, request: Request) -> bool:
        """Whether this replica could ever serve the request: no longer than max_model_len, and needing
        no more KV than the whole pool."""
        cfg = self.config
        blocks_needed = -(-max(request.max_total_tokens, self._reserve_tokens(request)) // self.block_size)
        return request.max_total_tokens <= cfg.max_model_len and blocks_needed <= cfg.num_blocks

    def abort(self, request_id: int) -> None:
        """Drop a request wherever it is, releasing its KV."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self.kv.free(request)
        elif request.status is RequestStatus.SWAPPED:
            self.swapped.remove(request)
            self._release_host(self._cdiv(request.num_swapped_tokens))
        elif request.status is RequestStatus.WAITING_FOR_KV and self.receiver is not None:
            self.receiver.abort(request)
        else:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Waiting plus swapped-out requests: every request held here that is not running."""
        return len(self.requests) - len(self.running)

    def kv_stats(self) -> KVStats:
        return self.kv.stats(self.running)

    # ----- one step --------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        plan = StepPlan(self.num_steps)
        self.num_steps += 1
        batching = self.config.batching
        if batching is Batching.CHUNKED:
            self._schedule_chunked(plan)
        elif batching is Batching.CONTINUOUS:
            self._schedule_continuous(plan)
        else:
            self._schedule_static(plan)
        if self.config.async_scheduling:
            self._commit(plan)
        elif self.config.speculation is not None:
            speculation.mark_proposals(plan)
        return plan

    def _commit(self, plan: StepPlan) -> None:
        """Async scheduling: the plan's tokens count as computed from the moment it is scheduled, and each
        row that reaches its end will sample a token, held as a placeholder until ``update`` delivers it
        (vLLM's ``Scheduler._update_after_schedule`` and ``AsyncScheduler._update_after_schedule``). The
        next plan, scheduled while this one runs, then continues every request from there."""
        rows = plan.requests
        rows_new = plan.num_new_tokens
        num_rows = plan.num_rows()
        sampled = [True] * num_rows  # made at its length (appended to, it grew by reallocation)
        for index in range(num_rows):
            request = rows[index]
            computed = request.num_computed_tokens + rows_new[index]
            request.num_computed_tokens = computed
            placeholders = request.num_output_placeholders
            if computed >= request.num_prompt_tokens + request.num_output_tokens + placeholders:
                request.num_output_placeholders = placeholders + 1
            else:
                sampled[index] = False  # a prompt chunk short of the end
        plan.sampled = sampled

    def update(self, plan: StepPlan, stopped_ids: Collection[int] = (),
               accepted: Sequence[int] | None = None) -> list[Request]:
        """Account a finished step: computed tokens catch up; a request whose computed tokens reach its
        tokens samples one more; it finishes at its output length (or when the engine says it stopped,
        e.g. on EOS). Returns the requests that finished, in plan order. Under speculative decoding,
        ``accepted`` gives each row's accepted proposals (``_update_speculative``)."""
        if plan.sampled is not None:
            return self._update_async(plan, stopped_ids)
        if plan.num_spec_tokens is not None:
            return self._update_speculative(plan, stopped_ids, accepted)
        finished: list[Request] = []
        rows = plan.requests
        rows_new = plan.num_new_tokens
        any_stopped = bool(stopped_ids)  # once: compiled, the truth of a Collection is a generic call
        for index in range(plan.num_rows()):  # indexed: compiled, zip(strict=True) is a slow generic call
            request = rows[index]
            num_new = rows_new[index]
            computed = request.num_computed_tokens + num_new
            request.num_computed_tokens = computed
            if computed < request.num_prompt_tokens + request.num_output_tokens:  # num_tokens
                continue  # a prompt chunk that did not reach the end: nothing sampled
            outputs = request.num_output_tokens + 1
            request.num_output_tokens = outputs
            if outputs >= request.max_output_tokens or (any_stopped and request.request_id in stopped_ids):
                self._finish(request)
                finished.append(request)
                plan.note_finished(request.request_id)
        if finished:
            self._drop_finished()
        return finished

    def _update_speculative(self, plan: StepPlan, stopped_ids: Collection[int],
                            accepted: Sequence[int] | None) -> list[Request]:
        """``update`` of a plan with proposals: a row verified with s proposals of which a were accepted
        gains 1 + a outputs (the accepted ones and the verifier's own token), and its computed tokens fall
        back by the s - a rejected (vLLM v1's ``update_from_output``). The slots of rejected proposals stay
        in its table (see ``core.speculation``)."""
        spec = plan.num_spec_tokens
        assert spec is not None
        rows = plan.requests
        rows_new = plan.num_new_tokens
        if accepted is None or len(accepted) != len(rows):
            raise ValueError(f"plan {plan.step_id} has proposals: update needs the accepted count of each of its "
                             f"{len(rows)} rows")
        finished: list[Request] = []
        for index in range(plan.num_rows()):
            request = rows[index]
            num_drafts = spec[index]
            num_accepted = accepted[index]
            if not 0 <= num_accepted <= num_drafts:
                raise ValueError(f"request {request.request_id}: {num_accepted} accepted of {num_drafts} proposals")
            computed = request.num_computed_tokens + rows_new[index] - (num_drafts - num_accepted)
            request.num_computed_tokens = computed
            if computed < request.num_prompt_tokens + request.num_output_tokens:
                continue  # a prompt chunk that did not reach the end: nothing sampled
            if num_drafts:
                self.num_spec_rows += 1
                self.num_draft_tokens += num_drafts
                self.num_accepted_tokens += num_accepted
            outputs = request.num_output_tokens + 1 + num_accepted
            request.num_output_tokens = outputs
            if outputs >= request.max_output_tokens or request.request_id in stopped_ids:
                self._finish(request)
                finished.append(request)
                plan.note_finished(request.request_id)
        if finished:
            self._drop_finished()
        return finished

    def _update_async(self, plan: StepPlan, stopped_ids: Collection[int]) -> list[Request]:
        """``update`` of a plan scheduled asynchronously (its tokens were counted computed when it was
        scheduled): deliver each sampled token, turning a placeholder into an output, index the blocks
        the token completes, and finish requests at their last token (vLLM's
        ``AsyncScheduler._update_request_with_output``). A request preempted while the step ran still
        gets its token (vLLM delivers such stale output, leaving the reset counters alone); one aborted
        or stopped meanwhile gets nothing."""
        sampled = plan.sampled
        assert sampled is not None
        finished = self._deliver_sampled(plan.requests, sampled, plan.num_rows(), stopped_ids)
        for request in finished:
            plan.note_finished(request.request_id)
        return finished

    def update_decodes(self, requests: list[Request]) -> list[Request]:
        """``update`` of an async decode step of ``requests`` (every row sampling), without its plan: the step
        a decode run's tail hands back (``Replica._settle``). Returns the requests that finished."""
        return self._deliver_sampled(requests, None, len(requests), ())

    def _deliver_sampled(self, rows: list[Request], sampled: list[bool] | None, num_rows: int,
                         stopped_ids: Collection[int]) -> list[Request]:
        """``_update_async``'s rows: each sampled row's token delivered (None: every row sampled)."""
        finished: list[Request] = []
        any_stopped = bool(stopped_ids)
        any_running = False
        kv = self.kv
        caching = kv.enable_caching
        for index in range(num_rows):
            if sampled is not None and not sampled[index]:
                continue
            request = rows[index]
            status = request.status
            if status is RequestStatus.FINISHED:
                continue
            running = status is RequestStatus.RUNNING
            if not running and self.sender is not None:
                # A prefill worker's request preempted while its first token was in flight: the KV the decode
                # worker would read went with the preemption, so the token is dropped and the prompt computed
                # again when it is readmitted (the request ends only holding its blocks for the transfer).
                continue
            outputs = request.num_output_tokens + 1
            request.num_output_tokens = outputs
            if running:  # ``_delivered`` spelled out (a call per row fewer, interpreted)
                request.num_output_placeholders -= 1
                if caching:
                    kv.cache_known_blocks(request)
            if outputs >= request.max_output_tokens or (any_stopped and request.request_id in stopped_ids):
                if running:
                    self._finish(request)
                    any_running = True
                else:  # preempted while its last token was in flight: it leaves the waiting queue
                    self.waiting.remove(request)
                    request.status = RequestStatus.FINISHED
                    del self.requests[request.request_id]
                finished.append(request)
        if any_running:
            self._drop_finished()
        return finished

    def _delivered(self, request: Request) -> None:
        """Async scheduling: a running request's sampled token has been delivered (its output counted): its
        placeholder goes, and the blocks its known tokens fill are indexed."""
        request.num_output_placeholders -= 1
        kv = self.kv
        if kv.enable_caching:  # (else nothing to index: no call per row, interpreted)
            kv.cache_known_blocks(request)

    def _drop_finished(self) -> None:
        """The running list without the requests just finished, in place (a new list per finish grew by
        reallocation as it filled)."""
        running = self.running
        kept = 0
        for index in range(len(running)):
            request = running[index]
            if request.status is RequestStatus.RUNNING:
                if kept != index:
                    running[kept] = request
                kept += 1
        del running[kept:]

    def _finish(self, request: Request) -> None:
        request.status = RequestStatus.FINISHED
        if self.sender is None:
            self.kv.free(request)
        else:
            self.sender.hold(request)  # a prefill worker: the decode worker reads the blocks first
        del self.requests[request.request_id]

    def retire_finished(self, requests: list[Request]) -> list[Request]:
        """Finish, in the order given, every request that has produced its last output token (the end of
        a decode run, whose last step is the one ``update`` would finish them in). Returns them."""
        finished = [r for r in requests if r.num_output_tokens >= r.max_output_tokens]
        if finished:
            for request in finished:
                self._finish(request)
            self._drop_finished()
        return finished

    def deliver_last_tokens(self, requests: list[Request]) -> list[Request]:
        """Async scheduling, the end of a decode run whose last step sampled these running requests' last
        tokens (their counters as that step's ``update`` finds them): deliver each, index the blocks it
        completes and finish the request, in the order given, as ``update`` does. Returns them."""
        if requests:
            for request in requests:
                self._delivered(request)
                self._finish(request)
            self._drop_finished()
        return requests

    # ----- fast path: how many steps until something changes ------------------------------------------

    def steady_decode_steps(self) -> int:
        """Steps ahead in which the batch cannot change: every running request decodes one token, none
        is admitted, no allocation fails, and none finishes before the last of them (the run ends with the
        step that finishes the first request(s), which ``retire_finished`` closes as ``update`` would).
        0 when the next step is not such a step.

        The simulator advances that many steps in one event (``DecodeRun``); arrivals that could change
        the answer (a waiting request the scheduler would try to admit) cut the run short.
        """
        running = self.running
        cfg = self.config
        if (not running or self.swapped or len(running) > cfg.max_num_batched_tokens or cfg.async_scheduling
                or cfg.speculation is not None):
            return 0  # speculation: tokens per step vary with acceptance, so every step goes one by one
        if (self.waiting and cfg.batching is not Batching.STATIC and len(running) < cfg.max_num_seqs
                and not self._admission_blocked()) or self._offers_waiting():
            return 0
        steps = 1 << 30
        for request in running:
            outputs = request.num_output_tokens
            if request.num_prompt_tokens + outputs - request.num_computed_tokens != 1 or outputs == 0:
                # A prompt chunk is still pending (num_tokens - computed); or its last one, a single token,
                # looks like a decode but samples the first token, which only a step of its own logs.
                return 0
            remaining = request.max_output_tokens - outputs
            if remaining < steps:
                steps = remaining
        if steps < 2:
            return 0
        if cfg.kv_policy is not KVPolicy.PAGED:
            return steps  # contiguous and reserve already hold every block the run needs
        # Paged KV: the blocks the run will pop must all be free now, else a step would preempt.
        free = self.kv.num_free_blocks
        # Each request pops at most ceil(steps / block_size) blocks (one per block boundary crossed): when
        # even that many for all of them are free, the exact count is not needed.
        if len(running) * -(-steps // self.block_size) <= free or self._blocks_for_steps(steps) <= free:
            return steps
        low, high = 0, steps  # the largest run that fits; blocks needed grow with the run
        while low < high:
            mid = (low + high + 1) // 2
            if self._blocks_for_steps(mid) <= free:
                low = mid
            else:
                high = mid - 1
        return low if low >= 2 else 0

    def steady_async_steps(self, queued: StepPlan, prompts: bool = False) -> int:
        """Async scheduling's ``steady_decode_steps``: with ``queued`` (scheduled, to run next) a decode of
        every running request, the steps from it on (it included) that are all such decodes, scheduled
        before anything can change the batch, and one more: through the one sampling the first request's
        last token, whose decision (scheduling the step after it) leaves that request out, when the pool
        holds the blocks of every decision; else up to that step, which is then the one more. 0 when fewer
        than 3 (no event saved).

        With ``prompts``, ``queued`` may also hold prompt rows (admitted now, or a last chunk), as long as
        every row samples a token: every running request, in running order, then has one token in flight
        after it, as after a decode, and the decodes after it are counted the same way (the caller prices
        that first step apart and reports its first tokens).

        The simulator runs all but the last as one run (``DecodeRun``), which finishes the requests whose
        last token its last step sampled and hands the last step back, queued: it starts as the run ends.
        An arrival the scheduler would try to admit cuts the run short."""
        running = self.running
        n = len(running)
        if not n or len(queued.requests) != n or queued.preempted_ids:
            return 0
        decodes = not queued.admitted_ids
        if decodes:
            for num_new in queued.num_new_tokens:  # a loop: compiled, ``sum`` is a builtin looked up
                if num_new != 1:
                    decodes = False
                    break
        if not decodes:
            sampled = queued.sampled
            if (not prompts or sampled is None or queued.swapped_in or queued.swapped_out
                    or queued.loads is not None):
                return 0
            rows = queued.requests
            for index in range(n):
                if not sampled[index] or rows[index] is not running[index]:
                    return 0  # a chunk short of its prompt's end, or rows not in running order
        return self.steady_async_batch()

    def admits_next(self) -> bool:
        """Async scheduling, at a decode run's cut: the next decision tries to admit the head of the queue
        (requests wait, a seat is free and the KV could take it), so ``steady_async_batch`` is 0 and the
        step handed back runs on its own, the decision after it a ``schedule``."""
        return bool(self.waiting) and len(self.running) < self.config.max_num_seqs and not self._admission_blocked()

    def steady_async_batch(self) -> int:
        """``steady_async_steps`` of a queued decode of every running request (known to be one: the step a
        decode run hands back), without the plan."""
        running = self.running
        cfg = self.config
        n = len(running)
        if not n or n > cfg.max_num_batched_tokens:
            return 0
        # A seat free and requests waiting: blocked now (else no run), but the decision that leaves out the
        # requests whose last token is in flight has their tokens of budget to spare, and may admit the head.
        head_may_join = bool(self.waiting) and n < cfg.max_num_seqs
        if (head_may_join and not self._admission_blocked()) or self._offers_waiting():
            return 0
        steps = 1 << 30
        for request in running:
            outputs = request.num_output_tokens
            if (request.num_output_placeholders != 1
                    or request.num_prompt_tokens + outputs != request.num_computed_tokens):
                return 0  # not one token in flight and one to schedule
            remaining = request.max_output_tokens - outputs  # the queued step's token included
            if remaining < steps:
                steps = remaining
        if steps < 3:
            return 0
        free = self.kv.num_free_blocks
        # A run through the step sampling the first last tokens: its steps decisions (the queued step holds
        # its blocks already) schedule every request but those in the last (fewer blocks than counted here),
        # and the step after it is handed back queued, behind the finished requests.
        if not head_may_join and (n * -(-steps // self.block_size) <= free
                                     or self._blocks_for_steps(steps) <= free):
            return steps + 1
        # Else a run up to it, handing it back in flight: steps - 1 more decodes (that decision is then the
        # scheduler's own, which admits what it can).
        decisions = steps - 1
        if n * -(-decisions // self.block_size) <= free or self._blocks_for_steps(decisions) <= free:
            return steps
        low, high = 0, decisions
        while low < high:
            mid = (low + high + 1) // 2
            if self._blocks_for_steps(mid) <= free:
                low = mid
            else:
                high = mid - 1
        return low + 1 if low >= 2 else 0

    def _offers_waiting(self) -> bool:
        """A decode worker with offers waiting for blocks: they are retried after every step, and a retry can
        succeed mid-run (a request whose KV landed indexed blocks the next offer's prompt hits, so it needs
        fewer), so no run starts until none waits."""
        receiver = self.receiver
        return receiver is not None and bool(receiver.pending)

    def _blocks_for_steps(self, steps: int) -> int:
        bs = self.block_size
        # Blocks each request must hold after ``steps`` more tokens, beyond those it holds (never < 0).
        return sum([max(0, (r.num_computed_tokens + steps + bs - 1) // bs - len(r.block_table)) for r in self.running])

    def account_steps(self, num_steps: int) -> None:
        """Counters the step-by-step path advances once per step (a DecodeRun advances them in bulk)."""
        self.num_steps += num_steps
        self._steps_since_prefill += num_steps

    # ----- policies ------------------------------------------------------------------------------

    def _schedule_chunked(self, plan: StepPlan) -> None:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        preempted = False
        running = self.running
        kv = self.kv  # its method called on it: compiled, a bound method taken out is a generic call
        caching = kv.enable_caching
        bs = self.block_size
        rows, rows_new = plan.requests, plan.num_new_tokens
        # Computed tokens as the process's shared int objects (``block_pool.shared_ints``) where they reach:
        # made anew, a decode row's count (past 256) would be an allocation per row per step, and a free.
        rows_computed: list[Any] = plan.num_computed_tokens
        ints = shared_ints(_SHARED_COUNTS)
        num_ints = len(ints)
        spec = cfg.speculation
        num_spec = 0 if spec is None else spec.num_speculative_tokens
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            placeholders = request.num_output_placeholders
            num_new = request.num_prompt_tokens + request.num_output_tokens + placeholders - computed
            if num_spec and num_new == 1 and request.num_output_tokens:
                # A decode with proposals: slots for them too (vLLM's num_tokens_with_spec), none past the
                # last output (the verifier samples one token of its own). Not a prompt's last chunk of one
                # token: nothing is drafted before a request's first token is sampled.
                num_new += min(num_spec, request.max_output_tokens - request.num_output_tokens - 1)
            if placeholders and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_output_tokens:
                # Async scheduling: the step in flight samples its last token; another step would be wasted
                # (vllm/v1/core/sched/scheduler.py, the running loop's first check).
                i += 1
                continue
            if num_new == 1 and (kv.appends_in_place(request) if caching else computed < len(request.block_table) * bs):
                # A decode the KV manager needs to do nothing for: schedule it without the allocation. Without the
                # prefix cache that is a token going in a block the request holds (``appends_in_place``'s answer
                # then, read here: a call per decode row fewer, interpreted).
                rows.append(request)
                rows_new.append(1)
                rows_computed.append(ints[computed] if computed < num_ints else computed)
                budget -= 1
                i += 1
                continue
            if threshold and threshold < num_new:  # min() spelled out (a builtin call each, interpreted)
                num_new = threshold
            if budget < num_new:
                num_new = budget
            if num_new <= 0:
                i += 1
                continue
            scheduled, budget, i = self._allocate_or_preempt(plan, request, num_new, budget, i)
            if scheduled:
                preempted = preempted or bool(plan.preempted_ids)
                plan.add(request, num_new)
                budget -= num_new
                i += 1
            else:
                preempted = True
                break  # the request preempted itself: nothing more fits this step
        preempted = preempted or bool(plan.preempted_ids)
        if not preempted:
            self._admit(plan, budget, whole_prompts=not cfg.enable_chunked_prefill)

    def _schedule_continuous(self, plan: StepPlan) -> None:
        cfg = self.config
        if self._prefill_allowed():
            self._admit(plan, cfg.max_num_batched_tokens, whole_prompts=True)
            if plan.requests:
                self._steps_since_prefill = 0
                return  # a prefill step: running requests wait (Orca / vLLM v0 / TGI)
        self._decode_all(plan)
        self._steps_since_prefill += 1

    def _schedule_static(self, plan: StepPlan) -> None:
        if not self.running:
            self._admit(plan, self.config.max_num_batched_tokens, whole_prompts=True)
            return
        self._decode_all(plan)

    def _prefill_allowed(self) -> bool:
        """TGI's gate: with a batch running, prefill only when enough requests wait (waiting-served
        ratio) or when decodes have run ``max_waiting_steps`` steps in a row."""
        if not (self.waiting or self.swapped):
            return False
        cfg = self.config
        if not self.running or cfg.waiting_served_ratio <= 0:
            return True
        if cfg.max_waiting_steps and self._steps_since_prefill >= cfg.max_waiting_steps:
            return True
        return self.num_waiting >= int(len(self.running) * cfg.waiting_served_ratio)

    def _decode_all(self, plan: StepPlan) -> None:
        """Every running request gets the tokens it lacks (one, for a decode), preempting on OOM, in
        running order while the step's token budget lasts (vLLM v0's running loop: with more requests
        running than ``max_num_batched_tokens``, the rest wait for the next step). The first row always
        goes, as a whole prompt does on admission."""
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running):
            request = self.running[i]
            num_new = request.num_tokens - request.num_computed_tokens
            if num_new <= 0:
                i += 1
                continue
            if num_new > budget and plan.requests:
                break
            scheduled, budget, i = self._allocate_or_preempt(plan, request, num_new, budget, i)
            if not scheduled:
                break
            plan.add(request, num_new)
            budget -= num_new
            i += 1

    def _allocate_or_preempt(
        self, plan: StepPlan, request: Request, num_new: int, budget: int, index: int
    ) -> tuple[bool, int, int]:
        """Slots for ``num_new`` tokens of a running request, preempting victims until they fit.
        Returns (scheduled, budget, index of ``request`` in running)."""
        reserve = 0 if self._paged else self._reserve_tokens(request)  # (paged: no call per row, interpreted)
        while self.kv.allocate(request, num_new, reserve_tokens=reserve) is None:
            victim = self._pick_victim()
            victim_index = self.running.index(victim)
            budget += self._preempt(victim, plan)
            if victim is request:
                return False, budget, index
            if victim_index < index:
                index -= 1
        return True, budget, index

    def _admit(self, plan: StepPlan, budget: int, *, whole_prompts: bool) -> None:
        """Admit swapped-out then waiting requests in queue order while budget, max_num_seqs and KV
        allow; stop at the first that does not fit (head-of-line blocking, no skipping ahead)."""
        cfg = self.config
        while budget > 0 and len(self.running) + self.num_receiving < cfg.max_num_seqs:
            if self.swapped:
                if not self._swap_in(plan, budget):
                    return
                budget -= plan.num_new_tokens[-1]
                continue
            if not self.waiting:
                return
            request = self.waiting.peek()
            admission = self._admission(request, budget, whole_prompts=whole_prompts,
                                        step_has_requests=bool(plan.requests))
            if admission is None:
                return
            hits, load, num_new = admission
            num_hit_tokens = len(hits) * self.block_size
            num_load_tokens = 0
            if load is not None and load.num_load_blocks and self.tiers is not None:
                num_load_tokens = load.num_load_blocks * self.block_size
                self.tiers.refresh(load, request.block_hashes, len(hits))
            reserve = 0 if self._paged else self._reserve_tokens(request)
            if self.kv.allocate(request, num_load_tokens + num_new, hits, reserve) is None:
                return
            self.waiting.pop()
            first_admission = request.status is RequestStatus.WAITING
            if first_admission:  # the hit counts once
                request.num_cached_tokens = num_hit_tokens
                self.kv.record_lookup(request.num_prompt_tokens, num_hit_tokens)
            if self.tiers is not None:
                self._commit_load(plan, request, hits, load, first_admission)
            request.num_computed_tokens += num_hit_tokens + num_load_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.note_admitted(request.request_id)
            plan.add(request, num_new)
            budget -= num_new

    def _admission(self, request: Request, budget: int, *, whole_prompts: bool,
                   step_has_requests: bool) -> tuple[list[int], TierLoad | None, int] | None:
        """What admitting ``request`` under ``budget`` asks of the KV manager: its prefix-hit blocks, the
        blocks to load from the KV tiers (if any) and its new tokens. None when it cannot go in this step
        whatever the KV holds."""
        hits = self.kv.get_computed_blocks(request) if request.num_computed_tokens == 0 else []
        load = None
        num_loaded = 0
        if self.tiers is not None and request.num_computed_tokens == 0 and request.num_hashed_blocks:
            max_blocks = min(request.num_hashed_blocks, (request.num_tokens - 1) // self.block_size)
            load = self.tiers.plan(request.block_hashes, len(hits), request.num_tokens, max_blocks)
            num_loaded = 0 if load is None else load.num_load_blocks
        num_new = self._admission_tokens(request, len(hits) + num_loaded, budget, whole_prompts=whole_prompts,
                                         step_has_requests=step_has_requests)
        return None if num_new is None else (hits, load, num_new)

    def _commit_load(self, plan: StepPlan, request: Request, hits: list[int], load: TierLoad | None,
                     first_admission: bool) -> None:
        """An admission with KV tiers: device hits counted (hit-count admission), the load planned for the
        runner (the fresh blocks after the hits), decisions counted."""
        tiers = self.tiers
        assert tiers is not None
        if hits:
            tiers.count_hits(request.block_hashes[: len(hits)])
        if load is None:
            return
        start = len(hits)
        stop = start + load.num_load_blocks
        op = tiers.commit(load, request.request_id, request.block_table[start:stop],
                          request.block_hashes[start:stop], first_admission=first_admission)
        if op is not None:
            if plan.loads is None:
                plan.loads = []
            plan.loads.append(op)

    def _admission_tokens(self, request: Request, num_hit_blocks: int, budget: int, *, whole_prompts: bool,
                          step_has_requests: bool) -> int | None:
        # ``num_tokens`` spelled out (a property: interpreted, a call)
        num_new = (request.num_prompt_tokens + request.num_output_tokens - request.num_computed_tokens
                   - num_hit_blocks * self.block_size)
        if whole_prompts:
            # Whole prompts only; the first one of a step always goes, so a prompt larger than the
            # budget is served alone rather than never.
            if num_new > budget and step_has_requests:
                return None
        else:
            threshold = self.config.long_prefill_token_threshold
            if threshold and threshold < num_new:  # min() spelled out (a builtin call each, interpreted)
                num_new = threshold
            if budget < num_new:
                num_new = budget
        return num_new

    def _admission_blocked(self) -> bool:
        """Chunked batching with requests waiting: True when the head of the queue (the only one
        ``_admit`` tries: no skipping ahead) cannot be admitted in any step of a decode run starting now.
        Free blocks only shrink while the batch decodes (blocks are popped, none is freed), and the head's
        KV need can only fall if its prefix hits grow — as the run caches blocks — so the need is taken
        at the most hits the head could ever get (every hashed block it has, optimistically free of
        charge): if even that does not fit now, no step of the run admits it. Never blocked with KV tiers:
        a try that fails has touched the head's blocks in them first (``_admit``), which only step by step
        repeats."""
        cfg = self.config
        if cfg.batching is not Batching.CHUNKED or self.swapped:
            return False
        budget = cfg.max_num_batched_tokens - len(self.running)  # every running request decodes one token
        if budget <= 0:
            return True
        if self.tiers is not None:
            # Each step's attempt may refresh the head's blocks in the tiers even when it fails (``_admit``
            # touches them before allocating): the order of a tier's evictions, which a run would not move.
            return False
        request = self.waiting.peek()
        max_hits = 0
        if self.kv.enable_caching and request.num_computed_tokens == 0:
            max_hits = (request.num_prompt_tokens + request.num_output_tokens - 1) // self.block_size  # num_tokens
            hashed = request.num_hashed_blocks
            if hashed < max_hits:
                max_hits = hashed
        # A KV need that falls as hits grow: min(new tokens, budget) tokens beyond the hit blocks.
        num_new = self._admission_tokens(request, max_hits, budget, whole_prompts=not cfg.enable_chunked_prefill,
                                         step_has_requests=True)
        if num_new is None:
            return True
        reserve = 0 if self._paged else self._reserve_tokens(request)
        need = self.kv.num_blocks_needed(request, num_new, max_hits, reserve)
        return need > self.kv.num_free_blocks

    def _swap_in(self, plan: StepPlan, budget: int) -> bool:
        request = self.swapped[0]
        num_new = min(request.num_tokens - request.num_computed_tokens, budget)
        if self.kv.allocate(request, num_new, reserve_tokens=self._reserve_tokens(request)) is None:
            return False
        self.swapped.popleft()
        self._release_host(self._cdiv(request.num_swapped_tokens))
        blocks = self.kv.block_ids(request.request_id)[: self._cdiv(request.num_computed_tokens)]
        plan.note_swapped_in(SwapOp(request.request_id, request.num_swapped_tokens, tuple(blocks)))
        request.num_swapped_tokens = 0
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        plan.add(request, num_new)
        return True

    def _pick_victim(self) -> Request:
        """FCFS: the most recently admitted running request (vLLM v1 pops the tail of ``running``).
        Priority: the least urgent, latest arrival."""
        if self.config.queue_policy is QueuePolicy.FCFS:
            return self.running[-1]
        return max(self.running, key=lambda r: (r.priority, r.arrival_s, r.request_id))

    def _preempt(self, victim: Request, plan: StepPlan) -> int:
        """Take a running request off the device; returns tokens given back to the budget (when the
        victim had already been scheduled in this plan)."""
        self.running.remove(victim)
        returned = plan.remove(victim) if victim in plan.requests else 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        plan.note_preempted(victim.request_id)
        host_blocks = self._cdiv(victim.num_computed_tokens)
        if (
            self.config.preemption is Preemption.SWAP
            and victim.num_computed_tokens > 0
            and self._reserve_host(host_blocks)
        ):
            blocks = self.kv.block_ids(victim.request_id)[:host_blocks]
            plan.note_swapped_out(SwapOp(victim.request_id, victim.num_computed_tokens, tuple(blocks)))
            self.kv.free(victim)
            victim.num_swapped_tokens = victim.num_computed_tokens
            victim.status = RequestStatus.SWAPPED
            self.swapped.append(victim)
        else:
            self.kv.free(victim)
            victim.num_computed_tokens = 0
            # Async scheduling: a token in flight for it is still delivered (``update``), without placeholder.
            victim.num_output_placeholders = 0
            victim.status = RequestStatus.PREEMPTED
            self.waiting.push_front(victim)
        return returned

    def _reserve_host(self, num_blocks: int) -> bool:
        """Host memory for a swapped-out request: the KV tiers' host tier when there is one (one host
        memory for cached blocks and swapped requests), else ``num_host_blocks``."""
        tiers = self.tiers
        if tiers is not None and tiers.host is not None:
            if not tiers.reserve_host(num_blocks):
                return False
        elif self.num_host_blocks_used + num_blocks > self.config.num_host_blocks:
            return False
        self.num_host_blocks_used += num_blocks
        return True

    def _release_host(self, num_blocks: int) -> None:
        self.num_host_blocks_used -= num_blocks
        if self.tiers is not None:
            self.tiers.release_host(num_blocks)

    def _reserve_tokens(self, request: Request) -> int:
        policy = self.config.kv_policy
        if policy is KVPolicy.PAGED:
            return 0
        if policy is KVPolicy.CONTIGUOUS:
            return self.config.max_model_len
        return request.max_total_tokens

    def _cdiv(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
