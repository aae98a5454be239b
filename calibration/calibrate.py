"""The calibration pipeline behind ``fleetsim calibrate``: profile the real engine, fit, write a measured profile.

``calibrate`` reads as its steps: resolve the settings (every default the device decides) → build the model
runner (a KV pool that fits next to the weights) → choose the clock → measure the grid into the timings CSV
(a rerun resumes into it) → fit the device terms (calibration/fit.py) → read the memory figures off the
runner → fit the host terms on the engine's own step loop → write the measured Profile with its held-out
error and provenance, and a measured-vs-predicted plot, all next to the profile YAML.

``calibration/cli.py`` is only the argparse glue around it; tests and the device script call ``calibrate``
directly. Importing this module must stay cheap (``fleetsim`` imports it when it builds its parser): torch,
pandas and the engine are imported inside the steps, never at module level.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from simulator.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from calibration.engine.configs import ModelShape
    from calibration.engine.runner import ModelRunner
    from calibration.fit import FitResult
    from calibration.grid import Grid
    from calibration.profiler import Clock, ProfileRun, RunInfo
    from simulator.cost.profile import CommModel, MemoryFigures

DEFAULT_CPU_KV_GIB = 0.25
"""KV pool of a CPU engine: large enough for the validation workloads, small enough to stay in the regime
where CPU timings are steady (research §3.2 saw erratic times above ~250 MB)."""

CPU_MEMORY_FRACTION = 0.9
"""Stated in the profile's memory figures; a CPU's KV capacity is the --kv-gib budget, not a fraction."""


@dataclass(frozen=True, slots=True)
class CalibrationOutputs:
    profile_path: Path
    csv_path: Path
    html_path: Path
    profile: Any
    """The measured simulator.cost.profile.Profile written."""
    skipped: list[str]
    knee_fitted: bool


def _torch_dtype(name: str) -> Any:
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    try:
        return dtypes[name]
    except KeyError:
        raise ConfigError(f"unknown dtype {name!r}; known: {', '.join(dtypes)}", field="dtype") from None


def hardware_label(device: str, explicit: str | None = None) -> str:
    """The profile's ``hardware``: 'CPU' on CPU; on a GPU the hardware.yaml key its name contains."""
    if explicit:
        return explicit
    if not device.startswith("cuda"):
        return "CPU"
    from calibration.profiler import device_name
    from simulator.cost.profile import load_hardware

    name = device_name(device).upper()
    for key in sorted(load_hardware(), key=len, reverse=True):
        if key.upper() in name:
            return key
    raise ConfigError(f"cannot tell which hardware.yaml entry {name!r} is; pass --hardware", field="hardware")


def measure_copy_bandwidth(device: str, num_bytes: int = 64 << 20) -> float:
    """One-direction host link bandwidth, bytes/s: pinned host→device copies on a GPU, a memcpy on CPU
    (what a swap preemption moves KV through)."""
    import torch

    from calibration.timing import RepeatPolicy, repeat, summarize

    n = num_bytes // 4
    if device.startswith("cuda"):
        src = torch.empty(n, dtype=torch.float32, pin_memory=True).normal_()
        dst = torch.empty(n, dtype=torch.float32, device=device)

        def copy() -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            return time.perf_counter() - t0
    else:
        src = torch.empty(n, dtype=torch.float32).normal_()
        dst = torch.empty_like(src)

        def copy() -> float:
            t0 = time.perf_counter()
            dst.copy_(src)
            return time.perf_counter() - t0

    stats = summarize(repeat(copy, RepeatPolicy(num_warmup=2, num_repeats=7, min_repeats=3)))
    return num_bytes / stats.median_s


def _weight_bytes(runner: Any) -> int:
    return int(sum(p.numel() * p.element_size() for p in runner.model.parameters()))


HOST_TRACE_REQUESTS = 48
"""Requests of the synthetic engine run the host terms are fitted on (all arrive at once)."""

HOST_TRACE_MAX_STEPS = 160
"""Cap on its steps: enough rows for three host coefficients over batch sizes 1 to 32."""


