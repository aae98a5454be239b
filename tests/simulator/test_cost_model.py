"""CostModel: the §4.3 form, its edge cases, and exact agreement of the vectorised decode path."""

from __future__ import annotations

import bisect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel, StepEnds, allreduce_time_s
from simulator.cost.profile import CommModel, load_profile, parse_profile
from simulator.errors import ConfigError

# Host work added to device work (not overlapped), so the form by hand is one sum.
BASE = load_profile("h200-llama-3-8b-tp1-analytic").model_copy(update={"overlap_host": False})


def _profile(**update: object):
    return BASE.model_copy(update=update)


def decode(batch: int, ctx_sum: int) -> StepShape:
    return StepShape(batch, batch, batch, ctx_sum, 0, 0.0)


def prefill(n: int, prefix: int = 0) -> StepShape:
    return StepShape(1, n, 0, 0, n, n * (prefix + n / 2))


def test_empty_step_costs_nothing() -> None:
    model = CostModel(BASE)
    empty = StepShape(0, 0, 0, 0, 0, 0.0)
    assert model.step_time(empty) == 0.0
    assert model.device_time(empty) == 0.0
    assert model.host_time(empty) == 0.0


def test_form_by_hand() -> None:
    d, h = BASE.device_s, BASE.host_s
    shape = StepShape(5, 1028, 4, 4000, 1024, 1024 * (100 + 512))
    knee = (d.weight_s**d.knee_p + (d.per_token_s * 1028) ** d.knee_p) ** (1 / d.knee_p)
    dev = d.a0_s + knee + d.per_ctx_token_s * 4000 + d.per_attn_pair_s * shape.prefill_attention_pairs + d.per_seq_s * 5
    host = h.h0_s + h.per_seq_s * 5 + h.per_token_s * 1028
    model = CostModel(BASE)
    assert model.device_time(shape) == pytest.approx(dev, rel=1e-12)
    assert model.host_time(shape) == pytest.approx(host, rel=1e-12)
    assert model.step_time(shape) == pytest.approx(dev + host, rel=1e-12)


def test_overlap_takes_max() -> None:
    model = CostModel(_profile(overlap_host=True))
    shape = decode(8, 8 * 1000)
    assert model.step_time(shape) == pytest.approx(max(model.device_time(shape), model.host_time(shape)))


def test_decode_floor_and_prefill_regimes() -> None:
    model = CostModel(BASE)
    d = BASE.device_s
    # Batch 1 decode sits on the weight-read floor.
    assert model.device_time(decode(1, 1)) == pytest.approx(d.a0_s + d.weight_s, rel=1e-3)
    # A long prefill is compute-bound: about f·N plus attention.
    n = 8192
    t = model.device_time(prefill(n))
    assert t == pytest.approx(d.a0_s + d.per_token_s * n + d.per_attn_pair_s * n * n / 2 + d.per_seq_s, rel=0.01)


def test_monotone_in_every_feature() -> None:
    model = CostModel(BASE)
    assert model.step_time(decode(32, 32_000)) < model.step_time(decode(32, 64_000))
    assert model.step_time(decode(32, 32_000)) < model.step_time(decode(64, 32_000))
    assert model.step_time(prefill(512, 0)) < model.step_time(prefill(512, 4096))


def test_swap_priced_by_host_link() -> None:
    model = CostModel(BASE)
    tokens = 1000
    expected = tokens * BASE.memory.kv_bytes_per_token / BASE.host_link_Bps
    only_swap = StepShape(0, 0, 0, 0, 0, 0.0, num_swap_tokens=tokens)
    assert model.step_time(only_swap) == pytest.approx(expected)
    with_swap = StepShape(4, 4, 4, 400, 0, 0.0, num_swap_tokens=tokens)
    assert model.step_time(with_swap) - model.step_time(decode(4, 400)) == pytest.approx(expected)


def test_allreduce_formula() -> None:
    # research §5: 70B TP8, decode B 32 → 512 KiB per all-reduce.
    nbytes = 32 * 8192 * 2
    t = allreduce_time_s(nbytes, 8, 8e-6, 450e9)
    assert t == pytest.approx(8e-6 + 2 * 7 / 8 * nbytes / 450e9)
    assert allreduce_time_s(nbytes, 1, 8e-6, 450e9) == 0.0


