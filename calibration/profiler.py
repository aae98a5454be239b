"""The profiler: a grid of step shapes forced through the real model runner, timed, written as raw CSV.

Each grid point (calibration/grid.py: the points and the presets) is one step composition — decode rows
with given contexts, prefill chunks over given cached prefixes, or both — built as ``ScheduledSeq`` rows
with distinct physical blocks and handed to ``ModelRunner.execute_timed`` exactly as the engine hands it a
scheduler's plan. Per point: warm-ups, repeats, the median of device time and (separately) of whole-call
cycle time, and their IQRs. Points run in a seeded random order (optionally in several passes, to expose
drift) so a slow drift of the machine does not masquerade as a trend in a grid axis.

The CSV carries the StepShape columns ``calibration/fit.py`` reads, computed by the serving core's own
``compute_shape`` so the fitted model sees exactly the features the simulator will. Rows are appended and
flushed as they are measured: an interrupted run keeps what it measured, and a rerun with the same output
skips the points already there. Provenance (device, versions, date, git revision, model, dtype, grid)
lives in a sidecar JSON next to the CSV.

Never fits and never decides anything about scheduling.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from calibration.grid import Grid, GridPoint
from calibration.timing import RepeatPolicy, Stats, ThreadCpuTimer, repeat, summarize
from simulator.errors import ConfigError

SHAPE_COLUMNS: tuple[str, ...] = (
    "num_seqs",
    "num_new_tokens",
    "num_decode_seqs",
    "decode_context_sum",
    "num_prefill_tokens",
    "prefill_attention_pairs",
)
"""StepShape fields, one column each, as calibration/fit.py reads them (num_seqs as the engine ran it, i.e.
padded to its CUDA-graph bucket)."""

CSV_COLUMNS: tuple[str, ...] = (
    "point",
    "kind",
    "pass_index",
    *SHAPE_COLUMNS,
    "device_s",
    "cycle_s",
    "device_iqr_s",
    "cycle_iqr_s",
    "device_min_s",
    "wall_device_s",
    "wall_cycle_s",
    "num_repeats",
    "max_context",
    "max_chunk",
    "num_layers",
)
"""Raw timings file: one row per (grid point, pass); times are medians over the repeats."""

TIMING_KEYS: tuple[str, ...] = ("device_type", "device_name", "dtype", "backend", "cuda_graphs", "clock",
                                "torch_threads", "model", "num_layers", "block_size", "grid", "engine_version", "seed")
"""Sidecar fields that change a timing (the seed orders the grid and draws the token ids): a rerun resumes
into an existing CSV only when every one of them, and each of ``EXTRA_TIMING_KEYS``, matches."""
EXTRA_TIMING_KEYS: tuple[str, ...] = ("tp", "hardware")
"""Timing settings the sidecar keeps under ``extra`` (calibrate records them there)."""


class Clock(StrEnum):
    """Which clock ``device_s`` and ``cycle_s`` of the timings file are read from."""

    RUNNER = "runner"
    """The runner's own: CUDA events (device) and the wall clock (cycle) on a GPU; the wall clock on CPU."""
    THREAD_CPU = "thread_cpu"
    """CPU time of the calling thread (one torch thread on CPU): immune to other processes' time slices.
    The call's CPU time is split into device and host in the proportion the runner's wall clocks give."""


# ----- provenance --------------------------------------------------------------------------------------


def git_revision(repo: Path | None = None) -> str | None:
    """HEAD of the fleetsim checkout, with '-dirty' when the tree has changes; None outside git."""
    cwd = repo or Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device: str) -> str:
    """'NVIDIA H200' on a GPU; the CPU's model name (and thread count) on CPU."""
    import torch

    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name(torch.device(device)))
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU ({model}, {torch.get_num_threads()} threads)"


def library_versions() -> dict[str, str]:
    import torch

    versions = {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version()}
    if torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
    try:
        import triton

        versions["triton"] = str(triton.__version__)
    except ImportError:
        pass
    return versions


ENGINE_DIR = Path(__file__).resolve().parent / "engine"


