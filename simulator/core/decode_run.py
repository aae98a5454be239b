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

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.core.request import Request
    from simulator.core.scheduler import Scheduler


class DecodeRun:
    """``num_steps`` decode steps of the scheduler's current running set, applied step by step on demand
    (``advance_to``) and closed by ``finish``; ``truncate`` cuts the run short (an arrival that could
    change the batch)."""

    def __init__(self, scheduler: Scheduler, num_steps: int) -> None:
        self.scheduler = scheduler
        self.requests: list[Request] = list(scheduler.running)
        self.num_steps = num_steps
        self.num_done = 0
        self._computed0 = [r.num_computed_tokens for r in self.requests]
        self._output0 = [r.num_output_tokens for r in self.requests]
        self.batch = len(self.requests)
        self.ctx_sum_start = sum(self._computed0) + self.batch
        """Context sum of the first step: every request attends to its computed tokens plus the new one."""
        # Steps where a request's KV bookkeeping can change: it starts a new block ((c + j - 1) % bs == 0)
        # or fills one ((c + j) % bs == 0). All other decode steps are no-ops for the KV manager.
        bs = scheduler.block_size
        kv = scheduler.kv
        tables = kv.req_blocks
        caching = kv.enable_caching
        events: dict[int, list[int]] = {}
        for index, computed in enumerate(self._computed0):
            request = self.requests[index]
            offsets: tuple[int, ...] = ()
            if (computed + num_steps + bs - 1) // bs > len(tables.get(request.request_id, ())):
                offsets = (1 - computed,)  # steps that start a block it does not hold yet
            if caching and len(request.block_hashes) > computed // bs:
                offsets += (-computed,)  # steps that fill a block with a known hash
            for offset in offsets:
                step = offset % bs or bs
                while step <= num_steps:
                    events.setdefault(step, []).append(index)
                    step += bs
        self._events = events

    def truncate(self, num_steps: int) -> None:
        if not self.num_done <= num_steps <= self.num_steps:
            raise ValueError(f"cannot truncate a run at step {self.num_done} of {self.num_steps} to {num_steps}")
        self.num_steps = num_steps

    def advance_to(self, step: int) -> None:
        """Apply the KV work of steps ``num_done + 1 .. step`` in step order, running order within a step."""
        step = min(step, self.num_steps)
        if step <= self.num_done:
            return  # already applied (most calls: a router's sync or a sample within one step)
        kv = self.scheduler.kv
        if not kv.enable_caching:
            # Only block pops happen (no hashes to index): hand them out in one call, in step order.
            events = self._events
            requests = self.requests
            computed0 = self._computed0
            tokens = [
                (requests[index].request_id, computed0[index] + j - 1)
                for j in range(self.num_done + 1, step + 1)
                for index in events.get(j, ())
            ]
            self.num_done = step
            if tokens:
                kv.append_decode_blocks(tokens)
            return
        allocate = kv.allocate
        while self.num_done < step:
            self.num_done += 1
            j = self.num_done
            indices = self._events.get(j)
            if not indices:
                continue
            for index in sorted(set(indices)):
                request = self.requests[index]
                request.num_computed_tokens = self._computed0[index] + j - 1
                request.num_output_tokens = self._output0[index] + j - 1
                if allocate(request, 1) is None:  # steady_decode_steps checked the pool: cannot happen
                    raise AssertionError(f"decode run: no KV for {request} at step {j}")

    def set_counters(self, step: int) -> None:
        """Leave every request as it is after ``step`` steps of the run (for readers of request state,
        e.g. KV usage figures, in the middle of a run; O(batch))."""
        for index, request in enumerate(self.requests):
            request.num_computed_tokens = self._computed0[index] + step
            request.num_output_tokens = self._output0[index] + step

    def finish(self) -> list[Request]:
        """Apply the remaining steps and leave every request as the step-by-step path would, finishing
        those whose last token the run's last step produced. Returns them, in running order."""
        self.advance_to(self.num_steps)
        self.set_counters(self.num_steps)
        self.scheduler.account_steps(self.num_steps)
        return self.scheduler.retire_finished(self.requests)
