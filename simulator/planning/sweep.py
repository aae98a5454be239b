"""Sweeps: a grid of scenario overrides × seeds, run as independent tasks, merged into one table.

A grid file names a scenario, the seeds, the grid (dotted key -> list of values; the cartesian product is
taken) and fixed overrides (``set:``) applied to every point::

    scenario: ../quickstart.yaml          # relative to the grid file
    seeds: [0, 1]
    set: {workload.num_requests: 200}
    grid:
      fleet.replicas: [1, 2, 4]
      engine.max_num_batched_tokens: [2048, 8192]

Each (point, seed) is one task: ``run_task`` — a top-level function of picklable arguments, so it runs
unchanged under the ``spawn`` start method and as a Ray remote task — loads the scenario with the point's
overrides, runs it and returns one row per variant: the overrides as columns, the summary metrics, and
``error`` (None, or what went wrong: a bad override fails its own task and no other). Executors: a local
process pool (default) or a Ray cluster (``pip install 'fleetsim[ray]'``). The same tasks give identical
rows on either, because a run depends only on its scenario and seed.

Never imported by the simulator's hot path; results are written only by ``save_sweep``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import multiprocessing
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar, cast

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator import yaml_text
from simulator.cost.profile import config_error_from_validation
from simulator.errors import ConfigError
from simulator.scenario import SEED_LIMIT, deep_merge, expand_dotted
from simulator.worker_pool import explained, spawn_pool

__all__ = [
    "Executor",
    "GridFile",
    "SweepTask",
    "build_tasks",
    "load_grid",
    "pareto_figure",
    "pareto_front",
    "run_task",
    "run_tasks",
    "save_sweep",
    "sweep",
]

T = TypeVar("T")
R = TypeVar("R")


class Executor(StrEnum):
    """Where sweep tasks run."""

    LOCAL = "local"
    """A process pool on this machine (spawn start method), or in this process with one worker."""
    RAY = "ray"
    """Remote tasks on a Ray cluster (``ray.init(address=...)``; a local one when no address is given)."""


class GridFile(BaseModel):
    """A sweep's grid file."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)

    scenario: str
    """Scenario YAML, relative to the grid file's folder."""
    seeds: list[Annotated[int, Field(ge=0, lt=SEED_LIMIT)]] = Field(default_factory=lambda: [0], min_length=1)
    """Seeds every grid point runs with; each (point, seed) is one task."""
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    """Dotted scenario key -> values; the sweep runs the cartesian product of all lists."""
    overrides: dict[str, Any] = Field(default_factory=dict, alias="set")
    """Dotted scenario key -> value applied to every point (e.g. a small ``workload.num_requests``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepTask:
    """One independent run: a scenario mapping, the grid point's overrides and a seed (all picklable)."""

    task_id: int
    raw: dict[str, Any]
    """The scenario mapping after the grid's ``set:`` overrides, before this point's."""
    source: str | None
    """The scenario file (relative trace paths resolve against its folder)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """The grid point: dotted key -> value."""
    seed: int = 0


# ----- grid -> tasks -------------------------------------------------------------------------------------


def load_grid(path: str | Path) -> tuple[GridFile, dict[str, Any], Path]:
    """(the grid, the scenario's raw mapping with ``set:`` applied, the scenario path)."""
    path = Path(path)
    try:
        doc = yaml_text.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read grid: {err.strerror}", file=path) from None
    except UnicodeDecodeError:
        raise ConfigError("not a text file: a grid is YAML text", file=path) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"not valid YAML ({getattr(err, 'problem', None) or err})", file=path) from None
    if not isinstance(doc, dict):
        raise ConfigError("a grid file must be a YAML mapping", file=path)
    try:
        grid = GridFile.model_validate(doc)
    except ValidationError as err:
        raise config_error_from_validation(err, GridFile, file=path) from None
    for key, values in grid.grid.items():
        if not values:
            raise ConfigError("a grid axis needs at least one value", file=path, field=f"grid.{key}")
    scenario_path = (path.parent / grid.scenario).resolve()
    try:
        raw = yaml_text.safe_load(scenario_path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read scenario {scenario_path}: {err.strerror}", file=path,
                          field="scenario") from None
    except (UnicodeDecodeError, yaml.YAMLError):
        raise ConfigError("not a YAML text file", file=scenario_path) from None
    if not isinstance(raw, dict):
        raise ConfigError("the scenario must be a YAML mapping", file=scenario_path)
    raw = deep_merge(raw, expand_dotted(grid.overrides))
    _check_axes(raw, grid.grid, scenario_path, grid_file=path)
    return grid, raw, scenario_path


