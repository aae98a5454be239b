"""PiecewiseLinear and the cost model's measured-curve form: interpolation by hand, validation, and exact
agreement of every path (step_time, time_of, decode_times, StepEnds) on a curved profile."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel, StepEnds
from simulator.cost.curve import PiecewiseLinear
from simulator.cost.profile import CommModel, DeviceCoefficients, load_profile

BASE = load_profile("h200-llama-3-8b-tp1-analytic")
TOKENS = PiecewiseLinear(x=(1.0, 16.0, 256.0, 4096.0), y=(0.010, 0.0105, 0.016, 0.30))
SEQS = PiecewiseLinear(x=(1.0, 64.0, 512.0), y=(0.001, 0.0012, 0.004))
ALLREDUCE = PiecewiseLinear(x=(20480.0, 1e6, 1.3e8), y=(2.5e-5, 4e-5, 6e-4))


def curved(tp: int = 1, *, overlap: bool = False):
    dev = DeviceCoefficients(a0_s=0.0, weight_s=0.010, per_token_s=7e-5, per_ctx_token_s=3e-8,
                             per_attn_pair_s=4e-10, per_seq_s=6e-6, token_curve=TOKENS, seq_curve=SEQS)
    comm = (CommModel(alpha_s=3e-5, bus_bandwidth_Bps=3e11, num_layers=32, hidden_size=4096, curve=ALLREDUCE,
                      topology="test") if tp > 1 else None)
    return BASE.model_copy(update={"device_s": dev, "comm": comm, "tp": tp, "overlap_host": overlap})


def test_interpolates_holds_and_extends() -> None:
    assert TOKENS.at(16) == 0.0105
    assert TOKENS.at(136) == pytest.approx(0.0105 + (0.016 - 0.0105) * 120 / 240)
    assert TOKENS.at(0) == 0.010  # flat before the first knot
    slope = (0.30 - 0.016) / (4096 - 256)
    assert TOKENS.at(8192) == pytest.approx(0.30 + slope * 4096)
    assert TOKENS.last_slope == pytest.approx(slope)
    assert PiecewiseLinear(x=(5.0,), y=(2.0,)).at(100) == 2.0


@pytest.mark.parametrize("x,y", [((1.0, 1.0), (1.0, 2.0)), ((2.0, 1.0), (1.0, 2.0)), ((1.0,), (1.0, 2.0)),
                                 ((1.0, 2.0), (2.0, 1.0)), ((1.0, 2.0), (-1.0, 2.0)), ((-1.0, 2.0), (1.0, 2.0))])
def test_rejects_bad_knots(x: tuple[float, ...], y: tuple[float, ...]) -> None:
    with pytest.raises(ValidationError):
        PiecewiseLinear(x=x, y=y)


def test_curved_step_by_hand() -> None:
    profile = curved(tp=2)
    model = CostModel(profile)
    shape = StepShape(3, 600, 2, 5000, 598, 598 * (40 + 299))
    comm = profile.comm
    assert comm is not None
    allreduce = comm.calls_per_step() * ALLREDUCE.at(600 * comm.bytes_per_token())
    dev = (TOKENS.at(600) + SEQS.at(3) + allreduce + 3e-8 * 5000 + 4e-10 * shape.prefill_attention_pairs)
    assert model.device_time(shape) == pytest.approx(dev, rel=1e-12)
    host = profile.host_s
    assert model.step_time(shape) == pytest.approx(dev + host.h0_s + host.per_seq_s * 3 + host.per_token_s * 600,
                                                   rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 600), ctx=st.integers(0, 10**6), steps=st.integers(1, 40), tp=st.sampled_from([1, 2]),
       overlap=st.booleans())
def test_every_path_gives_the_same_bits(batch: int, ctx: int, steps: int, tp: int, overlap: bool) -> None:
    model = CostModel(curved(tp, overlap=overlap))
    one_by_one = [model.step_time(StepShape(batch, batch, batch, ctx + j * batch, 0, 0.0)) for j in range(steps)]
    fields = [model.time_of(batch, batch, batch, ctx + j * batch, 0, 0.0, 0) for j in range(steps)]
    assert one_by_one == fields
    assert one_by_one == model.decode_times(batch, ctx, steps).tolist()
    ends = StepEnds()
    ends.reset(model, batch, ctx, steps, 5.0)
    clock = 5.0
    for j, t in enumerate(one_by_one, start=1):
        clock += t
        assert ends.end(j) == clock


@settings(max_examples=60, deadline=None)
@given(a=st.integers(1, 9000), b=st.integers(1, 9000))
def test_more_tokens_never_cost_less(a: int, b: int) -> None:
    model = CostModel(curved(tp=2))
    lo, hi = sorted((a, b))
    assert model.time_of(1, lo, 0, 0, lo, 0.0, 0) <= model.time_of(1, hi, 0, 0, hi, 0.0, 0)


def test_curve_profile_round_trips_through_yaml(tmp_path) -> None:
    from simulator.cost.profile import load_profile as load

    path = curved(tp=2).model_copy(update={"name": "curved"}).save(tmp_path / "curved.yaml")
    again = load(path)
    assert again.device_s.token_curve == TOKENS and again.comm is not None and again.comm.curve == ALLREDUCE
    shape = StepShape(4, 4, 4, 4000, 0, 0.0)
    assert CostModel(again).step_time(shape) == CostModel(curved(tp=2)).step_time(shape)
    assert np.isfinite(CostModel(again).decode_total_time(4, 4000, 10))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(1, 9000)), min_size=1, max_size=30))
def test_terms_kept_by_count_give_a_fresh_models_bits(shapes: list[tuple[int, int]]) -> None:
    """The curved terms are kept per token and per sequence count: a model that has priced many shapes
    prices each one to the bit as a model pricing it first does (a term kept under the wrong count, or
    the token term kept by sequences, would not)."""
    profile = curved(tp=2)
    seasoned = CostModel(profile)
    for seqs, tokens in shapes:
        seasoned.time_of(seqs, tokens, 0, 0, tokens, 0.0, 0)
        seasoned.time_of(tokens % 600 + 1, seqs, 0, 0, seqs, 0.0, 0)  # the same counts in the other roles
    for seqs, tokens in shapes:
        fresh = CostModel(profile)
        assert seasoned.time_of(seqs, tokens, 0, 0, tokens, 0.0, 0) == fresh.time_of(seqs, tokens, 0, 0, tokens,
                                                                                     0.0, 0)
