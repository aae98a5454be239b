"""A bench's run folder: the simulator's files (``requests.parquet``, ``series``, ``summary.json``,
``report.html``, through ``simulator.results.run_folder``) with the bench's own beside them
(``bench.json``: vLLM's figures; ``chunks.parquet``: every text chunk's arrival), and the console table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calibration.endpoint.bench import BenchRun, bench_metrics, chunks_frame
from simulator.results.run_folder import save_run
from simulator.results.run_result import RunResult, VariantResult


def save_bench(result: RunResult, runs: dict[str, BenchRun], out: Path, *, overwrite: bool = False,
               extra: dict[str, Any] | None = None) -> Path:
    """Save ``result`` as a run folder, then each bench's ``bench.json`` and chunk table (suffixed by the
    variant's name when there are several); ``extra`` is merged into the first bench.json."""
    folder = save_run(result, out, overwrite=overwrite)
    for i, (name, run) in enumerate(runs.items()):
        suffix = "" if len(runs) == 1 else f"-{name}"
        metrics = bench_metrics(run)
        if i == 0 and extra:
            metrics.update(extra)
        (folder / f"bench{suffix}.json").write_text(json.dumps(_finite(metrics), indent=2) + "\n", encoding="utf-8")
        chunks_frame(run).to_parquet(folder / f"chunks{suffix}.parquet", index=False)
    return folder


def run_result(name: str, variants: list[VariantResult], scenario: dict[str, Any] | None = None) -> RunResult:
    return RunResult(scenario_name=name, variants={v.name: v for v in variants}, scenario=scenario or {})


def format_metrics(m: dict[str, Any]) -> str:
    """vLLM's result table, in its words."""
    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"{'Successful requests:':40s}{m['completed']}",
        f"{'Failed requests:':40s}{m['failed']}",
        f"{'Max in flight:':40s}{m['max_in_flight']}",
        f"{'Benchmark duration (s):':40s}{m['duration']:.2f}",
        f"{'Total input tokens:':40s}{m['total_input_tokens']}",
        f"{'Total generated tokens:':40s}{m['total_output_tokens']}",
        f"{'Request throughput (req/s):':40s}{m['request_throughput']:.2f}",
        f"{'Output token throughput (tok/s):':40s}{m['output_throughput']:.2f}",
    ]
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append(f"---{title}---")
        lines.append(f"{f'Mean {name.upper()} (ms):':40s}{ms(m[f'mean_{name}_ms'])}")
        lines.append(f"{f'Median {name.upper()} (ms):':40s}{ms(m[f'median_{name}_ms'])}")
        lines.append(f"{f'P99 {name.upper()} (ms):':40s}{ms(m[f'p99_{name}_ms'])}")
    if m.get("mean_tokens_per_chunk") is not None:
        lines.append(f"{'Tokens per SSE chunk (mean):':40s}{m['mean_tokens_per_chunk']:.2f}")
    for error in m["errors"][:5]:
        lines.append(f"error: {error}")
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value
