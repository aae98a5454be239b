"""The mixture-of-experts FFN of the engine's decoder: top-k routing and SwiGLU experts, run two ways.

Routing is Mixtral's and Qwen3-MoE's (``norm_topk_prob``): softmax over the E router logits in fp32, the k
largest kept and renormalised to sum to 1. ``MoeMLP.forward`` runs each expert on the tokens routed to it
(gathered, multiplied, scattered back, as vLLM's fused MoE groups them); ``MoeMLP.reference`` runs every
expert on every token and weights the outputs by a dense (tokens, experts) matrix that is zero where a
token did not choose the expert: the plain spelling of the same function, kept beside it as the oracle
(tests hold the two together). Shared experts, where the shape has them, see every token in both.

Weights are the engine's random ones (``model._Init``); the module never schedules or samples. Expert
parallelism is priced analytically (``simulator.cost.moe``): here every expert lives on the one device.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from calibration.engine.configs import ModelShape


class ParameterSource(Protocol):
    """Where the layer's seeded random weights come from (``model._Init``)."""

    def normal(self, *size: int) -> nn.Parameter: ...


class MoeMLP(nn.Module):
    """Router, E routed SwiGLU experts (gate and up fused, stacked on a leading expert axis), shared experts."""

    def __init__(self, shape: ModelShape, init: ParameterSource) -> None:
        super().__init__()
        moe = shape.moe
        if moe is None:
            raise ValueError(f"{shape.name} has no mixture of experts")
        if moe.ep != 1:
            raise ValueError(f"{shape.name}: the engine holds every expert on one device (ep 1), got ep {moe.ep}")
        self.num_experts = moe.num_experts
        self.top_k = moe.experts_per_token
        hidden, width = shape.hidden_size, moe.expert_intermediate_size
        self.router = init.normal(moe.num_experts, hidden)
        self.experts_gate_up = init.normal(moe.num_experts, 2 * width, hidden)
        self.experts_down = init.normal(moe.num_experts, hidden, width)
        shared = moe.num_shared_experts * width
        self.shared_gate_up = init.normal(2 * shared, hidden) if shared else None
        self.shared_down = init.normal(hidden, shared) if shared else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each (num_tokens, k): softmax over all experts in fp32, top k, renormalised."""
        probs = F.linear(x, self.router).float().softmax(dim=-1)  # (num_tokens, num_experts)
        weights, ids = probs.topk(self.top_k, dim=-1)  # (num_tokens, k) each
        return weights / weights.sum(dim=-1, keepdim=True), ids

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.experts_gate_up[e]).chunk(2, dim=-1)  # (rows, width) each
        return F.linear(F.silu(gate) * up, self.experts_down[e])  # (rows, hidden)

    def _shared(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.shared_gate_up is None or self.shared_down is None:
            return None
        gate, up = F.linear(x, self.shared_gate_up).chunk(2, dim=-1)  # (num_tokens, shared width) each
        return F.linear(F.silu(gate) * up, self.shared_down)  # (num_tokens, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(num_tokens, hidden) → (num_tokens, hidden): each expert on its own tokens only."""
        weights, ids = self.route(x)
        flat_ids = ids.reshape(-1)  # (num_tokens * k,): token t's choices at t*k .. t*k + k - 1
        order = flat_ids.argsort(stable=True)  # (num_tokens * k,) grouped by expert
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        flat_weights = weights.reshape(-1).to(x.dtype)  # (num_tokens * k,)
        out = torch.zeros_like(x)  # (num_tokens, hidden)
        start = 0
        for e, count in enumerate(counts):
            if not count:
                continue
            picks = order[start : start + count]  # (count,) positions in the flat choices
            start += count
            tokens = picks // self.top_k  # (count,) token rows
            y = self._expert(e, x.index_select(0, tokens))  # (count, hidden)
            out.index_add_(0, tokens, y * flat_weights.index_select(0, picks)[:, None])
        shared = self._shared(x)
        return out if shared is None else out + shared

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same function computed densely: every expert on every token, weighted by a (num_tokens, E)
        matrix holding each token's k routing weights and zeros elsewhere."""
        weights, ids = self.route(x)
        dense = torch.zeros(x.shape[0], self.num_experts, dtype=weights.dtype, device=x.device)
        dense.scatter_(1, ids, weights)  # (num_tokens, num_experts)
        out = torch.zeros_like(x)  # (num_tokens, hidden)
        for e in range(self.num_experts):
            out += self._expert(e, x) * dense[:, e : e + 1].to(x.dtype)
        shared = self._shared(x)
        return out if shared is None else out + shared
