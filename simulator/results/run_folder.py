"""A run folder: requests, series, summary.json and report.html of one ``RunResult``, saved atomically.

The one place that joins the data (``run_result``) and its rendering (``report``): results are data, the
report reads them, and this module writes both into a folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from simulator.results.report import render_report
from simulator.results.run_result import RunResult


def save_run(result: RunResult, out_dir: Path, *, overwrite: bool = False) -> Path:
    """Write requests, series, summary.json and report.html into ``out_dir``; returns ``out_dir``.

    A non-empty ``out_dir`` is refused unless ``overwrite``; with it, only the files written here are
    replaced and any other file in the folder is left alone (we never delete a user's files). Files
    are written to a temporary folder beside ``out_dir`` first and moved in when all are complete, so
    an interrupted save leaves no half-written report behind.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"cannot save results to {out_dir}: it exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"cannot save results to {out_dir}: the directory is not empty "
            "(choose another directory or pass --overwrite)"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the renamed folder should read like any other
    try:
        _write_table(result.requests_df(), tmp / "requests")
        _write_table(result.series_df(), tmp / "series")
        (tmp / "summary.json").write_text(result.summary_json(), encoding="utf-8")
        (tmp / "report.html").write_text(render_report(result), encoding="utf-8")
        if not out_dir.exists():
            os.replace(tmp, out_dir)  # one atomic rename on the same filesystem
        else:
            out_dir.mkdir(exist_ok=True)
            for item in sorted(tmp.iterdir()):
                os.replace(item, out_dir / item.name)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)  # our own temporary folder, never the user's
    return out_dir



def _write_table(frame: pd.DataFrame, stem: Path) -> Path:
    """Parquet when pyarrow is installed (typed, compact), CSV otherwise."""
    if not _has_pyarrow():
        path = stem.with_suffix(".csv")
        frame.to_csv(path, index=False)
        return path
    path = stem.with_suffix(".parquet")
    frame.to_parquet(path, index=False)
    return path


def _has_pyarrow() -> bool:
    return importlib.util.find_spec("pyarrow") is not None

