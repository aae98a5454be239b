"""Synthetic workloads: arrival processes, length distributions, system prompts, sessions, block hashes."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.core.request import RequestSpec
from simulator.errors import ConfigError
from simulator.workload.arrival import ARRIVAL_PROCESSES, CurveArrival, arrival_times
from simulator.workload.block_keys import chain_hashes
from simulator.workload.config import WorkloadConfig
from simulator.workload.generate import generate
from simulator.workload.lengths import LENGTH_DISTRIBUTIONS
from simulator.workload.shared_hashes import SharedHashes
from simulator.workload.workload import Workload

BLOCK = 16


def config(**fields: Any) -> WorkloadConfig:
    """A small Poisson chat workload; keyword arguments replace top-level sections."""
    base: dict[str, Any] = {
        "num_requests": 2000,
        "arrival": {"process": "poisson", "rate_rps": 10.0},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 4000},
        "output_tokens": {"dist": "uniform", "low": 1, "high": 300},
    }
    base.update(fields)
    return WorkloadConfig.model_validate(base)


def gaps(workload: Workload) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], workload.arrival_s]))


# --- determinism and the Workload API -----------------------------------------------------------------


def test_same_seed_gives_identical_workload_and_another_seed_does_not() -> None:
    cfg = config(system_prompts={"num_prompts": 4, "tokens": 100})
    first, again, other = (generate(cfg, seed=s, block_size=BLOCK) for s in (7, 7, 8))
    for column in ("arrival_s", "prompt_tokens", "output_tokens", "session_id"):
        np.testing.assert_array_equal(getattr(first, column), getattr(again, column))
    assert first.specs() == again.specs()
    assert not np.array_equal(first.arrival_s, other.arrival_s)
    assert first.block_hashes(0) != other.block_hashes(0)


def test_iteration_yields_request_specs_in_arrival_order() -> None:
    workload = generate(config(num_requests=5000), seed=1, block_size=BLOCK)  # > one iteration chunk
    specs = workload.specs()
    assert len(specs) == len(workload) == 5000
    assert all(isinstance(s, RequestSpec) for s in specs)
    assert [s.request_id for s in specs] == list(range(5000))
    assert [s.arrival_s for s in specs] == workload.arrival_s.tolist()
    assert all(s.session_id is None for s in specs)
    assert specs[4321].block_hashes == workload.block_hashes(4321)
    # Without sessions only the prompt is hashed, one hash per full block.
    # Prompt and answer are hashed (vLLM hashes every full block of a request, outputs included).
    assert all(len(s.block_hashes) == (s.prompt_tokens + s.output_tokens) // BLOCK for s in specs)


def test_columns_are_read_only_and_to_pandas_has_every_column() -> None:
    workload = generate(config(num_requests=50), seed=0, block_size=BLOCK)
    with pytest.raises(ValueError, match="read-only"):
        workload.arrival_s[0] = 1.0
    frame = workload.to_pandas()
    assert list(frame.columns) == ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "session_id"]
    assert len(frame) == 50 and frame["session_id"].isna().all()


def test_requests_without_shared_prefix_share_no_block() -> None:
    workload = generate(config(num_requests=500), seed=3, block_size=BLOCK)
    hashes = [h for spec in workload for h in spec.block_hashes]
    assert len(hashes) == len(set(hashes))


def test_registries_name_every_choice() -> None:
    assert set(ARRIVAL_PROCESSES) == {"poisson", "gamma", "constant", "curve", "diurnal"}
    assert set(LENGTH_DISTRIBUTIONS) == {"fixed", "uniform", "lognormal", "empirical"}


# --- arrival processes -------------------------------------------------------------------------------


def test_poisson_mean_rate_and_exponential_gaps() -> None:
    workload = generate(
        config(num_requests=20_000, arrival={"process": "poisson", "rate_rps": 25.0}), seed=11, block_size=BLOCK
    )
    g = gaps(workload)
    # Mean of 20k exponential gaps: standard error 1/sqrt(20k) = 0.7 % of the mean; allow 5 of them.
    assert g.mean() == pytest.approx(1 / 25.0, rel=0.035)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.05)


def test_duration_limit_gives_poisson_count() -> None:
    cfg = config(num_requests=None, duration_s=1000.0, arrival={"process": "poisson", "rate_rps": 20.0})
    workload = generate(cfg, seed=5, block_size=BLOCK)
    assert workload.arrival_s[-1] < 1000.0
    assert abs(len(workload) - 20_000) < 5 * np.sqrt(20_000)


def test_whichever_limit_comes_first_stops_generation() -> None:
    by_count = generate(config(num_requests=100, duration_s=1e6), seed=1, block_size=BLOCK)
    by_time = generate(config(num_requests=10**6, duration_s=10.0), seed=1, block_size=BLOCK)
    assert len(by_count) == 100
    assert by_time.arrival_s[-1] < 10.0 and len(by_time) < 200


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_arrivals_have_the_configured_burstiness(cv: float) -> None:
    cfg = config(num_requests=40_000, arrival={"process": "gamma", "rate_rps": 8.0, "cv": cv})
    g = gaps(generate(cfg, seed=2, block_size=BLOCK))
    assert g.mean() == pytest.approx(1 / 8.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.08)


def test_constant_arrivals_are_evenly_spaced() -> None:
    workload = generate(
        config(num_requests=1000, arrival={"process": "constant", "rate_rps": 4.0}), seed=0, block_size=BLOCK
    )
    np.testing.assert_allclose(workload.arrival_s, np.arange(1, 1001) / 4.0)


def test_curve_arrivals_follow_the_rate() -> None:
    curve = {"process": "curve", "points": [[0, 5.0], [100, 50.0]]}
    workload = generate(config(num_requests=None, duration_s=100.0, arrival=curve), seed=4, block_size=BLOCK)
    # rate(t) = 5 + 0.45 t: expected counts are the integrals over each half.
    counts = np.histogram(workload.arrival_s, bins=[0, 50, 100])[0]
    for count, expected in zip(counts, [812.5, 1937.5], strict=True):
        assert abs(count - expected) < 5 * np.sqrt(expected)


def test_curve_ending_at_zero_rate_ends_the_process() -> None:
    curve = {"process": "curve", "points": [[0, 10.0], [10, 0.0]]}
    workload = generate(config(num_requests=10_000, arrival=curve), seed=4, block_size=BLOCK)
    assert workload.arrival_s[-1] < 10.0
    assert abs(len(workload) - 50) < 5 * np.sqrt(50)


@pytest.mark.parametrize("arrival", [
    {"process": "poisson", "rate_rps": float("inf")},
    {"process": "curve", "points": [[0, float("inf")], [100, 10]]},
    {"process": "diurnal", "trough_rps": 1, "peak_rps": 5, "peak_at_s": float("nan")},
    {"process": "gamma", "rate_rps": 5, "cv": 1e-300},
])
def test_arrival_settings_that_are_not_finite_or_out_of_range_are_refused_at_load(arrival: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        config(num_requests=50, arrival=arrival)


@pytest.mark.parametrize("arrival", [
    # A burst far above the rest, later on: until it starts, candidates at its peak are almost all thrown away.
    {"process": "diurnal", "trough_rps": 1, "peak_rps": 5, "peak_at_s": 100, "period_s": 200,
     "bursts": [{"start_s": 1000, "duration_s": 10, "factor": 1e300}]},
    # Times so large that the rate's phase is not a number anywhere: nothing is ever kept.
    {"process": "diurnal", "trough_rps": 1, "peak_rps": 5, "peak_at_s": 1e308, "period_s": 1e-300},
])
def test_thinning_that_would_keep_almost_nothing_stops_with_a_config_error(arrival: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="arrival rate is below"):
        generate(config(num_requests=50, arrival=arrival), seed=0, block_size=BLOCK)


def test_a_diurnal_curve_far_out_in_time_still_has_a_rate() -> None:
    """The phase divides the time's offset first: finite for finite settings however large."""
    far = {"process": "diurnal", "trough_rps": 1, "peak_rps": 5, "peak_at_s": 1e308, "period_s": 1e308}
    workload = generate(config(num_requests=50, arrival=far), seed=0, block_size=BLOCK)
    assert len(workload) == 50 and np.all(np.isfinite(workload.arrival_s))