def engine_host_steps(model: str, tp: int, *, device: str, dtype: Any, backend: str, cuda_graphs: bool,
                      seed: int = 0, thread_cpu: bool = False) -> Any:
    """Steps of the real engine on a synthetic burst (prompts 16–256, outputs 4–48 tokens, batch up to 32):
    a DataFrame of num_seqs, num_new_tokens, device_s, cycle_s per step, for ``fit_host``.

    With ``thread_cpu`` each step's thread CPU time is split into device and host in the proportion of its
    wall-clock record (as the profiler does), so host terms are on the same clock as the device terms."""
    import numpy as np
    import pandas as pd

    from calibration.engine.configs import get_model
    from calibration.engine.engine import Engine
    from simulator.core.config import SchedulerConfig
    from simulator.core.request import RequestSpec

    rng = np.random.default_rng(seed)
    config = SchedulerConfig(num_blocks=2048, block_size=16, max_num_seqs=32, max_num_batched_tokens=256,
                             enable_prefix_caching=False, max_model_len=2048)
    engine = Engine(get_model(model, tp), config, device=device, dtype=dtype, backend=backend, seed=seed,
                    cuda_graphs=cuda_graphs)
    # Graphs captured before any step is timed: captured on first use, each capture lands in a step's cycle
    # time and not its device time (the H200 run of 2026-12-04 read 14.3 ms of host per step that way; the
    # engine's own steps measured 0.3-0.9 ms).
    max_prompt, max_output = 256, 48
    engine.runner.capture_graphs_upto(config.max_num_seqs, max_prompt + max_output)
    for i in range(HOST_TRACE_REQUESTS):
        engine.add_request(RequestSpec(i, 0.0, int(rng.integers(16, max_prompt + 1)),
                                       int(rng.integers(4, max_output + 1))))
    rows: list[tuple[int, int, float, float]] = []
    while engine.has_work and len(rows) < HOST_TRACE_MAX_STEPS:
        cpu0 = time.thread_time()
        record = engine.step()
        cpu_s = time.thread_time() - cpu0
        if record.shape.num_seqs == 0 or record.cycle_s <= 0:
            continue
        if thread_cpu:
            device_s, cycle_s = cpu_s * record.device_s / record.cycle_s, cpu_s
        else:
            device_s, cycle_s = record.device_s, record.cycle_s
        rows.append((record.shape.num_seqs, record.shape.num_new_tokens, device_s, cycle_s))
    rows = rows[4:]  # the first steps pay one-time costs
    return pd.DataFrame(rows, columns=["num_seqs", "num_new_tokens", "device_s", "cycle_s"])


# ----- the pipeline ------------------------------------------------------------------------------------