def test_tp_comm_added_per_layer() -> None:
    comm = CommModel(alpha_s=8e-6, bus_bandwidth_Bps=450e9, num_layers=80, hidden_size=8192)
    with_comm = CostModel(_profile(tp=8, comm=comm))
    without = CostModel(_profile(tp=8, comm=None))
    shape = decode(32, 32 * 1024)
    expected = 2 * 80 * allreduce_time_s(32 * 8192 * 2, 8, 8e-6, 450e9)
    assert with_comm.step_time(shape) - without.step_time(shape) == pytest.approx(expected, rel=1e-9)


def test_cuda_graph_padding_only_for_decode() -> None:
    padded = CostModel(_profile(cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 32)))
    plain = CostModel(BASE)
    assert padded.step_time(decode(5, 500)) == plain.step_time(StepShape(8, 8, 8, 500, 0, 0.0))
    assert padded.step_time(decode(64, 640)) == plain.step_time(decode(64, 640))  # beyond the last bucket
    mixed = StepShape(5, 516, 4, 400, 512, 512 * 256.0)
    assert padded.step_time(mixed) == plain.step_time(mixed)


def test_scale_multiplies_every_time() -> None:
    model = CostModel(BASE)
    up = model.scale(1.1)
    for shape in (decode(1, 10), decode(256, 256 * 4096), prefill(2048, 1024)):
        assert up.step_time(shape) == pytest.approx(1.1 * model.step_time(shape), rel=1e-12)
    assert up.scale(1 / 1.1).step_time(decode(3, 30)) == pytest.approx(model.step_time(decode(3, 30)))
    with pytest.raises(ValueError):
        model.scale(0.0)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 512),
    ctx=st.integers(0, 2_000_000),
    steps=st.integers(1, 64),
    overlap=st.booleans(),
    factor=st.sampled_from([1.0, 0.9, 1.1]),
    buckets=st.booleans(),
    floor=st.sampled_from([0.0, 0.03]),
)
def test_decode_times_bit_identical_to_step_time(
    batch: int, ctx: int, steps: int, overlap: bool, factor: float, buckets: bool, floor: float
) -> None:
    """With graphs, a batch beyond the last one runs eagerly: a 30 ms floor binds at short contexts and not
    at long ones, and the vectorised path applies it exactly as step_time does."""
    device = BASE.device_s.model_copy(update={"eager_floor_s": floor if buckets else 0.0})
    profile = _profile(device_s=device, overlap_host=overlap, cuda_graph_batch_sizes=(1, 8, 64, 256) if buckets else ())
    model = CostModel(profile).scale(factor)
    times = model.decode_times(batch, ctx, steps)
    reference = [model.step_time(decode(batch, ctx + j * batch)) for j in range(steps)]
    assert times.dtype == np.float64 and len(times) == steps
    assert times.tolist() == reference  # exact, not approximate: the fast path must not drift
    assert math.isclose(model.decode_total_time(batch, ctx, steps), sum(reference), rel_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(0, 300),
    ctx=st.integers(0, 2_000_000),
    steps=st.integers(0, 150),
    start=st.floats(0.0, 1e6),
    overlap=st.booleans(),
    buckets=st.booleans(),
    multi=st.sampled_from([0.0, 7e-3]),
    floor=st.sampled_from([0.0, 0.03]),
)
def test_decode_step_ends_equal_a_step_by_step_clock(
    batch: int, ctx: int, steps: int, start: float, overlap: bool, buckets: bool, multi: float, floor: float
) -> None:
    device = BASE.device_s.model_copy(update={"multi_token_s": multi, "eager_floor_s": floor if buckets else 0.0})
    profile = _profile(device_s=device, overlap_host=overlap, cuda_graph_batch_sizes=(1, 8, 64, 256) if buckets else ())
    model = CostModel(profile).scale(1.1)
    clock, reference = start, []
    for j in range(steps):
        clock += model.step_time(decode(batch, ctx + j * batch)) if batch else 0.0
        reference.append(clock)
    assert model.decode_step_ends(batch, ctx, steps, start) == reference  # to the bit


_query = st.one_of(
    st.tuples(st.just("end"), st.integers(0, 40)),
    st.tuples(st.just("last"), st.just(0)),
    st.tuples(st.just("by"), st.floats(-0.05, 1.2)),
    st.tuples(st.just("before"), st.floats(-0.05, 1.2)),
)


