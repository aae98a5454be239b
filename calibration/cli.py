"""``fleetsim calibrate`` and ``fleetsim validate``: the calibration half of the command line.

``register(subparsers)`` adds both subcommands; the ``fleetsim`` parser finds it through the
``fleetsim.commands`` entry point (the simulator package never imports calibration). This module is only
the argparse glue: the calibration pipeline is ``calibration.calibrate.calibrate`` (tests and the device
script call it without argparse), the validation one ``calibration.validate.validate``.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from calibration.calibrate import DEFAULT_CPU_KV_GIB, calibrate
from simulator.errors import ConfigError


def require_engine(command: str) -> None:
    """One line naming the install, instead of torch's ModuleNotFoundError traceback halfway in."""
    if importlib.util.find_spec("torch") is None:
        raise ConfigError(f"fleetsim {command} runs the real engine, which needs PyTorch: "
                          "pip install -e '.[engine]'")


def refuse_overwrite(out: Path, *, overwrite: bool) -> None:
    """Before a calibration runs: a profile at ``out`` already (a link counts, even one pointing nowhere) is
    refused without ``--overwrite``, so no profile is replaced by surprise and no measuring is spent on an
    --out that would be refused. The grid's raw timings beside it are not: a rerun resumes into them when
    they were measured with the same settings (``profiler.check_resumable``)."""
    if not overwrite and (out.exists() or out.is_symlink()):
        raise FileExistsError(f"{out} exists: choose another --out, or pass --overwrite to replace it")


def cmd_calibrate(args: argparse.Namespace) -> int:
    refuse_overwrite(Path(args.out), overwrite=args.overwrite)
    if args.from_published is not None:
        return cmd_from_published(args)
    if args.endpoint is not None:
        return cmd_calibrate_endpoint(args)
    if args.model is None:
        raise ConfigError("--model is required (or --endpoint, or --from-published)", field="model")
    require_engine("calibrate")
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
          f"s {dev.per_seq_s * 1e6:.3f} us/seq  m {dev.multi_token_s * 1e3:.3f} ms  p {dev.knee_p:.3g}"
          + (f"  eager floor {dev.eager_floor_s * 1e3:.3f} ms" if dev.eager_floor_s else ""))
    host = profile.host_s
    print(f"host     h0 {host.h0_s * 1e6:.1f} us  {host.per_seq_s * 1e6:.2f} us/seq  "
          f"{host.per_token_s * 1e9:.1f} ns/tok")
    print(f"KV       {profile.memory.kv_bytes_per_token} B/token, capacity {profile.memory.kv_capacity_tokens} tokens")
    for reason in outputs.skipped:
        print(f"skipped  {reason}")
    print(f"raw      {outputs.csv_path}\nplot     {outputs.html_path}")
    return 0


def cmd_calibrate_endpoint(args: argparse.Namespace) -> int:
    """Fit a profile black-box to a live OpenAI-compatible server's client-side timings."""
    from calibration.endpoint.bench import BenchOptions
    from calibration.endpoint.blackbox import ProbePlan, calibrate_endpoint, print_fit
    from calibration.serve.cli import require_serve

    require_serve("calibrate --endpoint")
    options = BenchOptions(endpoint=args.endpoint, model=args.served_model, progress=not args.quiet)
    fit = calibrate_endpoint(options, out=Path(args.out), like=args.model, hardware=args.hardware or "endpoint",
                             dtype=args.dtype or "bfloat16", kv_capacity_tokens=args.kv_capacity_tokens,
                             plan=ProbePlan(repeats=args.probe_repeats, seed=args.seed), folds=args.folds)
    print_fit(fit)
    return 0


