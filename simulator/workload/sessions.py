"""Multi-turn sessions and shared system prompts: when turns arrive, how long each prompt grows (the
whole conversation so far), and which system prompt each session or request draws."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.errors import ConfigError
from simulator.workload.arrival import arrival_times
from simulator.workload.block_keys import BlockTag, SyntheticBlockKeys
from simulator.workload.config import SessionConfig, SystemPromptPool, WorkloadConfig
from simulator.workload.lengths import sample_lengths
from simulator.workload.random_streams import Stream, rng
from simulator.workload.workload import Workload

_MAX_SESSIONS_PER_REQUEST = 20
"""Sessions drawn per request asked for before ``generate_sessions`` gives up: a session holds at least one
turn unless its first turn does not fit under ``max_context_tokens``, so needing more means that nearly none
fits."""
_SESSIONS_JUDGED = 200
"""Sessions drawn before the share of them that fits is judged (``generate_sessions``)."""


def draw_system_prompts(pool: SystemPromptPool | None, seed: int, size: int) -> tuple[np.ndarray | None, int]:
    """(system prompt index per draw, or None without a pool; tokens of each system prompt)."""
    if pool is None:
        return None, 0
    weights = 1.0 / np.arange(1, pool.num_prompts + 1, dtype=np.float64) ** pool.zipf_exponent
    chosen = rng(seed, Stream.SYSTEM_PROMPT).choice(pool.num_prompts, size, p=weights / weights.sum())
    return chosen.astype(np.int64), pool.tokens


def _segment_cumsum(values: np.ndarray, first: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Inclusive running sum of ``values`` restarting at each segment's first index."""
    total = np.cumsum(values)
    return total - (total[first] - values[first])[segment]


