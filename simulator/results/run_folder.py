"""A run folder: requests, series, summary.json and report.html of one ``RunResult``, saved atomically.

The one place that joins the data (``run_result``) and its rendering (``report``): results are data, the
report reads them, and this module writes both into a folder.

What a save promises, whatever happens to the process or the disk:
- Everything is written into a temporary sibling ``.NAME.tmp-PID-*`` first; the folder appears (or, with
  ``--overwrite``, is exchanged with the old one) in one rename, so there is never a half-written run,
  and an interrupted ``--overwrite`` leaves the old run or the new, never a mix.
- A failed save (disk full, read-only file system) removes its temporary folder and leaves what was there
  untouched; ``check_writable`` finds the avoidable failures before a run spends its time.
- A temporary folder a killed save left behind (its process is gone) is removed by the next save beside it;
  a previous run set aside by a killed exchange is put back where it was.
- The user's own files in an overwritten folder are kept (hard-linked, or copied, into the new one).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.errors import ConfigError
from simulator.results.run_result import RunResult
from simulator.results.table import Table

if TYPE_CHECKING:
    import pandas as pd

    from simulator.results.day import DayResult


class RunFiles(StrEnum):
    """What a save writes. Workers of a sweep need only the summary; the tables cost pyarrow's import and
    the report the reading and writing of plotly.js (~5 MB)."""

    ALL = "all"
    """requests and series tables, summary.json and report.html."""
    NO_REPORT = "no-report"
    """The tables and summary.json."""
    SUMMARY = "summary"
    """summary.json alone."""


DAY_TABLES = ("decisions.csv", "lifecycle_events.csv", "replicas.csv")
"""The tables of a fleet that changed size (written only for such a run): the autoscaler's decisions, the
lifecycle and failure events, the replica counts over time."""

RUN_FILE_NAMES = frozenset({"requests.parquet", "requests.csv", "series.parquet", "series.csv", "summary.json",
                            "report.html", *DAY_TABLES})
"""Every file a save may write: an earlier run's copy of one is never carried into a new save, even one
that writes fewer (a report of the old run beside the new summary would mislead)."""

_RENAME_EXCHANGE = 2
"""``renameat2``'s flag that swaps two paths atomically (Linux 3.15+, on most local file systems)."""