def _check_axes(raw: dict[str, Any], grid: Mapping[str, Sequence[Any]], scenario_path: Path, *,
                grid_file: Path) -> None:
    """An axis none of whose values loads (a key typo, say) is one error now, not a failure in every task
    after the whole sweep ran. A bad value beside good ones stays that point's error row: one impossible
    point does not sink a sweep."""
    from simulator.scenario import load_mapping

    for key, values in grid.items():
        first_error: ConfigError | None = None
        for value in values:
            try:
                load_mapping(deep_merge(raw, expand_dotted({key: value})), source=scenario_path)
                break
            except ConfigError as err:
                first_error = first_error or err
        else:
            assert first_error is not None  # an axis has at least one value
            raise ConfigError(f"no value of this axis loads; with {values[0]!r}: {first_error.message}",
                              file=grid_file, field=f"grid.{key}")


def build_tasks(raw: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], seeds: Sequence[int], *,
                source: str | Path | None = None) -> list[SweepTask]:
    """The cartesian product of ``grid`` × ``seeds``, points in grid order, seeds innermost."""
    keys = list(grid)
    points = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]
    src = str(source) if source is not None else None
    return [
        SweepTask(task_id=i, raw=dict(raw), source=src, overrides=point, seed=int(seed))
        for i, (point, seed) in enumerate(itertools.product(points, seeds))
    ]


# ----- one task ------------------------------------------------------------------------------------------


def run_task(task: SweepTask) -> list[dict[str, Any]]:
    """Run one task; one row per variant, or one row with ``error`` set. Never raises for a bad scenario."""
    from simulator.scenario import load_mapping
    from simulator.simulation import run  # imported here so that a spawned worker pays for it once, on first use

    head: dict[str, Any] = {"task_id": task.task_id, "seed": task.seed, **task.overrides}
    try:
        raw = deep_merge(task.raw, expand_dotted(task.overrides))
        loaded = load_mapping(raw, seed=task.seed, source=Path(task.source) if task.source else None)
        result = run(loaded)
    except Exception as err:  # a failed task becomes a row: the sweep goes on
        message = str(err) if isinstance(err, ConfigError) else "".join(
            traceback.format_exception_only(type(err), err)).strip()
        return [{**head, "variant": None, "error": message}]
    return [
        {**head, "variant": name, **variant.summary.to_dict(), "error": None}
        for name, variant in result.variants.items()
    ]


def _crashed_row(task: SweepTask, err: BaseException) -> list[dict[str, Any]]:
    """The row of a task whose worker died (``run_task`` itself never raises for a bad scenario)."""
    return [{"task_id": task.task_id, "seed": task.seed, **task.overrides, "variant": None,
             "error": f"worker failed: {type(err).__name__}: {err}"}]


# ----- executors -----------------------------------------------------------------------------------------


class _Progress(Protocol):
    def update(self, n: int = 1) -> object: ...


OnError = Callable[[T, BaseException], R]
"""on_error(item, exception) -> the result to record for an item whose task raised or whose worker died."""


def run_tasks(fn: Callable[[T], R], items: Sequence[T], *, executor: Executor | str = Executor.LOCAL,
              workers: int | None = None, address: str | None = None, progress: _Progress | None = None,
              on_error: OnError[T, R] | None = None) -> list[R]:
    """``[fn(item) for item in items]`` on the chosen executor, in input order.

    ``fn`` must be a top-level function and ``items`` picklable. A task that raises (or whose worker
    process dies) gives ``on_error(item, exception)``; without ``on_error`` the first such exception
    propagates.
    """
    executor = Executor(executor)
    if executor is Executor.RAY:
        return _run_ray(fn, items, address=address, workers=workers, progress=progress, on_error=on_error)
    return list(_run_local(fn, items, workers=workers, progress=progress, on_error=on_error))


