"""Python's cycle collector, paused over work that makes no garbage cycles.

Reference counting frees every object that is not part of a cycle; the cycle collector runs on top of it,
triggered by allocations alone, and walks the young objects every 700 allocations, the older ones every
few of those passes. Two phases of a run allocate a great many objects and no garbage cycles, so its
passes there are pure cost:

- start-up: the imports and the scenario's load create ~10^5 objects that live as long as the process
  (modules, classes, functions, pydantic's schemas and validators): the passes over them were ~6 % of a
  short run's instructions (callgrind, 10-request run: 1,425 -> 1,331 M with ``start_up(freeze=True)``);
- the event loop: specs, requests, plans and queue entries, freed by reference counting as they finish:
  ~3 % of a long run's instructions (what the loop leaves, the finished fleet's cycles among it, the young
  passes after it walk once and free).

Standard library only; the collector is back on afterwards if it was on (a caller who turned it off keeps
it off), which collects whatever cycles the paused work did leave.

At exit, the interpreter's own collection walks everything still alive; ``before_exit`` freezes it first.

Turning it back on only defers the passes: its next pass walks everything made meanwhile (~30 ms after a
start-up). ``start_up(freeze=True)`` moves what start-up made into the permanent generation instead
(``gc.freeze``), which no pass walks. Only for a process that runs one command: whatever garbage exists at
the freeze is never collected, so a test or notebook calling a command in its own long-lived process must
not freeze.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_one_command = False
"""Set by ``start_up(freeze=True)``: this process runs one command and exits (the CLI's own process)."""


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """The cycle collector off inside the block, back on after it (if it was on), even after an error.

    What the block made stays in the young generation, so the next young passes walk it once (a
    100,000-request run's request log, tables and caches: ~0.1 s of a ~2 s run) and free what is garbage by
    then: a finished fleet's replicas, schedulers, KV pools and sessions' chains hold one another in cycles
    that only the collector frees. Moving it all to the oldest generation instead (freezing and unfreezing,
    O(1)) skipped that pass but left the cycles to full passes, which the interpreter starts only as
    objects are promoted by passes: a process running simulation after simulation (a notebook, the
    dashboard, ``plan``) kept every finished fleet, 180 MB per run of kv_tiers.yaml.

    In a process that runs one command (``start_up(freeze=True)``), what the block made is frozen instead:
    the process exits before those cycles would matter, and the young pass over everything the loop made is
    skipped (~4 % of a 100,000-request run of the realistic benchmark case, compiled)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _one_command:
            gc.freeze()
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def start_up(*, freeze: bool) -> Iterator[None]:
    """A command's imports and configuration load with the collector off; then (``freeze``) every object
    alive frozen out of later passes, before the collector is back on; and from then on
    ``cycle_collector_paused`` freezes what its block made, too."""
    global _one_command
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
            _one_command = True
        if was_enabled:
            gc.enable()


def before_exit() -> None:
    """A process about to exit after its one command: every object alive frozen out of the collection the
    interpreter runs as it shuts down (a full pass over everything the command left: 38 M of a
    30,000-request ``fleetsim run``'s 6.2 G instructions, more the larger the heap left). Reference counting
    still frees them. Only for a process that runs one command, as ``start_up(freeze=True)``."""
    gc.freeze()
