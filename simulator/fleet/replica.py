"""One simulated replica: the serving core's scheduler, with the clock advanced by a cost model.

The replica runs the same ``core.Scheduler`` the real engine runs; where the engine would run the model,
it schedules the end of the step ``CostModel.step_time(plan.shape)`` later on the SimPy clock (priced from
the shape's fields, ``time_of(*shape_fields(plan))``, without building it) and carries on when that event
fires. One SimPy event per engine step (or per decode run on the fast path), never per token; an idle
replica schedules nothing until work arrives.

In a disaggregated fleet a replica is a prefill or a decode worker (its scheduler's role): a prefill
worker hands the requests that reached their first token to the fleet (``on_prefilled``) instead of
logging them, and frees their blocks when the transfer has read them (``release``); a decode worker takes
offers (``offer``, reserving blocks through the core), retries them after every step (``on_step_ended``),
and takes a request into its batch when its KV lands (``receive``). Every decision stays the core's.

The replica is driven by callbacks rather than a SimPy process: each of its events (``Wake``) calls one
of its methods directly when SimPy's ``Environment.step`` pops it. That is exactly what a process does on
a yield (SimPy resumes it from the event's callback), without a generator, a ``Timeout`` object and the
process's resume bookkeeping per step — on the simulator's hottest path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import simpy

from simulator.core.config import Batching, QueuePolicy, SchedulerConfig
from simulator.core.decode_run import DecodeRun
from simulator.core.kv_transfer import KVReceiver, KVSender, Reservation
from simulator.core.request import Request, RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.core.step import StepPlan, shape_fields
from simulator.cost.cost_model import CostModel, StepEnds
from simulator.cost.speculative_step import speculative_step_s
from simulator.fleet.clock import Callback, Clock, Wake
from simulator.fleet.loads import LoadLevels
from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries


class Replica:
    """One scheduler on the SimPy clock. Satisfies the router's ``ReplicaView`` protocol live."""

    def __init__(
        self,
        env: simpy.Environment,
        replica_id: int,
        config: SchedulerConfig,
        cost_model: CostModel,
        log: RequestLog,
        series: ReplicaSeries,
        *,
        network_latency_s: float = 0.0,
        fast_path: bool = True,
        on_plan: Callable[[StepPlan], None] | None = None,
        loads: LoadLevels | None = None,
    ) -> None:
        self.env = env
        self.clock = Clock(env)
        self.replica_id = replica_id
        self.scheduler = Scheduler(config)
        self.cost_model = cost_model
        self.log = log
        self.series = series
        self.network_latency_s = network_latency_s
        self.num_steps = 0
        self.busy_s = 0.0
        self.num_prefill_tokens = 0
        """Tokens run as prompt chunks (first computations, recomputes after preemption) over the run."""
        self.fast_path = fast_path
        self.on_plan = on_plan
        """Called with every plan the scheduler makes on the step-by-step path (validation records them)."""
        self.loads = loads
        """The fleet's load levels, if any: this replica keeps ``loads.values[replica_id]`` equal to ``load``
        (the least-loaded scan then reads one list instead of every replica)."""
        self.num_fast_steps = 0
        """Steps advanced inside decode runs (the rest went one event per step)."""
        self.speed = 1.0
        """This replica's speed relative to the fleet's fastest (1.0): what speed-weighted routers divide
        its load by."""
        self.on_prefilled: Callable[[Replica, list[Request], float], None] | None = None
        """A prefill worker's fleet: given the requests that produced their first token (their KV now moves
        to a decode worker) and the step's end, in place of logging them."""
        self.tier_timing: Callable[[StepPlan, float, float], float] | None = None
        """With KV tiers (``fleet.kv_store``): given a plan, its start and its compute time, the step's time
        with its loads from the tiers."""
        self.on_step_ended: Callable[[Replica], None] | None = None
        """A decode worker's fleet: called after every step or decode run (blocks or slots may have freed,
        so offers waiting for a reservation can be retried)."""
        self.may_crash = False
        """A failure may halt this replica at any time (``fleet.failures``; set by the fleet that crashes it):
        its decode runs keep the state each unsampled step ended with while the next one is applied, which
        ``sync_before_crash`` samples if that next step never ends."""
        self._cut_possible = config.batching is not Batching.STATIC
        self._max_num_seqs = config.max_num_seqs
        self._idle = True
        """Nothing scheduled: the replica waits for work (none, or none that can start)."""
        self._plan: StepPlan | None = None
        self._tail: list[Request] | None = None
        """A cut run's tail in flight (``_settle``): the requests of the decode step it handed back."""
        """The step in flight on the step-by-step path, and its time."""
        self._step_s = 0.0
        self._async = config.async_scheduling
        self._fcfs_async = config.async_scheduling and config.queue_policy is QueuePolicy.FCFS
        self._spec = config.speculation
        """Speculative decoding: steps priced with their drafting, acceptance drawn (``core.speculation``)."""
        self._queued: StepPlan | None = None
        """Async scheduling: the next step, scheduled when the one in flight started (it runs next)."""
        self._run_state: _ActiveRun | None = None
        """The decode run in flight on the fast path."""
        self._run: _ActiveRun | None = None
        """The replica's decode run, reused from one run to the next (None before the first)."""
        self._event: Wake | None = None
        """The replica's last event: at most one is pending at a time (in a decode run, the run's end, which a
        cut moves), and each next one reuses it once fired."""
        # Each kind of event's callbacks, built once (see ``Wake``).
        self._wake_callbacks: list[Callback] = [self._on_wake]
        self._step_end_callbacks: list[Callback] = [self._on_step_end]
        self._run_end_callbacks: list[Callback] = [self._on_run_end]

    # ----- ReplicaView ---------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        self.sync()  # a cut run's tail admits at its settling time (``_settle``)
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        self.sync()
        return self.scheduler.num_waiting

    @property
    def load(self) -> int:
        """Running + waiting + swapped: every request the scheduler holds (one C-level length)."""
        return len(self.scheduler.requests)

    @property
    def kv_used_frac(self) -> float:
        self.sync()
        pool = self.scheduler.kv.pool
        return pool.num_used / pool.num_blocks

    def prefix_match_blocks(self, block_hashes: Sequence[int], num_blocks: int | None = None) -> float:
        self.sync()
        n = self.scheduler.kv.prefix_match_blocks(block_hashes, num_blocks)
        tiers = self.scheduler.tiers
        return n if tiers is None else n + tiers.prefix_match_blocks(block_hashes, n)

    def sync(self) -> None:
        """Inside a decode run, apply the steps that have ended by now, so that anything reading this
        replica sees exactly the state the step-by-step path would have."""
        active = self._run_state
        if active is not None:
            now = self.clock.now()
            if now >= active.settle_s:
                self._settle(active)
            else:
                active.advance(now)

    def sync_before_crash(self) -> None:
        """``sync`` for a replica that crashes now, its series left as the step-by-step path leaves it: that
        path sampled the last step to end as it ended, while a decode run samples a step only when a later
        grid point needs it, reckoning with later steps' ends, which now never come."""
        active = self._run_state
        if active is None or self.clock.now() >= active.settle_s:
            self.sync()  # (a settled run is closed, its last step sampled)
            return
        ended = active.ends.ended_by(self.clock.now())
        if ended > active.run.num_steps:
            ended = active.run.num_steps
        if ended > active.num_sampled:
            active.sample_through(ended)
        self.sync()

    # ----- work ------------------------------------------------------------------------------------

    def submit(self, spec: RequestSpec) -> None:
        self.sync()  # steps that ended before this arrival are sampled without it
        request = self.scheduler.add_request(spec)
        if request.status is RequestStatus.REJECTED:
            self.log.on_rejected(spec.request_id, self.clock.now())
            return
        self._publish_load()
        if self._idle:
            # Wake up after the events already due now (a process woken by an event does the same), so
            # that every request arriving at this instant is there for the first step.
            self._idle = False
            self._event = self.clock.at(self.clock.now(), self._wake_callbacks, self._event)
            return
        active = self._run_state
        if active is not None and active.cut_on_arrival and not active.cut:
            active.cut_at(self.clock.now())  # the scheduler would try to admit it at the next step boundary

    # ----- disaggregation ----------------------------------------------------------------------------

    def offer(self, spec: RequestSpec) -> list[Reservation]:
        """Decode worker: a request whose prompt a prefill worker will compute. Returns the reservations
        this makes now (its own, or none if it must wait for blocks: it is then retried in order)."""
        self.sync()
        self._receiver().offer(spec)
        self._publish_load()
        return self._reserve()

    def reserve_offered(self) -> list[Reservation]:
        """Decode worker: retry the offers still waiting for blocks, in order (after a step)."""
        if not self._receiver().pending:
            return []
        self.sync()
        return self._reserve()

    def _reserve(self) -> list[Reservation]:
        reservations = self._receiver().reserve()
        if reservations:
            active = self._run_state
            if active is not None and not active.cut:
                active.cut_at(self.clock.now())  # the blocks taken were free for the run's steps
        return reservations

    def receive(self, request_id: int, num_cached_tokens: int, num_preemptions: int) -> Request:
        """Decode worker: the request's KV has landed; it joins the running batch at the next step."""
        self.sync()
        request = self._receiver().complete(request_id, num_cached_tokens=num_cached_tokens,
                                            num_preemptions=num_preemptions)
        self._wake_or_cut()
        return request

    def release(self, request_id: int) -> Request:
        """Prefill worker: the transfer has read the request's KV; its blocks are freed, which may let a
        waiting prompt in."""
        self.sync()
        sender: KVSender | None = self.scheduler.sender
        if sender is None:
            raise RuntimeError(f"replica {self.replica_id} is not a prefill worker")
        request = sender.release(request_id)
        if self._idle and self.scheduler.has_work:
            self._wake_or_cut()
        return request

    def _receiver(self) -> KVReceiver:
        receiver: KVReceiver | None = self.scheduler.receiver
        if receiver is None:
            raise RuntimeError(f"replica {self.replica_id} is not a decode worker")
        return receiver

    def _wake_or_cut(self) -> None:
        """The scheduler has new work now: wake an idle replica after the events due now, or end a decode
        run at the step in flight."""
        now = self.clock.now()
        if self._idle:
            self._idle = False
            self._event = self.clock.at(now, self._wake_callbacks, self._event)
            return
        active = self._run_state
        if active is not None and not active.cut:
            active.cut_at(now)

    def _publish_load(self) -> None:
        """Requests were added or finished: keep the fleet's load list equal to ``load``."""
        if self.loads is not None:
            self.loads.set(self.replica_id, len(self.scheduler.requests))

    def _on_wake(self, event: object) -> None:
        self._next()

    def _next(self) -> None:
        """Start the replica's next step (or decode run) now, or go idle."""
        scheduler = self.scheduler
        if self._async:
            self._next_async()
            return
        if not scheduler.has_work:
            self._idle = True
            return
        if self.fast_path:
            num_steps = scheduler.steady_decode_steps()
            if num_steps >= 2:
                # A decode run: ``num_steps`` identical decode steps in one event, cut short by an
                # arrival the scheduler would try to admit (``submit`` -> ``_ActiveRun.cut_at``).
                self._start_run(num_steps)
                return
        plan = scheduler.schedule()
        if self.on_plan is not None:
            self.on_plan(plan)
        if plan.changes_nothing:
            # Work that cannot start (it waits on memory no running request will free): wait for the
            # next arrival rather than spin. The core rejects requests that can never fit.
            self._idle = True
            return
        self._start(plan)

    def _start_run(self, num_steps: int, first: StepPlan | None = None) -> None:
        """Start a decode run of ``num_steps`` steps (async: decisions, each scheduling the step after the
        one in flight) now; its end event is at a bound on its last step's end (``StepEnds.end_floor``: the
        exact end is walked to only if the run gets there uncut, ``_on_run_end``). ``first``: async, the
        queued step the run begins with (``steady_async_steps``), which may hold prompts: priced as
        ``_start`` prices a step, and its first tokens logged now, for when it ends (the run applies its
        update as a decode's: every row samples a token)."""
        scheduler = self.scheduler
        active = self._run
        if active is None:
            run = DecodeRun(scheduler, num_steps)
            active = self._run = _ActiveRun(self, run)
        else:
            run = active.run
            run.restart(num_steps)
        start = self.clock.now()
        active.restart(self._cut_possible and run.batch < self._max_num_seqs)
        first_s = -1.0
        if first is not None:
            first_s = self._first_step(first, start, active)
        # Step end times accumulated one addition at a time from now, as the step-by-step
        # clock does (worked out as they are asked for).
        active.ends.reset(self.cost_model, run.batch, run.ctx_sum_start, num_steps, start, first_s)
        self._run_state = active
        active.advance(start)  # the first step is scheduled now
        active.end_at = active.ends.end_floor
        self._event = self.clock.at(active.end_at, self._run_end_callbacks, self._event)

    def _first_step(self, plan: StepPlan, start: float, active: _ActiveRun) -> float:
        """A run's first step, queued (``_start_run``): what ``_start`` does for it (admissions logged, its
        time, its prompt tokens counted), and the first tokens it samples logged for its end, as
        ``_on_step_end`` would log them (``_ActiveRun.first_tokens`` keeps them, for a horizon that falls
        before that end). Returns its time."""
        step_s = self._begin_step(plan, start)
        log = self.log
        delivered = (start + step_s) + self.network_latency_s
        rows = plan.requests
        for index in range(len(rows)):
            request = rows[index]
            # Every row samples (``steady_async_steps``): a row with no output yet samples its first token.
            if request.num_output_tokens == 0 and log.on_first_token(request.request_id, delivered):
                active.first_tokens.append(request.request_id)
        return step_s

    def _next_async(self) -> None:
        """Async scheduling (vLLM's batch queue of two): start the step scheduled when the last one started
        (or, with none, schedule one now), then schedule the step after it at once, while this one runs.
        Each decision therefore sees the outputs of the step before the one in flight: finishes free their
        seats and blocks, and arrivals are admitted, one step later than under synchronous scheduling.

        On the fast path, when the queued step and the K - 1 after it are decodes of the whole batch (the
        last of them, K, without the requests whose last token step K - 1 samples), a decode run makes those
        K - 1 decisions, ends when step K - 1 does, and hands step K back as the queued step, which starts
        then (``_hand_back``; another run behind it, often): the same decisions at the same instants as step
        by step. The queued step may also hold prompts, all sampling their first tokens (the step after an
        arrival): the run begins with it (``_first_step``), one event and one step-by-step decision fewer
        per arrival."""
        scheduler = self.scheduler
        plan = self._queued
        self._queued = None
        if plan is not None and self.fast_path:
            # A run may begin with a step holding prompts (the usual one after an arrival) where nothing but
            # the core decides what happens at its end: not with KV tiers (its loads), speculation (its
            # acceptance) or disaggregation (its prompts leave, or offers retry, after every step).
            prompts = (self._spec is None and self.tier_timing is None and self.on_prefilled is None
                       and self.on_step_ended is None)
            num_steps = scheduler.steady_async_steps(plan, prompts)
            if num_steps:
                self._start_run(num_steps - 1, plan)
                return
        if plan is None:
            if not scheduler.has_work:
                self._idle = True
                return
            plan = scheduler.schedule()
            if self.on_plan is not None:
                self.on_plan(plan)
            if plan.changes_nothing:
                self._idle = True  # work that cannot start: wait for the next arrival
                return
        self._start(plan)
        self._schedule_following()

    def _schedule_following(self) -> None:
        """Async scheduling: with a step just started, schedule the one after it now (it runs next)."""
        scheduler = self.scheduler
        if scheduler.has_work:
            following = scheduler.schedule()
            if self.on_plan is not None:
                self.on_plan(following)
            if not following.is_empty:
                self._queued = following

    def _start(self, plan: StepPlan) -> None:
        """Run ``plan`` from now: its end is one step time away."""
        start = self.clock.now()
        step_s = self._begin_step(plan, start)
        self._plan = plan
        self._step_s = step_s
        self._event = self.clock.at(start + step_s, self._step_end_callbacks, self._event)

    def _begin_step(self, plan: StepPlan, start: float) -> float:
        """A step starting at ``start``: its admissions logged, its prompt tokens counted; returns its time."""
        admitted = plan.admitted_ids
        if admitted:  # most steps admit nothing (iterating an empty sequence is a generic call compiled)
            log = self.log
            for rid in admitted:
                log.on_scheduled(rid, start)
        if self._spec is None:
            seqs, tokens, decodes, decode_ctx, prefill_tokens, pairs, swap = shape_fields(plan)
            step_s = self.cost_model.time_of(seqs, tokens, decodes, decode_ctx, prefill_tokens, pairs, swap)
        else:
            step_s, prefill_tokens = speculative_step_s(self.cost_model, plan, self._spec)
        if self.tier_timing is not None:
            step_s = self.tier_timing(plan, start, step_s)
        self.num_prefill_tokens += prefill_tokens
        return step_s

    def _on_step_end(self, event: object) -> None:
        """One step of the step-by-step path ended: account it, log its tokens, sample, go on."""
        plan = self._plan
        assert plan is not None
        self._plan = None
        scheduler = self.scheduler
        log = self.log
        self.num_steps += 1
        self.busy_s += self._step_s
        sampled = plan.sampled
        if self._spec is None:
            finished = scheduler.update(plan)
        else:  # the simulator's verifier: accepted proposals drawn per row
            finished = scheduler.update(plan, accepted=self._spec.draw(plan))
        if finished:
            self._publish_load()
        now = self.clock.now()
        delivered = now + self.network_latency_s
        prefilled = self.on_prefilled
        if prefilled is not None:  # a prefill worker: what finished moves on to a decode worker
            if finished:
                prefilled(self, finished, now)
        elif sampled is None:
            for request in plan.requests:
                if request.num_output_tokens == 1 and request.num_computed_tokens == request.num_prompt_tokens:
                    log.on_first_token(request.request_id, delivered)
                if request.status is RequestStatus.FINISHED:
                    log.on_finish(request.request_id, delivered, request.num_cached_tokens, request.num_preemptions,
                                  request.num_output_tokens)
        else:  # async: the plan says which rows sampled (their computed tokens have moved on since)
            rows = plan.requests
            for index in range(len(rows)):
                if sampled[index] and rows[index].num_output_tokens == 1:
                    log.on_first_token(rows[index].request_id, delivered)
            for request in finished:
                log.on_finish(request.request_id, delivered, request.num_cached_tokens, request.num_preemptions,
                              request.num_output_tokens)
        kv = scheduler.kv
        pool = kv.pool
        self.series.maybe_sample(now, len(scheduler.running), scheduler.num_waiting, pool.num_used,
                                 pool.num_blocks, kv.num_hit_tokens, kv.num_lookup_tokens)
        if self.on_step_ended is not None:
            self.on_step_ended(self)
        self._next()

    def _on_run_end(self, event: object) -> None:
        """A decode run (possibly cut) reached its last step's end: apply it, log what finished, go on. A
        cut run with a tail: the step handed back at the cut's step end ends now (``_settle``)."""
        active = self._run_state
        if active is None or active.settle_s != _NO_TAIL:
            if active is not None:
                self._settle(active)
            self._on_tail_end()  # (settled before, by a sync)
            return
        end = active.ends.end(active.run.num_steps)
        if end > self.clock.now() and not self.clock.skip_to(end):
            # The planned run's bound on its end, and something else is due before the exact end: go on there.
            active.end_at = end
            self._event = self.clock.at(end, self._run_end_callbacks, self._event)
            return
        self._close_run(active, end)
        if self.on_step_ended is not None:
            self.on_step_ended(self)
        if self._async:
            self._hand_back(active.run)
            return
        self._next()

    def _close_run(self, active: _ActiveRun, end: float) -> None:
        """Apply and close the decode run ``active`` (its last step ends at ``end``): what finished logged, the
        replica's counters advanced by its steps."""
        k = active.run.num_steps
        finished = active.close()
        self._run_state = None
        self._log_finished(finished, end)
        self.num_steps += k
        self.num_fast_steps += k
        self.busy_s += end - active.ends.start

    def stop(self, end_s: float) -> None:
        """The clock stopped; the run ends at ``end_s``: steps that ended by now applied and sampled, the
        series closed, and a decode run the horizon cut settled (``_stop_run``)."""
        self.sync()
        self.series.close(end_s)
        self._stop_run(end_s)

    def _stop_run(self, end_s: float) -> None:
        """The clock stopped at ``end_s`` (a horizon) inside a decode run: the steps that ended before it are
        counted (steps, busy time) and their requests' token counters moved there, where the step-by-step
        path leaves them (its step in progress at the horizon never ends), and the first tokens the run
        logged ahead for a first step that had not ended are withdrawn."""
        active = self._run_state
        if active is None:
            return
        ends = active.ends
        ended = ends.ended_before(end_s)
        if ended > active.run.num_steps:
            ended = active.run.num_steps
        active.run.set_counters(ended)
        active.withdraw_first_tokens(end_s)
        if ended > 0:
            if ended >= 2 or ended < active.run.num_steps:  # a step ended with the whole batch running
                active.note_peak(active.run.batch)
            self.num_steps += ended
            self.num_fast_steps += ended
            self.busy_s += ends.end(ended) - ends.start

    def _log_finished(self, finished: list[Request], end: float) -> None:
        """Requests that finished in a step ending at ``end``: the fleet's load list updated, their last tokens
        logged as delivered."""
        if finished:
            self._publish_load()
            delivered = end + self.network_latency_s
            log = self.log
            for request in finished:
                log.on_finish(request.request_id, delivered, request.num_cached_tokens, request.num_preemptions,
                              request.num_output_tokens)

    def _tail_ok(self) -> bool:
        """A decode run cut by an arrival may keep the step it hands back (``_ActiveRun.cut_at``): async, the
        next decision admitting (so that step runs on its own), and nothing but the core acting at step
        ends (no KV tiers, speculation or disaggregation). First come, first served: the head of the queue,
        and so whether the decision admits, stays as it is until the cut's step ends (a later arrival with
        a higher priority could take the head, and a run might start there instead)."""
        return (self._fcfs_async and self._spec is None and self.tier_timing is None and self.on_prefilled is None
                and self.on_step_ended is None and self.scheduler.admits_next())

    def _settle(self, active: _ActiveRun) -> None:
        """A cut run's tail (``_ActiveRun.cut_at``): what its end event would have done at ``settle_s`` —
        the run applied and closed, the step it hands back started (its end event is the run's, moved there
        by the cut) and the one after it scheduled — done when the replica is first looked at from then on,
        or as that step ends. Nothing of it is seen from outside before: the step started logs nothing, and
        everything that reads the replica syncs first."""
        run = active.run
        k = run.num_steps
        end = active.settle_s
        self._close_run(active, end)
        if self.scheduler.steady_async_batch():
            raise RuntimeError(f"replica {self.replica_id}: a cut run's tail where a run would start")
        # The step handed back, a decode of the run's requests, without its plan (``_on_tail_end``): priced as
        # ``_start`` prices its shape (each row attends to its computed tokens, its new one included).
        requests = run.requests  # the run's own list (it takes a new one when it restarts)
        n = len(requests)
        # Each row's computed tokens, added up: the run's first step's sum moved k tokens a row (a run cut with a
        # tail finishes none of its requests: its last step is before the planned one's).
        decode_ctx = run.ctx_sum_start + k * n
        step_s = self.cost_model.time_of(n, n, n, decode_ctx, 0, 0.0, 0)
        if end + step_s != active.ends.end(k + 1):
            raise RuntimeError(f"replica {self.replica_id}: a cut run's tail ends off its step's end")
        self._tail = requests
        self._step_s = step_s
        self._schedule_following()

    def _on_tail_end(self) -> None:
        """The step a cut run's tail handed back ended: ``_on_step_end`` for a decode of ``_tail`` (its tokens
        delivered through the core's ``update_decodes``; no first tokens: each row has sampled before)."""
        requests = self._tail
        assert requests is not None
        self._tail = None
        scheduler = self.scheduler
        self.num_steps += 1
        self.busy_s += self._step_s
        now = self.clock.now()
        self._log_finished(scheduler.update_decodes(requests), now)
        kv = scheduler.kv
        pool = kv.pool
        self.series.maybe_sample(now, len(scheduler.running), scheduler.num_waiting, pool.num_used,
                                 pool.num_blocks, kv.num_hit_tokens, kv.num_lookup_tokens)
        self._next()

    def _hand_back(self, run: DecodeRun) -> None:
        """An async decode run ended: its last decision's step is the queued one, which starts now as in
        ``_next_async`` (another run behind it, when it is a decode of the whole batch: a run that finished
        requests at its last step goes on with the rest without a step of its own)."""
        num_steps = self.scheduler.steady_async_batch()  # what ``_next_async`` asks of that step, unbuilt
        if num_steps:
            self._start_run(num_steps - 1)
            return
        plan = run.in_flight_plan()
        if plan.requests:  # as ``_next_async`` goes on with a queued step that starts no run
            self._start(plan)
            self._schedule_following()
        else:
            self._next_async()