def _outcome(item: T, get: Callable[[], R], on_error: OnError[T, R] | None) -> R:
    try:
        return get()
    except Exception as err:
        if on_error is None:
            raise
        return on_error(item, err)


def _result(future: Future[R]) -> R:
    with explained("running a sweep task", "workers=1 (--workers 1)"):
        return future.result()


def _run_local(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None,
               progress: _Progress | None, on_error: OnError[T, R] | None) -> Iterator[R]:
    num_workers = min(workers or multiprocessing.cpu_count(), max(len(items), 1))
    if num_workers <= 1:
        for item in items:
            out = _outcome(item, functools.partial(fn, item), on_error)
            if progress is not None:
                progress.update(1)
            yield out
        return
    with spawn_pool(num_workers) as pool:
        futures: dict[Future[R], int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
        results: dict[int, R] = {}
        for future in as_completed(futures):
            i = futures[future]
            # A worker that died breaks the pool: this task and every one left get ``WorkerDied`` (the tasks
            # done keep their results).
            results[i] = _outcome(items[i], functools.partial(_result, future), on_error)
            if progress is not None:
                progress.update(1)
    yield from (results[i] for i in range(len(items)))


def _run_ray(fn: Callable[[T], R], items: Sequence[T], *, address: str | None, workers: int | None,
             progress: _Progress | None, on_error: OnError[T, R] | None) -> list[R]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'fleetsim[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=workers if address is None else None,
                 include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, R] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = index[ref]
                get = cast(Callable[[], R], functools.partial(ray.get, ref))  # ray.get's stubs know no R
                results[i] = _outcome(items[i], get, on_error)
                if progress is not None:
                    progress.update(1)
        return [results[i] for i in range(len(items))]
    finally:
        if started:
            ray.shutdown()


# ----- the whole sweep -----------------------------------------------------------------------------------


def sweep(
    grid: str | Path | Mapping[str, Any],
    *,
    executor: Executor | str = Executor.LOCAL,
    workers: int | None = None,
    address: str | None = None,
    show_progress: bool = True,
) -> pd.DataFrame:
    """Run a grid (a grid file, or the same mapping in code with ``scenario`` a path) -> one row per task
    and variant: ``task_id``, ``seed``, one column per grid key, ``variant``, the summary metrics, ``error``.

    Failed tasks are reported on stderr with their overrides and kept as rows with ``error`` set.
    """
    if isinstance(grid, Mapping):
        spec = GridFile.model_validate(dict(grid))
        scenario_path = Path(spec.scenario).resolve()
        raw = deep_merge(yaml_text.safe_load(scenario_path.read_text()), expand_dotted(spec.overrides))
    else:
        spec, raw, scenario_path = load_grid(grid)
    tasks = build_tasks(raw, spec.grid, spec.seeds, source=scenario_path)
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), desc="sweep", unit="task", file=sys.stderr, mininterval=0.5)
    try:
        nested = run_tasks(run_task, tasks, executor=executor, workers=workers, address=address, progress=bar,
                           on_error=_crashed_row)
    finally:
        if bar is not None:
            bar.close()
    rows = [row for task_rows in nested for row in task_rows]
    for row in rows:
        if row["error"] is not None:
            point = ", ".join(f"{k}={row[k]!r}" for k in spec.grid)
            print(f"fleetsim: sweep task {row['task_id']} ({point}; seed {row['seed']}) failed: {row['error']}",
                  file=sys.stderr)
    return results_frame(rows, list(spec.grid))


def results_frame(rows: Iterable[Mapping[str, Any]], grid_keys: Sequence[str]) -> pd.DataFrame:
    """Rows -> a DataFrame with a stable column order: ids, grid keys, variant, metrics, error."""
    frame = pd.DataFrame(list(rows))
    head = ["task_id", "seed", *grid_keys, "variant"]
    metrics = [c for c in frame.columns if c not in (*head, "error")]
    frame = frame.reindex(columns=[*head, *metrics, "error"])
    for key in grid_keys:  # parquet wants one type per column: mixed or nested values become text
        values = frame[key].dropna()
        kinds = {type(v) for v in values}
        if len(kinds) > 1 or not kinds <= {int, float, bool, str}:
            frame[key] = frame[key].map(lambda v: None if v is None else json.dumps(v, default=str))
    return frame.sort_values(["task_id", "variant"], kind="stable", na_position="first").reset_index(drop=True)