def generate_sessions(
    config: WorkloadConfig, sessions: SessionConfig, *, seed: int, block_size: int, base_dir: Path | None
) -> Workload:
    """Sessions start by the arrival process; their turns are then sorted with everyone else's.

    With num_requests N, the first N turns by arrival must not miss a turn of a session not yet drawn.
    Any later session starts after the last drawn one, so once N kept turns arrive by that start we are
    done; otherwise draw more sessions. Every draw is sequential per stream, so drawing more sessions
    only appends to the earlier draws and the result does not depend on how many were drawn.
    """
    num_sessions = _initial_session_count(config.num_requests, sessions, seed=seed, base_dir=base_dir)
    while True:
        turns = _session_turns(config, sessions, seed=seed, num_sessions=num_sessions, base_dir=base_dir)
        order = np.argsort(turns["arrival_s"], kind="stable")
        if num_sessions is None or len(turns["session_starts"]) < num_sessions:
            break  # every session that can start did: nothing is missing
        horizon = turns["session_starts"][-1]
        if np.count_nonzero(turns["arrival_s"] <= horizon) >= (config.num_requests or 0):
            break
        kept = len(turns["arrival_s"])
        # Each draw is half as large again: without a stop the loop would grow until memory ran out. Fewer
        # turns kept than one per _MAX_SESSIONS_PER_REQUEST sessions drawn (judged on a few hundred) says
        # that far more than that many sessions per request would be needed: stop now, not sessions later.
        hopeless = num_sessions >= _SESSIONS_JUDGED and kept * _MAX_SESSIONS_PER_REQUEST < num_sessions
        if hopeless or num_sessions > _MAX_SESSIONS_PER_REQUEST * (config.num_requests or 0):
            raise ConfigError(
                f"only {kept} turns of {num_sessions} sessions fit under "
                f"sessions.max_context_tokens ({sessions.max_context_tokens}): a session ends before a turn "
                "whose system prompt, history, prompt and answer exceed it, and most first turns do; raise "
                "max_context_tokens or shorten the prompts", field="workload")
        num_sessions = num_sessions * 3 // 2 + 1
    order = order[: config.num_requests]
    sorted_turns = {name: column[order] for name, column in turns.items() if name != "session_starts"}
    prefix_id = sorted_turns["prefix_id"] if config.system_prompts is not None else None
    # A session's last turn (of those kept) is the only one to walk its new blocks: they are private.
    session = sorted_turns["session_id"]
    last = np.zeros(len(session), dtype=bool)
    last[len(session) - 1 - np.unique(session[::-1], return_index=True)[1]] = True
    private_from = np.where(last, sorted_turns["shared_tokens"] // block_size, -1)
    keys = SyntheticBlockKeys(
        seed=seed,
        block_size=block_size,
        stream_tag=BlockTag.SESSION,
        stream_id=sorted_turns["session_id"],
        hashed_tokens=sorted_turns["prompt_tokens"] + sorted_turns["output_tokens"],  # next turn reuses both
        prefix_id=prefix_id,
        prefix_tokens=config.system_prompts.tokens if config.system_prompts is not None else 0,
        private_from=private_from,
    )
    return Workload(
        arrival_s=sorted_turns["arrival_s"],
        prompt_tokens=sorted_turns["prompt_tokens"],
        output_tokens=sorted_turns["output_tokens"],
        session_id=sorted_turns["session_id"],
        block_size=block_size,
        block_keys=keys,
    )


def _initial_session_count(
    num_requests: int | None, sessions: SessionConfig, *, seed: int, base_dir: Path | None
) -> int | None:
    """Sessions likely to hold num_requests turns: drawing num_requests sessions would always do, but
    would cost several times the memory of the turns finally kept."""
    if num_requests is None:
        return None
    probe = sessions.turns.sample(rng(seed, Stream.PROBE), 4096, base_dir)
    return min(num_requests, int(1.1 * num_requests / max(float(probe.mean()), 1.0)) + 100)


def _session_turns(
    config: WorkloadConfig,
    sessions: SessionConfig,
    *,
    seed: int,
    num_sessions: int | None,
    base_dir: Path | None,
) -> dict[str, np.ndarray]:
    """Every kept turn of the first ``num_sessions`` sessions, in (session, turn) order."""
    assert config.arrival is not None and config.prompt_tokens is not None and config.output_tokens is not None
    starts = arrival_times(
        config.arrival, rng(seed, Stream.ARRIVAL), max_count=num_sessions, duration_s=config.duration_s
    )
    num_turns = np.maximum(sessions.turns.sample(rng(seed, Stream.TURNS), len(starts), base_dir), 1)
    session = np.repeat(np.arange(len(starts), dtype=np.int64), num_turns)
    first = (np.cumsum(num_turns) - num_turns).astype(np.int64)  # each session's first row (none for none)

    gaps = sessions.response_time_estimate_s + rng(seed, Stream.THINK).exponential(
        sessions.think_time_s, len(session)
    )
    gaps[first] = 0.0  # the first turn arrives when the session starts
    arrival = starts[session] + _segment_cumsum(gaps, first, session)

    user, output = sample_lengths(config.prompt_tokens, config.output_tokens, seed, len(session), base_dir)
    session_prefix, prefix_tokens = draw_system_prompts(config.system_prompts, seed, len(starts))
    exchanged = user + output
    history = _segment_cumsum(exchanged, first, session) - exchanged  # earlier turns' prompts and answers
    prompt = prefix_tokens + history + user

    # prompt + output grows with every turn, so this keeps a prefix of each session's turns.
    keep = prompt + output <= sessions.max_context_tokens
    if config.duration_s is not None:
        keep &= arrival < config.duration_s
    prefix_id = session_prefix[session] if session_prefix is not None else np.full(len(session), -1)
    return {
        "session_starts": starts,
        "arrival_s": arrival[keep],
        "prompt_tokens": prompt[keep],
        "output_tokens": output[keep],
        "session_id": session[keep],
        "prefix_id": prefix_id[keep],
        "shared_tokens": (prompt - user)[keep],
    }