def test_arrival_times_needs_a_limit() -> None:
    process = CurveArrival(points=((0.0, 1.0),))
    with pytest.raises(ValueError):
        arrival_times(process, np.random.default_rng(0), max_count=None, duration_s=None)


# --- length distributions ----------------------------------------------------------------------------


def test_lognormal_median_and_clamps() -> None:
    prompt = {"dist": "lognormal", "median": 800, "sigma": 1.2, "min": 20, "max": 6000}
    workload = generate(config(num_requests=20_001, prompt_tokens=prompt), seed=9, block_size=BLOCK)
    assert np.median(workload.prompt_tokens) == pytest.approx(800, rel=0.04)
    assert workload.prompt_tokens.min() == 20 and workload.prompt_tokens.max() == 6000


def test_uniform_and_fixed_lengths() -> None:
    cfg = config(prompt_tokens={"dist": "fixed", "value": 77}, output_tokens={"dist": "uniform", "low": 3, "high": 5})
    workload = generate(cfg, seed=1, block_size=BLOCK)
    assert set(workload.prompt_tokens.tolist()) == {77}
    assert set(workload.output_tokens.tolist()) == {3, 4, 5}


def test_empirical_lengths_from_one_file_keep_rows_together(tmp_path: Path) -> None:
    rows = [(100, 7), (2000, 0), (350, 42)]
    trace = tmp_path / "lengths.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{p},{d}\n" for p, d in rows))
    source = {"dist": "empirical", "format": "vidur", "path": "lengths.csv"}
    cfg = config(
        prompt_tokens={**source, "column": "prompt_tokens"}, output_tokens={**source, "column": "output_tokens"}
    )
    workload = generate(cfg, seed=1, block_size=BLOCK, base_dir=tmp_path)
    pairs = set(zip(workload.prompt_tokens.tolist(), workload.output_tokens.tolist(), strict=True))
    assert pairs == {(100, 7), (2000, 1), (350, 42)}  # a zero-token answer counts as one token