# ----- Pareto view ---------------------------------------------------------------------------------------


def pareto_front(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> np.ndarray:
    """Boolean mask of the points no other point beats on both (lower ``x`` and lower ``y``, one strictly).
    NaN points are never on the front."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    finite = np.isfinite(xs) & np.isfinite(ys)
    front = np.zeros(len(xs), dtype=bool)
    best_y = math.inf
    # Sweep by x ascending (ties: lower y first); a point is on the front when its y beats every earlier y.
    for i in np.lexsort((ys, xs)):
        if finite[i] and ys[i] < best_y:
            front[i] = True
            best_y = ys[i]
    return front


def pareto_points(frame: pd.DataFrame, grid_keys: Sequence[str], *, x: str = "cost_per_mtok_usd",
                  y: str = "e2e_p99_ms") -> pd.DataFrame:
    """Successful rows averaged over seeds per grid point and variant, with an ``on_front`` column."""
    ok = frame[frame["error"].isna()]
    keys = [*grid_keys, "variant"]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, x, y, "slo_attainment", "num_seeds", "on_front"])
    points = (
        ok.groupby(keys, dropna=False, sort=False)
        .agg(**{x: (x, "mean"), y: (y, "mean"), "slo_attainment": ("slo_attainment", "mean"),
                "num_seeds": ("seed", "count")})
        .reset_index()
    )
    points["on_front"] = pareto_front(points[x].to_numpy(), points[y].to_numpy())
    return points


def pareto_figure(frame: pd.DataFrame, grid_keys: Sequence[str], *, x: str = "cost_per_mtok_usd",
                  y: str = "e2e_p99_ms") -> Any:
    """A plotly scatter of every grid point (mean over seeds), the Pareto front highlighted and joined."""
    import plotly.graph_objects as go

    points = pareto_points(frame, grid_keys, x=x, y=y)
    labels = [
        "<br>".join(f"{k}={row[k]}" for k in [*grid_keys, "variant"])
        + f"<br>{x}={row[x]:.4g}<br>{y}={row[y]:.4g}<br>SLO attainment={row['slo_attainment']:.3f}"
        for _, row in points.iterrows()
    ]
    on = points["on_front"].to_numpy(dtype=bool)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=points[x][~on], y=points[y][~on], mode="markers", name="dominated",
        marker={"color": "#9aa5b1", "size": 8}, hovertext=[t for t, f in zip(labels, on, strict=True) if not f],
        hoverinfo="text",
    ))
    front = points[on].sort_values(x)
    fig.add_trace(go.Scatter(
        x=front[x], y=front[y], mode="lines+markers", name="Pareto front",
        marker={"color": "#d62728", "size": 11}, line={"color": "#d62728"},
        hovertext=[labels[i] for i in front.index], hoverinfo="text",
    ))
    fig.update_layout(
        title="Sweep: cost vs tail latency (mean over seeds; lower-left is better)",
        xaxis_title=x.replace("_", " "), yaxis_title=y.replace("_", " "), template="plotly_white",
    )
    return fig


def save_sweep(frame: pd.DataFrame, grid_keys: Sequence[str], out_dir: str | Path, *,
               latency: str = "e2e_p99_ms") -> dict[str, Path]:
    """Write sweep.parquet, sweep.csv and pareto.html into ``out_dir``; returns the paths by kind."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"parquet": out / "sweep.parquet", "csv": out / "sweep.csv", "html": out / "pareto.html"}
    frame.to_parquet(paths["parquet"], index=False)
    frame.to_csv(paths["csv"], index=False)
    fig = pareto_figure(frame, grid_keys, y=latency)
    paths["html"].write_text(fig.to_html(include_plotlyjs=True, full_html=True, config={"displaylogo": False}),
                             encoding="utf-8")
    return paths
