"""The serving loop: one thread that owns the real engine and steps it while it has work; requests come
in and tokens go out through thread-safe hand-offs, so the HTTP side never touches the engine.

In: ``submit`` (on the event loop) puts an ``_Add`` on a ``queue.SimpleQueue``; ``abort`` puts an
``_Abort``. The engine thread drains that queue at every step boundary — where a serving engine admits
arrivals — and blocks on it while idle. Out: after each step the thread hands the event loop one batch
(``call_soon_threadsafe``) of what each request got: accepted or rejected (by the core's own rule), the
step's tokens, the finish. Each request's ``RequestStream`` is an ``asyncio.Queue`` that its HTTP
handler reads.

This module must never decide anything about scheduling, admission or KV: the engine's ``core.Scheduler``
does, unchanged; the loop only feeds requests in, streams tokens out, and aborts a request whose client
left (which frees its KV blocks in the core). An exception in a step fails the requests then in flight
and the loop goes on; it never takes the server down.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from calibration.serve.protocol import FinishReason
from simulator.core.request import RequestSpec, RequestStatus

log = logging.getLogger("fleetsim.serve")

IDLE_POLL_S = 0.5
"""How long the idle thread waits for a command before looking again (only matters for shutdown)."""
LOG_FLUSH_S = 1.0
"""The step and request logs are flushed at most this often (from the engine thread, between steps)."""


# ----- what a request's stream receives ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Accepted:
    """The engine queued the request."""

    added_s: float
    """Engine clock when it was handed to the scheduler."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """The core refused it (it could never be served by this replica), or the loop is shut down."""

    reason: str


@dataclass(frozen=True, slots=True)
class Tokens:
    """What one step produced for the request: its new token (or none), and its finish."""

    token_ids: tuple[int, ...]
    time_s: float
    """Engine clock when the step's tokens reached the host."""
    finish: FinishReason | None = None
    error: str | None = None
    """Why the request was aborted by the server (engine failure, shutdown)."""


StreamItem = Accepted | Rejected | Tokens