def engine_version() -> str:
    """What runs the grid, as one text: a digest of the engine's sources (``calibration/engine``) and the
    versions of the libraries that time it (torch, its CUDA, triton, the Python interpreter)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(ENGINE_DIR.rglob("*.py")):
        digest.update(path.relative_to(ENGINE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    versions = {k: v for k, v in library_versions().items() if k != "numpy"}
    return "; ".join([f"engine {digest.hexdigest()[:16]}", *(f"{k} {v}" for k, v in sorted(versions.items()))])


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """Sidecar provenance of one timings CSV."""

    model: str
    dtype: str
    backend: str
    device_type: str
    grid: str
    block_size: int
    num_layers: int
    cuda_graphs: bool
    device_name: str
    clock: str = Clock.RUNNER.value
    library_versions: dict[str, str] = field(default_factory=dict)
    date: str = ""
    git_revision: str | None = None
    torch_threads: int = 0
    seed: int = 0
    engine_version: str = ""
    """``engine_version()`` of the run ("" where the caller does not record it)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """The settings that change a timing (``timing_settings``)."""
        return timing_settings(asdict(self))


def timing_settings(sidecar: dict[str, Any]) -> dict[str, Any]:
    """The settings of a sidecar (or of ``asdict(RunInfo)``) that change a timing; None where it has none."""
    extra = sidecar.get("extra") or {}
    return {**{k: sidecar.get(k) for k in TIMING_KEYS}, **{k: extra.get(k) for k in EXTRA_TIMING_KEYS}}


def sidecar_path(csv_path: Path) -> Path:
    return csv_path.with_suffix(".provenance.json")


# ----- the runner seam ---------------------------------------------------------------------------------


class TimedRunner(Protocol):
    """What the profiler needs of ``calibration.engine.runner.ModelRunner``."""

    num_blocks: int
    block_size: int

    def execute_timed(self, seqs: Sequence[Any], input_ids: Sequence[int]) -> tuple[list[int], Any]: ...


@dataclass(frozen=True, slots=True)
class PointResult:
    point: GridPoint
    pass_index: int
    timings: PointTimings


@dataclass(frozen=True, slots=True)
class CallTiming:
    """One timed call: the chosen clock's device and cycle seconds, and the runner's wall-clock pair."""

    device_s: float
    cycle_s: float
    wall_device_s: float
    wall_cycle_s: float


def timed_call(runner: TimedRunner, seqs: Sequence[Any], ids: Sequence[int], clock: Clock) -> CallTiming:
    """``runner.execute_timed`` once, read on ``clock``."""
    if clock is Clock.THREAD_CPU:
        timer = ThreadCpuTimer()
        timer.start()
        _, timing = runner.execute_timed(seqs, ids)
        cpu_s = timer.stop()
        share = timing.device_s / timing.cycle_s if timing.cycle_s > 0 else 1.0
        return CallTiming(cpu_s * share, cpu_s, timing.device_s, timing.cycle_s)
    _, timing = runner.execute_timed(seqs, ids)
    return CallTiming(timing.device_s, timing.cycle_s, timing.device_s, timing.cycle_s)


@dataclass(frozen=True, slots=True)
class PointTimings:
    device: Stats
    cycle: Stats
    wall_device: Stats
    wall_cycle: Stats


def measure_point(runner: TimedRunner, point: GridPoint, policy: RepeatPolicy, *, vocab_size: int,
                  seed: int = 0, clock: Clock = Clock.RUNNER) -> PointTimings:
    """Time one step composition: rows get distinct blocks (never aliased: aliasing would let caches
    serve repeated context), random token ids (never zeros)."""
    from calibration.engine.attention import ScheduledSeq

    bs = runner.block_size
    if point.num_blocks(bs) > runner.num_blocks:
        raise ValueError(f"{point.name} needs {point.num_blocks(bs)} blocks, the pool has {runner.num_blocks}")
    seqs = []
    next_block = 0
    for num_new, num_computed in point.rows():
        n_blocks = -(-(num_new + num_computed) // bs)
        seqs.append(ScheduledSeq(num_new_tokens=num_new, num_computed_tokens=num_computed,
                                 block_table=tuple(range(next_block, next_block + n_blocks))))
        next_block += n_blocks
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab_size, size=point.shape.num_new_tokens).tolist()
    calls = repeat(lambda: timed_call(runner, seqs, ids, clock), policy)
    return PointTimings(
        device=summarize([c.device_s for c in calls]),
        cycle=summarize([c.cycle_s for c in calls]),
        wall_device=summarize([c.wall_device_s for c in calls]),
        wall_cycle=summarize([c.wall_cycle_s for c in calls]),
    )


