"""Attention times for any shape, from the one published attention profile (A100, Llama-2-70B at TP 2).

Fitted per layer on that file's rows (FlashAttention, paged KV, block 16):
decode ``d0 + d1·B + k·Σctx`` over B sequences of context c each (Σctx = B·c), prefill ``p0 + q·pairs``
with pairs = n·(p + n/2) for a chunk of n new tokens over a cached prefix of p.

**The scaling rule** to another model, TP degree and GPU, for terms nothing measured: launch and
per-sequence costs (d0, d1, p0) are kept; the context term scales with KV bytes read per token on one
rank, ``k' = k · (kv_heads' · head_dim') / (kv_heads · head_dim)``; the pair term with the FLOPs per pair,
``q' = q · (q_heads' · head_dim') / (q_heads · head_dim)``; on another GPU, ``k`` by the ratio of the two
GPUs' measured weight-streaming GEMM cost per parameter at one token (achieved bandwidth) and ``q`` by
that ratio at 4,096 tokens (achieved tensor-core rate), both from the trend across shapes of the fitted
``KernelModel``s. A sample
row keeps its own residual from the fit: only the scaled term changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.engine.configs import ModelShape
from calibration.published.kernels import KernelModel
from calibration.published.vidur import AttentionTable


def _pairs(chunk: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    return chunk * (prefix + chunk / 2.0)


@dataclass(frozen=True, slots=True)
class AttentionFit:
    """Per-layer attention coefficients of the profiled shape (seconds)."""

    decode_fixed: float
    decode_per_seq: float
    per_ctx_token: float
    prefill_fixed: float
    per_pair: float
    median_error: float
    """Median relative error of the fit on the file's own rows."""


def fit_attention(table: AttentionTable) -> AttentionFit:
    dec = table.decode
    b = dec["batch_size"].to_numpy(dtype=np.float64)
    ctx = b * dec["kv_cache_size"].to_numpy(dtype=np.float64)
    t = dec["seconds"].to_numpy()
    design = np.column_stack([np.ones_like(b), b, ctx]) / t[:, None]
    (d0, d1, k), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    pre = table.prefill
    pairs = _pairs(pre["chunk"].to_numpy(dtype=np.float64), pre["prefix"].to_numpy(dtype=np.float64))
    tp_ = pre["seconds"].to_numpy()
    design_p = np.column_stack([np.ones_like(pairs), pairs]) / tp_[:, None]
    (p0, q), *_ = np.linalg.lstsq(design_p, np.ones_like(tp_), rcond=None)
    fit = AttentionFit(max(d0, 0.0), max(d1, 0.0), max(k, 0.0), max(p0, 0.0), max(q, 0.0), 0.0)
    errors = np.concatenate([np.abs(decode_seconds(fit, b, ctx) / t - 1),
                             np.abs(prefill_seconds(fit, pairs) / tp_ - 1)])
    return AttentionFit(fit.decode_fixed, fit.decode_per_seq, fit.per_ctx_token, fit.prefill_fixed, fit.per_pair,
                        float(np.median(errors)))


def decode_seconds(fit: AttentionFit, batch: np.ndarray, ctx_sum: np.ndarray) -> np.ndarray:
    return fit.decode_fixed + fit.decode_per_seq * batch + fit.per_ctx_token * ctx_sum


def prefill_seconds(fit: AttentionFit, pairs: np.ndarray) -> np.ndarray:
    return fit.prefill_fixed + fit.per_pair * pairs


@dataclass(frozen=True, slots=True)
class AttentionScale:
    """Factors from the profiled shape on the A100 to one rank of another shape on another GPU."""

    ctx: float
    pairs: float

    @staticmethod
    def to(table: AttentionTable, shape: ModelShape, *, gpu: KernelModel | None = None,
           a100: KernelModel | None = None) -> AttentionScale:
        ctx = shape.num_kv_heads * shape.head_dim / (table.kv_heads * table.head_dim)
        pairs = shape.num_heads * shape.head_dim / (table.q_heads * table.head_dim)
        if gpu is not None and a100 is not None and gpu.hardware != a100.hardware:
            ctx *= float(gpu.trend(1, 1e8)[()] / a100.trend(1, 1e8)[()])
            pairs *= float(gpu.trend(4096, 1e8)[()] / a100.trend(4096, 1e8)[()])
        return AttentionScale(ctx=ctx, pairs=pairs)


def scaled_rows(table: AttentionTable, fit: AttentionFit, scale: AttentionScale) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The file's rows moved to another shape: each row's time less its fitted scaled term, plus that term
    scaled. Decode: batch, ctx_sum, seconds; prefill: chunk, prefix, pairs, seconds (per layer)."""
    dec = table.decode
    b = dec["batch_size"].to_numpy(dtype=np.float64)
    ctx = b * dec["kv_cache_size"].to_numpy(dtype=np.float64)
    dec_s = dec["seconds"].to_numpy() + (scale.ctx - 1.0) * fit.per_ctx_token * ctx
    pre = table.prefill
    chunk = pre["chunk"].to_numpy(dtype=np.float64)
    prefix = pre["prefix"].to_numpy(dtype=np.float64)
    pairs = _pairs(chunk, prefix)
    pre_s = pre["seconds"].to_numpy() + (scale.pairs - 1.0) * fit.per_pair * pairs
    return (pd.DataFrame({"batch": b, "ctx_sum": ctx, "seconds": np.maximum(dec_s, 0.0)}),
            pd.DataFrame({"chunk": chunk, "prefix": prefix, "pairs": pairs, "seconds": np.maximum(pre_s, 0.0)}))