# --- system prompts and sessions ---------------------------------------------------------------------


def test_system_prompt_blocks_are_shared_exactly() -> None:
    tokens = 100  # 6 full blocks of 16, the 7th straddles into the user's tokens
    cfg = config(
        system_prompts={"num_prompts": 3, "tokens": tokens}, prompt_tokens={"dist": "uniform", "low": 40, "high": 400}
    )
    specs = generate(cfg, seed=2, block_size=BLOCK).specs()
    assert all(s.prompt_tokens >= tokens + 40 for s in specs)
    by_prompt: dict[tuple[int, ...], list[RequestSpec]] = {}
    for spec in specs:
        by_prompt.setdefault(spec.block_hashes[: tokens // BLOCK], []).append(spec)
    assert len(by_prompt) == 3
    for a, b in itertools.combinations([group[0] for group in by_prompt.values()], 2):
        assert a.block_hashes[0] != b.block_hashes[0]
    for group in by_prompt.values():
        a, b = group[:2]
        assert a.block_hashes[tokens // BLOCK] != b.block_hashes[tokens // BLOCK]


def test_zipf_popularity_favours_the_first_system_prompt() -> None:
    cfg = config(system_prompts={"num_prompts": 20, "tokens": 64, "zipf_exponent": 1.5})
    specs = generate(cfg, seed=2, block_size=BLOCK).specs()
    counts = sorted(
        (sum(1 for s in specs if s.block_hashes[0] == h) for h in {s.block_hashes[0] for s in specs}),
        reverse=True,
    )
    assert counts[0] > 0.3 * len(specs)  # 1 / zeta-like weight of the first of 20 at s = 1.5 is ~0.4


SESSIONS = {
    "turns": {"dist": "uniform", "low": 1, "high": 6},
    "think_time_s": 15.0,
    "response_time_estimate_s": 4.0,
    "max_context_tokens": 6000,
}


def session_config(**fields: Any) -> WorkloadConfig:
    base: dict[str, Any] = {
        "num_requests": 3000,
        "arrival": {"process": "poisson", "rate_rps": 2.0},
        "prompt_tokens": {"dist": "lognormal", "median": 120, "sigma": 0.7, "max": 1000},
        "output_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.7, "max": 800},
        "system_prompts": {"num_prompts": 2, "tokens": 200},
        "sessions": SESSIONS,
    }
    return config(**{**base, **fields})


def turns_by_session(workload: Workload) -> dict[int, list[RequestSpec]]:
    sessions: dict[int, list[RequestSpec]] = {}
    for spec in workload:
        assert spec.session_id is not None
        sessions.setdefault(spec.session_id, []).append(spec)
    return sessions


def test_session_turns_extend_the_previous_turn_exactly() -> None:
    workload = generate(session_config(), seed=6, block_size=BLOCK)
    sessions = turns_by_session(workload)
    assert len(workload) == 3000 and any(len(turns) > 2 for turns in sessions.values())
    for turns in sessions.values():
        for before, after in itertools.pairwise(turns):
            history = before.prompt_tokens + before.output_tokens
            # Prompt and answer are both hashed: the next turn's prompt holds them.
            assert len(before.block_hashes) == history // BLOCK
            assert after.prompt_tokens > history
            assert after.block_hashes[: len(before.block_hashes)] == before.block_hashes
            # The block straddling the end of the previous turn gets a hash the previous turn never had.
            assert after.block_hashes[history // BLOCK] not in before.block_hashes
            assert after.arrival_s - before.arrival_s >= 4.0
        assert all(t.prompt_tokens + t.output_tokens <= 6000 for t in turns)


def test_sessions_share_only_their_system_prompt() -> None:
    workload = generate(session_config(), seed=6, block_size=BLOCK)
    first_turns = [turns[0] for turns in turns_by_session(workload).values()]
    shared = 200 // BLOCK
    prefixes = {t.block_hashes[:shared] for t in first_turns}
    assert len(prefixes) == 2
    after_prefix = [t.block_hashes[shared] for t in first_turns]
    assert len(set(after_prefix)) == len(after_prefix)


def test_sessions_first_requests_are_the_earliest_arrivals() -> None:
    # Doubling num_requests must not change the first N: no turn of an undrawn session comes earlier.
    small = generate(session_config(num_requests=500), seed=1, block_size=BLOCK)
    large = generate(session_config(num_requests=1000), seed=1, block_size=BLOCK)
    np.testing.assert_array_equal(small.arrival_s, large.arrival_s[:500])
    np.testing.assert_array_equal(small.session_id, large.session_id[:500])


def test_sessions_with_a_duration_end_there() -> None:
    workload = generate(session_config(num_requests=None, duration_s=300.0), seed=1, block_size=BLOCK)
    assert workload.arrival_s[-1] < 300.0
    assert set(turns_by_session(workload)) == set(range(workload.session_id.max() + 1))


def test_sessions_none_of_which_starts_before_the_duration_make_an_empty_workload() -> None:
    """As without sessions: a constant 0.1 sessions/s starts its first at 10 s, after a 5 s duration."""
    arrival = {"process": "constant", "rate_rps": 0.1}
    workload = generate(session_config(num_requests=None, duration_s=5.0, arrival=arrival), seed=1, block_size=BLOCK)
    assert len(workload) == 0


def test_think_time_zero_spaces_turns_by_the_response_estimate() -> None:
    sessions = {**SESSIONS, "think_time_s": 0.0, "turns": {"dist": "fixed", "value": 3}}
    workload = generate(session_config(sessions=sessions, num_requests=90), seed=1, block_size=BLOCK)
    for turns in turns_by_session(workload).values():
        for before, after in itertools.pairwise(turns):
            assert after.arrival_s - before.arrival_s == pytest.approx(4.0)


# --- block hashing -----------------------------------------------------------------------------------

MASK = (1 << 64) - 1


def reference_mix(value: int) -> int:
    """splitmix64's finaliser on Python ints."""
    z = (value + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, MASK), max_size=12), max_size=10))
def test_chain_hashes_matches_a_sequential_reference(rows: list[list[int]]) -> None:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    keys = np.array([k for r in rows for k in r], dtype=np.uint64)
    expected = []
    for row in rows:
        parent = 0x243F6A8885A308D3
        for key in row:
            parent = reference_mix(parent ^ key)
            expected.append(parent)
    assert chain_hashes(keys, offsets).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 3000), min_size=1, max_size=25),
    block_size=st.sampled_from([4, 16, 512, 1024]),
    window=st.integers(1, 400),
    calls=st.lists(st.tuples(st.booleans(), st.integers(0, 24), st.integers(1, 6)), max_size=30),
    seed=st.integers(0, 2**16),
)
def test_mooncake_hashes_read_in_windows_are_each_requests_own_chain(
    prompts: list[int], block_size: int, window: int, calls: list[tuple[bool, int, int]], seed: int
) -> None:
    """``MooncakeBlockKeys.hashes`` derives the chains of a window of requests ahead when requests are read in
    order and slices later calls from it: every call, in order or not, across window edges or inside one,
    answers what deriving just its own requests' chains gives."""
    from simulator.workload import block_keys
    from simulator.workload.block_keys import MooncakeBlockKeys

    rng = np.random.default_rng(seed)
    n = len(prompts)
    prompt = np.array(prompts, dtype=np.int64)
    ids_per_request = rng.integers(0, 8, n)
    offsets = np.concatenate([[0], np.cumsum(ids_per_request)])
    ids = rng.integers(0, 12, int(offsets[-1]))  # few ids: requests share prefixes
    keys = MooncakeBlockKeys(block_size=block_size, id_values=ids, id_offsets=offsets, prompt_tokens=prompt)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(block_keys, "_CHAIN_WINDOW_BLOCKS", window)  # windows of a few blocks: many edges
        position = 0
        for in_order, jump, length in calls:
            start = position if in_order else min(jump, n)
            stop = min(start + length, n)
            position = stop if stop < n else 0
            values, bounds = keys.hashes(start, stop)
            own_keys, own_bounds = keys.keys(start, stop)
            assert bounds.tolist() == own_bounds.tolist()
            assert values.tolist() == chain_hashes(own_keys, own_bounds).tolist()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    low=st.integers(1, 300),
    span=st.integers(0, 300),
    block_size=st.sampled_from([1, 16, 64]),
    num_requests=st.integers(1, 60),
)
def test_any_uniform_workload_is_sorted_bounded_and_hashed_per_block(
    seed: int, low: int, span: int, block_size: int, num_requests: int
) -> None:
    lengths = {"dist": "uniform", "low": low, "high": low + span}
    cfg = config(num_requests=num_requests, prompt_tokens=lengths, output_tokens=lengths)
    workload = generate(cfg, seed=seed, block_size=block_size)
    assert len(workload) == num_requests
    assert np.all(np.diff(workload.arrival_s) >= 0)
    assert workload.prompt_tokens.min() >= low and workload.prompt_tokens.max() <= low + span
    for spec in workload:
        assert len(spec.block_hashes) == (spec.prompt_tokens + spec.output_tokens) // block_size


