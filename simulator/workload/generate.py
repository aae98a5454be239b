"""Workload generation: the request stream a run replays, from synthetic processes or from a real trace.

``generate(config, seed=..., block_size=...)`` turns the ``workload:`` section of a scenario into a
``Workload``: sorted numpy columns (arrival, prompt and output tokens, session) plus the chained KV block
hashes each request brings to the prefix cache, yielded lazily as ``RequestSpec`` in arrival order.

Rules this module keeps:
- Deterministic: the same config and seed give identical columns and hashes on every machine. Every random
  component draws from its own stream (``random_streams.Stream``), so adding sessions does not move the arrivals; hashes
  are a splitmix64 mix of integers, never Python's salted ``hash()``.
- Columnar: no Python loop per request when generating; block hashes (the only per-block data) are computed
  chunk by chunk while iterating, so a million requests stay far below 500 MB.
- Open loop: arrivals never depend on how the fleet serves them. A session's next turn arrives a fixed
  ``response_time_estimate_s`` plus an exponential think time after the previous turn's arrival; a closed
  loop (next turn after the real answer) would need the simulator's clock and is not modelled here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.workload.arrival import arrival_times
from simulator.workload.block_keys import BlockTag, SyntheticBlockKeys
from simulator.workload.config import WorkloadConfig
from simulator.workload.lengths import sample_lengths
from simulator.workload.random_streams import Stream, rng
from simulator.workload.sessions import draw_system_prompts, generate_sessions
from simulator.workload.trace_replay import replay_trace
from simulator.workload.workload import Workload


def generate(config: WorkloadConfig, *, seed: int, block_size: int, base_dir: Path | None = None) -> Workload:
    """The request stream ``config`` describes: same config and seed, same workload.

    ``block_size`` is the engine's KV block size (the hashes are per block); ``base_dir`` is the folder
    relative trace paths resolve against (the scenario file's).
    """
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if config.trace is not None:
        return replay_trace(config, config.trace, seed=seed, block_size=block_size, base_dir=base_dir)
    if config.sessions is not None:
        return generate_sessions(config, config.sessions, seed=seed, block_size=block_size, base_dir=base_dir)
    return _generate_requests(config, seed=seed, block_size=block_size, base_dir=base_dir)


def _generate_requests(config: WorkloadConfig, *, seed: int, block_size: int, base_dir: Path | None) -> Workload:
    """Independent requests: one arrival, one prompt (system prompt + user tokens), one answer each."""
    assert config.arrival is not None and config.prompt_tokens is not None and config.output_tokens is not None
    arrival = arrival_times(
        config.arrival,
        rng(seed, Stream.ARRIVAL),
        max_count=config.num_requests,
        duration_s=config.duration_s,
    )
    size = len(arrival)
    user, output = sample_lengths(config.prompt_tokens, config.output_tokens, seed, size, base_dir)
    prefix_id, prefix_tokens = draw_system_prompts(config.system_prompts, seed, size)
    prompt = user + prefix_tokens
    keys = SyntheticBlockKeys(
        seed=seed,
        block_size=block_size,
        stream_tag=BlockTag.REQUEST,
        stream_id=np.arange(size, dtype=np.int64),
        # Prompt and answer, as vLLM hashes every full block of a request's tokens (Request.block_hashes
        # grows as output fills blocks): no other request shares the answer, but the request itself hits
        # its own output blocks when it is recomputed after a preemption.
        hashed_tokens=prompt + output,
        prefix_id=prefix_id,
        prefix_tokens=prefix_tokens,
    )
    return Workload(
        arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, block_size=block_size, block_keys=keys
    )
