"""The arrival feed: a workload's requests put on the SimPy clock, each routed and submitted to a replica
at its arrival time.

One event per distinct arrival time (requests arriving at the same instant go together), scheduled at
the spec's own ``arrival_s`` (no ``now + delay`` rounding) and handled by a callback, like the replicas'
own events (``replica.Clock.at``): no SimPy process, generator or ``Timeout`` per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

import simpy

from simulator.core.request import RequestSpec
from simulator.fleet.clock import Clock, Wake
from simulator.fleet.loads import LoadLevels, least_loaded_of
from simulator.fleet.replica import Replica
from simulator.results.request_log import RequestLog

RouteFn = Callable[[RequestSpec, float], int]
"""route(spec, now) -> index of the replica that receives it."""

DispatchFn = Callable[[RequestSpec, float], None]
"""dispatch(spec, now): route, log and submit the request itself (a pool whose replicas come and go)."""

ProgressFn = Callable[[int], None]
"""progress(requests arrived so far), every ``report_every`` requests."""


class ReadyRoute:
    """A dynamic fleet's least-requests dispatch where nothing is unusual, compiled: the first of the ready
    replicas (``ids``, ascending) with the fewest requests gets the request, routed and submitted in one
    native call (``DynamicFleet.dispatch``, interpreted, was ~3 % of a simulated day's instructions).
    ``dispatch`` answers False, doing nothing, where the fleet's own dispatch must decide: no ready replica
    (the request waits at the router), or a crashed one the router has not noticed among the ready (the
    fleet leaves ``ids`` empty then)."""

    __slots__ = ("ids", "levels", "log", "replicas")

    def __init__(self, levels: LoadLevels, log: RequestLog) -> None:
        self.levels = levels
        self.log = log
        self.replicas: list[Replica] = []
        """Every replica of the fleet (index = replica id)."""
        self.ids: list[int] = []
        """The ready replicas' ids, ascending; empty while any of them has crashed unnoticed."""

    def dispatch(self, spec: RequestSpec) -> bool:
        ids = self.ids
        if not ids:
            return False
        levels = self.levels
        index = least_loaded_of(levels.values, ids, levels.lowest)
        self.log.on_routed(spec.request_id, index)
        self.replicas[index].submit(spec)
        return True


class ArrivalFeed:
    """Replays ``specs`` (in arrival order) onto ``env``: at each arrival, log it, route it, submit it; or,
    given ``dispatch``, hand it over (a pool routes, logs and submits it, or holds it while no replica
    can take it), after ``ready`` (the pool's usual case, compiled) if given has declined it."""

    def __init__(
        self,
        env: simpy.Environment,
        specs: Iterable[RequestSpec],
        log: RequestLog,
        replicas: Sequence[Replica],
        *,
        route: RouteFn | None = None,
        dispatch: DispatchFn | None = None,
        progress: ProgressFn | None = None,
        report_every: int = 1,
        log_arrivals: bool = True,
        ready: ReadyRoute | None = None,
    ) -> None:
        if route is None and dispatch is None and len(replicas) != 1:
            raise ValueError("an arrival feed without a router needs exactly one replica")
        if report_every < 1:
            raise ValueError(f"report_every must be >= 1, got {report_every}")
        self.env = env
        self.clock = Clock(env)
        self.log = log
        self.replicas = list(replicas)
        self.route = route
        self.dispatch = dispatch
        self.ready = ready
        """With ``dispatch``: its usual case, compiled (``ReadyRoute``), tried first."""
        self.progress = progress
        self.report_every = report_every
        self.log_arrivals = log_arrivals
        """Log each arrival (``RequestLog.on_arrival``); off, the caller logs them in bulk afterwards
        (``RequestLog.record_arrivals``: the specs are then a workload's rows 0 .. n-1 in order)."""
        self.num_arrived = 0
        self._specs: Iterator[RequestSpec] = iter(specs)
        self._buffer: list[RequestSpec] = []
        """Specs taken from ``specs`` ahead of time, in blocks (``_pull``); ``_position`` is the next one."""
        self._position = 0
        self._next: RequestSpec | None = self._pull()
        self._callbacks: list[Callable[[object], None]] = [self._on_arrival]
        """Every arrival event's callbacks (built once: see ``replica.Wake``)."""
        self._event: Wake | None = None
        """The pending (or last) arrival event: one at a time, each reusing the last once fired."""
        if self._next is not None:
            self._event = self.clock.at(max(self._next.arrival_s, env.now), self._callbacks)

    def _on_arrival(self, event: object) -> None:
        """Dispatch every request due now, then schedule the next arrival."""
        now = self.clock.now()
        log = self.log
        route = self.route
        dispatch = self.dispatch
        ready = self.ready
        replicas = self.replicas
        progress = self.progress
        log_arrivals = self.log_arrivals
        spec = self._next
        while spec is not None and spec.arrival_s <= now:
            rid = spec.request_id
            if log_arrivals:
                log.on_arrival(rid, spec.arrival_s, spec.prompt_tokens, spec.output_tokens, spec.session_id)
            if dispatch is not None:
                if ready is None or not ready.dispatch(spec):
                    dispatch(spec, now)
            else:
                index = 0 if route is None else route(spec, now)
                log.on_routed(rid, index)
                replicas[index].submit(spec)
            self.num_arrived += 1
            if progress is not None and self.num_arrived % self.report_every == 0:
                progress(self.num_arrived)
            spec = self._pull()
        self._next = spec
        if spec is not None:
            self._event = self.clock.at(spec.arrival_s, self._callbacks, self._event)

    def _pull(self) -> RequestSpec | None:
        """The next spec, or None when there are no more. Taken from the iterator a block at a time: in the
        compiled build ``next`` on it is a generic call, an item of a list is not."""
        position = self._position
        buffer = self._buffer
        if position >= len(buffer):
            buffer = self._buffer = list(islice(self._specs, _PULL_BLOCK))
            position = 0
            if not buffer:
                return None
        self._position = position + 1
        return buffer[position]


_PULL_BLOCK = 512
"""Specs the feed takes from its iterator at a time."""
