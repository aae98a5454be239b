"""Worker processes: the one way this package starts a pool of them, and what it says when one dies.

Every pool is spawned, never forked: a fork of a process holding threads (a progress bar's, a BLAS pool's)
can hang, and spawn behaves the same on Linux, macOS and Windows. A spawned worker imports the parent's
``__main__`` again, so a script that calls ``api.run(jobs=...)``, ``api.plan`` or ``api.sweep`` must keep
that call under ``if __name__ == "__main__":``: without it each worker fails as it starts (Python says so
on stderr) and the pool breaks. A worker killed while it runs (out of memory, a signal) breaks it too.
Either way the parent sees only ``BrokenProcessPool`` ("a process in the process pool was terminated
abruptly"); ``explained`` turns it into ``WorkerDied``, whose message names both causes and the way round
them (one worker, in this process).

Standard library only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

__all__ = ["WorkerDied", "explained", "spawn_pool"]


class WorkerDied(RuntimeError):
    """A worker process ended without a result (killed: out of memory, a signal; or it could not start: a
    script without a ``__main__`` guard); the work it had has no result."""


def spawn_pool(max_workers: int, *, initializer: Callable[..., object] | None = None,
               initargs: tuple[Any, ...] = ()) -> ProcessPoolExecutor:
    """A pool of ``max_workers`` spawned worker processes."""
    # Imported here, not at the top: process pools cost a command that never uses them ~10 ms of start-up.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=initializer, initargs=initargs)


@contextlib.contextmanager
def explained(work: str, one_worker: str) -> Iterator[None]:
    """``BrokenProcessPool`` raised inside the block becomes ``WorkerDied``: a worker process doing ``work``
    (e.g. "running a variant") died, why it may have, and ``one_worker`` (the option that runs the work in
    this process, e.g. "--jobs 1")."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        yield
    except BrokenProcessPool as err:
        raise WorkerDied(
            f"a worker process {work} died: killed (out of memory, a signal), or it could not start (a script "
            f"calling fleetsim's API must do so under `if __name__ == \"__main__\":`, since each spawned worker "
            f"imports the script again); {one_worker} runs it all in this process") from err