@settings(max_examples=150, deadline=None)
@given(
    batch=st.integers(0, 64),
    ctx=st.integers(0, 200_000),
    steps=st.integers(0, 40),
    overlap=st.booleans(),
    queries=st.lists(_query, max_size=30),
    reuse=st.booleans(),
    first=st.one_of(st.none(), st.floats(0.0, 0.05), st.just(0.0)),
)
def test_step_ends_answer_as_the_list_of_ends_would(
    batch: int, ctx: int, steps: int, overlap: bool, queries: list[tuple[str, float]], reuse: bool,
    first: float | None,
) -> None:
    """Questions in any order (the walk moves forward, steps back one, or starts over) get the answers the
    full list of ends gives: the same floats, and bisect's counts, ties included (an empty batch's steps
    all end at the start). With a first step of its own (``first``: its time), the decodes follow from
    its end, their context sums from the second step's."""
    model = CostModel(_profile(overlap_host=overlap))
    start = 0.25
    if first is not None and steps:
        first_end = start + first
        ends = [first_end, *model.decode_step_ends(batch, ctx + batch, steps - 1, first_end)]
    else:
        ends = model.decode_step_ends(batch, ctx, steps, start)
    walker = StepEnds()
    if reuse:  # a replica's object, reset from an earlier run (with or without a first step of its own)
        walker.reset(model, batch + 3, ctx + 7, steps + 5, 0.0, -1.0 if first is not None else 0.01)
        walker.ended_by(0.5)
    walker.reset(model, batch, ctx, steps, start, -1.0 if first is None else first)
    last = ends[-1] if ends else start
    assert walker.end_floor <= last <= walker.end_ceiling
    scale = ends[-1] - start if ends and ends[-1] > start else 1.0
    for kind, value in queries:
        if kind == "last":  # the exact end, walked to aside: the cursor stays for the next question
            assert walker.last_end() == last
        elif kind == "end":
            step = int(value) % (steps + 1)
            assert walker.end(step) == ([start, *ends][step])
        elif kind == "by":
            now = start + value * scale
            assert walker.ended_by(now) == bisect.bisect_right(ends, now)
            if ends:  # exactly at an end: ties count as ended
                tie = ends[int(value * 1000) % len(ends)]
                assert walker.ended_by(tie) == bisect.bisect_right(ends, tie)
        else:
            t = start + value * scale
            assert walker.ended_before(t) == bisect.bisect_left(ends, t)
            if ends:
                tie = ends[int(value * 1000) % len(ends)]
                assert walker.ended_before(tie) == bisect.bisect_left(ends, tie)


@settings(max_examples=300, deadline=None)
@given(
    batch=st.integers(0, 300),
    ctx=st.integers(0, 2_000_000),
    steps=st.integers(0, 150),
    start=st.floats(0.0, 1e6),
    overlap=st.booleans(),
    buckets=st.booleans(),
    floor=st.sampled_from([0.0, 0.03, 1e-4]),
    host=st.sampled_from([None, 1e-3, 0.05]),
    first=st.one_of(st.none(), st.floats(0.0, 0.05)),
    factor=st.sampled_from([1.0, 1.1, 0.37]),
)
def test_a_runs_last_end_lies_in_its_closed_form_bracket(
    batch: int, ctx: int, steps: int, start: float, overlap: bool, buckets: bool, floor: float, host: float | None,
    first: float | None, factor: float,
) -> None:
    """``reset`` brackets the last step's end without walking to it (most runs are cut first): the exact end,
    added up one step at a time, lies between ``end_floor`` and ``end_ceiling``, which are a few ulps apart;
    host time above or below the device time (overlapping: a max that switches), and steps held at the eager
    floor for part of the run (small batches are replayed as graphs, large ones are not)."""
    device = BASE.device_s.model_copy(update={"eager_floor_s": floor if buckets else 0.0})
    host_s = BASE.host_s if host is None else BASE.host_s.model_copy(update={"h0_s": host})
    profile = _profile(device_s=device, host_s=host_s, overlap_host=overlap,
                       cuda_graph_batch_sizes=(1, 8, 64, 256) if buckets else ())
    model = CostModel(profile).scale(factor)
    if first is not None and steps:
        exact = [start + first, *model.decode_step_ends(batch, ctx + batch, steps - 1, start + first)]
    else:
        exact = model.decode_step_ends(batch, ctx, steps, start)
    last = exact[-1] if exact else start
    ends = StepEnds()
    ends.reset(model, batch, ctx, steps, start, -1.0 if first is None else first)
    assert ends.end_floor <= last <= ends.end_ceiling
    assert ends.end_ceiling - ends.end_floor <= 1e-12 * (last + 1.0)
    assert ends.last_end() == last
    assert ends.end_floor == last == ends.end_ceiling  # known now: the bracket closes on it


