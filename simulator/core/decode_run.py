"""A run of identical decode steps, advanced in bulk: the simulator's fast path (DESIGN §6).

Between changes of batch composition every step is the same: each running request decodes one token,
nothing is admitted, no allocation fails, and requests finish only at the run's last step.
``Scheduler.steady_decode_steps()`` says how many such steps lie ahead; a ``DecodeRun`` then applies them
without building k step plans. The per-request token counters are updated once at the end (O(batch)); the
only per-step work replayed is the KV manager's, and only on the steps where a request crosses a block
boundary — through the very same ``KVManager.allocate`` call, in the same order the step-by-step path
makes it — so block ids, prefix-cache contents and evictions are identical to running the steps one by one
(a test holds both paths to that).

Standard library only.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.core.request import Request
    from simulator.core.scheduler import Scheduler


class DecodeRun:
    """``num_steps`` decode steps of the scheduler's current running set, applied step by step on demand
    (``advance_to``) and closed by ``finish``; ``truncate`` cuts the run short (an arrival that could
    change the batch)."""

    __slots__ = ("_computed0", "_event_steps", "_events", "_next_event", "_output0", "batch", "ctx_sum_start",
                 "num_done", "num_steps", "requests", "scheduler")

    def __init__(self, scheduler: Scheduler, num_steps: int) -> None:
        self.scheduler = scheduler
        requests = self.requests = list(scheduler.running)
        self.num_steps = num_steps
        self.num_done = 0
        computed0 = self._computed0 = [r.num_computed_tokens for r in requests]
        self._output0 = [r.num_output_tokens for r in requests]
        self.batch = len(requests)
        self.ctx_sum_start = sum(computed0) + self.batch
        """Context sum of the first step: every request attends to its computed tokens plus the new one."""
        # Steps where a request's KV bookkeeping can change: it starts a block it does not hold yet, or
        # (with the prefix cache) fills a block with a known hash. All other decode steps are no-ops for
        # the KV manager. Step j of the run computes token c + j - 1 of a request with c computed tokens.
        bs = scheduler.block_size
        kv = scheduler.kv
        tables = kv.req_blocks
        events: list[tuple[int, int]] = []
        for index, computed in enumerate(computed0):
            step = len(tables[requests[index].request_id]) * bs - computed + 1  # first token of a new block
            while step <= num_steps:
                events.append((step, index))
                step += bs
        if kv.enable_caching:
            for index, computed in enumerate(computed0):
                if len(requests[index].block_hashes) > computed // bs:
                    step = -computed % bs or bs  # the step whose token completes a block
                    while step <= num_steps:
                        events.append((step, index))
                        step += bs
        events.sort()  # step order, running order within a step (a pair listed twice is applied once)
        self._events = events
        self._event_steps = [step for step, _ in events]
        self._next_event = 0

    def truncate(self, num_steps: int) -> None:
        if not self.num_done <= num_steps <= self.num_steps:
            raise ValueError(f"cannot truncate a run at step {self.num_done} of {self.num_steps} to {num_steps}")
        self.num_steps = num_steps

    def advance_to(self, step: int) -> None:
        """Apply the KV work of steps ``num_done + 1 .. step`` in step order, running order within a step."""
        step = min(step, self.num_steps)
        if step <= self.num_done:
            return  # already applied (most calls: a router's sync or a sample within one step)
        self.num_done = step
        first = self._next_event
        last = bisect_right(self._event_steps, step, first)
        if last == first:
            return
        self._next_event = last
        kv = self.scheduler.kv
        events = self._events
        requests = self.requests
        if not kv.enable_caching:
            # Only block pops happen (no hashes to index): hand them out in one call, in step order.
            tables = kv.req_blocks
            blocks = kv.pool.get_new_blocks(last - first)
            for (_, index), block_id in zip(events[first:last], blocks, strict=True):
                tables[requests[index].request_id].append(block_id)
            return
        allocate = kv.allocate
        computed0 = self._computed0
        output0 = self._output0
        previous = None
        for event in events[first:last]:
            if event == previous:
                continue
            previous = event
            j, index = event
            request = requests[index]
            request.num_computed_tokens = computed0[index] + j - 1
            request.num_output_tokens = output0[index] + j - 1
            if allocate(request, 1) is None:  # steady_decode_steps checked the pool: cannot happen
                raise AssertionError(f"decode run: no KV for {request} at step {j}")

    def set_counters(self, step: int) -> None:
        """Leave every request as it is after ``step`` steps of the run (for readers of request state,
        e.g. KV usage figures, in the middle of a run; O(batch))."""
        for request, computed, outputs in zip(self.requests, self._computed0, self._output0, strict=True):
            request.num_computed_tokens = computed + step
            request.num_output_tokens = outputs + step

    def finish(self) -> list[Request]:
        """Apply the remaining steps and leave every request as the step-by-step path would, finishing
        those whose last token the run's last step produced. Returns them, in running order."""
        self.advance_to(self.num_steps)
        self.set_counters(self.num_steps)
        self.scheduler.account_steps(self.num_steps)
        return self.scheduler.retire_finished(self.requests)
