"""One simulated replica: the serving core's scheduler, with the clock advanced by a cost model.

The replica runs the same ``core.Scheduler`` the real engine runs; where the engine would run the model,
it schedules the end of the step ``CostModel.step_time(plan.shape)`` later on the SimPy clock (priced from
the shape's fields, ``time_of(*shape_fields(plan))``, without building it) and carries on when that event
fires. One SimPy event per engine step (or per decode run on the fast path), never per token; an idle
replica schedules nothing until work arrives.

The replica is driven by callbacks rather than a SimPy process: each of its events (``Wake``) calls one
of its methods directly when SimPy's ``Environment.step`` pops it. That is exactly what a process does on
a yield (SimPy resumes it from the event's callback), without a generator, a ``Timeout`` object and the
process's resume bookkeeping per step — on the simulator's hottest path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from heapq import heapify, heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Any, Final

import simpy
from simpy.events import NORMAL, URGENT

from simulator.core.config import Batching, SchedulerConfig
from simulator.core.decode_run import DecodeRun
from simulator.core.request import Request, RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.core.step import StepPlan, shape_fields
from simulator.cost.cost_model import CostModel, StepEnds
from simulator.results.metrics import ReplicaSeries, RequestLog

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python

Callback = Callable[[Any], None]


class Wake:
    """An event on SimPy's queue that calls back one replica method. SimPy's ``Environment.step`` reads
    an event's ``callbacks`` (then sets them to None) and ``_ok``, and calls each callback with the event;
    this is all a ``simpy.Event`` needs to be for that. A cut decode run moves its end event earlier on
    the queue (``Clock.move_earlier``); an event whose callbacks were replaced by an empty list pops as a
    no-op (the fallback there, for a move to the same time).

    ``callbacks`` is a list its owner built once and hands to every event of one kind (SimPy and
    ``run_until`` only ever replace an event's list, never change one): no bound method and no list is
    made per event. Nor an event per event: each owner (a replica, the arrival feed) has one pending at a
    time and schedules the next with the last one once it has fired (``Clock.at``'s ``reuse``)."""

    __slots__ = ("_ok", "callbacks")

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks: list[Callback] | None = callbacks
        self._ok = True


class EventIds:
    """SimPy's event-id counter (``Environment._eid``, an ``itertools.count``) as a native iterator: the
    replicas take an id per event through ``take``, a direct call in the compiled build (``next`` on the
    ``itertools.count`` is a generic call there), and SimPy's own ``next(env._eid)`` still works.

    While ``run_until`` drives the environment (``live``), it also keeps the clock here (``now``, equal to
    ``env.now``): the replicas read the time several times per event, and ``env._now`` is an attribute of
    an interpreted object (a dictionary lookup each time, compiled)."""

    __slots__ = ("dispatching", "live", "next_id", "now")

    def __init__(self, start: int) -> None:
        self.next_id = start
        self.now = 0.0
        self.live = False
        self.dispatching: tuple[Any, ...] | None = None
        """The queue entry whose callbacks ``run_until`` is running, still at the head of the queue: the
        first event scheduled meanwhile (``Clock.at``) takes its place there (one sift, as
        ``heapq.heapreplace``, instead of a pop and a push); if none is, it is popped afterwards."""

    def __iter__(self) -> EventIds:
        return self

    def __next__(self) -> Any:  # an object, not an int: mypyc's tp_iternext slot returns an object
        return self.take()

    def release(self) -> tuple[Any, ...] | None:
        """The entry ``run_until`` is dispatching if no event has taken its place yet (cleared)."""
        entry = self.dispatching
        self.dispatching = None
        return entry

    def take(self) -> int:
        eid = self.next_id
        self.next_id = eid + 1
        return eid


class Clock:
    """A SimPy environment's clock and event queue, as the replicas and the arrival feed drive them (the
    queue and its id counter read once, not per event)."""

    __slots__ = ("_eid", "_queue", "env")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._queue: list[tuple[Any, ...]] = env._queue  # (time, priority, id, event): see heap_push
        self._eid = event_ids(env)

    def now(self) -> float:
        """``env.now`` without the property call (nor, inside ``run_until``, the attribute lookup)."""
        eids = self._eid
        if eids.live:
            return eids.now
        return self.env._now

    def at(self, at_s: float, callbacks: list[Callback], reuse: Wake | None = None) -> Wake:
        """Schedule ``callbacks`` (a list built once per kind of event, see ``Wake``) at the absolute
        time ``at_s`` (>= now): what ``Environment.schedule`` does with priority NORMAL — the order a
        ``Timeout`` gets — without the ``now + delay`` rounding, so a decode run ends exactly at its last
        step's accumulated end time. ``reuse``: the caller's previous event, taken again if it has fired
        (its callbacks are None from then on; a pending event, or a cut run's no-op, is never reused)."""
        if reuse is not None and reuse.callbacks is None:
            event = reuse
            event.callbacks = callbacks
        else:
            event = Wake(callbacks)
        eids = self._eid
        entry = (at_s, _NORMAL, eids.take(), event)
        queue = self._queue
        dispatching = eids.dispatching
        if dispatching is not None and queue[0] is dispatching:
            eids.dispatching = None
            if _COMPILED:
                heap_replace(queue, entry)
            else:
                heapreplace(queue, entry)
        elif _COMPILED:
            heap_push(queue, entry)
        else:
            heappush(queue, entry)
        return event

    def move_earlier(self, event: Wake, at_s: float) -> Wake:
        """Reschedule a pending ``event`` at ``at_s`` (<= its time) as if it were scheduled now (with a
        new id, so ties order as they would for a new event); returns the event that now fires. Strictly
        earlier, the entry is replaced in place and sifted toward the root: a cut decode run moves its end
        event this way rather than leaving it on the queue as a no-op, so the queue stays as short as the
        replicas' live events. At the same time, the old event becomes a no-op and a new one is made."""
        queue = self._queue
        for pos in range(len(queue)):
            entry = queue[pos]
            if entry[3] is event:
                old_at: float = entry[0]
                if at_s < old_at:
                    _sift_toward_root(queue, pos, (at_s, _NORMAL, self._eid.take(), event))
                    return event
                if at_s > old_at:
                    raise ValueError(f"move_earlier: {at_s} is later than the event's time {old_at}")
                callbacks = event.callbacks
                if callbacks is None:
                    break
                event.callbacks = []
                return self.at(at_s, callbacks)
        raise RuntimeError("move_earlier: the event is not on the queue (it has fired)")


def event_ids(env: simpy.Environment) -> EventIds:
    """The environment's ``EventIds``, installed in place of SimPy's counter on first use (continuing its
    count from its next id: every event keeps a unique, increasing id)."""
    current: Any = env._eid
    if isinstance(current, EventIds):
        return current
    eids = EventIds(next(current))
    env._eid = eids  # type: ignore[assignment]  # an iterator of ints, as SimPy needs
    return eids


_NORMAL: Final = 1
_URGENT: Final = 0
if (_NORMAL, _URGENT) != (NORMAL, URGENT):  # literals, so the compiled build inlines them
    raise ImportError(f"simpy's event priorities changed: NORMAL={NORMAL}, URGENT={URGENT}")
_COMPILED: Final = not __file__.endswith(".py")
"""This module runs as the compiled build (``fleetsim build-native``), not as its source."""


def _earlier(at: float, priority: int, eid: int, other: tuple[Any, ...]) -> bool:
    """(at, priority, eid) sorts before ``other``'s key: SimPy's queue order (ids are unique)."""
    other_at: float = other[0]
    if at != other_at:
        return at < other_at
    other_priority: int = other[1]
    if priority != other_priority:
        return priority < other_priority
    other_eid: int = other[2]
    return eid < other_eid


# The heap's entries are typed as plain tuples of objects: typed as (float, int, int, Any), the compiled
# build would hold them unboxed and allocate a new tuple each time one is stored back into the list.


def heap_push(queue: list[tuple[Any, ...]], entry: tuple[Any, ...]) -> None:
    """``heapq.heappush`` on SimPy's queue, as a native loop comparing the keys' numbers directly
    (heapq compares the entries as tuples, through generic comparisons, several per push)."""
    queue.append(entry)
    _sift_toward_root(queue, len(queue) - 1, entry)


def _sift_toward_root(queue: list[tuple[Any, ...]], start: int, entry: tuple[Any, ...]) -> None:
    """Put ``entry`` at ``start`` or above, moving the later parents down (heapq's ``_siftdown``)."""
    at: float = entry[0]
    priority: int = entry[1]
    eid: int = entry[2]
    pos: i64 = start
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = queue[parent_pos]
        parent_at: float = parent[0]
        # Times decide almost always; only a tie reads the rest of the key (_earlier).
        if at > parent_at or (at == parent_at and not _earlier(at, priority, eid, parent)):
            break
        queue[pos] = parent
        pos = parent_pos
    queue[pos] = entry


def heap_pop(queue: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """``heapq.heappop`` on SimPy's queue, native (see ``heap_push``): the same sift as heapq's, so the
    queue stays a valid heap for SimPy's own ``heappop``."""
    last = queue.pop()
    if not queue:
        return last
    top = queue[0]
    _replace_head(queue, last)
    return top


def heap_replace(queue: list[tuple[Any, ...]], entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """``heapq.heapreplace`` on SimPy's queue, native: pop the head and push ``entry`` in one sift."""
    top = queue[0]
    _replace_head(queue, entry)
    return top


def _replace_head(queue: list[tuple[Any, ...]], last: tuple[Any, ...]) -> None:
    """Put ``last`` in the head's place and restore the heap (heapq's ``_siftup`` from the root)."""
    size: i64 = len(queue)
    # heapq's _siftup: move the smaller child up until a leaf, then sift ``last`` down from there.
    pos: i64 = 0
    child: i64 = 1
    while child < size:
        smaller = queue[child]
        right = child + 1
        if right < size:
            other = queue[right]
            c_at: float = smaller[0]
            r_at: float = other[0]
            # The right child when it is earlier: times decide almost always; only a tie reads the rest of
            # the key (_earlier; keys are unique, so "not left before right" is "right before left").
            if r_at < c_at or (r_at == c_at and _earlier(r_at, other[1], other[2], smaller)):
                child = right
                smaller = other
        queue[pos] = smaller
        pos = child
        child = 2 * pos + 1
    _sift_toward_root(queue, pos, last)


def _drop(queue: list[tuple[Any, ...]], entry: tuple[Any, ...]) -> None:
    """Take ``entry`` off the queue: the head (almost always), or wherever an urgent event pushed it."""
    if queue[0] is entry:
        if _COMPILED:
            heap_pop(queue)
        else:
            heappop(queue)
        return
    for pos in range(len(queue)):
        if queue[pos] is entry:
            del queue[pos]
            heapify(queue)
            return


def run_until(env: simpy.Environment, until: float | None = None) -> int:
    """``env.run(until)``, with the replicas' and the arrival feed's events (``Wake``) dispatched here.

    Exactly SimPy's loop: pop the earliest (time, priority, id) entry, set the clock, call the event's
    callbacks. A ``Wake`` at the head is handled inline (compiled, this is the simulator's innermost
    loop, and ``Environment.step`` is interpreted Python); any other event (a process, a timeout someone
    scheduled) goes through ``env.step()`` itself, so a fleet can mix in ordinary SimPy processes.
    ``until`` stops the clock where SimPy's urgent until-event would: before the events due at ``until``
    that are not urgent and older than the call, and leaves ``env.now`` at ``until``. Returns the number
    of events processed (what ``Environment.step`` would have been called for).
    """
    queue: list[tuple[Any, ...]] = env._queue  # (time, priority, id, event): see heap_push
    eids = event_ids(env)
    bounded = until is not None
    stop: tuple[Any, ...] = ()
    if until is not None:
        now = env._now
        if not until > now:
            raise ValueError(f"until (={until}) must be greater than the current simulation time ({now})")
        # The key SimPy's until-event would have: now plus a delay, urgent, the next id.
        stop = (now + (until - now), _URGENT, eids.take())
    step = env.step
    processed = 0
    was_live = eids.live
    eids.now = env._now
    eids.live = True
    try:
        while queue:
            head = queue[0]
            at: float = head[0]
            event = head[3]
            if bounded and not _earlier(at, head[1], head[2], stop):
                break
            processed += 1
            eids.now = at  # the clock at this event, for SimPy's own events too (their callbacks may read it)
            if type(event) is Wake:
                env._now = at
                callbacks = event.callbacks
                event.callbacks = None
                if callbacks:
                    # Popped after its callbacks: the first event they schedule takes its place.
                    eids.dispatching = head
                    for callback in callbacks:
                        callback(event)
                    if eids.release() is not None:  # a method: compiled, the attribute stays typed as optional
                        _drop(queue, head)
                else:
                    _drop(queue, head)  # a cut run's no-op
            else:
                step()
        if bounded:
            env._now = stop[0]
    finally:
        eids.live = was_live
        eids.now = env._now
        dispatching = eids.release()
        if dispatching is not None:  # a callback raised: leave the queue as SimPy would have it
            _drop(queue, dispatching)
    return processed


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
        loads: list[int] | None = None,
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
        self.fast_path = fast_path
        self.on_plan = on_plan
        """Called with every plan the scheduler makes on the step-by-step path (validation records them)."""
        self.loads = loads
        """The fleet's load list, if any: this replica keeps ``loads[replica_id]`` equal to ``load``
        (the least-loaded scan then reads one list instead of every replica)."""
        self.num_fast_steps = 0
        """Steps advanced inside decode runs (the rest went one event per step)."""
        self._cut_possible = config.batching is not Batching.STATIC
        self._max_num_seqs = config.max_num_seqs
        self._idle = True
        """Nothing scheduled: the replica waits for work (none, or none that can start)."""
        self._plan: StepPlan | None = None
        """The step in flight on the step-by-step path, and its time."""
        self._step_s = 0.0
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
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
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

    def prefix_match_blocks(self, block_hashes: Sequence[int]) -> int:
        self.sync()
        return self.scheduler.kv.prefix_match_blocks(block_hashes)

    def sync(self) -> None:
        """Inside a decode run, apply the steps that have ended by now, so that anything reading this
        replica sees exactly the state the step-by-step path would have."""
        active = self._run_state
        if active is not None:
            active.advance(self.clock.now())

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

    def _publish_load(self) -> None:
        """Requests were added or finished: keep the fleet's load list equal to ``load``."""
        if self.loads is not None:
            self.loads[self.replica_id] = len(self.scheduler.requests)

    def _on_wake(self, event: object) -> None:
        self._next()

    def _next(self) -> None:
        """Start the replica's next step (or decode run) now, or go idle."""
        scheduler = self.scheduler
        if not scheduler.has_work:
            self._idle = True
            return
        if self.fast_path:
            num_steps = scheduler.steady_decode_steps()
            if num_steps >= 2:
                # A decode run: ``num_steps`` identical decode steps in one event, cut short by an
                # arrival the scheduler would try to admit (``submit`` -> ``_ActiveRun.cut_at``).
                active = self._run
                if active is None:
                    run = DecodeRun(scheduler, num_steps)
                    active = self._run = _ActiveRun(self, run)
                else:
                    run = active.run
                    run.restart(num_steps)
                start = self.clock.now()
                # Step end times accumulated one addition at a time from now, as the step-by-step
                # clock does (worked out as they are asked for).
                active.ends.reset(self.cost_model, run.batch, run.ctx_sum_start, num_steps, start)
                active.restart(self._cut_possible and run.batch < self._max_num_seqs)
                self._run_state = active
                active.advance(start)  # the first step is scheduled now
                self._event = self.clock.at(active.ends.last_end, self._run_end_callbacks, self._event)
                return
        plan = scheduler.schedule()
        if self.on_plan is not None:
            self.on_plan(plan)
        if plan.is_empty:
            # Work that cannot start (it waits on memory no running request will free): wait for the
            # next arrival rather than spin. The core rejects requests that can never fit.
            self._idle = True
            return
        start = self.clock.now()
        log = self.log
        for rid in plan.admitted_ids:
            log.on_scheduled(rid, start)
        seqs, tokens, decodes, decode_ctx, prefill_tokens, pairs, swap = shape_fields(plan)
        step_s = self.cost_model.time_of(seqs, tokens, decodes, decode_ctx, prefill_tokens, pairs, swap)
        self._plan = plan
        self._step_s = step_s
        self._event = self.clock.at(start + step_s, self._step_end_callbacks, self._event)

    def _on_step_end(self, event: object) -> None:
        """One step of the step-by-step path ended: account it, log its tokens, sample, go on."""
        plan = self._plan
        assert plan is not None
        self._plan = None
        scheduler = self.scheduler
        log = self.log
        self.num_steps += 1
        self.busy_s += self._step_s
        if scheduler.update(plan):
            self._publish_load()
        now = self.clock.now()
        delivered = now + self.network_latency_s
        for request in plan.requests:
            if request.num_output_tokens == 1 and request.num_computed_tokens == request.num_prompt_tokens:
                log.on_first_token(request.request_id, delivered)
            if request.status is RequestStatus.FINISHED:
                log.on_finish(request.request_id, delivered, request.num_cached_tokens, request.num_preemptions)
        kv = scheduler.kv
        pool = kv.pool
        self.series.maybe_sample(now, len(scheduler.running), scheduler.num_waiting, pool.num_used,
                                 pool.num_blocks, kv.num_hit_tokens, kv.num_lookup_tokens)
        self._next()

    def _on_run_end(self, event: object) -> None:
        """A decode run (possibly cut) reached its last step's end: apply it, log what finished, go on."""
        active = self._run_state
        assert active is not None
        k = active.run.num_steps
        end = active.ends.end(k)
        finished = active.close()
        self._run_state = None
        if finished:
            self._publish_load()
            delivered = end + self.network_latency_s
            log = self.log
            for request in finished:
                log.on_finish(request.request_id, delivered, request.num_cached_tokens, request.num_preemptions)
        self.num_steps += k
        self.num_fast_steps += k
        self.busy_s += end - active.ends.start
        self._next()


class _ActiveRun:
    """A decode run in flight on a replica: which of its steps have been applied, with their samples.

    The step-by-step path allocates a step's KV when the step is scheduled (at its start) and samples
    the series when it ends, so a step is applied once its start has passed and sampled at its end.
    """

    __slots__ = ("cut", "cut_on_arrival", "ends", "num_sampled", "replica", "run", "start")

    def __init__(self, replica: Replica, run: DecodeRun) -> None:
        self.replica = replica
        self.run = run
        self.ends = StepEnds()
        """The run's step end times (reset with each run)."""
        self.cut_on_arrival = False
        self.cut = False
        self.num_sampled = 0

    def restart(self, cut_on_arrival: bool) -> None:
        """Track a new run of ``run`` and ``ends`` (both restarted by the caller)."""
        self.cut_on_arrival = cut_on_arrival
        self.cut = False
        self.num_sampled = 0

    def cut_at(self, now: float) -> None:
        """An arrival during step j: step j completes, then the scheduler sees the new request. The run
        is truncated to j steps and its end event (the replica's pending one) moved to step j's end, in
        place on SimPy's queue."""
        self.cut = True
        run = self.run
        last = min(self.ends.ended_by(now) + 1, run.num_steps)
        last = max(last, run.num_done)
        if last == run.num_steps:
            return  # the arrival came during the run's last step: the end is already right
        run.truncate(last)
        replica = self.replica
        event = replica._event
        if event is None or not event.callbacks:
            raise RuntimeError("decode run cut after its end event fired")
        replica._event = replica.clock.move_earlier(event, self.ends.end(last))

    def advance(self, now: float) -> None:
        """Apply every step of the run that has started by ``now``; sample the ones that have ended."""
        run = self.run
        if run.num_done >= run.num_steps:
            return
        started = 1 + self.ends.ended_by(now)  # step 1 starts at the run's start
        target = run.num_steps if started > run.num_steps else started
        self._sample_until(target - 1)
        run.advance_to(target)

    def close(self) -> list[Request]:
        """Apply and sample every step of the (possibly truncated) run; returns the requests its last
        step finished (retired before that step is sampled, as ``update`` precedes the sample)."""
        last = self.run.num_steps
        self.advance(self.ends.end(last))
        self._sample_until(last - 1)
        finished = self.run.finish()
        self._sample(last)
        return finished

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
            if last < ends.num_steps and (ends.last_end < next_sample_s or ends.end(last + 1) < next_sample_s):
                return
            j = ends.ended_before(next_sample_s)
            if j <= self.num_sampled:
                j = self.num_sampled + 1
            if j > last:
                return
            self.run.advance_to(j)
            self._sample(j)

    def _sample(self, j: int) -> None:
        series = self.replica.series
        end = self.ends.end(j)
        if series.kv_probe is not None and end >= series.next_sample_s:
            self.run.set_counters(j)  # the probe reads per-request tokens: make them exact for step j
        scheduler = self.replica.scheduler
        kv = scheduler.kv
        pool = kv.pool
        self.replica.series.maybe_sample(end, len(scheduler.running), scheduler.num_waiting,
                                         pool.num_used, pool.num_blocks, kv.num_hit_tokens, kv.num_lookup_tokens)
        self.num_sampled = j