@settings(max_examples=300, deadline=None)
@given(a=st.floats(-10.0, 10.0), b=st.floats(-1.0, 1.0), floor=st.floats(-5.0, 5.0), count=st.integers(0, 400))
def test_the_closed_form_sum_of_clamped_affine_terms_adds_them_up(a: float, b: float, floor: float,
                                                                  count: int) -> None:
    from simulator.cost.cost_model import _sum_max_affine

    terms = [max(a + b * i, floor) for i in range(count)]
    scale = sum(abs(t) for t in terms) + abs(a) + abs(b) * count + abs(floor) + 1.0
    assert _sum_max_affine(a, b, floor, count) == pytest.approx(math.fsum(terms), abs=1e-12 * count * scale)


def test_decode_times_degenerate() -> None:
    model = CostModel(BASE)
    assert model.decode_times(4, 100, 0).shape == (0,)
    assert model.decode_total_time(4, 100, 0) == 0.0
    assert model.decode_times(0, 0, 3).tolist() == [0.0, 0.0, 0.0]


def test_multi_token_term_defaults_to_zero_and_prices_multi_token_steps() -> None:
    assert BASE.device_s.multi_token_s == 0.0
    m = 5e-3
    plain = CostModel(BASE)
    multi = CostModel(_profile(device_s=BASE.device_s.model_copy(update={"multi_token_s": m})))
    # One new token (a batch-1 decode step) never pays it; two or more tokens do, prefill and decode alike.
    assert multi.step_time(decode(1, 100)) == plain.step_time(decode(1, 100))
    for shape in (decode(2, 200), decode(64, 6400), prefill(2), prefill(512, 128)):
        assert multi.step_time(shape) == pytest.approx(plain.step_time(shape) + m, rel=1e-12)
        assert multi.device_time(shape) == pytest.approx(plain.device_time(shape) + m, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 128), ctx=st.integers(0, 200_000), steps=st.integers(1, 32), overlap=st.booleans())
def test_decode_times_bit_identical_with_multi_token_term(batch: int, ctx: int, steps: int, overlap: bool) -> None:
    device = BASE.device_s.model_copy(update={"multi_token_s": 7e-3})
    model = CostModel(_profile(device_s=device, overlap_host=overlap))
    reference = [model.step_time(decode(batch, ctx + j * batch)) for j in range(steps)]
    assert model.decode_times(batch, ctx, steps).tolist() == reference
    assert math.isclose(model.decode_total_time(batch, ctx, steps), sum(reference), rel_tol=1e-12)


def test_eager_floor_holds_steps_run_without_a_graph() -> None:
    """A step the engine cannot replay as a CUDA graph (prefill tokens, a verification row, more rows than
    the last captured batch) takes at least the eager floor; graph-replayed decode steps never pay it."""
    graphs = (1, 2, 4, 8, 16, 32)
    floor = 0.05
    plain = CostModel(_profile(cuda_graph_batch_sizes=graphs))
    eager = CostModel(_profile(cuda_graph_batch_sizes=graphs,
                               device_s=BASE.device_s.model_copy(update={"eager_floor_s": floor})))
    for shape in (decode(1, 100), decode(5, 5000), decode(32, 32 * 8000)):  # replayed graphs
        assert eager.step_time(shape) == plain.step_time(shape)
        assert eager.device_time(shape) == plain.device_time(shape)
    small = (prefill(16), StepShape(5, 516, 4, 400, 512, 512 * 256.0), decode(64, 640),
             StepShape(4, 12, 0, 0, 0, 0.0))  # a prefill, a mixed step, beyond the graphs, a verification step
    for shape in small:
        assert plain.device_time(shape) < floor
        assert eager.device_time(shape) == floor
        assert eager.step_time(shape) == pytest.approx(floor + plain.host_time(shape), rel=1e-12)
        assert eager.step_time(shape) == eager.time_of(*shape)
    big = prefill(8192, 4096)  # its own work outlasts the launches
    assert plain.device_time(big) > floor
    assert eager.step_time(big) == plain.step_time(big)


def test_eager_floor_needs_cuda_graphs() -> None:
    """Without graphs every step runs eagerly and a0 holds the floor: a floor there is a bad profile, named."""
    data = BASE.model_dump(mode="json")
    data["device_s"]["eager_floor_s"] = 0.01
    data["cuda_graph_batch_sizes"] = []
    with pytest.raises(ConfigError, match="eager_floor_s"):
        parse_profile(data, file="p.yaml")
    data["cuda_graph_batch_sizes"] = [1, 2, 4]
    assert parse_profile(data, file="p.yaml").device_s.eager_floor_s == 0.01
    data["device_s"]["eager_floor_s"] = -1.0
    with pytest.raises(ConfigError, match="eager_floor_s"):
        parse_profile(data, file="p.yaml")
