"""The engine's mixture of experts: grouped experts = the dense reference of the same weights (per layer and
greedy token for token), routing by hand, and an MoE model served by the unchanged engine and scheduler."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")
import torch

from calibration.engine.attention.dense import dense_greedy, dense_last_logits
from calibration.engine.configs import get_model
from calibration.engine.engine import Engine
from calibration.engine.model import DecoderLayer, LlamaModel
from calibration.engine.moe import MoeMLP
from calibration.engine.runner import ModelRunner
from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec

TINY_MOE = get_model("tiny-moe")  # 3 layers: 1 dense, 2 MoE of top-2 among 4 experts plus a shared expert


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, TINY_MOE.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pair(seed: int = 3, name: str = "tiny-moe") -> tuple[LlamaModel, LlamaModel]:
    """The grouped model and the dense-experts reference, with the same weights (same seed)."""
    shape = get_model(name)
    fast = LlamaModel(shape, dtype=torch.float32, seed=seed)
    reference = LlamaModel(shape, dtype=torch.float32, seed=seed, dense_experts=True)
    return fast, reference


def test_weights_are_the_catalogue_counts() -> None:
    fast, reference = pair()
    assert sum(p.numel() for p in fast.parameters()) == TINY_MOE.num_params
    for (name, a), (_, b) in zip(fast.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    layers = [layer for layer in fast.layers if isinstance(layer, DecoderLayer)]
    assert [layer.moe is not None for layer in layers] == [False, True, True]


def test_routing_by_hand() -> None:
    fast, _ = pair()
    layer = fast.layers[1]
    assert isinstance(layer, DecoderLayer) and isinstance(layer.moe, MoeMLP)
    mlp = layer.moe
    x = torch.randn(5, TINY_MOE.hidden_size, generator=torch.Generator().manual_seed(0))
    weights, ids = mlp.route(x)
    probs = torch.softmax(x @ mlp.router.T, dim=-1)
    for t in range(5):
        top = sorted(range(4), key=lambda e: -float(probs[t, e]))[:2]
        assert sorted(ids[t].tolist()) == sorted(top)
        chosen = probs[t, ids[t]]
        torch.testing.assert_close(weights[t], chosen / chosen.sum())
    assert torch.allclose(weights.sum(-1), torch.ones(5))


@pytest.mark.parametrize("num_tokens", [1, 3, 64])
def test_grouped_experts_equal_the_reference(num_tokens: int) -> None:
    fast, _ = pair()
    for layer in fast.layers:
        assert isinstance(layer, DecoderLayer)
        if layer.moe is None:
            continue
        x = torch.randn(num_tokens, TINY_MOE.hidden_size, generator=torch.Generator().manual_seed(num_tokens))
        torch.testing.assert_close(layer.moe(x), layer.moe.reference(x), atol=1e-6, rtol=1e-5)


def test_every_layer_output_close_to_the_reference() -> None:
    fast, reference = pair()
    outputs: dict[str, list[torch.Tensor]] = {"fast": [], "reference": []}
    for key, model in (("fast", fast), ("reference", reference)):
        for layer in model.layers:
            layer.register_forward_hook(lambda _m, _i, out, key=key: outputs[key].append(out.detach().clone()))
        dense_last_logits(model, [_tokens(17, seed=1), _tokens(6, seed=2)])
    assert len(outputs["fast"]) == len(outputs["reference"]) == TINY_MOE.num_layers  # one batched forward
    for i, (a, b) in enumerate(zip(outputs["fast"], outputs["reference"], strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"layer output {i}")


@pytest.mark.parametrize("name", ["tiny-moe", "small-moe"])
def test_greedy_tokens_equal_the_reference(name: str) -> None:
    fast, reference = pair(seed=4, name=name)
    for seed in range(3):
        prompt = _tokens(9 + 5 * seed, seed=10 + seed)
        assert dense_greedy(fast, prompt, 12) == dense_greedy(reference, prompt, 12), (name, seed)


def test_engine_serves_an_moe_model_as_the_reference_would() -> None:
    """The engine and scheduler, unchanged, run the MoE model paged and chunked: every request's tokens are the
    dense-experts reference's greedy continuation."""
    config = SchedulerConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=16,
                             max_model_len=64)
    engine = Engine(TINY_MOE, config, seed=5)
    reference = LlamaModel(TINY_MOE, dtype=torch.float32, seed=5, dense_experts=True)
    rng = random.Random(2)
    prompts = {rid: [rng.randrange(TINY_MOE.vocab_size) for _ in range(rng.randint(3, 20))] for rid in range(6)}
    for rid, prompt in prompts.items():
        engine.add_request(RequestSpec(rid, 0.0, len(prompt), 6), prompt)
    engine.run()
    assert sorted(engine.outputs) == sorted(prompts)
    for rid, prompt in prompts.items():
        assert engine.outputs[rid] == dense_greedy(reference, prompt, 6), rid


def test_engine_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="MLA"):
        LlamaModel(get_model("deepseek-v3").with_layers(1), dtype=torch.float32)
    with pytest.raises(ValueError, match="ep 1"):
        MoeMLP(get_model("qwen3-30b-a3b", 2, 2), None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runs eagerly"):
        ModelRunner(TINY_MOE, num_blocks=8, cuda_graphs=True)