def calibrate(
    *,
    device: str,
    model: str,
    out: str | Path,
    tp: int = 1,
    grid: str | None = None,
    dtype: str | None = None,
    backend: str | None = None,
    cuda_graphs: bool | None = None,
    kv_gib: float = DEFAULT_CPU_KV_GIB,
    memory_fraction: float = 0.9,
    threads: int | None = 1,
    hardware: str | None = None,
    folds: int = 5,
    seed: int = 0,
    progress: bool = True,
    host_from: Literal["engine", "grid"] = "engine",
    clock: Literal["auto", "runner", "thread_cpu"] = "auto",
    multi_token: bool | None = None,
    pass_aggregate: str = "mean",
    command: str | None = None,
) -> CalibrationOutputs:
    """Profile ``model`` (at ``tp`` shapes) on ``device``, fit, and write a measured profile.

    Files: ``out`` (profile YAML), ``out`` with .csv (raw timings; rerunning resumes into it),
    .provenance.json (its sidecar) and .html (measured vs held-out predicted step time).

    ``clock``: ``auto`` reads CPU steps on the thread's CPU time when torch runs one thread (immune to
    other processes on a shared host), else the runner's clocks (CUDA events on a GPU); ``runner`` or
    ``thread_cpu`` force one.

    ``multi_token``: fit the fixed extra time m of steps with more than one new token (default: on CPU,
    where one-token matmuls run as matrix-vector kernels). ``command``: the command line, recorded in the
    profile's provenance. ``pass_aggregate``: how each point's passes are combined (``mean``: default, the
    engine later runs at the average speed; ``min``: least disturbed, for a host shared with other jobs;
    see ``profiler.aggregate_passes``).
    """
    import torch

    settings = resolve_settings(
        device=device, model=model, out=out, tp=tp, grid=grid, dtype=dtype, backend=backend, cuda_graphs=cuda_graphs,
        kv_gib=kv_gib, memory_fraction=memory_fraction, threads=threads, hardware=hardware, folds=folds, seed=seed,
        progress=progress, host_from=host_from, clock=clock, multi_token=multi_token, pass_aggregate=pass_aggregate,
        command=command,
    )
    info = run_info(settings, choose_clock(settings))
    check_outputs(settings, info)  # before the model loads: a CSV of other settings is refused at once
    runner = build_runner(settings)
    timings = measure_grid(settings, runner, info)
    graph_batch_sizes = tuple(runner.graph_batch_sizes) if settings.cuda_graphs else ()
    result, knee_fitted = fit_device_terms(settings, timings.points, graph_max=max(graph_batch_sizes, default=0))
    memory = memory_figures(settings, runner)
    del runner  # the engine below builds its own model and pool
    if settings.cuda:
        torch.cuda.empty_cache()
    result, num_engine_steps = fit_host_terms(settings, timings.clock, result)
    comm = analytic_comm(settings)
    source = provenance_source(settings, timings, result, knee_fitted=knee_fitted, num_engine_steps=num_engine_steps,
                               comm=comm)
    return write_outputs(settings, timings, result, memory=memory, comm=comm, graph_batch_sizes=graph_batch_sizes,
                         source=source, knee_fitted=knee_fitted)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationSettings:
    """One calibration's settings with every default resolved; fixed before anything is measured."""

    device: str
    """torch device: cpu, cuda or cuda:N."""
    cuda: bool
    """Whether ``device`` is a GPU (it decides the defaults below)."""
    model: str
    """Model name (calibration/engine/configs.py)."""
    tp: int
    """Tensor-parallel degree: one rank's shard is profiled."""
    shape: ModelShape
    """``model`` at ``tp``."""
    dtype: str
    """float32 (CPU default) or bfloat16 (GPU default)."""
    torch_dtype: Any
    """``dtype`` as a torch dtype."""
    backend: str
    """Attention backend: sdpa_gather on CPU, triton_paged on GPU by default."""
    cuda_graphs: bool
    """Decode through CUDA graphs (default: on a GPU with triton_paged)."""
    grid: Grid
    """The grid measured (default: the device's preset)."""
    hardware: str
    """The profile's hardware label (``hardware_label``)."""
    out: Path
    """The profile YAML; the CSV, sidecar and plot are named after it."""
    kv_gib: float
    """CPU KV pool budget, GiB."""
    memory_fraction: float
    """Share of GPU memory the engine may use."""
    folds: int
    """k of the held-out k-fold error."""
    seed: int
    """Seed of the grid's order, token ids and folds."""
    progress: bool
    """Show a progress bar while the grid runs."""
    host_from: Literal["engine", "grid"]
    """Fit host overhead on engine steps (scheduler included) or on the grid's forced steps."""
    clock: Literal["auto", "runner", "thread_cpu"]
    """The clock asked for; ``choose_clock`` settles ``auto`` once the runner exists."""
    multi_token: bool
    """Fit the fixed extra time of steps with more than one new token (default: on CPU)."""
    pass_aggregate: str
    """How each grid point's passes are combined (``profiler.aggregate_passes``)."""
    command: str | None
    """The command line, recorded in the profile's provenance."""
    block_size: int = 16
    """KV block size of the runner the grid runs on, tokens."""

    @property
    def csv_path(self) -> Path:
        return self.out.with_suffix(".csv")

    @property
    def html_path(self) -> Path:
        return self.out.with_suffix(".html")


