"""What a bench sends: a scenario's or a trace's request stream as timed requests with concrete prompts.

Lengths and arrival times come from the simulator's own workload generator (``simulator.workload``), so
a bench and a simulation of the same scenario and seed replay the same requests. ``--rate`` replaces the
arrivals with a seeded Poisson process (``inf``: all at once, as vLLM's benchmark does by default).

Prompts are token ids by default — exact lengths on any server that accepts ids (vLLM, fleetsim serve):
ids of a request's hashed KV blocks are a function of the block's hash, so requests that share a prefix
in the workload (system prompts, sessions) share it on the server too and hit its prefix cache; the rest
are seeded pseudo-random. ``text`` sends the same ids as characters (``calibration.serve.tokens``: exact
on fleetsim serve, approximate under another tokenizer).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from calibration.serve import tokens
from simulator.errors import ConfigError
from simulator.workload.workload import Workload

PROMPT_ID_RANGE = 256
"""Prompt ids are drawn below this: valid in every catalogue model's vocabulary and in real tokenizers'."""


class PromptFormat(StrEnum):
    IDS = "ids"
    TEXT = "text"


@dataclass(frozen=True, slots=True)
class BenchRequest:
    index: int
    arrival_s: float
    prompt: list[int] | str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class BenchWorkload:
    """The requests to send and the workload they came from (the simulator replays the latter)."""

    workload: Workload
    requests: list[BenchRequest]
    scenario: object | None
    """The loaded scenario (``simulator.scenario.Scenario``) when there was one: its SLO and engine."""


def load_workload(*, scenario: Path | None, trace: Path | None, trace_format: str = "azure",
                  num_requests: int | None, rate_rps: float | None, seed: int | None,
                  prompt_format: PromptFormat = PromptFormat.IDS, overrides: tuple[str, ...] = ()) -> BenchWorkload:
    """The request stream of a scenario file or a trace file, cut to ``num_requests``, re-timed by
    ``rate_rps`` when given."""
    from simulator.workload.generate import generate

    if (scenario is None) == (trace is None):
        raise ConfigError("give --scenario or --trace (one of them)")
    loaded_scenario = None
    if scenario is not None:
        from simulator.scenario import load_scenario, resolve_replica

        sets = list(overrides)
        if num_requests is not None:
            sets.append(f"workload.num_requests={num_requests}")
        loaded = load_scenario(scenario, sets, seed=seed)
        loaded_scenario = loaded.scenario
        block_size = resolve_replica(loaded.scenario).scheduler.block_size
        workload = generate(loaded.scenario.workload, seed=loaded.scenario.seed, block_size=block_size,
                            base_dir=loaded.base_dir)
        seed = loaded.scenario.seed
    else:
        from simulator.workload.config import WorkloadConfig

        try:
            config = WorkloadConfig.model_validate(
                {"num_requests": num_requests or 1000, "trace": {"format": trace_format, "path": str(trace)}})
        except ValueError as err:
            raise ConfigError(f"bad trace settings: {err}", field="trace") from None
        seed = seed or 0
        workload = generate(config, seed=seed, block_size=16)
    if not len(workload):
        raise ConfigError("the workload has no requests")
    if rate_rps is not None:
        workload = workload.with_arrivals(poisson_arrivals(len(workload), rate_rps, seed))
    return BenchWorkload(workload, bench_requests(workload, prompt_format=prompt_format, seed=seed),
                         loaded_scenario)


def poisson_arrivals(count: int, rate_rps: float, seed: int) -> np.ndarray:
    """Seeded Poisson arrival times at ``rate_rps`` (all zero for an infinite rate)."""
    if not rate_rps > 0:
        raise ConfigError(f"--rate must be > 0, got {rate_rps}", field="rate")
    if math.isinf(rate_rps):
        return np.zeros(count)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_rps, size=count)
    gaps[0] = 0.0  # the first request starts the run
    return np.cumsum(gaps)


def bench_requests(workload: Workload, *, prompt_format: PromptFormat, seed: int) -> list[BenchRequest]:
    block_size = workload.block_size
    out = []
    for i in range(len(workload)):
        prompt_tokens = int(workload.prompt_tokens[i])
        ids: list[int] = []
        for block_hash in workload.block_hashes(i):
            if len(ids) >= prompt_tokens:
                break
            ids.extend(_block_ids(block_hash, block_size))
        filler = random.Random(f"bench:{seed}:{i}")
        ids = ids[:prompt_tokens] + [filler.randrange(PROMPT_ID_RANGE) for _ in range(prompt_tokens - len(ids))]
        prompt: list[int] | str = ids if prompt_format is PromptFormat.IDS else tokens.decode(ids)
        out.append(BenchRequest(i, float(workload.arrival_s[i]), prompt, prompt_tokens, int(workload.output_tokens[i])))
    return out


def _block_ids(block_hash: int, block_size: int) -> list[int]:
    """The ids of a hashed block: a function of its hash alone (equal prefixes, equal ids)."""
    rng = random.Random(block_hash)
    return [rng.randrange(PROMPT_ID_RANGE) for _ in range(block_size)]
