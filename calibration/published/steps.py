"""Whole-model step timings composed from published per-operator rows: the samples a profile is fitted to.

A step of B sequences and N new tokens on one rank of ``model`` at TP t takes

    layers × (layer operators at N + attention) + embedding at N + LM head at B + 2·layers all-reduces at N

* **layer operators, embedding**: the model's own rows at t (interpolated linearly between the measured
  token counts), or, for a model the data does not hold on this GPU, the ``KernelModel`` prediction from
  the shape (the profile's rules say which);
* **attention**: the published attention rows moved to this shape and GPU (``attention`` module's rule):
  each decode row (B sequences, context c) is one decode sample, each prefill row (chunk n over prefix p)
  one prefill sample of one sequence;
* **LM head**: not in the data; a GEMM over the last token of each sequence against hidden × vocab / t,
  priced by the ``KernelModel`` of this GPU;
* **all-reduces**: two per layer at t > 1, each of N · hidden · 2 bytes, from the measured curve of this
  GPU's NVSwitch topology at t ranks (``collectives``).

Nothing else is added: sampling and scheduling are host work (the engine preset's host term).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.engine.configs import ModelShape, get_model
from calibration.fit import curve_values
from calibration.published.attention import AttentionFit, AttentionScale, scaled_rows
from calibration.published.kernels import KernelModel
from calibration.published.vidur import (
    ELEMENTWISE_OPS,
    EMBEDDING_OP,
    GEMM_OPS,
    AttentionTable,
    OperatorTable,
)
from simulator.cost.profile import CommModel


@dataclass(frozen=True, slots=True)
class StepParts:
    """What a model's steps are made of on one GPU at one TP degree (each a function of tokens/sequences)."""

    shape: ModelShape
    kernels: KernelModel
    table: OperatorTable | None
    """The model's own operator rows, or None when the kernel model stands in for them."""
    comm: CommModel | None

    def layer_ops(self, tokens: np.ndarray) -> np.ndarray:
        """Seconds of one layer's non-attention operators at each token count."""
        if self.table is not None:
            measured_tokens, seconds = self.table.layer_seconds(self.shape.tp)
            return curve_values(tokens, measured_tokens, seconds)
        ops = [*GEMM_OPS, *ELEMENTWISE_OPS]
        if not self.shape.gated_mlp:
            ops.remove("post_attention_layernorm")
        return self.kernels.layer(self.shape, tokens, ops)

    def embedding(self, tokens: np.ndarray) -> np.ndarray:
        if self.table is not None:
            measured_tokens, seconds = self.table.embedding_seconds(self.shape.tp)
            return curve_values(tokens, measured_tokens, seconds)
        return self.kernels.elementwise_op(EMBEDDING_OP, tokens, self.shape.hidden_size)

    def token_seconds(self, tokens: np.ndarray) -> np.ndarray:
        """Everything of a step that scales with its new tokens, attention and all-reduces excluded."""
        return self.shape.num_layers * self.layer_ops(tokens) + self.embedding(tokens)

    def seq_seconds(self, sequences: np.ndarray) -> np.ndarray:
        return self.kernels.lm_head(self.shape, sequences)

    def comm_seconds(self, tokens: np.ndarray) -> np.ndarray:
        comm = self.comm
        if comm is None or comm.curve is None:
            return np.zeros_like(np.asarray(tokens, dtype=np.float64))
        nbytes = np.asarray(tokens, dtype=np.float64) * comm.bytes_per_token()
        xs = np.array(comm.curve.x)
        ys = np.array(comm.curve.y)
        return comm.calls_per_step() * curve_values(nbytes, xs, ys)


def step_parts(model: str, tp: int, kernels: KernelModel, table: OperatorTable | None,
               comm: CommModel | None) -> StepParts:
    return StepParts(shape=get_model(model, tp), kernels=kernels, table=table, comm=comm)


def step_samples(parts: StepParts, attention: AttentionTable, fit: AttentionFit, scale: AttentionScale,
                 *, max_rows: int | None = 4000, seed: int = 0) -> pd.DataFrame:
    """One row per published attention row, as a whole step of this model (the fitter's input columns)."""
    decode, prefill = scaled_rows(attention, fit, scale)
    rng = np.random.default_rng(seed)
    if max_rows is not None:
        decode = decode.iloc[np.sort(rng.permutation(len(decode))[: max_rows])] if len(decode) > max_rows else decode
        prefill = (prefill.iloc[np.sort(rng.permutation(len(prefill))[: max_rows])]
                   if len(prefill) > max_rows else prefill)
    layers = parts.shape.num_layers
    b = decode["batch"].to_numpy()
    dec_t = (parts.token_seconds(b) + layers * decode["seconds"].to_numpy() + parts.seq_seconds(b)
             + parts.comm_seconds(b))
    n = prefill["chunk"].to_numpy()
    one = np.ones_like(n)
    pre_t = (parts.token_seconds(n) + layers * prefill["seconds"].to_numpy() + parts.seq_seconds(one)
             + parts.comm_seconds(n))
    dec = pd.DataFrame({
        "num_seqs": b.astype(int), "num_new_tokens": b.astype(int), "num_decode_seqs": b.astype(int),
        "decode_context_sum": decode["ctx_sum"].to_numpy().astype(int), "num_prefill_tokens": 0,
        "prefill_attention_pairs": 0.0, "device_s": dec_t,
        "max_context": (decode["ctx_sum"] / decode["batch"]).to_numpy().astype(int),
    })
    pre = pd.DataFrame({
        "num_seqs": 1, "num_new_tokens": n.astype(int), "num_decode_seqs": 0, "decode_context_sum": 0,
        "num_prefill_tokens": n.astype(int), "prefill_attention_pairs": prefill["pairs"].to_numpy(),
        "device_s": pre_t, "max_context": (prefill["prefix"] + prefill["chunk"]).to_numpy().astype(int),
    })
    return pd.concat([dec, pre], ignore_index=True)
