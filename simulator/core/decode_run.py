"""A run of identical decode steps, advanced in bulk: the simulator's fast path (DESIGN §6).

Between changes of batch composition every step is the same: each running request decodes one token,
nothing is admitted, no allocation fails, and requests finish only at the run's last step.
``Scheduler.steady_decode_steps()`` says how many such steps lie ahead; a ``DecodeRun`` then applies them
without building k step plans. The per-request token counters are updated once at the end (O(batch)); the
only per-step work replayed is the KV manager's, and only on the steps where a request crosses a block
boundary — through the very same ``KVManager.allocate`` call, in the same order the step-by-step path
makes it — so block ids, prefix-cache contents and evictions are identical to running the steps one by one
(a test holds both paths to that).

Under async scheduling (``SchedulerConfig.async_scheduling``) a run of K decode steps starts when the
first of them, already scheduled, is about to run, and applies the K - 1 decisions scheduled while the
steps before them run: each decision allocates the slot of the step after the one in flight, so a
request's counters stand one token ahead and the block-start events come one step earlier, while the
blocks its tokens fill are indexed when those tokens become known, on the same steps as without async.
A run ends with the step sampling the first requests' last tokens when the pool holds the blocks of its
decisions (``steady_async_steps``): its last decision leaves them out, as the scheduler does a request
whose last token is in flight, and ``finish`` delivers those tokens and finishes them, as that step's
``update`` would; one ``update`` and one decision per finish fewer than handing that step back and
running it on its own (a simulated day's events -13 %). The step its last decision scheduled is handed
back (``in_flight_plan``) to start as the run ends, as the queued step does. The first step may also be a
queued step of prompts that all sample (``steady_async_steps(prompts=True)``): every request then has one
token in flight as after a decode, so the run applies that step's update as a decode's (its caller prices
the step and reports its first tokens).

Standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from simulator.core.block_pool import shared_ints
from simulator.core.step import StepPlan

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python

    from simulator.core.request import Request
    from simulator.core.scheduler import Scheduler


class DecodeRun:
    """``num_steps`` decode steps of the scheduler's current running set, applied step by step on demand
    (``advance_to``) and closed by ``finish``; ``truncate`` cuts the run short (an arrival that could
    change the batch)."""

    __slots__ = ("_async", "_caching", "_counter_step", "_cursor_cycle", "_cursor_position", "_finish_step",
                 "_finishing", "_first_cycle", "_index_bits", "_next_block_step", "_progressions", "batch",
                 "block_size", "ctx_sum_start", "num_done", "num_steps", "requests", "scheduler")

    def __init__(self, scheduler: Scheduler, num_steps: int) -> None:
        self.scheduler = scheduler
        self.block_size: i64 = scheduler.block_size
        self._caching = scheduler.kv.enable_caching
        self._async = scheduler.config.async_scheduling
        self.requests: list[Request] = []
        self._progressions: list[Any] = []
        self._first_cycle: list[int] = []
        self._index_bits: i64 = 0
        self._cursor_cycle = 0
        self._cursor_position = 0
        self._next_block_step: i64 = _NEVER
        self._finishing: list[bool] = []
        self._finish_step: i64 = _NEVER
        self.restart(num_steps)

    def restart(self, num_steps: int) -> None:
        """Begin a new run of ``num_steps`` steps of the scheduler's current running set, reusing this
        object (a replica starts a run per arrival or completion)."""
        requests = self.requests = list(self.scheduler.running)  # a fresh copy (the last one may be the plan in flight)
        self.num_steps: i64 = num_steps
        self.num_done: i64 = 0
        self.batch: i64 = len(requests)
        self._counter_step: i64 = 0
        """The run step every request's token counters stand at (all move together: ``set_counters``)."""
        self._finish_step = _NEVER
        if self._async:
            # The requests whose last token the run's last step samples (``steady_async_steps`` ends a run
            # there when the blocks allow): the run's last decision, scheduled as that step starts, leaves
            # them out, and ``finish`` delivers their last tokens and finishes them, as ``update`` would.
            # Flagged in the pass over the batch below (``_index_events``' with the prefix cache): one pass.
            # Written over in place, grown only past its longest fill (only its first ``batch`` entries are
            # read): cleared and appended to, it was freed and grown again by reallocation per run.
            finishing = self._finishing
            n = len(requests)
            if len(finishing) < n:
                finishing.extend([False] * (n - len(finishing)))
        ctx_sum: i64 = 0
        if self._caching:
            ctx_sum = self._index_events(num_steps)
        else:
            # Without the prefix cache, the only KV work is a new block for a request whose next token starts
            # one: step j of the run computes token c + j - 1 of a request with c computed tokens, so it
            # needs a block on step len(block_table) * block_size - c + 1, and every block_size steps after.
            # That step is read off the request's table as the run goes (``_append_blocks_until``); here only
            # the earliest of them is kept, so that steps before it cost nothing.
            bs = self.block_size
            next_block_step: i64 = _NEVER
            flag = self._async
            finishing = self._finishing
            any_finishing = False
            for index in range(len(requests)):
                request = requests[index]
                computed = request.num_computed_tokens
                ctx_sum += computed
                first = len(request.block_table) * bs - computed + 1
                if 1 <= first < next_block_step:
                    next_block_step = first
                if flag:
                    last = request.max_output_tokens - request.num_output_tokens == num_steps
                    finishing[index] = last
                    any_finishing = any_finishing or last
            self._next_block_step = next_block_step
            if any_finishing:
                self._finish_step = num_steps
        # Every request attends to the tokens computed before the step plus the new one; under async
        # scheduling the first step's token is already counted computed.
        self.ctx_sum_start: i64 = ctx_sum if self._async else ctx_sum + self.batch
        """Context sum of the first step."""

    def _index_events(self, num_steps: int) -> int:
        """With the prefix cache: list the run's KV events (``_apply_events`` applies them); returns the
        requests' context sum.

        Steps where a request's KV bookkeeping can change: it starts a block it does not hold yet, or fills
        a block with a known hash. All other decode steps are no-ops for the KV manager. Each kind of event
        recurs every block_size steps from its first step f: it is kept as (phase, index, cycle) with f =
        phase + cycle * block_size, phase in 1..block_size, and expanded lazily (most runs are cut after a
        few steps). In cycle m, event (phase, index, cycle) falls on step phase + m * block_size if cycle
        <= m: sorted by (phase, index), one cycle's events come in step order, running order within a step.
        Each is kept as one int, ((phase << bits) + index) * 2 + kind with ``bits`` the batch size's bit length
        (sorting ints is several times cheaper than sorting tuples), its cycle in ``_first_cycle`` at
        2 * index + kind (only the entries of listed events are read, so the list is never cleared)."""
        requests = self.requests
        n = self.batch
        bs = self.block_size
        # Keys as the process's shared int objects (``block_pool.shared_ints``): a key is past 256, and made
        # anew it would be an allocation, and a free as the run ends.
        bits: i64 = 1  # the index's field (n's bit length at least): shifts and masks rather than divisions
        while (1 << bits) <= n:
            bits += 1
        self._index_bits = bits
        ints = shared_ints(((bs + 1) << bits) * 2 + 2)
        # The last run's list, written over in place (a fresh one per run grew by reallocation as it filled).
        progressions = self._progressions
        count = 0
        capacity = len(progressions)  # written by index below it, appended to past it
        first_cycle = self._first_cycle
        if len(first_cycle) < 2 * n:
            first_cycle.extend([0] * (2 * n - len(first_cycle)))
        ctx_sum = 0
        flag = self._async
        shift = 1 if flag else 0  # async: the first step's token is computed
        finishing = self._finishing
        any_finishing = False
        for index in range(n):  # one pass, plain ints (this runs once per decode run)
            request = requests[index]
            computed = request.num_computed_tokens
            ctx_sum += computed
            if flag:  # (``restart``)
                last = request.max_output_tokens - request.num_output_tokens == num_steps
                finishing[index] = last
                any_finishing = any_finishing or last
            num_held = len(request.block_table)
            first = num_held * bs - computed + 1  # first token of a new block
            starts = 0  # the step of the run's first block start in cycle 0 (0: none there)
            if 1 <= first <= bs:
                # The usual case (the request holds no block past the one its next token goes in): the step in
                # cycle 0, and the blocks full of known tokens read off the table, with no division.
                if first <= num_steps:
                    key = ints[((first << bits) + index) * 2]
                    if count < capacity:
                        progressions[count] = key
                    else:
                        progressions.append(key)
                        capacity += 1
                    count += 1
                    first_cycle[2 * index] = 0
                starts = first
                num_known = num_held - 1 if first > 1 - shift else num_held  # (computed - shift) // bs
                completes = first - 1 + shift or bs  # -(computed - shift) % bs or bs
            else:
                if 1 <= first <= num_steps:
                    key = ints[((((first - 1) % bs + 1) << bits) + index) * 2]
                    if count < capacity:
                        progressions[count] = key
                    else:
                        progressions.append(key)
                        capacity += 1
                    count += 1
                    first_cycle[2 * index] = (first - 1) // bs
                num_known = (computed - shift) // bs
                completes = -(computed - shift) % bs or bs
            if request.num_hashed_blocks > num_known:
                first = completes  # the step whose token completes a block (becomes known), cycle 0
                # On the block start's steps from cycle 0 on (under async scheduling, the usual case: the
                # token that completes a block becomes known as the next one starts a block), one allocation
                # does both: the start's event stands for the two.
                if first <= num_steps and first != starts:
                    key = ints[((first << bits) + index) * 2 + 1]
                    if count < capacity:
                        progressions[count] = key
                    else:
                        progressions.append(key)
                        capacity += 1
                    count += 1
                    first_cycle[2 * index + 1] = 0
        if count < capacity:
            del progressions[count:]
        if count > 1:
            progressions.sort()  # a request's two kinds of event on one step sit together: applied once
        if any_finishing:
            self._finish_step = num_steps
        self._cursor_cycle = 0
        self._cursor_position = 0
        """(cycle, position in the progressions) of the next event not yet applied."""
        return ctx_sum

    def _apply_events(self, step: int) -> None:
        """Apply the events after the cursor up to ``step``, in order, and move the cursor past them. Each
        is applied as it is found (a list of them built and read back was ~4 % of a day's instructions);
        a request's two kinds of event on one step are one allocation."""
        progressions = self._progressions
        if not progressions:
            return
        bs = self.block_size
        bits: i64 = self._index_bits
        mask: i64 = (1 << bits) - 1
        first_cycle = self._first_cycle
        cycle = self._cursor_cycle
        position = self._cursor_position
        count = len(progressions)
        kv = self.scheduler.kv
        requests = self.requests
        counter_step = self._counter_step
        previous: i64 = -1
        while True:
            base = cycle * bs
            if base + 1 > step:
                break
            while position < count:
                key: int = progressions[position]
                slot = key >> 1  # (phase << bits) + index
                phase = slot >> bits
                if phase + base > step:
                    self._cursor_cycle = cycle
                    self._cursor_position = position
                    return
                index = slot & mask
                position += 1
                if first_cycle[2 * index + (key & 1)] > cycle:
                    continue  # this kind of event of the request begins in a later cycle
                event: i64 = slot + (base << bits)  # ((phase + base) << bits) + index: step j, then index
                if event == previous:
                    continue  # both kinds of event of one request on one step: one allocation
                previous = event
                request = requests[index]
                # allocate(request, 1) as the request stands when step j is scheduled (steady_decode_steps
                # checked the pool holds every block the run pops).
                delta = phase + base - 1 - counter_step
                if phase + base == self._finish_step and self._finishing[index]:
                    # The last decision leaves out a request whose last token is in flight: no slot, and only
                    # the blocks ``update`` indexes before it (those full of tokens whose KV is computed or
                    # being computed: not the token the step in flight computes, whose block ``finish``
                    # indexes as that step's ``update`` does, after the decisions of the others).
                    kv.index_known_tokens(request, request.num_prompt_tokens + request.num_output_tokens + delta - 1)
                    continue
                kv.append_decode_token(request, request.num_computed_tokens + delta,
                                       request.num_prompt_tokens + request.num_output_tokens + delta)
            cycle += 1
            position = 0
        self._cursor_cycle = cycle
        self._cursor_position = position

    def truncate(self, num_steps: int) -> None:
        if not self.num_done <= num_steps <= self.num_steps:
            raise ValueError(f"cannot truncate a run at step {self.num_done} of {self.num_steps} to {num_steps}")
        self.num_steps = num_steps

    def advance_to(self, step: int) -> None:
        """Apply the KV work of steps ``num_done + 1 .. step`` in step order, running order within a step."""
        if step > self.num_steps:
            step = self.num_steps
        if step <= self.num_done:
            return  # already applied (most calls: a router's sync or a sample within one step)
        self.num_done = step
        if not self._caching:
            if step >= self._next_block_step:
                self._append_blocks_until(step)
            return
        self._apply_events(step)

    def _append_blocks_until(self, step: int) -> None:
        """Without the prefix cache: pop a block onto each table whose request starts one on a step from
        ``_next_block_step`` to ``step``, in step order, running order within a step.

        Each request's next such step is read off its table (see ``restart``): a block appended moves it
        block_size steps on. The steps are taken in windows of block_size, in which a request starts at most
        one block, so one pass over the batch finds a window's blocks."""
        requests = self.requests
        bs = self.block_size
        kv = self.scheduler.kv
        base = self._counter_step + 1  # at = len(table) * block_size - (computed tokens at the run's start) + 1
        low = self._next_block_step
        following = low
        end: i64 = step
        while low <= end:
            high: i64 = low + bs - 1
            if high > end:
                high = end
            following = _NEVER
            # In step order, running order within a step: a request found after others with a later step
            # goes in before them (a few per window: plain inserts beat building keys to sort; in a window of
            # one step, the usual case, nothing moves).
            tables: list[list[int]] = []
            steps: list[int] = []  # each listed table's step (a run's steps: mostly cached small ints)
            count = 0
            finish_step = self._finish_step
            for index in range(len(requests)):
                request = requests[index]
                table = request.block_table
                at: i64 = len(table) * bs - request.num_computed_tokens + base
                if at == finish_step and self._finishing[index]:
                    at += bs  # its last decision left it out: no block (and none later: the run ends here)
                if 1 <= at <= high:
                    position = count
                    while position > 0 and steps[position - 1] > at:
                        position -= 1
                    if position == count:
                        tables.append(table)
                        steps.append(at)
                    else:
                        tables.insert(position, table)
                        steps.insert(position, at)
                    count += 1
                    at += bs
                if 1 <= at < following:
                    following = at
            if count:
                kv.append_blocks(tables)
            low = following
        self._next_block_step = following

    def set_counters(self, step: int) -> None:
        """Leave every request as it is after ``step`` steps of the run (for readers of request state,
        e.g. KV usage figures, in the middle of a run; O(batch)). Counters move by the same amount for
        every request, so no copy of them is kept."""
        delta = step - self._counter_step
        if delta == 0:
            return
        self._counter_step = step
        for request in self.requests:
            request.num_computed_tokens += delta
            request.num_output_tokens += delta

    def finish(self) -> list[Request]:
        """Apply the remaining steps and leave every request as the step-by-step path would, finishing
        those whose last token the run's last step produced. Returns them, in running order (under async
        scheduling, those of a run that ends with the step sampling them, not cut short)."""
        num_steps = self.num_steps
        self.advance_to(num_steps)
        self.scheduler.account_steps(num_steps)
        if not self._async or num_steps != self._finish_step:
            self.set_counters(num_steps)
            if not self._async:
                return self.scheduler.retire_finished(self.requests)
            return []
        # ``set_counters(num_steps)`` in the pass that takes out the finishing requests (one pass, not two).
        delta = num_steps - self._counter_step
        self._counter_step = num_steps
        requests = self.requests
        finishing = self._finishing
        finished: list[Request] = []
        kept = 0
        for index in range(len(requests)):
            request = requests[index]
            request.num_output_tokens += delta
            if finishing[index]:
                request.num_computed_tokens += delta - 1  # not in the last decision
                finished.append(request)
            else:
                request.num_computed_tokens += delta
                if kept != index:
                    requests[kept] = request
                kept += 1
        # The step handed back (``in_flight_plan``) runs without them: the run's own list (nothing else holds
        # it yet), cut in place.
        del requests[kept:]
        return self.scheduler.deliver_last_tokens(finished)

    def in_flight_plan(self) -> StepPlan:
        """Async scheduling, after ``finish``: the plan of the step the last decision scheduled, which
        runs next (a decode of every request of the run but those ``finish`` finished), as the step-by-step
        path would hold it."""
        # The run's own list of requests goes to the plan (the run takes a new one when it restarts).
        requests = self.requests
        n = len(requests)
        plan = StepPlan(self.scheduler.num_steps - 1, requests, [1] * n, [r.num_computed_tokens - 1 for r in requests])
        plan.sampled = [True] * n
        return plan


_NEVER: Final = 1 << 60
"""A step no run reaches (a short int in the compiled build, which holds up to 2**62 unboxed)."""
