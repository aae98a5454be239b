"""The paged model equals the dense oracle: logits step by step and greedy tokens end to end (tiny, fp32)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("torch")
import torch

from calibration.engine.attention import BACKENDS, ScheduledSeq, step_positions
from calibration.engine.attention.dense import dense_greedy, dense_last_logits
from calibration.engine.configs import get_model
from calibration.engine.kv_cache import KVCache
from calibration.engine.model import LlamaModel, apply_rope, rope_cos_sin, rope_inv_freq

# Triton's interpreter trips a numpy deprecation on every scalar argument: noise, not our code.
INTERPRETER_NOISE = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
PAGED = ["sdpa_gather", "flex", pytest.param("triton_paged", marks=INTERPRETER_NOISE)]
ATOL = 2e-5  # fp32; logits are O(0.1), so this is ~1e-4 relative


def _model_for(backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> LlamaModel:
    """The tiny model, set up for a backend's CPU constraints (the slow emulated paths get one layer)."""
    model: LlamaModel = request.getfixturevalue("tiny_model")
    on_cpu = not torch.cuda.is_available()
    if backend == "triton_paged":
        request.getfixturevalue("triton_backend_ready")
        if on_cpu:  # the interpreter runs ~1 s per kernel call: one layer proves the same wiring
            model = LlamaModel(get_model("tiny"), num_layers=1, dtype=torch.float32, seed=1)
    if backend == "flex" and on_cpu:
        # Eager flex otherwise re-traces with dynamo for every new shape (seconds each); its debug path is
        # the same unfused reference without tracing.
        monkeypatch.setattr(torch.nn.attention.flex_attention, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    return model


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("backend", PAGED)
def test_chunked_shared_mixed_steps_match_dense(
    backend: str, paged_run: Callable[..., Any], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = paged_run(backend, model=_model_for(backend, request, monkeypatch))
    a = _tokens(23, seed=1)
    run.add("a", a)
    run.add("b", _tokens(10, seed=2))
    plans: list[dict[str, int]] = [
        {"a": 9, "b": 10},  # a's prompt chunked, b's whole
        {"a": 14, "b": 1},  # a finishes over its cached chunk while b decodes
        {"c": 7, "a": 1, "b": 1},  # c reuses a's first three blocks (12 tokens) and prefills the rest
        {"b": 1, "c": 1, "a": 1},
        {"c": 1, "a": 1},
    ]
    for i, plan in enumerate(plans):
        if i == 2:
            run.add("c", a[:12] + _tokens(7, seed=3), prefix_of="a", num_shared_blocks=3)
        names = list(plan)
        logits = run.step(plan)
        torch.testing.assert_close(logits, run.dense(names), atol=ATOL, rtol=1e-4, msg=f"step {i}")
        run.append_greedy(names, logits)
    assert run.tables["c"][:3] == run.tables["a"][:3]


def test_greedy_generation_matches_dense(paged_run: Callable[..., Any]) -> None:
    run = paged_run("sdpa_gather", num_blocks=48)
    prompts = {"p": _tokens(13, seed=4), "q": _tokens(5, seed=5), "r": _tokens(30, seed=6)}
    num_output = 8
    for name, prompt in prompts.items():
        run.add(name, prompt)
    # A token budget of 12 per step: prompts are chunked, decodes ride along, as chunked prefill schedules.
    budget = 12
    while any(len(run.tokens[n]) - len(prompts[n]) < num_output for n in prompts):
        plan: dict[str, int] = {}
        left = budget
        for name in prompts:
            todo = len(run.tokens[name]) - run.computed[name]
            if todo and left and len(run.tokens[name]) - len(prompts[name]) < num_output:
                plan[name] = min(todo, left)
                left -= plan[name]
        logits = run.step(plan)
        run.append_greedy(list(plan), logits)
    for name, prompt in prompts.items():
        paged_out = run.tokens[name][len(prompt) :][:num_output]
        assert paged_out == dense_greedy(run.model, prompt, num_output), name


def test_dense_oracle_is_per_sequence() -> None:
    """Batching sequences in the oracle changes nothing: each is attended on its own."""
    model = LlamaModel(get_model("tiny"), dtype=torch.float32, seed=2)
    seqs = [_tokens(7, seed=7), _tokens(3, seed=8)]
    together = dense_last_logits(model, seqs)
    alone = torch.cat([dense_last_logits(model, [s]) for s in seqs])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)


def test_model_with_scaled_rope_and_layer_override() -> None:
    shape = replace(get_model("tiny"), rope_scaling_factor=8.0)
    model = LlamaModel(shape, num_layers=1, dtype=torch.float32, seed=3)
    assert len(model.layers) == 1 and model.shape.num_layers == 1
    backend = BACKENDS["sdpa_gather"](block_size=4)
    kv = KVCache(model.shape, num_blocks=8, block_size=4, dtype=torch.float32)
    tokens = _tokens(6, seed=9)
    seqs = [ScheduledSeq(num_new_tokens=6, num_computed_tokens=0, block_table=[5, 2])]
    logits = model(torch.tensor(tokens), step_positions(seqs), backend.prepare(seqs), kv)
    torch.testing.assert_close(logits, dense_last_logits(model, [tokens]), atol=1e-5, rtol=1e-4)


def test_weights_are_seeded_and_in_dtype() -> None:
    a = LlamaModel(get_model("tiny"), dtype=torch.bfloat16, seed=5)
    b = LlamaModel(get_model("tiny"), dtype=torch.bfloat16, seed=5)
    c = LlamaModel(get_model("tiny"), dtype=torch.bfloat16, seed=6)
    assert all(p.dtype == torch.bfloat16 for p in a.parameters())
    def qkv(m: LlamaModel) -> torch.Tensor:
        return dict(m.named_parameters())["layers.1.qkv_proj"]

    assert qkv(a).shape == (4 * 16 + 2 * 2 * 16, 64)  # fused q, k, v rows
    assert torch.equal(qkv(a), qkv(b)) and not torch.equal(qkv(a), qkv(c))
    assert abs(float(a.lm_head.float().std()) - 0.02) < 0.002
    num_params = sum(p.numel() for p in a.parameters())
    assert num_params == a.shape.num_params


def test_forward_rejects_mismatched_inputs(tiny_model: LlamaModel) -> None:
    backend = BACKENDS["sdpa_gather"](block_size=4)
    seqs = [ScheduledSeq(num_new_tokens=3, num_computed_tokens=0, block_table=[0])]
    meta = backend.prepare(seqs)
    with pytest.raises(ValueError, match="needs a KV cache"):
        tiny_model(torch.tensor([1, 2, 3]), step_positions(seqs), meta)
    kv = KVCache(tiny_model.shape, num_blocks=4, block_size=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="positions"):
        tiny_model(torch.tensor([1, 2]), torch.tensor([0, 1]), meta, kv)
    with pytest.raises(ValueError, match="cannot hold"):
        backend.prepare([ScheduledSeq(num_new_tokens=5, num_computed_tokens=0, block_table=[0])])
    with pytest.raises(ValueError, match="whole history"):
        BACKENDS["dense"]().prepare([ScheduledSeq(num_new_tokens=1, num_computed_tokens=4)])


# RoPE


def test_rope_scale_one_is_plain_rope() -> None:
    plain = rope_inv_freq(128, 500000.0)
    torch.testing.assert_close(rope_inv_freq(128, 500000.0, 1.0), plain, atol=0, rtol=1e-12)


def test_rope_llama3_scaling_bands() -> None:
    """High frequencies (wavelength < 2K) untouched, low (> 8K) divided by the factor, blend in between."""
    plain = rope_inv_freq(128, 500000.0)
    scaled = rope_inv_freq(128, 500000.0, 8.0)
    wavelen = 2 * math.pi / plain
    high, low = wavelen < 8192 / 4, wavelen > 8192
    assert high.any() and low.any() and (~high & ~low).any()
    torch.testing.assert_close(scaled[high], plain[high], atol=0, rtol=0)
    torch.testing.assert_close(scaled[low], plain[low] / 8, atol=0, rtol=1e-12)
    mid = ~high & ~low
    assert bool(((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 8)).all())


def test_rope_position_zero_is_identity_and_rotation_keeps_norm() -> None:
    inv_freq = rope_inv_freq(16, 10000.0, 8.0).float()
    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(0))  # (num_tokens, num_heads, head_dim)
    cos, sin = rope_cos_sin(torch.tensor([0, 0, 0]), inv_freq)
    torch.testing.assert_close(apply_rope(x, cos, sin), x)
    cos, sin = rope_cos_sin(torch.tensor([1, 50, 4000]), inv_freq)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_rope_scores_depend_on_relative_position_only() -> None:
    inv_freq = rope_inv_freq(16, 10000.0).float()
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 16, generator=g), torch.randn(1, 1, 16, generator=g)

    def score(pq: int, pk: int) -> float:
        cq, sq = rope_cos_sin(torch.tensor([pq]), inv_freq)
        ck, sk = rope_cos_sin(torch.tensor([pk]), inv_freq)
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
