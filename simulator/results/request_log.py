"""The per-request log of a run: preallocated numpy columns indexed by request id, written on the
simulator's hot path (``RequestLog.on_*``: plain scalars in, one or two item writes each) and read once at
the end (``columns``, ``latencies_ms``, ``to_frame``). Latency definitions: see ``simulator.results.summary``.

On the per-step path, so ``fleetsim build-native`` compiles it; it must never import simpy or the
simulator's replica/fleet modules (they import it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from simulator.results.table import Table

if TYPE_CHECKING:
    import pandas as pd

# --------------------------------------------------------------------------------------------------------
# Per-request log (hot path)
# --------------------------------------------------------------------------------------------------------


class RequestOutcome(StrEnum):
    """Where a request stands at the end of a run; every arrived request is exactly one of these."""

    COMPLETED = "completed"
    IN_FLIGHT = "in_flight"
    REJECTED = "rejected"


_FLOAT_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "rejected_s")
_INT_COLUMNS: dict[str, type[np.integer[Any]]] = {
    "replica": np.int32,
    "prompt_tokens": np.int64,
    "output_tokens": np.int64,
    "cached_tokens": np.int64,
    "preemptions": np.int32,
    "session_id": np.int64,
    "produced_tokens": np.int64,
}
REQUEST_COLUMNS: tuple[str, ...] = (*_FLOAT_COLUMNS, *_INT_COLUMNS, "rejected")
"""Names of the raw columns of a RequestLog, in a fixed order."""


class RequestLog:
    """Preallocated numpy columns indexed by request id (ids are 0..n-1, assigned in arrival order).

    Times are seconds from the start of the run and NaN until the event happened. ``replica`` is -1 until
    the request is routed and ``session_id`` is -1 when there is none: sentinels rather than ``None``
    because these are fixed-width numpy columns written a million times; DataFrames built from them turn
    the sentinels into missing values. Capacity grows by doubling if an id beyond it arrives, so a
    workload whose size is not known ahead (Poisson over a horizon) still costs amortised O(1).
    """

    arrival_s: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    rejected_s: np.ndarray
    replica: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    cached_tokens: np.ndarray
    preemptions: np.ndarray
    session_id: np.ndarray
    produced_tokens: np.ndarray
    """Output tokens produced: a finished request's count as its replica reported it at the finish, the
    others' set once the clock stopped (``record_produced``); -1 until then."""
    rejected: np.ndarray
    num_finishes: int
    """``on_finish`` calls so far: one per finished request in a correct run (the run check compares). A
    counter, not a column: a per-request item write here cost ~750 instructions a request compiled."""
    _arrival: memoryview[float]
    _first_scheduled: memoryview[float]
    _first_token: memoryview[float]
    _finish: memoryview[float]
    _rejected_s: memoryview[float]
    _replica: memoryview[int]
    _prompt: memoryview[int]
    _output: memoryview[int]
    _cached: memoryview[int]
    _preemptions: memoryview[int]
    _produced: memoryview[int]
    _session: memoryview[int]
    _rejected: memoryview[bool]

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = max(int(capacity), 1)
        self._size = 0
        """One past the largest request id seen: the length of the exported columns."""
        self.num_finishes = 0
        self._allocate(self._capacity)

    def _allocate(self, capacity: int) -> None:
        for name in _FLOAT_COLUMNS:
            setattr(self, name, np.full(capacity, np.nan))
        for name, dtype in _INT_COLUMNS.items():
            fill = -1 if name in ("replica", "session_id", "produced_tokens") else 0
            setattr(self, name, np.full(capacity, fill, dtype=dtype))
        self.rejected = np.zeros(capacity, dtype=bool)
        # The hot-path hooks write through memoryviews of the columns (``ndarray.data``, in the column's own
        # item format): an item write through the buffer protocol costs a fraction of numpy's indexing
        # machinery, and lands in the same memory. The casts only type the views' items.
        self._arrival = cast("memoryview[float]", self.arrival_s.data)
        self._first_scheduled = cast("memoryview[float]", self.first_scheduled_s.data)
        self._first_token = cast("memoryview[float]", self.first_token_s.data)
        self._finish = cast("memoryview[float]", self.finish_s.data)
        self._rejected_s = cast("memoryview[float]", self.rejected_s.data)
        self._replica = self.replica.data
        self._prompt = self.prompt_tokens.data
        self._output = self.output_tokens.data
        self._cached = self.cached_tokens.data
        self._preemptions = self.preemptions.data
        self._produced = self.produced_tokens.data
        self._session = self.session_id.data
        self._rejected = cast("memoryview[bool]", self.rejected.data)

    def _grow(self, min_capacity: int) -> None:
        old = {name: getattr(self, name) for name in REQUEST_COLUMNS}
        capacity = max(min_capacity, 2 * self._capacity)
        self._allocate(capacity)
        for name, column in old.items():
            getattr(self, name)[: len(column)] = column
        self._capacity = capacity

    def __len__(self) -> int:
        return self._size

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its trimmed columns (the compiled build's native class has no instance dict)."""
        return (RequestLog.from_columns, ({name: column.copy() for name, column in self.columns().items()},))

    # Hot-path hooks: plain scalars in, one or two item writes each (through the memoryviews).

    def on_arrival(self, rid: int, t: float, prompt: int, output: int, session: int | None) -> None:
        """Request ``rid`` arrived at the fleet at ``t`` asking for ``output`` tokens after ``prompt``."""
        if rid >= self._capacity:
            self._grow(rid + 1)
        if rid >= self._size:
            self._size = rid + 1
        self._arrival[rid] = t
        self._prompt[rid] = prompt
        self._output[rid] = output
        if session is not None:
            self._session[rid] = session

    def record_arrivals(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                        session_id: np.ndarray) -> None:
        """``on_arrival`` for requests 0 .. n-1 at once, from a workload's columns (a session id < 0 is
        none): a fleet whose requests are a workload's rows in order logs their arrivals this way after
        the run, for the ones that arrived, instead of one call each on the hot path."""
        n = len(arrival_s)
        if not len(prompt_tokens) == len(output_tokens) == len(session_id) == n:
            raise ValueError("arrival columns must have equal lengths")
        if n > self._capacity:
            self._grow(n)
        if n > self._size:
            self._size = n
        self.arrival_s[:n] = arrival_s
        self.prompt_tokens[:n] = prompt_tokens
        self.output_tokens[:n] = output_tokens
        self.session_id[:n] = np.where(session_id >= 0, session_id, -1)

    def on_routed(self, rid: int, replica: int) -> None:
        self._replica[rid] = replica

    def on_scheduled(self, rid: int, t: float) -> None:
        """First time the request got tokens in a step; later calls (after a preemption) are ignored so
        the queue delay is the wait before service started, as vLLM reports it."""
        if math.isnan(self._first_scheduled[rid]):
            self._first_scheduled[rid] = t

    def on_first_token(self, rid: int, t: float) -> bool:
        """First token delivered to the client (network latency already added by the caller). Only the
        first call counts: a recompute after preemption does not deliver the first token again. Returns
        whether this call recorded it."""
        if math.isnan(self._first_token[rid]):
            self._first_token[rid] = t
            return True
        return False

    def withdraw_first_token(self, rid: int) -> None:
        """Undo the ``on_first_token`` that recorded ``rid``'s first token: it was logged ahead, for the end of
        a step the clock stopped before (``Replica``'s decode runs log a first step's first tokens as it
        begins)."""
        self._first_token[rid] = math.nan

    def on_finish(self, rid: int, t: float, cached_tokens: int, preemptions: int, produced: int = -1) -> None:
        """Last token delivered at ``t``; ``cached_tokens`` prompt tokens came from the prefix cache;
        ``produced``: the output tokens the replica's core counted (-1: not counted, taken as the request's
        output length). A one-token answer whose first token was not reported separately gets ``t`` as
        its first token."""
        self._finish[rid] = t
        if math.isnan(self._first_token[rid]):
            self._first_token[rid] = t
        self._cached[rid] = cached_tokens
        self._preemptions[rid] = preemptions
        self._produced[rid] = produced
        self.num_finishes += 1

    def on_rejected(self, rid: int, t: float) -> None:
        """The fleet will never serve this request (too long for any replica, or admission refused)."""
        self._rejected[rid] = True
        self._rejected_s[rid] = t

    def flush_deliveries(self, interval_s: float) -> None:
        """A buffering proxy forwards what it holds every ``interval_s`` (from time 0): each first and last
        token reaches the client at the first flush at or after it left the fleet."""
        n = self._size
        for column in (self.first_token_s, self.finish_s):
            times = column[:n]
            np.multiply(np.ceil(times / interval_s), interval_s, out=times)

    def record_produced(self, in_flight: Mapping[int, int]) -> None:
        """Set ``produced_tokens`` once the clock stopped: ``in_flight`` maps each request a replica still
        holds to the output tokens it produced so far (the core's count); a completed request keeps the
        count its replica reported at the finish (one whose finish carried none produced what it asked
        for); any other, none."""
        n = self._size
        completed = self.outcomes()[RequestOutcome.COMPLETED]
        produced = self.produced_tokens[:n]
        unreported = completed & (produced < 0)
        produced[unreported] = self.output_tokens[:n][unreported]
        produced[~completed] = 0
        for rid, count in in_flight.items():
            if 0 <= rid < n:
                self.produced_tokens[rid] = count

    # Export.

    def columns(self) -> dict[str, np.ndarray]:
        """The raw columns trimmed to the ids seen, as views (copy them before the run goes on)."""
        n = self._size
        return {name: getattr(self, name)[:n] for name in REQUEST_COLUMNS}

    @classmethod
    def from_columns(cls, columns: Mapping[str, np.ndarray]) -> RequestLog:
        """A log holding copies of ``columns`` (as given by ``columns()``); missing columns stay empty."""
        n = len(columns["arrival_s"])
        log = cls(n)
        for name, values in columns.items():
            if name not in REQUEST_COLUMNS:
                raise ValueError(f"unknown request column {name!r}; expected one of {REQUEST_COLUMNS}")
            if len(values) != n:
                raise ValueError(f"column {name!r} has {len(values)} rows, arrival_s has {n}")
            getattr(log, name)[:n] = values
        log._size = n
        log.num_finishes = int(np.count_nonzero(~np.isnan(log.finish_s[:n])))
        return log

    def trimmed(self) -> RequestLog:
        """A compact copy holding only the ids seen (drops the spare preallocated capacity)."""
        return RequestLog.from_columns(self.columns())

    def outcomes(self) -> dict[RequestOutcome, np.ndarray]:
        """Boolean masks over ids: each arrived request is in exactly one mask; unseen ids in none."""
        c = self.columns()
        arrived = ~np.isnan(c["arrival_s"])
        rejected = arrived & c["rejected"]
        finished = arrived & ~rejected & ~np.isnan(c["finish_s"])
        return {
            RequestOutcome.COMPLETED: finished,
            RequestOutcome.IN_FLIGHT: arrived & ~rejected & ~finished,
            RequestOutcome.REJECTED: rejected,
        }

    def latencies_ms(self) -> dict[str, np.ndarray]:
        """``queue_ms``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` per id, NaN where undefined (the event did not
        happen, or TPOT of a one-token answer). Raw per event: mask with ``outcomes()`` as needed."""
        return {f"{k}_ms": v * 1e3 for k, v in latencies_s(self.columns()).items()}

    def table(self) -> Table:
        """One row per arrived request with derived ``queue_ms``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms``.

        Latencies are NaN where undefined (not finished, or TPOT of a one-token answer); ``replica`` and
        ``session_id`` are nullable integers, missing when not routed or not in a session; ``outcome`` is
        categorical over ``RequestOutcome``'s values.
        """
        c = self.columns()
        keep = ~np.isnan(c["arrival_s"])
        ids = np.flatnonzero(keep)
        c = {name: col[keep] for name, col in c.items()}
        masks = {k: v[keep] for k, v in self.outcomes().items()}
        # Codes index RequestOutcome's members in declaration order (COMPLETED, IN_FLIGHT, REJECTED).
        codes = np.ones(len(ids), dtype=np.int8)
        codes[masks[RequestOutcome.COMPLETED]] = 0
        codes[masks[RequestOutcome.REJECTED]] = 2
        lat = {k: v[keep] for k, v in self.latencies_ms().items()}
        return Table(
            {
                "request_id": ids.astype(np.int64),
                "arrival_s": c["arrival_s"],
                "replica": c["replica"].astype(np.int32),
                "session_id": c["session_id"].astype(np.int64),
                "outcome": codes,
                "prompt_tokens": c["prompt_tokens"],
                "output_tokens": c["output_tokens"],
                "produced_tokens": c["produced_tokens"],
                "cached_tokens": c["cached_tokens"],
                "preemptions": c["preemptions"],
                "first_scheduled_s": c["first_scheduled_s"],
                "first_token_s": c["first_token_s"],
                "finish_s": c["finish_s"],
                "queue_ms": lat["queue_ms"],
                "ttft_ms": lat["ttft_ms"],
                "tpot_ms": lat["tpot_ms"],
                "e2e_ms": lat["e2e_ms"],
            },
            missing={"replica": c["replica"] < 0, "session_id": c["session_id"] < 0},
            categories={"outcome": tuple(o.value for o in RequestOutcome)},
        )

    def to_frame(self) -> pd.DataFrame:
        """``table`` as a DataFrame."""
        return self.table().to_pandas()


def latencies_s(c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-request latencies in seconds, NaN where undefined. The one place the §5 formulas live."""
    arrival = c["arrival_s"]
    ttft = c["first_token_s"] - arrival
    e2e = c["finish_s"] - arrival
    out = c["output_tokens"]
    # A one-token answer has no inter-token gap: TPOT is undefined there, not zero (vLLM skips it too).
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    return {"queue": c["first_scheduled_s"] - arrival, "ttft": ttft, "tpot": tpot, "e2e": e2e}