# --- configuration errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"num_requestz": 10},  # unknown key
        {"arrival": {"process": "poisson", "rate_rps": 1.0, "burst": 2}},  # unknown key in a section
        {"arrival": {"process": "weibull", "rate_rps": 1.0}},  # unknown process
        {"arrival": {"process": "poisson", "rate_rps": 0.0}},
        {"arrival": {"process": "curve", "points": [[0, 1.0], [0, 2.0]]}},  # times not increasing
        {"arrival": {"process": "curve", "points": [[0, 0.0]]}},  # never any arrival
        {"prompt_tokens": {"dist": "uniform", "low": 10, "high": 5}},
        {"prompt_tokens": {"dist": "lognormal", "median": 100, "sigma": 1, "min": 50, "max": 10}},
        {"num_requests": None},  # no limit at all
        {"arrival": None},
        {"sessions": {"turns": {"dist": "fixed", "value": 2}, "think_time_s": 1.0}},  # missing estimate
    ],
)
def test_bad_configs_are_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        config(**fields)


def test_configs_are_frozen() -> None:
    cfg = config()
    with pytest.raises(ValidationError):
        cfg.num_requests = 5  # type: ignore[misc]


def test_bad_generate_arguments() -> None:
    with pytest.raises(ValueError, match="power of two"):
        generate(config(), seed=0, block_size=24)
    with pytest.raises(ValueError, match="seed"):
        generate(config(), seed=-1, block_size=16)