class RequestStream:
    """The event-loop end of one request: items arrive in order, the last is a finish or a rejection."""

    def __init__(self, request_id: int, prompt_tokens: int, max_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self.done = False
        """A final item was delivered (or the request was aborted): nothing more will come."""

    async def get(self) -> StreamItem:
        return await self.queue.get()


# ----- engine-thread commands ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: int
    prompt_ids: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool
    received_s: float
    """Engine clock when the HTTP handler got the request (the server-side start of its TTFT)."""


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: int


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


_Command = _Add | _Abort | _Stop


# ----- counters for /metrics -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopStats:
    """The engine's state after the latest step, published by the engine thread (read as one object)."""

    num_running: int = 0
    num_waiting: int = 0
    """Waiting or swapped out: held by the scheduler but not running."""
    kv_used_blocks: int = 0
    kv_total_blocks: int = 1
    prefix_hit_tokens: int = 0
    """Prompt tokens served from the prefix cache, since start."""
    prefix_query_tokens: int = 0
    """Prompt tokens looked up in the prefix cache, since start."""
    prompt_tokens: int = 0
    """Prompt tokens of accepted requests, since start."""
    generation_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0
    num_steps: int = 0
    busy_s: float = 0.0
    """Wall time spent inside engine steps, since start."""
    step_errors: int = 0

    @property
    def kv_used_frac(self) -> float:
        return self.kv_used_blocks / self.kv_total_blocks


@dataclass(slots=True)
class _Live:
    """Engine-thread bookkeeping of one request in the engine (for the request log)."""

    received_s: float
    added_s: float
    prompt_tokens: int
    max_tokens: int
    token_s: list[float] = field(default_factory=list)


# ----- the loop --------------------------------------------------------------------------------------------


class EngineLoop:
    """Owns ``engine`` (a ``calibration.engine.engine.Engine``) on a thread of its own."""

    def __init__(self, engine: Any, *, log_dir: Path | None = None) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._pending: list[_Command] = []
        """Commands the engine thread took off the inbox but has not applied yet."""
        self._streams: dict[int, RequestStream] = {}
        """Live streams by request id: touched on the event loop thread only."""
        self._next_id = 0
        self._aio: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.stats = LoopStats(kv_total_blocks=engine.config.num_blocks)
        """The latest counters (replaced, never mutated, by the engine thread)."""
        self._live: dict[int, _Live] = {}
        self._log = _ServeLog(log_dir) if log_dir is not None else None
        self._counters = dict.fromkeys(("prompt_tokens", "generation_tokens", "requests_finished",
                                        "requests_aborted", "requests_rejected", "step_errors"), 0)
        self._busy_s = 0.0

    # ----- event-loop side ---------------------------------------------------------------------------

    def start(self, aio: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; its batches are delivered on ``aio``."""
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._aio = aio
        self._thread = threading.Thread(target=self._run, name="fleetsim-engine", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def now(self) -> float:
        """The engine clock (seconds), readable from any thread."""
        return float(self.engine.now())

    def submit(self, prompt_ids: Sequence[int], max_tokens: int, *, ignore_eos: bool) -> RequestStream:
        """Hand a request to the engine thread (call on the event loop); read its items from the stream."""
        request_id = self._next_id
        self._next_id += 1
        stream = RequestStream(request_id, len(prompt_ids), max_tokens)
        if not self.running:
            stream.queue.put_nowait(Rejected("the engine is not running"))
            stream.done = True
            return stream
        self._streams[request_id] = stream
        self._inbox.put(_Add(request_id, tuple(prompt_ids), max_tokens, ignore_eos, self.now()))
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client is gone: drop the request wherever it is (its KV blocks return to the pool)."""
        if stream.done:
            return
        stream.done = True
        self._streams.pop(stream.request_id, None)
        self._inbox.put(_Abort(stream.request_id))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort everything in flight, stop the thread, close the logs."""
        thread = self._thread
        if thread is None:
            return
        self._inbox.put(_Stop())
        thread.join(timeout_s)
        self._thread = None

    def _dispatch(self, batch: list[tuple[int, StreamItem]]) -> None:
        """On the event loop: hand each item to its stream (a stream already aborted gets nothing)."""
        for request_id, item in batch:
            stream = self._streams.get(request_id)
            if stream is None:
                continue
            stream.queue.put_nowait(item)
            if isinstance(item, Rejected) or (isinstance(item, Tokens) and item.finish is not None):
                stream.done = True
                del self._streams[request_id]

    def _send(self, batch: list[tuple[int, StreamItem]]) -> None:
        if batch and self._aio is not None:
            with contextlib.suppress(RuntimeError):  # the event loop closed under a stopping server
                self._aio.call_soon_threadsafe(self._dispatch, batch)

    # ----- engine thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                batch: list[tuple[int, StreamItem]] = []
                if self._apply(self._commands(block=not engine.has_work), batch):
                    break
                if engine.has_work:
                    self._step(batch)
                self._publish()  # before the batch: a client that got its tokens sees counters that include them
                self._send(batch)
                if self._log is not None:
                    self._log.maybe_flush()
        finally:
            self._shutdown()

    def _commands(self, *, block: bool) -> list[_Command]:
        """Everything queued now; while idle, wait for the first."""
        commands, self._pending = self._pending, []
        if block and not commands:
            with contextlib.suppress(queue.Empty):
                commands.append(self._inbox.get(timeout=IDLE_POLL_S))
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, commands: list[_Command], batch: list[tuple[int, StreamItem]]) -> bool:
        """Add and abort requests; True when told to stop."""
        engine = self.engine
        for command in commands:
            if isinstance(command, _Stop):
                return True
            if isinstance(command, _Abort):
                if command.request_id in self._live:
                    engine.abort(command.request_id)
                    self._retire(command.request_id, "abort")
                continue
            batch.append((command.request_id, self._add(command)))
        return False

    def _add(self, command: _Add) -> StreamItem:
        engine = self.engine
        spec = RequestSpec(command.request_id, engine.now(), len(command.prompt_ids), command.max_tokens)
        try:
            request = engine.add_request(spec, command.prompt_ids, ignore_eos=command.ignore_eos)
        except ValueError as err:  # ids out of range: the HTTP side checks, this is the last line
            engine.outputs.pop(command.request_id, None)
            self._counters["requests_rejected"] += 1
            return Rejected(str(err))
        if request.status is RequestStatus.REJECTED:
            engine.outputs.pop(command.request_id, None)
            self._counters["requests_rejected"] += 1
            kv_tokens = engine.config.num_blocks * engine.config.block_size
            return Rejected(f"the request needs {spec.prompt_tokens} prompt + {spec.output_tokens} output tokens; "
                            f"this replica holds at most {min(engine.config.max_model_len, kv_tokens)}")
        added_s = engine.now()
        self._live[command.request_id] = _Live(command.received_s, added_s, spec.prompt_tokens, spec.output_tokens)
        self._counters["prompt_tokens"] += spec.prompt_tokens
        return Accepted(added_s)

    def _step(self, batch: list[tuple[int, StreamItem]]) -> None:
        engine = self.engine
        start = time.perf_counter()
        try:
            record = engine.step()
        except Exception as err:  # the loop outlives a failed step; its requests do not
            log.exception("engine step failed; aborting the requests in flight")
            self._counters["step_errors"] += 1
            self._fail_all(batch, f"engine step failed: {type(err).__name__}: {err}")
            return
        finally:
            self._busy_s += time.perf_counter() - start
        # The engine keeps every step record and every request's output for offline replays; a server
        # runs indefinitely, so the loop (the engine's only user here) keeps neither.
        engine.records.clear()
        finished = set(record.finished_ids)
        for event in record.events:
            rid = event.request_id
            live = self._live.get(rid)
            if live is None:
                continue
            live.token_s.append(event.timestamp_s)
            finish = None
            if rid in finished:
                finish = FinishReason.LENGTH if len(live.token_s) >= live.max_tokens else FinishReason.STOP
            batch.append((rid, Tokens((event.token,), event.timestamp_s, finish)))
        self._counters["generation_tokens"] += len(record.events)
        for rid in finished:
            self._retire(rid, "finish")
        if self._log is not None:
            self._log.step(record)
        if record.shape.is_empty and not record.preempted_ids:
            # Work that cannot start: the core admits it once memory frees, which only a command can
            # change here (an abort). Wait for one rather than spin; the next iteration applies it.
            with contextlib.suppress(queue.Empty):
                self._pending.append(self._inbox.get(timeout=IDLE_POLL_S))

    def _retire(self, request_id: int, how: str) -> None:
        """The request left the engine: drop what the engine kept of it, count it, log it."""
        self.engine.outputs.pop(request_id, None)
        live = self._live.pop(request_id, None)
        if live is None:
            return
        self._counters["requests_finished" if how == "finish" else "requests_aborted"] += 1
        if self._log is not None:
            self._log.request(request_id, live, how)

    def _fail_all(self, batch: list[tuple[int, StreamItem]], reason: str) -> None:
        engine = self.engine
        now = engine.now()
        for rid in list(self._live):
            with contextlib.suppress(Exception):  # leave the scheduler as clean as it lets us
                engine.abort(rid)
            batch.append((rid, Tokens((), now, FinishReason.ABORT, error=reason)))
            self._retire(rid, "abort")

    def _publish(self) -> None:
        scheduler = self.engine.scheduler
        kv = scheduler.kv
        self.stats = LoopStats(
            num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
            kv_used_blocks=kv.pool.num_used, kv_total_blocks=kv.pool.num_blocks,
            prefix_hit_tokens=kv.num_hit_tokens, prefix_query_tokens=kv.num_lookup_tokens,
            num_steps=scheduler.num_steps, busy_s=self._busy_s, **self._counters,
        )

    def _shutdown(self) -> None:
        batch: list[tuple[int, StreamItem]] = []
        self._fail_all(batch, "the server is shutting down")
        # Adds still queued behind the stop are refused.
        for command in self._commands(block=False):
            if isinstance(command, _Add):
                batch.append((command.request_id, Rejected("the server is shutting down")))
        self._send(batch)
        self._publish()
        if self._log is not None:
            self._log.close()


# ----- the server-side log -----------------------------------------------------------------------------


STEP_LOG_COLUMNS = ("step_id", "start_s", "cycle_s", "device_s", "num_seqs", "num_new_tokens", "num_decode_seqs",
                    "decode_context_sum", "num_prefill_tokens", "num_finished")


class _ServeLog:
    """``steps.csv`` (one row per engine step) and ``requests.jsonl`` (one line per request that left the
    engine: its server-side times on the engine clock, every token's time included), appended as the
    server runs and flushed about once a second; the engine's own account to hold a client's against."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._steps: IO[str] = (folder / "steps.csv").open("w", newline="", encoding="utf-8")
        self._requests: IO[str] = (folder / "requests.jsonl").open("w", encoding="utf-8")
        self._writer = csv.writer(self._steps)
        self._writer.writerow(STEP_LOG_COLUMNS)
        self._last_flush = time.monotonic()

    def step(self, record: Any) -> None:
        s = record.shape
        self._writer.writerow((record.step_id, f"{record.start_s:.6f}", f"{record.cycle_s:.6f}",
                               f"{record.device_s:.6f}", s.num_seqs, s.num_new_tokens, s.num_decode_seqs,
                               s.decode_context_sum, s.num_prefill_tokens, len(record.finished_ids)))

    def request(self, request_id: int, live: _Live, how: str) -> None:
        line = {"request_id": request_id, "outcome": how, "prompt_tokens": live.prompt_tokens,
                "max_tokens": live.max_tokens, "received_s": round(live.received_s, 6),
                "added_s": round(live.added_s, 6), "token_s": [round(t, 6) for t in live.token_s]}
        self._requests.write(json.dumps(line) + "\n")

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= LOG_FLUSH_S:
            self._steps.flush()
            self._requests.flush()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        self._steps.close()
        self._requests.close()
