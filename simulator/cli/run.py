"""``fleetsim run``: simulate a scenario's variants, print the summary table and the SLO verdict, save
the run folder (report.html, summary.json, requests and series)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.cli.output import fresh_out_dir, non_negative, progress_bar
from simulator.collector import start_up

if TYPE_CHECKING:
    from simulator.results.kv_tiers import TierFigures
    from simulator.results.pools import FleetFigures
    from simulator.scenario import LoadedScenario

SUMMARY_COLUMNS = (
    ("requests_completed", "done", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.1f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.2f}"),
    ("tpot_p99_ms", "TPOT p99 ms", "{:.2f}"),
    ("e2e_p99_ms", "E2E p99 ms", "{:.0f}"),
    ("throughput_tok_s", "tok/s", "{:.0f}"),
    ("slo_attainment", "SLO att.", "{:.3f}"),
    ("kv_util_mean", "KV use", "{:.3f}"),
    ("kv_waste_mean", "KV waste", "{:.3f}"),
    ("running_peak", "peak run", "{:.0f}"),
    ("prefix_hit_rate", "prefix hit", "{:.3f}"),
    ("preemptions", "preempt", "{:.0f}"),
    ("cost_per_mtok_usd", "$/Mtok", "{:.3f}"),
    ("goodput_per_gpu_rps", "good/GPU", "{:.2f}"),
    ("spec_tokens_per_step", "tok/step", "{:.2f}"),
    ("spec_acceptance_rate", "accept", "{:.3f}"),
)
OPTIONAL_COLUMNS = frozenset({"spec_tokens_per_step", "spec_acceptance_rate"})
"""Shown only when some variant has them (speculative decoding)."""


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """Variants as rows, the headline metrics as columns."""
    columns = [c for c in SUMMARY_COLUMNS
               if c[0] not in OPTIONAL_COLUMNS or any(summary.get(c[0]) is not None for summary in rows.values())]
    header = ["variant", *(title for _, title, _ in columns)]
    body = []
    for name, summary in rows.items():
        cells = [name]
        for key, _, fmt in columns:
            value = summary.get(key)
            cells.append("-" if value is None else fmt.format(value))
        body.append(cells)
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *body]
    ]
    return "\n".join(lines)


def pools_line(name: str, fleet: FleetFigures) -> str:
    """A pooled variant in one line: each pool's replicas, GPU and busy share; the hand-offs."""
    pools = ", ".join(f"{p.name} {p.replicas}x{p.hardware} busy {p.busy_frac:.0%}" for p in fleet.pools)
    line = f"pools of {name}: {pools}"
    h = fleet.handoffs
    if h is not None:
        line += (f"; {h.num_landed} transfers, p50 {h.transfer_p50_ms:.2g} ms after the first token; "
                 f"{h.num_waited} waited for decode memory")
    return line


def tiers_line(name: str, tiers: TierFigures) -> str:
    """One line of a variant's KV-tier figures: hit rate by place, loads and recomputes, the TTFT split."""
    hits = ", ".join(f"{place} {rate:.3f}" for place, rate in tiers.hit_rate.items())
    split = tiers.ttft_split_ms
    return (f"kv tiers {name}: prefix hit rate {hits}; {tiers.num_loads} loads, {tiers.num_recomputes} recomputed; "
            f"TTFT mean queue {split['queue']:.4g} + load {split['load']:.4g} + compute {split['compute']:.4g} ms; "
            f"${tiers.usd_per_hour:.3g}/h of tier capacity, ${tiers.cost_per_mtok_usd:.4g}/Mtok with the GPUs")


