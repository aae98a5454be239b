"""``fleetsim calibrate`` and ``fleetsim validate``: the calibration half of the command line.

``register(subparsers)`` adds both subcommands; ``simulator/cli.py`` imports this module only when it
builds its parser (the simulator package never imports calibration at module level). ``calibrate`` is
also a plain function so tests and the device script run the same path without argparse:
profile a grid on the real runner → fit (calibration/fit.py) → a measured Profile with held-out error,
its raw CSV and provenance sidecar, and a measured-vs-predicted plot, all next to the profile YAML.
"""

from __future__ import annotations

import argparse
import datetime
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from simulator.errors import ConfigError

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
    for i in range(HOST_TRACE_REQUESTS):
        engine.add_request(RequestSpec(i, 0.0, int(rng.integers(16, 257)), int(rng.integers(4, 49))))
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

    from calibration.analytic import comm_model as analytic_comm
    from calibration.analytic import dtype_bytes as analytic_dtype_bytes
    from calibration.engine.configs import get_model
    from calibration.engine.kv_cache import kv_budget_bytes, num_blocks_for_budget
    from calibration.engine.runner import ModelRunner
    from calibration.fit import figure_measured_vs_predicted, fit_host, fit_timings, save_figure, sha256_file
    from calibration.profiler import (
        Clock,
        RunInfo,
        device_name,
        get_grid,
        git_revision,
        library_versions,
        run_grid,
    )
    from simulator.cost.profile import MemoryFigures, Provenance, get_accelerator, list_profiles, load_profile

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
    torch_dtype = _torch_dtype(dtype)
    hw = hardware_label(device, hardware)
    out = Path(out)
    csv_path, html_path = out.with_suffix(".csv"), out.with_suffix(".html")
    block_size = 16

    num_blocks = grid_obj.max_blocks(block_size)
    kv_per_token = shape.kv_bytes_per_token(torch.empty((), dtype=torch_dtype).element_size())
    if cuda:  # never allocate a pool larger than what fits next to the weights
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        weights = shape.num_params * torch.empty((), dtype=torch_dtype).element_size()
        fits = int((free * memory_fraction - weights - (4 << 30)) // (kv_per_token * block_size))
        num_blocks = max(1, min(num_blocks, fits))
    runner = ModelRunner(shape, device=device, dtype=torch_dtype, num_blocks=num_blocks, block_size=block_size,
                         backend=backend, seed=seed, cuda_graphs=bool(cuda_graphs))
    if clock == "auto":
        chosen = Clock.THREAD_CPU if not cuda and torch.get_num_threads() == 1 else Clock.RUNNER
    else:
        chosen = Clock(clock)
    if chosen is Clock.THREAD_CPU and (cuda or torch.get_num_threads() != 1):
        raise ConfigError("the thread_cpu clock needs a CPU device and one torch thread (--threads 1)",
                          field="clock")
    info = RunInfo(
        clock=chosen.value, model=model, dtype=dtype, backend=backend, device_type="cuda" if cuda else "cpu",
        grid=grid_obj.name,
        block_size=block_size, num_layers=runner.shape.num_layers, cuda_graphs=bool(cuda_graphs),
        device_name=device_name(device), library_versions=library_versions(),
        git_revision=git_revision(), torch_threads=torch.get_num_threads(), seed=seed,
        extra={"tp": tp, "hardware": hw},
    )
    run = run_grid(runner, grid_obj, csv_path, info, vocab_size=runner.shape.vocab_size, seed=seed,
                   progress=progress)
    df = run.points_frame(pass_aggregate)
    if len(df) < 4:
        raise ConfigError(f"only {len(df)} grid points measured: too few to fit", file=csv_path)

    # Roofline start when an analytic profile of this hardware/model/tp exists (GPU); else a linear guess.
    initial = None
    analytic_name = f"{hw.lower()}-{model}-tp{tp}-analytic"
    if analytic_name in list_profiles():
        initial = load_profile(analytic_name).device_s
    # The knee exponent is fitted only when the grid reaches the compute-bound side; both fits are
    # cross-validated the same way and the lower held-out error is kept (recorded in the source).
    multi = not cuda if multi_token is None else multi_token
    fixed = fit_timings(df, num_folds=folds, seed=seed, initial=initial, multi_token=multi)
    fitted = fit_timings(df, num_folds=folds, seed=seed, initial=initial, fit_knee=True, multi_token=multi)
    knee_fitted = fitted.error.mape < fixed.error.mape
    result = fitted if knee_fitted else fixed

    # KV figures as measured on the engine: bytes per token from the pool the runner allocated.
    pool = runner.kv_cache
    measured_kv_per_token = pool.num_bytes // (pool.num_blocks * pool.block_size)
    weight_bytes = _weight_bytes(runner)
    if cuda:
        dev = torch.device(device)
        total = torch.cuda.get_device_properties(dev).total_memory
        activations = max(0, torch.cuda.max_memory_allocated(dev) - weight_bytes - pool.num_bytes)
        kv_bytes = int(total * memory_fraction) - weight_bytes - activations
        device_memory = int(total)
    else:
        import os

        device_memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        kv_bytes = kv_budget_bytes("cpu", memory_fraction=1.0, cpu_memory_bytes=int(kv_gib * 2**30))
        activations = 0
    capacity_tokens = num_blocks_for_budget(runner.shape, block_size, torch_dtype, max(kv_bytes, 0)) * block_size
    memory = MemoryFigures(
        kv_bytes_per_token=measured_kv_per_token,
        kv_capacity_tokens=capacity_tokens,
        weight_bytes=weight_bytes,
        device_memory_bytes=device_memory,
        memory_fraction=memory_fraction if cuda else CPU_MEMORY_FRACTION,
        activation_bytes=activations,
    )
    graph_batch_sizes = tuple(runner.graph_batch_sizes) if cuda_graphs else ()
    del runner, pool  # the engine below builds its own model and pool
    if cuda:
        torch.cuda.empty_cache()
    # Host overhead from the engine's own step loop (schedule, input preparation, sampling sync, update):
    # the profiler's forced steps skip the scheduler, and host time is what separates engines.
    engine_host = None
    if host_from == "engine":
        engine_host = engine_host_steps(model, tp, device=device, dtype=torch_dtype, backend=backend,
                                        cuda_graphs=bool(cuda_graphs), seed=seed,
                                        thread_cpu=chosen is Clock.THREAD_CPU)
        result = replace(result, host=fit_host(engine_host))

    comm = None
    if tp > 1:
        from calibration.analytic import Efficiencies

        comm = analytic_comm(get_accelerator(hw), shape, analytic_dtype_bytes(dtype), Efficiencies())
    err = result.error
    kv_note = (f"KV capacity = the --kv-gib {kv_gib:g} GiB CPU budget" if not cuda else
               f"KV capacity = {memory_fraction} x device memory - weights - measured activation peak")
    source = (
        f"Measured: grid '{grid_obj.name}' ({len(df)} points, medians of repeats after warm-ups, randomised "
        f"order, {grid_obj.num_passes} pass(es), "
        f"{'least-disturbed pass' if pass_aggregate == 'min' else 'mean of the passes'} per point) "
        f"of {model} tp={tp} {dtype} "
        f"on the fleetsim engine runner (backend {backend}, "
        f"CUDA graphs {bool(cuda_graphs)}, {info.torch_threads} torch threads, clock {chosen.value}); "
        f"fitted by calibration.fit "
        f"(relative least squares, soft_l1, knee {'fitted' if knee_fitted else 'fixed'} at "
        f"p={result.device.knee_p:.3g}"
        + (f", multi-token step term m={result.device.multi_token_s * 1e3:.3g} ms" if multi else "")
        + f"); held-out {err.num_folds}-fold MAPE {err.mape:.2%}, max "
        f"{err.max_error:.2%}; host terms from cycle - device time of "
        + (f"{len(engine_host)} engine steps (scheduler loop included)" if engine_host is not None else
           "the grid's forced steps")
        + f"; {kv_note}"
        + ("; all-reduce terms analytic (not measured on one device)" if comm is not None else "")
        + (f"; skipped: {len(run.skipped)} points beyond the KV pool" if run.skipped else "")
        + (f"; command: {command}" if command else "")
    )
    versions = dict(info.library_versions)
    profile = result.to_profile(
        name=out.stem,
        hardware=hw,
        model=model,
        tp=tp,
        dtype=dtype,
        memory=memory,
        host_link_Bps=measure_copy_bandwidth(device),
        comm=comm,
        cuda_graph_batch_sizes=graph_batch_sizes,
        provenance=Provenance(
            device_name=info.device_name,
            library_versions=versions,
            date=datetime.date.today().isoformat(),
            git_revision=info.git_revision,
            raw_timings_sha256=sha256_file(csv_path),
            source=source,
        ),
    )
    profile.save(out)
    title = f"{profile.name}: measured vs held-out predicted device time (MAPE {err.mape:.1%})"
    save_figure(figure_measured_vs_predicted(df, result.held_out_s, title=title), html_path)
    return CalibrationOutputs(profile_path=out, csv_path=csv_path, html_path=html_path, profile=profile,
                              skipped=run.skipped, knee_fitted=knee_fitted)


# ----- argparse ----------------------------------------------------------------------------------------


def cmd_calibrate(args: argparse.Namespace) -> int:
    outputs = calibrate(
        device=args.device, model=args.model, out=args.out, tp=args.tp, grid=args.grid, dtype=args.dtype,
        backend=args.backend, kv_gib=args.kv_gib, threads=args.threads, hardware=args.hardware,
        folds=args.folds, seed=args.seed, progress=not args.quiet, host_from=args.host_from, clock=args.clock,
        pass_aggregate=args.pass_aggregate, command=_command_line(),
    )
    profile = outputs.profile
    err = profile.fit_error
    print(f"profile  {outputs.profile_path}  ({profile.label})")
    print(f"held-out MAPE {err.mape:.2%}  max {err.max_error:.2%}  R² {err.r2:.4f}  "
          f"({err.num_points} points, {err.num_folds} folds)")
    dev = profile.device_s
    print(f"device   a0 {dev.a0_s * 1e3:.3f} ms  W {dev.weight_s * 1e3:.3f} ms  f {dev.per_token_s * 1e6:.3f} us/tok  "
          f"k {dev.per_ctx_token_s * 1e9:.3f} ns/ctx  q {dev.per_attn_pair_s * 1e12:.3f} ps/pair  "
          f"s {dev.per_seq_s * 1e6:.3f} us/seq  m {dev.multi_token_s * 1e3:.3f} ms  p {dev.knee_p:.3g}")
    host = profile.host_s
    print(f"host     h0 {host.h0_s * 1e6:.1f} us  {host.per_seq_s * 1e6:.2f} us/seq  "
          f"{host.per_token_s * 1e9:.1f} ns/tok")
    print(f"KV       {profile.memory.kv_bytes_per_token} B/token, capacity {profile.memory.kv_capacity_tokens} tokens")
    for reason in outputs.skipped:
        print(f"skipped  {reason}")
    print(f"raw      {outputs.csv_path}\nplot     {outputs.html_path}")
    return 0


def _command_line() -> str:
    """How this process was invoked, as ``fleetsim <subcommand> ...`` (for provenance)."""
    import shlex
    import sys

    return "fleetsim " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def cmd_validate(args: argparse.Namespace) -> int:
    from calibration.validate import ValidationOptions, print_report, validate

    options = ValidationOptions(
        profile=args.profile, model=args.model, num_requests=args.num_requests, rate_rps=args.rate,
        trace=args.trace, prompt_scale=args.prompt_scale, output_scale=args.output_scale,
        max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        mode=args.mode, threads=args.threads, seed=args.seed, device=args.device, repeat_realtime=args.repeat,
    )
    report = validate(options, out_dir=Path(args.out), progress=not args.quiet)
    print_report(report)
    return 0


def register(subparsers: Any) -> None:
    """Add ``calibrate`` and ``validate`` to the ``fleetsim`` parser."""
    p = subparsers.add_parser("calibrate", help="profile the real engine on a grid, fit, write a measured profile")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    p.add_argument("--model", required=True, help="tiny, small, llama-3-8b, llama-3-70b, llama-3-405b")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (profiles one rank's shard)")
    p.add_argument("--grid", choices=("ci", "cpu", "gpu"), default=None, help="grid preset (default by device)")
    p.add_argument("--out", required=True, type=Path, help="profile YAML to write (CSV and HTML go next to it)")
    p.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16 (GPU default)")
    p.add_argument("--backend", default=None, help="attention backend (sdpa_gather on CPU, triton_paged on GPU)")
    p.add_argument("--kv-gib", type=float, default=DEFAULT_CPU_KV_GIB, help="CPU KV pool budget, GiB")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared host)")
    p.add_argument("--hardware", default=None, help="profile hardware label (default: CPU, or from the GPU name)")
    p.add_argument("--folds", type=int, default=5, help="k of the held-out k-fold error")
    p.add_argument("--clock", choices=("auto", "runner", "thread_cpu"), default="auto",
                   help="auto: thread CPU time on CPU with one torch thread, else the runner's clocks")
    p.add_argument("--host-from", choices=("engine", "grid"), default="engine",
                   help="fit host overhead on engine steps (scheduler included) or on the grid's forced steps")
    p.add_argument("--pass-aggregate", choices=("min", "mean"), default="mean",
                   help="combine each grid point's passes: mean (the engine runs at the average speed, not the "
                        "best) or min (least disturbed pass, for a host shared with other jobs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_calibrate)

    p = subparsers.add_parser("validate", help="replay a workload on the real engine and in the simulator")
    p.add_argument("--profile", required=True, help="measured profile (path or shipped name)")
    p.add_argument("--model", default=None, help="engine model (default: the profile's)")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=None,
                   help="arrival rate, requests/s (default: a moderate load by the profile)")
    p.add_argument("--trace", default="${traces}/azure_llm_2023_conv.csv", help="azure-format trace")
    p.add_argument("--prompt-scale", type=float, default=0.25, help="multiply trace prompt lengths by this")
    p.add_argument("--output-scale", type=float, default=0.25, help="multiply trace output lengths by this")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--max-output-tokens", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--mode", choices=("realtime", "lockstep", "both"), default="both")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", action="store_true",
                   help="replay the real-time run twice: the engine against itself is the host's noise floor")
    p.add_argument("--out", default="runs/validate", help="folder for fidelity.json and the CDF plot")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_validate)