def _row(result: PointResult, num_layers: int) -> dict[str, Any]:
    point = result.point
    row: dict[str, Any] = {"point": point.name, "kind": point.kind.value, "pass_index": result.pass_index}
    row.update(point.shape._asdict())
    row.pop("num_swap_tokens", None)
    t = result.timings
    row.update(
        device_s=t.device.median_s,
        cycle_s=t.cycle.median_s,
        device_iqr_s=t.device.iqr_s,
        cycle_iqr_s=t.cycle.iqr_s,
        device_min_s=t.device.min_s,
        wall_device_s=t.wall_device.median_s,
        wall_cycle_s=t.wall_cycle.median_s,
        num_repeats=t.device.num_samples,
        max_context=point.max_context,
        max_chunk=point.max_chunk,
        num_layers=num_layers,
    )
    return row


def _repair_tail(path: Path) -> None:
    """Drop a partial last line (a run killed mid-write) so appended rows start on a line of their own."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def read_timings(path: str | Path) -> pd.DataFrame:
    """The rows of a timings CSV that were written completely."""
    df = pd.read_csv(path)
    return df.dropna(subset=["device_s", "cycle_s"]).reset_index(drop=True)


def load_sidecar(csv_path: Path) -> dict[str, Any] | None:
    path = sidecar_path(csv_path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ConfigError(f"unreadable provenance sidecar ({type(err).__name__})", file=path) from None
    if not isinstance(data, dict):
        raise ConfigError("provenance sidecar is not a JSON object", file=path)
    return data


def check_resumable(csv_path: Path, info: RunInfo) -> None:
    """Refuse to resume into a CSV measured under other settings, naming each one that differs, or one
    without a sidecar (nothing says how its rows were measured). Reads only; changes no file."""
    previous = load_sidecar(csv_path)
    if previous is None:
        raise ConfigError(f"holds timings but no {sidecar_path(csv_path).name} saying how they were measured: "
                          "cannot resume into it; choose another output", file=csv_path)
    theirs, ours = timing_settings(previous), info.identity()
    differ = [f"{key} {_shown(theirs[key])} there, {_shown(value)} now" for key, value in ours.items()
              if theirs[key] != value]
    if differ:
        raise ConfigError(f"holds timings measured with other settings ({'; '.join(differ)}): resuming would mix "
                          "them; choose another output", file=csv_path)


def _shown(value: Any) -> str:
    return "(not recorded)" if value is None else repr(value)[:80]


def _write_sidecar(csv_path: Path, sidecar: dict[str, Any]) -> None:
    """Replace the sidecar in one rename: a reader sees the old one or the new one, never half of either."""
    path = sidecar_path(csv_path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclass(slots=True)
class ProfileRun:
    """Outcome of ``run_grid``: the rows now in the CSV, what was skipped and why."""

    csv_path: Path
    measured: int
    """Points measured in this run."""
    resumed: int
    """Points found already measured in the CSV."""
    skipped: list[str]
    """Points not measured (e.g. larger than the KV pool), with the reason."""

    def frame(self) -> pd.DataFrame:
        """Every row measured (one per point and pass)."""
        return read_timings(self.csv_path)

    def points_frame(self, how: str = "min") -> pd.DataFrame:
        """One row per point (``aggregate_passes``): what the fit reads."""
        return aggregate_passes(self.frame(), how=how)


def run_grid(
    runner: TimedRunner,
    grid: Grid,
    csv_path: str | Path,
    info: RunInfo,
    *,
    vocab_size: int,
    seed: int = 0,
    progress: bool = True,
    max_points: int | None = None,
) -> ProfileRun:
    """Measure every (point, pass) of ``grid`` not already in ``csv_path``, appending rows as measured.

    ``max_points`` stops after that many new measurements (a test of interruption, or a time cap).
    """
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    done: set[tuple[str, int]] = set()
    resuming = csv_path.is_file() and csv_path.stat().st_size > 0
    if resuming:
        check_resumable(csv_path, info)
        previous = load_sidecar(csv_path)
        assert previous is not None  # check_resumable refuses a CSV without one
        _repair_tail(csv_path)
        existing = read_timings(csv_path)
        done = set(zip(existing["point"].astype(str), existing["pass_index"].astype(int), strict=True))
        # The sidecar describes the rows already there; it changes only once a new row is measured, and then
        # only to add this session (its date and revision) to the ones that wrote the CSV.
        sidecar = {**previous, "resumed": [*previous.get("resumed", []),
                                           {"date": info.date or _now(), "git_revision": info.git_revision,
                                            "rows_before": len(existing)}]}
    else:
        sidecar = asdict(info)
        sidecar["date"] = sidecar["date"] or _now()
        _write_sidecar(csv_path, sidecar)

    rng = np.random.default_rng(seed)
    todo: list[tuple[GridPoint, int]] = []
    skipped: list[str] = []
    for pass_index in range(grid.num_passes):
        order = rng.permutation(len(grid.points))
        for i in order:
            point = grid.points[i]
            if point.num_blocks(runner.block_size) > runner.num_blocks:
                if pass_index == 0:
                    skipped.append(f"{point.name}: needs {point.num_blocks(runner.block_size)} KV blocks, "
                                   f"the pool has {runner.num_blocks}")
                continue
            if (point.name, pass_index) not in done:
                todo.append((point, pass_index))
    resumed = len(done)
    if max_points is not None:
        todo = todo[:max_points]

    new_file = not csv_path.is_file() or csv_path.stat().st_size == 0
    bar = _progress(len(todo), f"profile {grid.name}", progress)
    measured = 0
    with csv_path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        if new_file:
            writer.writeheader()
            fh.flush()
        clock = Clock(info.clock)
        for point, pass_index in todo:
            timings = measure_point(runner, point, grid.policy, vocab_size=vocab_size, seed=seed, clock=clock)
            writer.writerow(_row(PointResult(point, pass_index, timings), info.num_layers))
            fh.flush()
            os.fsync(fh.fileno())
            if resuming and measured == 0:
                _write_sidecar(csv_path, sidecar)
            measured += 1
            if bar is not None:
                bar.set_postfix_str(f"{point.name} {timings.device.median_s * 1e3:.2f} ms", refresh=False)
                bar.update(1)
    if bar is not None:
        bar.close()
    return ProfileRun(csv_path=csv_path, measured=measured, resumed=resumed, skipped=skipped)


PASS_AGGREGATES = ("min", "mean")
"""How ``aggregate_passes`` combines a point's passes."""