def save_run(result: RunResult, out_dir: Path, *, overwrite: bool = False, files: RunFiles = RunFiles.ALL) -> Path:
    """Write requests, series, summary.json and report.html (or the subset ``files`` names) into
    ``out_dir``; returns ``out_dir``.

    A non-empty ``out_dir`` is refused unless ``overwrite``; with it, only the files written here are
    replaced and any other file in the folder is left alone (we never delete a user's files).
    """
    out_dir = Path(out_dir)
    check_writable(out_dir, overwrite=overwrite)
    remove_stale_temporaries(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(out_dir), dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the renamed folder should read like any other
        written = _write_files(result, tmp, files) | RUN_FILE_NAMES
        if not out_dir.exists():
            os.replace(tmp, out_dir)  # one atomic rename on the same filesystem
        else:
            _carry_user_files(out_dir, tmp, written)
            _exchange(tmp, out_dir)  # tmp now holds the previous run (and links to the user's files)
    except OSError as err:
        raise ConfigError(f"cannot save results to {out_dir}: {err.strerror or err}; nothing was written "
                          "(an earlier run there is untouched)") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder, never the user's
    return out_dir


def check_writable(out_dir: Path, *, overwrite: bool = False) -> None:
    """Refuse, before anything runs, an ``out_dir`` a save could not write: a file in its place, a non-empty
    folder without ``overwrite``, or a parent that cannot be created or written (read-only, no permission)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"cannot save results to {out_dir}: it exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"cannot save results to {out_dir}: the directory is not empty "
            "(choose another directory or pass --overwrite)"
        )
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        Path(tempfile.mkdtemp(prefix=_temporary_prefix(out_dir), dir=out_dir.parent)).rmdir()
    except OSError as err:
        raise ConfigError(f"cannot write results beside {out_dir}: {err.strerror or err}") from None


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Clean up after saves to ``out_dir`` whose process no longer runs: their temporary folders are
    removed, and a previous run one of them had set aside is put back if ``out_dir`` is missing (else
    removed: the new run is in place). Returns the folders removed or restored."""
    pattern = re.compile(rf"^\.{re.escape(out_dir.name)}\.(tmp|old)-(\d+)-")
    cleaned: list[Path] = []
    parent = out_dir.parent
    if not parent.is_dir():
        return cleaned
    for item in sorted(parent.iterdir()):
        match = pattern.match(item.name)
        if not match or not item.is_dir() or _alive(int(match.group(2))):
            continue
        if match.group(1) == "old" and not out_dir.exists():
            os.rename(item, out_dir)
        else:
            shutil.rmtree(item, ignore_errors=True)
        cleaned.append(item)
    return cleaned


def _temporary_prefix(out_dir: Path, kind: str = "tmp") -> str:
    return f".{out_dir.name}.{kind}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _write_files(result: RunResult, folder: Path, files: RunFiles = RunFiles.ALL) -> set[str]:
    """The run's files, written into ``folder``; returns their names."""
    names = {"summary.json"}
    (folder / "summary.json").write_text(result.summary_json(), encoding="utf-8")
    if files is RunFiles.SUMMARY:
        return names
    names |= {_write_table(result.requests_table(), folder / "requests").name,
              _write_table(result.series_table(), folder / "series").name}
    days = {name: v.day for name, v in result.variants.items() if v.day is not None}
    for table, frame in day_tables(days).items():  # a fleet that changed size: what it did, as small tables
        frame.to_csv(folder / table, index=False)
        names.add(table)
    if files is RunFiles.ALL:
        (folder / "report.html").write_text(render_report(result), encoding="utf-8")
        names.add("report.html")
    return names


def day_tables(days: Mapping[str, DayResult]) -> dict[str, pd.DataFrame]:
    """``DAY_TABLES`` of every variant (a ``variant`` column first); none when no variant changed size."""
    if not days:
        return {}
    import pandas as pd

    from simulator.results.day import DayLog  # a plain run's save does not import the day's records

    out = {}
    for table, frame_of in zip(DAY_TABLES, (DayLog.decisions_frame, DayLog.events_frame, DayLog.counts_frame),
                               strict=True):
        frames = []
        for name, day in days.items():
            frame = frame_of(day.log)
            frame.insert(0, "variant", name)
            frames.append(frame)
        out[table] = pd.concat(frames, ignore_index=True)
    return out


def render_report(result: RunResult) -> str:
    """``report.render_report``, imported on first use: a run that writes no report never loads the
    report's modules."""
    from simulator.results import report

    return report.render_report(result)


def _carry_user_files(old: Path, new: Path, written: set[str]) -> None:
    """Put the files of ``old`` that this save does not write into ``new`` (hard links where the file
    system allows: no data is copied or ever deleted)."""
    for item in old.iterdir():
        if item.name in written:
            continue
        target = new / item.name
        if item.is_dir() and not item.is_symlink():
            shutil.copytree(item, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(item), str(target))


def _link_or_copy(source: str, target: str) -> None:
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _exchange(a: Path, b: Path) -> None:
    """Swap two folders: atomically where the kernel can, else by two renames (a moment without ``b``)."""
    import ctypes.util  # only an --overwrite pays for it (ctypes.util imports subprocess: ~5 ms of start-up)

    libc_name = ctypes.util.find_library("c")
    renameat2 = getattr(ctypes.CDLL(libc_name, use_errno=True), "renameat2", None) if libc_name else None
    if renameat2 is not None:
        at_fdcwd = -100
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), str(b))
    aside = Path(tempfile.mkdtemp(prefix=_temporary_prefix(b, "old"), dir=b.parent))
    aside.rmdir()
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def _write_table(table: Table, stem: Path) -> Path:
    """Parquet when pyarrow is installed (typed, compact; written without pandas), CSV otherwise."""
    if not _has_pyarrow():
        path = stem.with_suffix(".csv")
        table.to_pandas().to_csv(path, index=False)
        return path
    path = stem.with_suffix(".parquet")
    table.write_parquet(path)
    return path


def _has_pyarrow() -> bool:
    return importlib.util.find_spec("pyarrow") is not None
