"""The SimPy clock as the replicas and the arrival feed drive it: one reusable event per owner (``Wake``),
SimPy's event-id counter as a native iterator, absolute-time scheduling and moving an event
(``Clock``), the event queue's heap operations compiled, and ``run_until``, SimPy's own loop with the
fleet's events dispatched inline.

Everything here keeps SimPy's queue exactly as SimPy would have it (same entries, same order, same ids),
so a fleet can mix in ordinary SimPy processes. On the per-step path: ``fleetsim build-native`` compiles it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Any, Final

import simpy
from simpy.events import NORMAL, URGENT

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python

Callback = Callable[[Any], None]


class Wake:
    """An event on SimPy's queue that calls back one replica method. SimPy's ``Environment.step`` reads
    an event's ``callbacks`` (then sets them to None) and ``_ok``, and calls each callback with the event;
    this is all a ``simpy.Event`` needs to be for that. A cut decode run moves its end event earlier on
    the queue (``Clock.move``); an event whose callbacks were replaced by an empty list pops as a
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

    __slots__ = ("dispatching", "live", "next_id", "now", "skipped", "stop_at")

    def __init__(self, start: int) -> None:
        self.next_id = start
        self.now = 0.0
        self.live = False
        self.stop_at = math.inf
        """While ``run_until`` drives: its ``until`` (infinity for none), where the clock stops."""
        self.skipped = 0
        """Events ``Clock.skip_to`` spared (each one SimPy's own loop would have popped)."""
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

    def skip_to(self, at_s: float) -> bool:
        """Inside the callbacks of the event ``run_until`` is dispatching, before they schedule anything:
        move the clock on to ``at_s`` (> now) if nothing else is due by then (no event on the queue at or
        before it, and the clock does not stop there), as if the event had been scheduled at ``at_s``; True
        if it did. A decode run's end event fires at a bound on its end and goes on from the exact end this
        way (``StepEnds.end_floor``), without a second event; False, the caller schedules one there."""
        eids = self._eid
        queue = self._queue
        head = eids.dispatching
        if not eids.live or head is None or not queue or queue[0] is not head or not at_s < eids.stop_at:
            return False
        # The earliest other event is one of the head's children.
        size = len(queue)
        if size > 1:
            child: tuple[Any, ...] = queue[1]
            child_at: float = child[0]
            if not child_at > at_s:
                return False
            if size > 2:
                child = queue[2]
                child_at = child[0]
                if not child_at > at_s:
                    return False
        eids.now = at_s
        self.env._now = at_s
        eids.skipped += 1
        return True

    def move(self, event: Wake, at_s: float) -> Wake:
        """Reschedule a pending ``event`` at ``at_s`` (>= now) as if it were scheduled now (with a new id, so
        ties order as they would for a new event); returns the event that now fires. Earlier, the entry is
        replaced in place and sifted toward the root: a cut decode run moves its end event this way rather
        than leaving it on the queue as a no-op, so the queue stays as short as the replicas' live events.
        At the same time or later (a run's end event at a bound before its end, ``StepEnds.end_floor``, cut
        by an arrival at that very time), the old event becomes a no-op and a new one is made."""
        queue = self._queue
        # From the back: the events moved are decode runs' ends, later than most on the queue, so they sit
        # deep in the heap (a heap keeps half its entries in the last level).
        pos: i64 = len(queue)
        while pos > 0:
            pos -= 1
            entry = queue[pos]
            if entry[3] is event:
                old_at: float = entry[0]
                if at_s < old_at:
                    _sift_toward_root(queue, pos, (at_s, _NORMAL, self._eid.take(), event))
                    return event
                callbacks = event.callbacks
                if callbacks is None:
                    break
                event.callbacks = []
                return self.at(at_s, callbacks)
        raise RuntimeError("move: the event is not on the queue (it has fired)")


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
    of events processed (what ``Environment.step`` would have been called for: with the events
    ``Clock.skip_to`` spared, which SimPy's loop, where it does not skip, pops as events of their own).
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
    was_stop = eids.stop_at
    skipped_before = eids.skipped
    eids.now = env._now
    eids.live = True
    eids.stop_at = stop[0] if bounded else math.inf
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
        eids.stop_at = was_stop
        eids.now = env._now
        dispatching = eids.release()
        if dispatching is not None:  # a callback raised: leave the queue as SimPy would have it
            _drop(queue, dispatching)
    return processed + (eids.skipped - skipped_before)