def aggregate_passes(df: pd.DataFrame, how: str = "min") -> pd.DataFrame:
    """One row per grid point from its passes; with one pass this is the identity. Repeats inside a pass
    are still summarised by their median.

    ``min`` (default): the pass with the smallest median device time (its cycle time with it). Contention
    from other processes on a shared host only adds time, so across passes measured at different moments
    the smallest median is the least-disturbed estimate.
    ``mean``: the mean of the passes' medians, for a quiet host whose remaining pass-to-pass spread is
    drift in both directions (CPU clock, cache and allocator state): the minimum of noisy passes is biased
    low, and the engine later runs at the average speed, not the best."""
    if how not in PASS_AGGREGATES:
        raise ValueError(f"unknown pass aggregate {how!r}; known: {', '.join(PASS_AGGREGATES)}")
    if df.empty or df["pass_index"].nunique() <= 1:
        return df.reset_index(drop=True)
    best = df.loc[df.groupby("point", sort=False)["device_s"].idxmin()]
    best = best.sort_index().reset_index(drop=True)
    if how == "min":
        return best
    numeric = [c for c in df.columns if c not in ("point", "kind", "pass_index") and
               pd.api.types.is_float_dtype(df[c])]
    means = df.groupby("point", sort=False)[numeric].mean()
    best[numeric] = means.loc[best["point"]].to_numpy()
    return best


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled or total == 0:
        return None
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="pt", file=sys.stderr, mininterval=0.5, leave=True)
