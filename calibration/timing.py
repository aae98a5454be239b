"""Timing: two clocks behind one protocol, and the repeat/median policy every measurement follows.

``CudaEventTimer`` times device work with CUDA events (what transfers across models); ``WallTimer`` is the
host clock (the only honest clock on CPU, and the cycle clock everywhere). A measurement is always
warm-ups first (JIT, autotuning, allocator growth, graph capture happen there), then timed repeats,
reported as the median with the inter-quartile range: a median shrugs off the one slow repeat a
preempted host thread causes, and the IQR says how much to trust it.

Never asserts on a time, never prints: callers decide what a spread means.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

T = TypeVar("T")


class Timer(Protocol):
    """A stopwatch around device work: ``start()``, the work, ``stop()`` → seconds (synchronises)."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> float: ...


class WallTimer:
    """Host wall clock (``perf_counter``); ``sync`` (e.g. ``torch.cuda.synchronize``) runs before the
    clock stops so queued device work is counted."""

    name = "wall"

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self._sync = sync
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self._t0 is None:
            raise RuntimeError("stop() before start()")
        if self._sync is not None:
            self._sync()
        elapsed = time.perf_counter() - self._t0
        self._t0 = None
        return elapsed


class ThreadCpuTimer:
    """CPU time of the calling thread (``time.thread_time``): the CPU-device clock on a shared host.

    On a CPU "device" running torch with one intra-op thread, every step's work happens on the calling
    thread, so its CPU time is the step's cost on a quiet machine: it does not count the slices other
    processes take (measured on a loaded 2-core VM: run-to-run medians within ~15 %, wall-clock medians
    apart by up to 2x). Meaningless with several torch threads or on a GPU.
    """

    name = "thread_cpu"

    def __init__(self) -> None:
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.thread_time()

    def stop(self) -> float:
        if self._t0 is None:
            raise RuntimeError("stop() before start()")
        elapsed = time.thread_time() - self._t0
        self._t0 = None
        return elapsed


class CudaEventTimer:
    """CUDA events recorded on the current stream: device time between them, host gaps excluded."""

    name = "cuda_event"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._begin: Any = None
        self._end: Any = None

    def start(self) -> None:
        cuda = self._torch.cuda
        self._begin = cuda.Event(enable_timing=True)
        self._end = cuda.Event(enable_timing=True)
        self._begin.record()

    def stop(self) -> float:
        if self._begin is None:
            raise RuntimeError("stop() before start()")
        self._end.record()
        self._end.synchronize()
        elapsed = float(self._begin.elapsed_time(self._end)) / 1e3  # elapsed_time is in milliseconds
        self._begin = self._end = None
        return elapsed


def make_timer(device: str) -> Timer:
    """CUDA events on a GPU, the wall clock elsewhere."""
    return CudaEventTimer() if device.startswith("cuda") else WallTimer()


def time_call(timer: Timer, fn: Callable[[], T]) -> tuple[T, float]:
    """Run ``fn`` once between ``timer.start()`` and ``timer.stop()``."""
    timer.start()
    result = fn()
    return result, timer.stop()


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of repeated timings of one thing."""

    median_s: float
    q1_s: float
    """25th percentile."""
    q3_s: float
    """75th percentile."""
    min_s: float
    num_samples: int

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    @property
    def rel_iqr(self) -> float:
        """IQR over the median: the relative spread a reader should attach to the median."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("nan")


def summarize(samples: Sequence[float]) -> Stats:
    """Median, quartiles and minimum of timings; an empty list is an error, not a zero."""
    if not samples:
        raise ValueError("no timing samples to summarise")
    values = np.asarray(samples, dtype=np.float64)
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return Stats(
        median_s=float(median), q1_s=float(q1), q3_s=float(q3), min_s=float(values.min()), num_samples=len(values)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RepeatPolicy:
    """How one measurement is taken: warm-ups, then repeats (fewer for slow calls, never below the min)."""

    num_warmup: int = 3
    """Untimed calls first (research §4.1: ≥ 3–5 on a GPU for cuBLAS heuristics, Triton JIT, graphs)."""
    num_repeats: int = 10
    """Timed calls when time allows."""
    min_repeats: int = 3
    """Timed calls even when one call is slow: a median of fewer is not a median."""
    budget_s: float | None = None
    """Wall seconds one measurement may take before it stops at ``min_repeats``; None = no cap."""

    def __post_init__(self) -> None:
        if self.num_warmup < 0 or self.min_repeats < 1 or self.num_repeats < self.min_repeats:
            raise ValueError(f"need num_warmup >= 0 and 1 <= min_repeats <= num_repeats, got {self}")


def repeat(fn: Callable[[], T], policy: RepeatPolicy) -> list[T]:
    """Warm up, then call ``fn`` repeatedly; returns the timed calls' results (each carries its own times).

    Repeats stop early (at ``min_repeats``) once ``policy.budget_s`` of wall time is spent, so a grid can
    afford a few very slow points without shrinking the repeats of the fast ones.
    """
    for _ in range(policy.num_warmup):
        fn()
    t0 = time.perf_counter()
    results: list[T] = []
    while len(results) < policy.num_repeats:
        results.append(fn())
        if (
            policy.budget_s is not None
            and len(results) >= policy.min_repeats
            and time.perf_counter() - t0 > policy.budget_s
        ):
            break
    return results
