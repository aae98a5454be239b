"""``fleetsim bench``: argparse glue only (the bench is ``calibration.endpoint.bench``)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError


def add_workload_arguments(p: argparse.ArgumentParser, *, scenario_required: bool = False) -> None:
    """The request stream and how it is sent: shared by bench, validate --endpoint."""
    if not scenario_required:
        p.add_argument("--scenario", default=None, help="replay this scenario's workload")
        p.add_argument("--trace", default=None, help="... or this trace file (see --trace-format)")
        p.add_argument("--trace-format", default="azure", help="azure, mooncake or vidur (with --rate)")
    p.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals at this many requests/s instead of the workload's (inf: all at once)")
    p.add_argument("--num-requests", type=int, default=None, help="send this many requests (default: the workload's)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no limit)")
    p.add_argument("--max-duration", type=float, default=600.0,
                   help="send nothing after this many seconds; cut streams 30 s later (600)")
    p.add_argument("--model", default=None, help="the model field of requests (default: the server's first)")
    p.add_argument("--api", choices=("completions", "chat"), default="completions")
    p.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                   help="send prompts as token ids (exact lengths) or as text (one character per token on "
                        "fleetsim serve)")
    p.add_argument("--no-ignore-eos", action="store_true", help="let the server stop at EOS")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--sample-interval", type=float, default=1.0,
                   help="seconds between samples of the server's /metrics (1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def bench_options(args: argparse.Namespace) -> Any:
    from calibration.endpoint.bench import BenchOptions
    from calibration.endpoint.client import Api

    if args.num_requests is not None and args.num_requests < 1:
        raise ConfigError("--num-requests must be >= 1", field="num_requests")
    if not (math.isfinite(args.sample_interval) and args.sample_interval > 0):
        raise ConfigError("--sample-interval must be a number of seconds > 0", field="sample_interval")
    return BenchOptions(endpoint=args.endpoint, model=args.model, api=Api(args.api),
                        max_concurrency=args.max_concurrency, max_duration_s=args.max_duration,
                        ignore_eos=not args.no_ignore_eos, sample_interval_s=args.sample_interval,
                        progress=not args.quiet)


def load_bench_workload(args: argparse.Namespace, *, scenario: str | None, trace: str | None,
                        overrides: tuple[str, ...] = ()) -> Any:
    from calibration.endpoint.schedule import PromptFormat, load_workload

    if args.rate is not None and not (args.rate > 0 or math.isinf(args.rate)):
        raise ConfigError("--rate must be > 0", field="rate")
    return load_workload(scenario=Path(scenario) if scenario else None, trace=Path(trace) if trace else None,
                         trace_format=getattr(args, "trace_format", "azure"), num_requests=args.num_requests,
                         rate_rps=args.rate, seed=args.seed, prompt_format=PromptFormat(args.prompt_format),
                         overrides=overrides)


def cmd_bench(args: argparse.Namespace) -> int:
    from calibration.endpoint.bench import bench_metrics, measured_variant, run_bench
    from calibration.endpoint.report import format_metrics, run_result, save_bench
    from calibration.serve.cli import require_serve
    from simulator.cli.output import fresh_out_dir
    from simulator.results.run_folder import check_writable
    from simulator.scenario import scenario_record

    require_serve("bench")
    options = bench_options(args)
    loaded = load_bench_workload(args, scenario=args.scenario, trace=args.trace)
    name = loaded.scenario.name if loaded.scenario is not None else Path(args.trace).stem
    out = Path(args.out) if args.out else fresh_out_dir(f"bench-{name}")
    check_writable(out, overwrite=args.overwrite)
    run = run_bench(loaded.requests, options)
    slo = loaded.scenario.slo if loaded.scenario is not None else None
    record = {"measured": scenario_record(loaded.scenario)} if loaded.scenario is not None else {}
    result = run_result(name, [measured_variant(run, slo=slo)], record)
    folder = save_bench(result, {"measured": run}, out, overwrite=args.overwrite)
    print(format_metrics(bench_metrics(run)))
    print(f"report: {folder / 'report.html'}")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="replay a workload against an OpenAI-compatible endpoint, in real time")
    p.add_argument("--endpoint", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    add_workload_arguments(p)
    p.add_argument("--out", default=None, help="run folder (default runs/bench-NAME, never an existing one)")
    p.add_argument("--overwrite", action="store_true", help="write into an existing non-empty --out")
    p.set_defaults(func=cmd_bench)
