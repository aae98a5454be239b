"""A trace replayed as a workload: its rows in arrival order (or lengths in file order under an arrival
process), rescaled in time if asked, with Mooncake's prefix block ids where the trace has them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.errors import ConfigError
from simulator.workload.arrival import arrival_times
from simulator.workload.block_keys import BlockKeys, BlockTag, MooncakeBlockKeys, SyntheticBlockKeys, block_positions
from simulator.workload.config import TraceConfig, WorkloadConfig
from simulator.workload.random_streams import Stream, rng
from simulator.workload.traces import load_trace, resolve_trace_path
from simulator.workload.workload import Workload


def replay_trace(
    config: WorkloadConfig, trace: TraceConfig, *, seed: int, block_size: int, base_dir: Path | None
) -> Workload:
    """Trace rows in arrival order, limited by num_requests and duration_s; the trace is never looped."""
    path = resolve_trace_path(trace.path, base_dir)
    rows = load_trace(trace.format, path)
    if config.arrival is None:
        assert rows.arrival_s is not None  # the config validator requires an arrival process otherwise
        arrival, row_index = _trace_times(rows.arrival_s, trace, file=path)
        if config.duration_s is not None:
            inside = arrival < config.duration_s
            arrival, row_index = arrival[inside], row_index[inside]
        arrival, row_index = arrival[: config.num_requests], row_index[: config.num_requests]
    else:
        # Lengths in file order, arrivals from the process, until either runs out.
        limit = len(rows) if config.num_requests is None else min(config.num_requests, len(rows))
        arrival = arrival_times(
            config.arrival, rng(seed, Stream.ARRIVAL), max_count=limit, duration_s=config.duration_s
        )
        row_index = np.arange(len(arrival))

    # Zero-length prompts or answers occur in traces; RequestSpec needs >= 1, so they count as 1.
    prompt = np.clip(rows.prompt_tokens[row_index], 1, trace.max_prompt_tokens)
    output = np.clip(rows.output_tokens[row_index], 1, trace.max_output_tokens)
    keys: BlockKeys
    if rows.hash_id_values is not None and rows.hash_id_offsets is not None:
        values, offsets = _gather_rows(rows.hash_id_values, rows.hash_id_offsets, row_index)
        keys = MooncakeBlockKeys(block_size=block_size, id_values=values, id_offsets=offsets, prompt_tokens=prompt)
    else:
        # No prefix information: every request's prompt blocks are its own.
        keys = SyntheticBlockKeys(
            seed=seed,
            block_size=block_size,
            stream_tag=BlockTag.REQUEST,
            stream_id=np.arange(len(prompt), dtype=np.int64),
            hashed_tokens=prompt,
        )
    return Workload(
        arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, block_size=block_size, block_keys=keys
    )


def _trace_times(times: np.ndarray, trace: TraceConfig, *, file: Path) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times after start_s and rescaling, the trace row of each), sorted by time."""
    order = np.argsort(times, kind="stable")  # shipped traces are sorted; a stable sort keeps ties in order
    order = order[times[order] >= trace.start_s]
    if len(order) == 0:
        raise ConfigError(
            f"no trace rows at or after start_s = {trace.start_s} s",
            file=file,
            field="workload.trace.start_s",
        )
    arrival = times[order] - trace.start_s
    if trace.time_scale is not None:
        arrival = arrival * trace.time_scale
    elif trace.rate_rps is not None:
        span = float(arrival[-1] - arrival[0]) if len(arrival) > 1 else 0.0
        if span <= 0:
            raise ConfigError(
                "cannot rescale to rate_rps: the selected rows span no time",
                file=file,
                field="workload.trace.rate_rps",
            )
        # (n - 1) gaps over the span is the mean rate; scale so that it becomes rate_rps.
        arrival = arrival * ((len(arrival) - 1) / span / trace.rate_rps)
    return arrival, order


def _gather_rows(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ragged rows ``rows`` of (values, offsets), in that order."""
    lengths = offsets[rows + 1] - offsets[rows]
    new_offsets, owner, position = block_positions(lengths)
    return values[offsets[rows][owner] + position], new_offsets