def cmd_from_published(args: argparse.Namespace) -> int:
    """Fit a profile to published GPU measurements: no engine, no GPU, no torch."""
    from calibration.published.from_published import fit_published

    if args.hardware is None:
        raise ConfigError("--from-published needs --hardware (A100 or H100)", field="hardware")
    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        raise ConfigError("--out must name a .yaml file", field="out")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the output folder: {err.strerror or err}", file=out.parent) from None
    try:
        result = fit_published(args.model, args.hardware, args.tp, data=args.data, source=args.from_published,
                               engine=args.engine, folds=args.folds, seed=args.seed)
    except (ValueError, IndexError) as err:
        # Files that read well but cannot be fitted (one token count, no rank count that is a power of two):
        # the data, not the program, so one line naming it.
        raise ConfigError(f"cannot fit a profile to this data: {err}", field="data") from None
    profile = result.profile
    temporary = out.with_name(f".{out.name}.tmp")
    profile.save(temporary)
    temporary.replace(out)
    held = profile.fit_error
    assert held is not None
    print(f"profile  {out}  ({profile.label})")
    print(f"held-out MAPE {held.mape:.2%}  max {held.max_error:.2%}  R² {held.r2:.4f}  "
          f"({held.num_points} composed steps, {held.num_folds} folds)")
    dev = profile.device_s
    print(f"device   {len(dev.token_curve.x) if dev.token_curve else 0}-knot token curve: "
          f"{dev.weight_s * 1e3:.3f} ms at 1 token, {dev.per_token_s * 1e6:.3f} us/token past "
          f"{dev.token_curve.x[-1] if dev.token_curve else 0:.0f}; k {dev.per_ctx_token_s * 1e9:.3f} ns/ctx  "
          f"q {dev.per_attn_pair_s * 1e12:.3f} ps/pair")
    if profile.comm is not None:
        print(f"comm     measured all-reduce curve, {profile.comm.topology} at {profile.tp} ranks")
    host = profile.host_s
    print(f"host     {host.engine}: h0 {host.h0_s * 1e6:.1f} us  {host.per_seq_s * 1e6:.2f} us/seq"
          f"  overlap {profile.overlap_host}")
    print(f"KV       {profile.memory.kv_bytes_per_token} B/token, capacity {profile.memory.kv_capacity_tokens} tokens")
    for source in profile.provenance.sources:
        print(f"source   {source.path}  sha256 {source.sha256[:16]}  {source.rows_used} rows")
    return 0


def _command_line() -> str:
    """How this process was invoked, as ``fleetsim <subcommand> ...`` (for provenance)."""
    import shlex
    import sys

    return "fleetsim " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _validation_out(args: argparse.Namespace) -> Path:
    """``validate``'s folder, checked before anything runs: ``--out`` (refused when it holds files, unless
    ``--overwrite``), else a fresh runs/validate, runs/validate-2, ... (an earlier validation is never
    written over)."""
    from simulator.cli.output import checked_out_dir, fresh_out_dir

    return checked_out_dir(Path(args.out), args.overwrite) if args.out else fresh_out_dir("validate")


def cmd_validate(args: argparse.Namespace) -> int:
    if args.endpoint is not None:
        return cmd_validate_endpoint(args)
    require_engine("validate")
    from calibration.validate import ValidationOptions, print_report, validate

    options = ValidationOptions(
        profile=args.profile, model=args.model, num_requests=args.num_requests, rate_rps=args.rate,
        trace=args.trace, prompt_scale=args.prompt_scale, output_scale=args.output_scale,
        max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        mode=args.mode, threads=args.threads, seed=args.seed, device=args.device, repeat_realtime=args.repeat,
    )
    report = validate(options, out_dir=_validation_out(args), progress=not args.quiet)
    print_report(report)
    return 0


def cmd_validate_endpoint(args: argparse.Namespace) -> int:
    """Bench a live OpenAI-compatible server and simulate the same requests with the profile."""
    from calibration.endpoint.cli import bench_options, load_bench_workload
    from calibration.endpoint.validate import print_validation, validate_endpoint
    from calibration.serve.cli import require_serve

    require_serve("validate --endpoint")
    if args.scenario is None:
        raise ConfigError("validate --endpoint needs --scenario (the simulated replica's settings and workload)",
                          field="scenario")
    overrides = (f"fleet.profile={args.profile}",)
    loaded = load_bench_workload(args, scenario=args.scenario, trace=None, overrides=overrides)
    out = _validation_out(args)
    print_validation(validate_endpoint(loaded, bench_options(args), out=out, repeat=args.repeat,
                                       overwrite=args.overwrite))
    return 0


