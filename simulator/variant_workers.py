"""A scenario's variants simulated side by side, one worker process each (``fleetsim run --jobs``).

Variants are independent runs on the same request stream, so a multi-variant scenario (``scenarios/day.yaml``:
a static fleet, two autoscalers and an oracle over a day) takes the time of its slowest variant on enough
cores instead of the sum. Each worker gets its variant's scenario and the workload (pickled: the parent
generated it once) and sends back the ``VariantResult``; the results are the same as one after another, in
the same order (a test compares them). Progress travels back through a queue the workers share. Workers are
spawned (never forked: a fork of a process holding threads, a progress bar's or a BLAS pool's, can hang).
Memory: each worker holds its own copy of the workload and its variant's state while it runs, on top of
the parent's (which ends holding every variant's results, as one after another would).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simulator.fleet.fleet import ProgressFn
from simulator.results.run_result import VariantResult
from simulator.scenario import Scenario
from simulator.worker_pool import WorkerDied, explained, spawn_pool
from simulator.workload.workload import Workload

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["SimulateFn", "VariantTask", "WorkerDied", "simulate_variants"]

SimulateFn = Callable[..., VariantResult]
"""``simulation.simulate``: passed in (workers find it by its module and name), so that this module, below
``simulation`` in the layers, does not import it."""

_POLL_S = 0.2
"""How often the parent passes the workers' progress on while it waits."""


@dataclass(frozen=True, slots=True)
class VariantTask:
    """One variant to simulate: its name, its resolved scenario and the request stream it replays."""

    name: str
    scenario: Scenario
    workload: Workload


_progress_queue: Any = None
"""In a worker: the queue its progress goes to (None when nobody shows progress)."""


def _init_worker(progress_queue: Any) -> None:
    global _progress_queue
    _progress_queue = progress_queue


def _report(name: str, done: int, total: int) -> None:
    _progress_queue.put((name, done, total))


def _simulate(simulate: SimulateFn, task: VariantTask, check: bool) -> VariantResult:
    return simulate(task.scenario, task.workload, name=task.name, check=check,
                    progress=None if _progress_queue is None else _report)


def simulate_variants(simulate: SimulateFn, tasks: Sequence[VariantTask], *, jobs: int,
                      progress: ProgressFn | None = None, check: bool = False) -> dict[str, VariantResult]:
    """``simulate`` each task in up to ``jobs`` worker processes; the results by name, in the tasks' order. A
    worker's exception (an ``InvariantError``, a scenario the workers cannot run) is raised here: tasks not
    started are cancelled, those running are let finish (their results dropped); a worker that dies raises
    ``WorkerDied``."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    # Imported here, not at the top: process pools cost a run that never uses them ~10 ms of start-up.
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, wait

    progress_queue = multiprocessing.get_context("spawn").Queue() if progress is not None else None
    results: dict[str, VariantResult] = {}
    with (explained("running a variant", "jobs=1 (--jobs 1)"),
          spawn_pool(min(jobs, len(tasks)), initializer=_init_worker, initargs=(progress_queue,)) as pool):
        futures: dict[Future[VariantResult], str] = {pool.submit(_simulate, simulate, task, check): task.name
                                                     for task in tasks}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                _pass_on(progress_queue, progress)
                for future in done:
                    future.result()  # a worker's error, raised now
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        _pass_on(progress_queue, progress)
        for future, name in futures.items():
            results[name] = future.result()
    return {task.name: results[task.name] for task in tasks}


def _pass_on(progress_queue: Any, progress: ProgressFn | None) -> None:
    """Hand the workers' progress reports so far to ``progress``."""
    if progress_queue is None or progress is None:
        return
    while True:
        try:
            name, done, total = progress_queue.get_nowait()
        except queue.Empty:
            return
        progress(name, done, total)
