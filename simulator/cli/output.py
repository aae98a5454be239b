"""Where a command writes: a fresh run folder that never touches an earlier one, or a folder the user
named, refused when it holds files unless they said --overwrite; and the progress bar on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fresh_out_dir(name: str) -> Path:
    """runs/NAME, or runs/NAME-2, -3, ... so an earlier run is never touched."""
    base = Path("runs") / name
    candidate, k = base, 2
    while candidate.exists():
        candidate = base.with_name(f"{name}-{k}")
        k += 1
    return candidate


def checked_out_dir(out: Path, overwrite: bool) -> Path:
    """An --out the user named: refused when it holds files, unless --overwrite (never silently), or when
    it cannot be written; the same rule a run folder's save applies (``run_folder.check_writable``)."""
    from simulator.results.run_folder import check_writable

    check_writable(out, overwrite=overwrite)
    return out


PROGRESS_AFTER_S = 0.5
"""A variant's bar appears once its run has lasted this long: a run over sooner shows none, and never imports
tqdm (with the logging it imports, ~6 ms of a short run's start-up)."""


def progress_bar(enabled: bool, *, after_s: float = PROGRESS_AFTER_S) -> tuple[
        Callable[[str, int, int], None] | None, Callable[[], None]]:
    """``(update(variant, done, total), close())`` for a run's progress on stderr, one line per variant
    (none when not ``enabled``)."""
    if not enabled:
        return None, lambda: None
    bars: dict[str, Any] = {}
    first_report: dict[str, float] = {}

    def update(variant: str, done: int, total: int) -> None:
        bar = bars.get(variant)
        if bar is None:
            now = time.monotonic()
            if now - first_report.setdefault(variant, now) < after_s:
                return
            from tqdm import tqdm

            # One line each, in order of appearance (variants in worker processes report interleaved).
            bar = bars[variant] = tqdm(total=total, initial=done, desc=f"{variant:>12}", unit="req", leave=True,
                                       file=sys.stderr, mininterval=0.5, position=len(bars))
        bar.update(done - bar.n)

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return update, close


def non_negative(text: str) -> int:
    """A whole number >= 0 (argparse turns the ValueError into a one-line usage error naming the option)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value