def register(subparsers: Any) -> None:
    """Add ``calibrate``, ``validate``, ``serve`` and ``bench`` to the ``fleetsim`` parser."""
    from calibration.endpoint.cli import register as register_bench
    from calibration.serve.cli import register as register_serve

    p = subparsers.add_parser("calibrate", help="profile the real engine on a grid, fit, write a measured profile")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    p.add_argument("--model", default=None,
                   help="catalogue name (calibration/engine/configs.py): tiny, small, llama-3-8b, llama-3-70b, "
                        "llama-3-405b, llama-2-7b, llama-2-70b, codellama-34b, internlm-20b, phi-2, qwen-72b, "
                        "tiny-moe, small-moe")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (profiles one rank's shard)")
    p.add_argument("--grid", choices=("ci", "cpu", "gpu"), default=None, help="grid preset (default by device)")
    p.add_argument("--out", required=True, type=Path, help="profile YAML to write (CSV and HTML go next to it)")
    p.add_argument("--overwrite", action="store_true", help="replace the profile at --out if there is one")
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
    p.add_argument("--seed", type=int, default=0, help="seed of the grid's order, token ids and held-out folds")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--from-published", default=None, choices=("vidur",),
                   help="fit to published GPU measurements instead of running the engine (needs --hardware "
                        "A100|H100; no torch, no GPU)")
    p.add_argument("--data", type=Path, default=None,
                   help="folder of the published profiles (default ../shared/data/profiling/vidur)")
    p.add_argument("--engine", default=None,
                   help="serving-engine preset whose host overhead the profile carries (calibration/engines.yaml)")
    live = p.add_argument_group("black-box, from a live server's client-side timings (--endpoint)")
    live.add_argument("--endpoint", default=None,
                      help="OpenAI-compatible server base URL: probe it and fit a profile (--model names the "
                           "catalogue shape for its KV size; default the served model's name)")
    live.add_argument("--served-model", default=None, help="the model field of probe requests (default: the first)")
    live.add_argument("--kv-capacity-tokens", type=int, default=None,
                      help="the server's KV pool in tokens (default: from its /metrics when it publishes it)")
    live.add_argument("--probe-repeats", type=int, default=3, help="repeats of each prefill probe (3)")
    p.set_defaults(func=cmd_calibrate)

    p = subparsers.add_parser("validate", help="replay a workload on the real engine and in the simulator")
    p.add_argument("--profile", required=True, help="measured profile (path or shipped name)")
    p.add_argument("--model", default=None, help="engine model (default: the profile's)")
    p.add_argument("--num-requests", type=int, default=200, help="requests replayed from the trace (200)")
    p.add_argument("--rate", type=float, default=None,
                   help="arrival rate, requests/s (default: a moderate load by the profile)")
    p.add_argument("--trace", default="${traces}/azure_llm_2023_conv.csv", help="azure-format trace")
    p.add_argument("--prompt-scale", type=float, default=0.25, help="multiply trace prompt lengths by this")
    p.add_argument("--output-scale", type=float, default=0.25, help="multiply trace output lengths by this")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="truncate scaled prompts to this (1024)")
    p.add_argument("--max-output-tokens", type=int, default=128, help="truncate scaled outputs to this (128)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="scheduler: most running sequences (32)")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="scheduler: token budget per step (512)")
    p.add_argument("--mode", choices=("realtime", "lockstep", "both"), default="both",
                   help="realtime: arrivals on the wall clock (latency fidelity); lockstep: the same step plans "
                        "on both sides (scheduling parity and per-step cost error); both (default)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared host)")
    p.add_argument("--seed", type=int, default=0, help="seed of the replayed workload")
    p.add_argument("--repeat", action="store_true",
                   help="replay the real-time run twice: the engine against itself is the host's noise floor")
    p.add_argument("--out", default=None,
                   help="folder for fidelity.json and the CDF plot (default runs/validate, never an existing one)")
    p.add_argument("--overwrite", action="store_true", help="write into an existing non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    live = p.add_argument_group("against a live server (--endpoint): bench it, simulate the same requests")
    live.add_argument("--endpoint", default=None, help="OpenAI-compatible server base URL (fleetsim serve, vLLM...)")
    live.add_argument("--scenario", default=None,
                      help="scenario whose workload is sent and whose engine settings the simulator runs")
    live.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    live.add_argument("--max-duration", type=float, default=600.0, help="send nothing after this many seconds")
    live.add_argument("--api", choices=("completions", "chat"), default="completions")
    live.add_argument("--prompt-format", choices=("ids", "text"), default="ids")
    live.add_argument("--no-ignore-eos", action="store_true", help="let the server stop at EOS")
    live.add_argument("--sample-interval", type=float, default=1.0,
                      help="seconds between samples of the server's /metrics (1)")
    p.set_defaults(func=cmd_validate)

    register_serve(subparsers)
    register_bench(subparsers)