def resolve_settings(*, device: str, model: str, out: str | Path, tp: int, grid: str | None, dtype: str | None,
                     backend: str | None, cuda_graphs: bool | None, kv_gib: float, memory_fraction: float,
                     threads: int | None, hardware: str | None, folds: int, seed: int, progress: bool,
                     host_from: Literal["engine", "grid"], clock: Literal["auto", "runner", "thread_cpu"],
                     multi_token: bool | None, pass_aggregate: str, command: str | None) -> CalibrationSettings:
    """Check the device, set torch's CPU threads, and fill in every default the device decides."""
    import torch

    from calibration.engine.configs import get_model
    from calibration.grid import get_grid

    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ConfigError("--device cuda but no CUDA device is visible", field="device")
    if not cuda and threads:
        torch.set_num_threads(threads)
    dtype = dtype or ("bfloat16" if cuda else "float32")
    backend = backend or ("triton_paged" if cuda else "sdpa_gather")
    cuda_graphs = cuda and backend == "triton_paged" if cuda_graphs is None else cuda_graphs
    grid_obj = get_grid(grid or ("gpu" if cuda else "cpu"))
    try:
        shape = get_model(model, tp)
    except ValueError as bad:
        raise ConfigError(str(bad), field="model") from None
    return CalibrationSettings(
        device=device, cuda=cuda, model=model, tp=tp, shape=shape, dtype=dtype, torch_dtype=_torch_dtype(dtype),
        backend=backend, cuda_graphs=bool(cuda_graphs), grid=grid_obj, hardware=hardware_label(device, hardware),
        out=Path(out), kv_gib=kv_gib, memory_fraction=memory_fraction, folds=folds, seed=seed, progress=progress,
        host_from=host_from, clock=clock, multi_token=not cuda if multi_token is None else multi_token,
        pass_aggregate=pass_aggregate, command=command,
    )