@pytest.mark.parametrize("lengths", [
    {"dist": "lognormal", "median": 9e7, "sigma": 0.5},
    {"dist": "fixed", "value": 10**12},
    {"dist": "uniform", "low": 1, "high": 10**10},
    {"dist": "lognormal", "median": 100, "sigma": 1, "max": 10**9},
])
def test_lengths_past_any_context_are_refused(lengths: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="less than or equal to 16777216"):
        config(prompt_tokens=lengths)


def test_an_unbounded_lognormal_tail_stops_at_what_a_request_can_hold() -> None:
    from simulator.workload.lengths import LognormalLength
    from simulator.workload.traces import MAX_TOKENS

    wide = LognormalLength(median=1e6, sigma=8.0)
    values = wide.sample(np.random.default_rng(0), 10_000, None)
    assert values.max() == MAX_TOKENS and values.min() >= 1


# --- private blocks: the workload's promise that nobody else carries a request's own hashes -------------


@pytest.mark.parametrize("shape", ["chat", "chat+system", "sessions", "sessions+system", "sessions-cut"])
def test_private_blocks_are_carried_by_their_request_only(shape: str) -> None:
    fields: dict[str, Any] = {"num_requests": 3000}
    if "system" in shape:
        fields["system_prompts"] = {"num_prompts": 3, "tokens": 100}
    if shape.startswith("sessions"):
        fields["sessions"] = {"turns": {"dist": "uniform", "low": 1, "high": 5}, "think_time_s": 1,
                              "response_time_estimate_s": 1,
                              **({"max_context_tokens": 1500} if shape == "sessions-cut" else {})}
    specs = generate(config(**fields), seed=4, block_size=BLOCK).specs()
    carriers: dict[int, set[int]] = {}
    for spec in specs:
        for block_hash in spec.block_hashes:
            carriers.setdefault(block_hash, set()).add(spec.request_id)
    private = [s for s in specs if s.private_from is not None and s.private_from < len(s.block_hashes)]
    assert private, "no request declares a private block: the test would prove nothing"
    for spec in private:
        assert spec.private_from is not None
        for block_hash in spec.block_hashes[spec.private_from:]:
            assert carriers[block_hash] == {spec.request_id}
    if shape.startswith("sessions"):
        by_session: dict[int | None, list[RequestSpec]] = {}
        for spec in specs:
            by_session.setdefault(spec.session_id, []).append(spec)
        for turns in by_session.values():
            # Only a session's last turn has private blocks, and they start where its previous turn's end.
            assert all(t.private_from is None for t in turns[:-1])
            last = turns[-1]
            if len(turns) > 1:
                assert last.private_from == len(turns[-2].block_hashes)