def cmd_run(args: argparse.Namespace) -> int:
    with start_up(freeze=getattr(args, "own_process", False)):  # long-lived objects, no garbage cycles
        from simulator.results.run_folder import RunFiles, check_writable, save_run
        from simulator.results.summary import goodput_per_gpu
        from simulator.scenario import load_scenario, pick_profile, vllm_gpu_defaults
        from simulator.simulation import run
        from simulator.variant_workers import WorkerDied

        loaded = load_scenario(args.scenario, args.set or [], seed=args.seed)
        if args.variant:
            loaded = loaded.only(args.variant)
    out = Path(args.out) if args.out else fresh_out_dir(loaded.scenario.name)
    check_writable(out, overwrite=args.overwrite)  # before the run: a read-only disk costs no simulation
    progress, close = progress_bar(not args.quiet)
    from simulator.results.invariants import InvariantError

    try:
        result = run(loaded, progress=progress, check=args.check, jobs=args.jobs or None)
    except InvariantError as err:  # the simulator is wrong, not the scenario: say so, save nothing misleading
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return 1
    except WorkerDied as err:  # a worker killed (out of memory, a signal): nothing of the run is saved
        print(f"fleetsim: error: {err}; nothing was saved (fewer --jobs need less memory)", file=sys.stderr)
        return 1
    finally:
        close()
    files = RunFiles.SUMMARY if args.summary_only else RunFiles.NO_REPORT if args.no_report else RunFiles.ALL
    saved = save_run(result, out, overwrite=args.overwrite, files=files)
    rows = {name: {**v.summary.to_dict(), "goodput_per_gpu_rps": goodput_per_gpu(v.summary)}
            for name, v in result.variants.items()}
    print(format_table(rows))
    for variant in result.variants.values():
        if variant.fleet is not None and len(variant.fleet.pools) > 1:
            print(pools_line(variant.name, variant.fleet))
        if variant.tiers is not None:
            print(tiers_line(variant.name, variant.tiers))
    base_profile = pick_profile(loaded.scenario.fleet)
    defaults = vllm_gpu_defaults(loaded.scenario, base_profile)
    if defaults is not None:
        engine = loaded.scenario.engine
        launcher = "vllm serve" if engine.entry_point == "api_server" else "vLLM's offline LLM class"
        print(f"note: vllm preset on {base_profile.hardware}: {launcher}'s defaults for this GPU, "
              f"max_num_batched_tokens {defaults[0]}, max_num_seqs {defaults[1]}, async scheduling "
              f"{'off' if engine.async_scheduling is False else 'on'}"
              + (" (off where speculative decoding runs)" if _any_speculation(loaded) else ""))
    for variant in result.variants.values():
        if variant.profile.kind != "measured":
            print(f"note: {variant.name}: cost model {variant.profile.label or variant.profile.name}")
    for name, summary in rows.items():
        verdict = summary.get("slo_met")
        if verdict is not None and loaded.scenario.slo is not None:
            attainment = summary.get("slo_attainment")  # None when no request arrived after the warm-up
            shown = "-" if attainment is None else f"{attainment:.3f}"
            print(f"SLO {'met' if verdict else 'NOT met'} by {name}: attainment {shown}")
    if args.check:
        print(f"run check passed: {len(result.variants)} variant(s); every request finished once or is counted "
              "rejected, failed (after its retries) or in flight, tokens add up, KV blocks conserved, latencies "
              "non-negative, TTFT <= E2E")
    print(f"report: {saved / 'report.html'}" if files is RunFiles.ALL else f"results: {saved}")
    from simulator import native

    notice = native.pure_python_notice()  # after the run: a failed one stays a single line of error
    if notice is not None:
        print(notice, file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fleetsim run``."""
    p = subparsers.add_parser("run", help="simulate a scenario and write a report")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", help="output folder (default runs/NAME, never an existing one)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")
    p.add_argument("--seed", type=int, help="override the scenario's seed")
    p.add_argument("--variant", action="append", metavar="NAME",
                   help="run only this variant (repeat for several; a shell pattern such as 'doc_*' picks "
                        "every variant it matches; default: every variant)")
    p.add_argument("--overwrite", action="store_true", help="write into an existing non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--jobs", type=non_negative, default=0, metavar="N",
                   help="variants simulated at once, each in a worker process (same results); default 0: one per "
                        "CPU core when the variants replay 20,000 requests or more in all, else 1 (in this process)")
    p.add_argument("--check", action="store_true",
                   help="verify the run's invariants (requests, tokens, KV blocks, latencies); exit 1 if one fails")
    files = p.add_mutually_exclusive_group()
    files.add_argument("--no-report", action="store_true", help="write the tables and summary.json, no report.html")
    files.add_argument("--summary-only", action="store_true",
                       help="write summary.json alone (sweep workers, scripts: the quickest start and save)")
    p.set_defaults(func=cmd_run)


def _any_speculation(loaded: LoadedScenario) -> bool:
    """Whether a variant runs speculative decoding (which takes synchronous scheduling)."""
    return any(v.engine.speculative is not None and v.engine.speculative.num_speculative_tokens > 0
               for v in loaded.variants().values())