def build_runner(settings: CalibrationSettings) -> ModelRunner:
    """The model runner the grid runs on, its KV pool sized for the grid's largest point."""
    import torch

    from calibration.engine.runner import ModelRunner

    shape, block_size = settings.shape, settings.block_size
    num_blocks = settings.grid.max_blocks(block_size)
    kv_per_token = shape.kv_bytes_per_token(torch.empty((), dtype=settings.torch_dtype).element_size())
    if settings.cuda:  # never allocate a pool larger than what fits next to the weights
        free, _ = torch.cuda.mem_get_info(torch.device(settings.device))
        weights = shape.num_params * torch.empty((), dtype=settings.torch_dtype).element_size()
        fits = int((free * settings.memory_fraction - weights - (4 << 30)) // (kv_per_token * block_size))
        num_blocks = max(1, min(num_blocks, fits))
    return ModelRunner(shape, device=settings.device, dtype=settings.torch_dtype, num_blocks=num_blocks,
                       block_size=block_size, backend=settings.backend, seed=settings.seed,
                       cuda_graphs=settings.cuda_graphs)


def choose_clock(settings: CalibrationSettings) -> Clock:
    """The clock the grid is read on: ``auto`` is thread CPU time on a CPU with one torch thread, else the
    runner's clocks."""
    import torch

    from calibration.profiler import Clock

    if settings.clock == "auto":
        chosen = Clock.THREAD_CPU if not settings.cuda and torch.get_num_threads() == 1 else Clock.RUNNER
    else:
        chosen = Clock(settings.clock)
    if chosen is Clock.THREAD_CPU and (settings.cuda or torch.get_num_threads() != 1):
        raise ConfigError("the thread_cpu clock needs a CPU device and one torch thread (--threads 1)",
                          field="clock")
    return chosen


@dataclass(frozen=True, slots=True)
class GridTimings:
    """The grid as measured: the run (and what it skipped), the points to fit, and how they were read."""

    run: ProfileRun
    points: pd.DataFrame
    """One row per grid point, its passes combined by ``pass_aggregate``: what the fit reads."""
    info: RunInfo
    """The timings CSV's sidecar provenance."""
    clock: Clock


def run_info(settings: CalibrationSettings, clock: Clock) -> RunInfo:
    """The timings CSV's sidecar provenance: every setting that changes a timing, and when and where."""
    import torch

    from calibration.profiler import RunInfo, device_name, engine_version, git_revision, library_versions

    return RunInfo(
        clock=clock.value, model=settings.model, dtype=settings.dtype, backend=settings.backend,
        device_type="cuda" if settings.cuda else "cpu", grid=settings.grid.name, block_size=settings.block_size,
        num_layers=settings.shape.num_layers, cuda_graphs=settings.cuda_graphs,
        device_name=device_name(settings.device), library_versions=library_versions(), git_revision=git_revision(),
        torch_threads=torch.get_num_threads(), seed=settings.seed, engine_version=engine_version(),
        extra={"tp": settings.tp, "hardware": settings.hardware},
    )


def check_outputs(settings: CalibrationSettings, info: RunInfo) -> None:
    """An existing timings CSV is resumed only when it was measured with the same settings
    (``profiler.check_resumable``); nothing is written here."""
    from calibration.profiler import check_resumable

    csv_path = settings.csv_path
    if csv_path.is_file() and csv_path.stat().st_size > 0:
        check_resumable(csv_path, info)


def measure_grid(settings: CalibrationSettings, runner: ModelRunner, info: RunInfo) -> GridTimings:
    """Time every grid point not yet in the timings CSV, appending each row as it is measured."""
    from calibration.profiler import Clock, run_grid

    run = run_grid(runner, settings.grid, settings.csv_path, info, vocab_size=runner.shape.vocab_size,
                   seed=settings.seed, progress=settings.progress)
    points = run.points_frame(settings.pass_aggregate)
    if len(points) < 4:
        raise ConfigError(f"only {len(points)} grid points measured: too few to fit", file=settings.csv_path)
    return GridTimings(run=run, points=points, info=info, clock=Clock(info.clock))


def fit_device_terms(settings: CalibrationSettings, points: pd.DataFrame, *,
                     graph_max: int = 0) -> tuple[FitResult, bool]:
    """The fit of the grid's points, and whether its knee exponent was fitted (else fixed). ``graph_max``:
    the largest decode batch the runner replayed as a CUDA graph (0: none), for the eager floor."""
    from calibration.fit import best_fit
    from simulator.cost.profile import list_profiles, load_profile

    # Roofline start when an analytic profile of this hardware/model/tp exists (GPU); else a linear guess.
    initial = None
    analytic_name = f"{settings.hardware.lower()}-{settings.model}-tp{settings.tp}-analytic"
    if analytic_name in list_profiles():
        initial = load_profile(analytic_name).device_s
    # The knee exponent is fitted only when the grid reaches the compute-bound side; both fits are
    # cross-validated the same way and the lower held-out error is kept (recorded in the source).
    return best_fit(points, num_folds=settings.folds, seed=settings.seed, initial=initial,
                    multi_token=settings.multi_token, graph_max=graph_max)


def memory_figures(settings: CalibrationSettings, runner: ModelRunner) -> MemoryFigures:
    """KV figures as measured on the engine: bytes per token from the pool the runner allocated; capacity
    from the device's memory (GPU) or the --kv-gib budget (CPU)."""
    import torch

    from calibration.engine.kv_cache import kv_budget_bytes, num_blocks_for_budget
    from simulator.cost.profile import MemoryFigures

    pool = runner.kv_cache
    measured_kv_per_token = pool.num_bytes // (pool.num_blocks * pool.block_size)
    weight_bytes = _weight_bytes(runner)
    if settings.cuda:
        dev = torch.device(settings.device)
        total = torch.cuda.get_device_properties(dev).total_memory
        activations = max(0, torch.cuda.max_memory_allocated(dev) - weight_bytes - pool.num_bytes)
        kv_bytes = int(total * settings.memory_fraction) - weight_bytes - activations
        device_memory = int(total)
    else:
        import os

        device_memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        kv_bytes = kv_budget_bytes("cpu", memory_fraction=1.0, cpu_memory_bytes=int(settings.kv_gib * 2**30))
        activations = 0
    block_size = settings.block_size
    capacity_blocks = num_blocks_for_budget(runner.shape, block_size, settings.torch_dtype, max(kv_bytes, 0))
    return MemoryFigures(
        kv_bytes_per_token=measured_kv_per_token,
        kv_capacity_tokens=capacity_blocks * block_size,
        weight_bytes=weight_bytes,
        device_memory_bytes=device_memory,
        memory_fraction=settings.memory_fraction if settings.cuda else CPU_MEMORY_FRACTION,
        activation_bytes=activations,
    )


def fit_host_terms(settings: CalibrationSettings, clock: Clock, result: FitResult) -> tuple[FitResult, int | None]:
    """``result`` with host terms fitted on the engine's own step loop (schedule, input preparation,
    sampling sync, update), and the number of engine steps they came from; unchanged (None) when they come
    from the grid. The profiler's forced steps skip the scheduler, and host time is what separates engines."""
    if settings.host_from != "engine":
        return result, None
    from calibration.fit import fit_host
    from calibration.profiler import Clock

    engine_host = engine_host_steps(settings.model, settings.tp, device=settings.device, dtype=settings.torch_dtype,
                                    backend=settings.backend, cuda_graphs=settings.cuda_graphs, seed=settings.seed,
                                    thread_cpu=clock is Clock.THREAD_CPU)
    return replace(result, host=fit_host(engine_host)), len(engine_host)


def analytic_comm(settings: CalibrationSettings) -> CommModel | None:
    """All-reduce terms when tp > 1: analytic, as one device cannot measure them."""
    if settings.tp <= 1:
        return None
    from calibration.analytic import Efficiencies, comm_model, dtype_bytes
    from simulator.cost.profile import get_accelerator

    return comm_model(get_accelerator(settings.hardware), settings.shape, dtype_bytes(settings.dtype), Efficiencies())


def provenance_source(settings: CalibrationSettings, timings: GridTimings, result: FitResult, *, knee_fitted: bool,
                      num_engine_steps: int | None, comm: CommModel | None) -> str:
    """The profile's ``provenance.source``: how each of its figures was obtained, in one paragraph."""
    s, grid, err, skipped = settings, settings.grid, result.error, timings.run.skipped
    kv_note = (f"KV capacity = the --kv-gib {s.kv_gib:g} GiB CPU budget" if not s.cuda else
               f"KV capacity = {s.memory_fraction} x device memory - weights - measured activation peak")
    return (
        f"Measured: grid '{grid.name}' ({len(timings.points)} points, medians of repeats after warm-ups, "
        f"randomised order, {grid.num_passes} pass(es), "
        f"{'least-disturbed pass' if s.pass_aggregate == 'min' else 'mean of the passes'} per point) "
        f"of {s.model} tp={s.tp} {s.dtype} "
        f"on the fleetsim engine runner (backend {s.backend}, "
        f"CUDA graphs {s.cuda_graphs}, {timings.info.torch_threads} torch threads, clock {timings.clock.value}); "
        f"fitted by calibration.fit "
        f"(relative least squares, soft_l1, knee {'fitted' if knee_fitted else 'fixed'} at "
        f"p={result.device.knee_p:.3g}"
        + (f", multi-token step term m={result.device.multi_token_s * 1e3:.3g} ms" if s.multi_token else "")
        + (f", eager floor E={result.device.eager_floor_s * 1e3:.3g} ms for steps run without a CUDA graph"
           if result.device.eager_floor_s else "")
        + f"); held-out {err.num_folds}-fold MAPE {err.mape:.2%}, max "
        f"{err.max_error:.2%}; host terms from cycle - device time of "
        + (f"{num_engine_steps} engine steps (scheduler loop included)" if num_engine_steps is not None else
           "the grid's forced steps")
        + f"; {kv_note}"
        + ("; all-reduce terms analytic (not measured on one device)" if comm is not None else "")
        + (f"; skipped: {len(skipped)} points beyond the KV pool" if skipped else "")
        + (f"; command: {s.command}" if s.command else "")
    )


def write_outputs(settings: CalibrationSettings, timings: GridTimings, result: FitResult, *, memory: MemoryFigures,
                  comm: CommModel | None, graph_batch_sizes: tuple[int, ...], source: str,
                  knee_fitted: bool) -> CalibrationOutputs:
    """Write the measured profile (its provenance hashes the timings CSV) and the measured-vs-predicted plot."""
    from calibration.fit import figure_measured_vs_predicted, save_figure, sha256_file
    from simulator.cost.profile import FLEETSIM_ENGINE, Provenance

    info = timings.info
    profile = result.to_profile(
        name=settings.out.stem,
        hardware=settings.hardware,
        model=settings.model,
        tp=settings.tp,
        dtype=settings.dtype,
        memory=memory,
        host_link_Bps=measure_copy_bandwidth(settings.device),
        comm=comm,
        cuda_graph_batch_sizes=graph_batch_sizes,
        measured_on=FLEETSIM_ENGINE,  # this project's engine: chosen by name, not as a serving engine's figures
        provenance=Provenance(
            device_name=info.device_name,
            library_versions=dict(info.library_versions),
            date=datetime.date.today().isoformat(),
            git_revision=info.git_revision,
            raw_timings_sha256=sha256_file(settings.csv_path),
            source=source,
        ),
    )
    profile.save(settings.out)
    title = f"{profile.name}: measured vs held-out predicted device time (MAPE {result.error.mape:.1%})"
    save_figure(figure_measured_vs_predicted(timings.points, result.held_out_s, title=title), settings.html_path)
    return CalibrationOutputs(profile_path=settings.out, csv_path=settings.csv_path, html_path=settings.html_path,
                              profile=profile, skipped=timings.run.skipped, knee_fitted=knee_fitted)