def test_specs_built_in_chunks_match_one_by_one() -> None:
    """Iteration builds hashes a few tens of thousands of blocks at a time (chunks of varying request
    counts; a private tail's blocks do not count, they are not derived): every spec equals the one built
    for its request alone."""
    workload = generate(config(num_requests=1500, system_prompts={"num_prompts": 2, "tokens": 64},
                               prompt_tokens={"dist": "lognormal", "median": 3000, "sigma": 1.0, "max": 30000},
                               sessions={"turns": {"dist": "uniform", "low": 1, "high": 6}, "think_time_s": 1,
                                         "response_time_estimate_s": 1, "max_context_tokens": 60000}),
                        seed=2, block_size=BLOCK)
    bounds = list(workload._chunk_bounds(True))
    assert len(bounds) > 5 and len(set(np.diff(bounds).tolist())) > 1, "one chunk size: nothing tested"
    for spec in workload.specs():
        assert list(spec.block_hashes) == list(workload.block_hashes(spec.request_id))


def test_session_turns_share_their_previous_turns_hash_objects() -> None:
    """A later turn's first hashes are its previous turn's very int objects (a prefix-cache lookup then meets
    the keys the cache holds, and a turn costs only its new blocks' ints), across chunks too; a session's
    entry is dropped at its last turn, so a whole pass holds nothing at its end."""
    workload = generate(session_config(), seed=6, block_size=BLOCK)
    sessions = turns_by_session(workload)
    shared = 0
    for turns in sessions.values():
        for before, after in itertools.pairwise(turns):
            n = len(before.block_hashes)
            assert all(a is b for a, b in zip(after.block_hashes[:n], before.block_hashes, strict=True))
            shared += n
    assert shared > 10_000
    held = SharedHashes()
    for start, stop in itertools.pairwise(workload._chunk_bounds(True)):
        workload._chunk(start, stop, shared=held)
    assert held.num_open_sessions == 0


@pytest.mark.parametrize("sessions", [True, False])
def test_requests_with_one_system_prompt_share_its_hash_objects(sessions: bool) -> None:
    """Every request with a system prompt starts with that prompt's very hash objects (sessions or not), and
    every tuple equals the one the plain path makes value for value, private tails included."""
    fields: dict[str, Any] = {"system_prompts": {"num_prompts": 3, "tokens": 160}}
    workload = generate(session_config(**fields) if sessions else config(num_requests=2000, **fields),
                        seed=4, block_size=BLOCK)
    specs = workload.specs()
    plain = [spec for start, stop in itertools.pairwise(workload._chunk_bounds(True))
             for spec in workload._chunk(start, stop)]
    assert [s.block_hashes for s in specs] == [s.block_hashes for s in plain]
    assert [(s.private_from, s._tail) for s in specs] == [(s.private_from, s._tail) for s in plain]
    prompt_blocks = 160 // BLOCK
    first_of: dict[int, tuple[int, ...]] = {}
    shared = 0
    for spec in specs:
        head = spec.block_hashes[:prompt_blocks]
        if len(head) < prompt_blocks:
            continue
        owner = first_of.setdefault(head[0], head)  # the first hash names the prompt (position 0)
        assert all(a is b for a, b in zip(head, owner, strict=True))
        shared += owner is not head
    assert shared > 1000 and len(first_of) == 3


