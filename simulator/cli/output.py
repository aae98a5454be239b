"""Where a command writes: a fresh run folder that never touches an earlier one, or a folder the user
named, refused when it holds files unless they said --overwrite; and the progress bar on stderr."""

from __future__ import annotations

import sys
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


def progress_bar(enabled: bool) -> tuple[Callable[[str, int, int], None] | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def update(variant: str, done: int, total: int) -> None:
        bar = bars.get(variant)
        if bar is None:
            # One line each, in order of first report (variants in worker processes report interleaved).
            bar = bars[variant] = tqdm(total=total, desc=f"{variant:>12}", unit="req", leave=True,
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