class _ActiveRun:
    """A decode run in flight on a replica: which of its steps have been applied, with their samples.

    The step-by-step path allocates a step's KV when the step is scheduled (at its start) and samples
    the series when it ends, so a step is applied once its start has passed and sampled at its end.
    """

    __slots__ = ("cut", "cut_on_arrival", "end_at", "ends", "first_tokens", "held_step", "held_used",
                 "held_waiting", "num_sampled", "replica", "run", "settle_s", "start")

    def __init__(self, replica: Replica, run: DecodeRun) -> None:
        self.replica = replica
        self.run = run
        self.ends = StepEnds()
        """The run's step end times (reset with each run)."""
        self.cut_on_arrival = False
        self.cut = False
        self.num_sampled = 0
        self.end_at = 0.0
        """When the replica's event for the run's end is due (``Replica._start_run``; a cut moves it)."""
        self.settle_s = _NO_TAIL
        """A cut with a tail: the run's (new) last step's end, where its end work is due (``Replica._settle``)."""
        self.first_tokens: list[int] = []
        """Requests whose first token the run's first step samples, logged when it began (for its end)."""
        self.held_step = 0
        self.held_used = 0
        self.held_waiting = 0
        """The KV blocks in use and the requests waiting as step ``held_step`` of the run ended, kept as step
        ``held_step + 1`` was applied (its KV allocated as it started, arrivals queued after it) while
        ``held_step`` was not sampled (the other figures a sample records do not move inside a run: ``_record``)."""

    def restart(self, cut_on_arrival: bool) -> None:
        """Track a new run of ``run`` (restarted by the caller; ``ends`` is reset after this)."""
        self.cut_on_arrival = cut_on_arrival
        self.cut = False
        self.num_sampled = 0
        self.held_step = 0
        self.settle_s = _NO_TAIL
        if self.first_tokens:
            self.first_tokens.clear()

    def withdraw_first_tokens(self, end_s: float) -> None:
        """The clock stopped at ``end_s`` (a horizon) before the run's first step ended: the first tokens
        logged for that end were never sampled (the step-by-step path logs them as the step ends)."""
        if self.first_tokens and self.ends.ended_before(end_s) < 1:
            log = self.replica.log
            for rid in self.first_tokens:
                log.withdraw_first_token(rid)
            self.first_tokens.clear()

    def cut_at(self, now: float) -> None:
        """An arrival during step j: step j completes, then the scheduler sees the new request. The run
        is truncated to j steps and its end event (the replica's pending one) moved to step j's end, in
        place on SimPy's queue.

        With a tail (``Replica._tail_ok``: async, the next decision admitting), the end event goes to the
        end of step j + 1 instead: that step, the decode handed back at step j's end, runs on its own, so
        its end is known now, and what step j's end does (close the run, start step j + 1, schedule the
        step after it) is settled when the replica is next looked at or as step j + 1 ends — one event
        fewer per arrival (``Replica._settle``)."""
        self.cut = True
        run = self.run
        last = self.ends.ended_by(now) + 1  # min() and max() spelled out (a builtin call each, interpreted)
        if last > run.num_steps:
            last = run.num_steps
        if last < run.num_done:
            last = run.num_done
        if last == run.num_steps:
            return  # the arrival came during the run's last step: the end is already right
        run.truncate(last)
        replica = self.replica
        event = replica._event
        if event is None or not event.callbacks:
            raise RuntimeError("decode run cut after its end event fired")
        ends = self.ends
        if replica._tail_ok():
            self.settle_s = ends.end(last)
            at = ends.end(last + 1)
            # Unless the handed-back step is the planned run's last and the event is at its end already (it may
            # be at a bound before it: ``_start_run``), the event goes to that step's end (later than the bound
            # only for an arrival at the very time of the bound).
            if at < ends.end_floor or at < ends.last_end() or self.end_at != at:
                replica._event = replica.clock.move(event, at)
            return
        replica._event = replica.clock.move(event, ends.end(last))

    def advance(self, now: float) -> None:
        """Apply every step of the run that has started by ``now``; sample the ones that have ended."""
        run = self.run
        if run.num_done >= run.num_steps:
            return
        started = 1 + self.ends.ended_by(now)  # step 1 starts at the run's start
        target = run.num_steps if started > run.num_steps else started
        self._sample_until(target - 1)
        if self.replica.may_crash and target > run.num_done and target - 1 > self.num_sampled:
            # A step left unsampled (a later one will be sampled for the grid points) while the next one
            # starts: if that one never ends (a crash), the step-by-step path's last sample is this state.
            run.advance_to(target - 1)
            self.held_step = target - 1
            self.held_used = self.replica.scheduler.kv.pool.num_used
            self.held_waiting = self.replica.scheduler.num_waiting
        run.advance_to(target)

    def close(self) -> list[Request]:
        """Apply and sample every step of the (possibly truncated) run; returns the requests its last
        step finished (retired before that step is sampled, as ``update`` precedes the sample)."""
        last = self.run.num_steps
        self.advance(self.ends.end(last))
        self._sample_until(last - 1)
        batch = self.run.batch
        finished = self.run.finish()
        if last >= 2 or not finished:
            self.note_peak(batch)
        self._sample(last)
        return finished

    def note_peak(self, batch: int) -> None:
        """The series' peak of requests running after a step: a step of the run ended with its whole batch
        running (only its last step finishes requests), which the step-by-step path sampled; the run samples
        only the steps grid points need."""
        series = self.replica.series
        if batch > series.peak_running:
            series.peak_running = batch

    def sample_through(self, last: int) -> None:
        """Steps up to ``last`` applied, sampled as grid points need them, and step ``last`` sampled whatever
        comes after it (``Replica.sync_before_crash``), with the state it ended with: kept (``held_*``) if
        the step after it has been applied since."""
        self._sample_until(last)
        if last <= self.num_sampled:
            return
        if self.run.num_done > last:
            if self.held_step != last:
                raise RuntimeError(f"decode run: step {last} ended unsampled and its state was not kept")
            self._record(last, self.held_waiting, self.held_used)
            return
        self.run.advance_to(last)
        self._sample(last)

    def _sample_until(self, last: int) -> None:
        """Sample steps up to ``last`` — only those whose state a grid point will record: a step is
        needed when the next step ends at or after the next grid point (earlier samples would only be
        overwritten before any grid point sees them)."""
        series = self.replica.series
        ends = self.ends
        while True:
            next_sample_s = series.next_sample_s
            # Step last + 1 ends before the grid point: no step up to last is needed (no search). The whole
            # planned run ending before it says so without walking to that step (the usual case).
            if last < ends.num_steps and (ends.end_ceiling < next_sample_s or ends.end(last + 1) < next_sample_s):
                return
            j = ends.ended_before(next_sample_s)
            if j <= self.num_sampled:
                j = self.num_sampled + 1
            if j > last:
                return
            self.run.advance_to(j)
            self._sample(j)

    def _sample(self, j: int) -> None:
        scheduler = self.replica.scheduler
        self._record(j, scheduler.num_waiting, scheduler.kv.pool.num_used)

    def _record(self, j: int, waiting: int, used: int) -> None:
        """Sample step ``j`` with these requests waiting and KV blocks in use (the rest does not move inside a
        run: the batch is the run's, prompt tokens are counted as steps with prompts are scheduled)."""
        series = self.replica.series
        end = self.ends.end(j)
        if series.kv_probe is not None and end >= series.next_sample_s:
            self.run.set_counters(j)  # the probe reads per-request tokens: make them exact for step j
        scheduler = self.replica.scheduler
        kv = scheduler.kv
        series.maybe_sample(end, len(scheduler.running), waiting, used, kv.pool.num_blocks, kv.num_hit_tokens,
                            kv.num_lookup_tokens)
        self.num_sampled = j


_NO_TAIL: Final = math.inf
"""``_ActiveRun.settle_s`` of a run without a tail."""