@pytest.mark.parametrize("kind", ["mooncake", "synthetic"])
def test_values_from_is_the_hashes_from_each_requests_first_block(kind: str) -> None:
    """``BlockKeys.values_from(first)`` is each request's value hashes from block ``first[i]`` on, back to back;
    ``value_counts`` counts them; a synthetic system prompt's ``prefix_values`` are its requests' first hashes."""
    from simulator.workload.block_keys import BlockTag, MooncakeBlockKeys, SyntheticBlockKeys

    rng = np.random.default_rng(3)
    n = 40
    prompt = rng.integers(1, 2000, n)
    if kind == "mooncake":
        ids_per_request = prompt // 512 + 1
        offsets = np.concatenate([[0], np.cumsum(ids_per_request)])
        ids = rng.integers(0, 50, int(offsets[-1]))
        keys: Any = MooncakeBlockKeys(block_size=BLOCK, id_values=ids, id_offsets=offsets, prompt_tokens=prompt)
        values, bounds = keys.hashes(0, n)
    else:
        prefix = rng.integers(-1, 3, n)
        keys = SyntheticBlockKeys(seed=5, block_size=BLOCK, stream_tag=BlockTag.REQUEST, stream_id=np.arange(n),
                                  hashed_tokens=prompt, prefix_id=prefix, prefix_tokens=96)
        split = keys.split_hashes(0, n)
        values, bounds = split.values, split.offsets
        assert keys.tails(0, n) is not None
        assert keys.tails(0, n)[1].tolist() == split.tail_stop.tolist()
        head = keys.prefix_values([0, 2]).tolist()
        for i in range(n):
            if prefix[i] in (0, 2) and bounds[i + 1] - bounds[i] >= 6:
                at = 0 if prefix[i] == 0 else 6
                assert values[bounds[i]:bounds[i] + 6].tolist() == head[at:at + 6]
    counts = keys.value_counts(0, n)
    assert counts.tolist() == np.diff(bounds).tolist()
    first = np.minimum(rng.integers(0, 8, n), counts)
    expected = [h for i in range(n) for h in values[bounds[i] + first[i]:bounds[i + 1]].tolist()]
    assert keys.values_from(0, n, first).tolist() == expected


def test_a_system_prompt_longer_than_the_context_is_refused_at_load() -> None:
    with pytest.raises(ValidationError, match=r"system_prompts.tokens \(7000\) leaves no room"):
        session_config(system_prompts={"num_prompts": 2, "tokens": 7000})


def test_sessions_whose_first_turns_do_not_fit_end_in_an_error_not_an_endless_draw() -> None:
    """The system prompt fits, but with every prompt at least 300 tokens no first turn does: drawing half as
    many sessions again each time would grow until memory ran out."""
    too_long = session_config(system_prompts={"num_prompts": 2, "tokens": 5800},
                              prompt_tokens={"dist": "lognormal", "median": 400, "sigma": 0.5, "min": 300})
    with pytest.raises(ConfigError, match=r"only 0 turns of \d+ sessions fit under sessions.max_context_tokens"):
        generate(too_long, seed=1, block_size=BLOCK)
    # judged on the first draw, not after drawing twenty sessions per request asked for
    many = too_long.model_copy(update={"num_requests": 200_000})
    with pytest.raises(ConfigError) as refused:
        generate(many, seed=1, block_size=BLOCK)
    assert int(str(refused.value).split(" turns of ")[1].split()[0]) <= 200_000
    # where some first turns fit, the draw goes on until it has the turns asked for
    some = session_config(system_prompts={"num_prompts": 2, "tokens": 5500}, num_requests=300)
    assert len(generate(some, seed=1, block_size=BLOCK)) == 300
