"""KernelModel: per-GPU kernel times fitted across models, so they transfer to shapes the data lacks.

**GEMMs** (QKV, O, gate+up, down, and the LM head). At a fixed number of rows M (tokens of the step) a
GEMM against a weight of P = K·N parameters takes ``a(M) + b(M)·P``: ``b(M)`` is seconds per weight
parameter, bandwidth-bound at small M (≈ 2 bytes / achieved bandwidth) and compute-bound at large M
(≈ 2·M / achieved FLOP rate), with the climb between them (small-M tiles, SM occupancy) measured rather
than assumed; ``a(M)`` holds launch and tail costs. Both are fitted at every token count of the data by
least squares on relative error over every GEMM of the training models at every TP degree, and
interpolated in M between them; past the last measured M, ``b`` grows in proportion to M (compute-bound)
and ``a`` stays.

Why this form, from the data (A100 and H100 files, 1–4,096 tokens): a global roofline
``c0 + smoothmax(P·2/BW, padded FLOPs/F)`` with wave quantisation over the SMs (tiles of 64–256 rows)
predicted a held-out model's GEMM sum with a median error of 3.8–25 % and worst 31–146 %; the per-M
form above gives 2–4.5 % median. Extra per-M features (activation bytes M·(K+N), P·log P, a wave-padding
factor) moved the worst case by under two points, so they are not kept.

**Elementwise operators** (norms, RoPE, activation, residual add, embedding) take ``c0 + c1·M·w`` with w
the operator's width per token on one rank (hidden size, heads × head dim, FFN width): bandwidth-bound
streams with a fixed launch cost, fitted per operator across models. They do not shrink with TP where w
does not (norms run on the full hidden state on every rank): the per-rank fixed costs that keep decode at
TP 8 from scaling ideally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.engine.configs import ModelShape, get_model
from calibration.published.vidur import ELEMENTWISE_OPS, EMBEDDING_OP, GEMM_OPS, OperatorTable
from simulator.cost.profile import SourceFile


def gemm_dims(shape: ModelShape, op: str) -> tuple[int, int]:
    """(K, N) of one rank's GEMM ``op`` (``shape`` already sharded)."""
    h = shape.hidden_size
    if op == "attn_pre_proj":
        return h, (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
    if op == "attn_post_proj":
        return shape.num_heads * shape.head_dim, h
    if op == "mlp_up_proj":
        return h, (2 if shape.gated_mlp else 1) * shape.intermediate_size
    if op == "mlp_down_proj":
        return shape.intermediate_size, h
    if op == "lm_head":
        return h, shape.vocab_size
    raise ValueError(f"not a GEMM: {op}")


def elementwise_width(shape: ModelShape, op: str) -> int:
    """Elements per token one rank's ``op`` reads or writes (``shape`` already sharded)."""
    if op in ("input_layernorm", "post_attention_layernorm", "add", EMBEDDING_OP):
        return shape.hidden_size
    if op == "attn_rope":
        return (shape.num_heads + shape.num_kv_heads) * shape.head_dim
    if op == "mlp_act":
        return (3 if shape.gated_mlp else 2) * shape.intermediate_size
    raise ValueError(f"not an elementwise operator: {op}")


def _relative_lstsq(design: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Least squares on relative error: rows divided by the observation."""
    coef, *_ = np.linalg.lstsq(design / observed[:, None], np.ones_like(observed), rcond=None)
    return coef


@dataclass(frozen=True, slots=True)
class KernelModel:
    """GEMM and elementwise kernel times of one GPU (seconds)."""

    hardware: str
    trained_on: tuple[str, ...]
    sources: tuple[SourceFile, ...]
    """The operator files it was fitted on (sha256 and rows used), for a profile's provenance."""
    rows: np.ndarray
    """Token counts M at which a(M), b(M) were fitted, ascending."""
    gemm_fixed: np.ndarray
    """a(M), seconds."""
    gemm_per_param: np.ndarray
    """b(M), seconds per weight parameter."""
    elementwise: dict[str, tuple[float, float]]
    """op -> (c0 seconds, c1 seconds per element)."""

    def gemm(self, rows: float | np.ndarray, params: float) -> np.ndarray:
        """Seconds of one GEMM of ``rows`` × K against a K·N = ``params`` weight."""
        m = np.asarray(rows, dtype=np.float64)
        last = self.rows[-1]
        a = np.interp(m, self.rows, self.gemm_fixed)
        b = np.where(m <= last, np.interp(m, self.rows, self.gemm_per_param), self.gemm_per_param[-1] * m / last)
        return np.maximum(a + b * params, 0.0)

    def elementwise_op(self, op: str, rows: float | np.ndarray, width: int) -> np.ndarray:
        c0, c1 = self.elementwise[op]
        return np.maximum(c0 + c1 * np.asarray(rows, dtype=np.float64) * width, 0.0)

    def layer(self, shape: ModelShape, tokens: np.ndarray, ops: Sequence[str]) -> np.ndarray:
        """Seconds of one layer's ``ops`` at each token count (``shape`` sharded to one rank)."""
        total = np.zeros_like(np.asarray(tokens, dtype=np.float64))
        for op in ops:
            if op in GEMM_OPS:
                k, n = gemm_dims(shape, op)
                total = total + self.gemm(tokens, k * n)
            else:
                total = total + self.elementwise_op(op, tokens, elementwise_width(shape, op))
        return total

    def lm_head(self, shape: ModelShape, sequences: np.ndarray) -> np.ndarray:
        """Seconds of the LM head over the last token of each of ``sequences`` (sharded vocabulary)."""
        k, n = gemm_dims(shape, "lm_head")
        return self.gemm(sequences, k * n)


def fit_kernels(tables: Sequence[OperatorTable]) -> KernelModel:
    """Fit a(M), b(M) and the elementwise terms on every row of ``tables`` (one GPU)."""
    if not tables:
        raise ValueError("no operator tables to fit")
    hardware = tables[0].hardware
    gemm_rows: list[pd.DataFrame] = []
    elem_rows: list[pd.DataFrame] = []
    for table in tables:
        for tp, rows in table.frame.groupby("tp"):
            shape = get_model(table.model, int(str(tp)))
            m = rows["num_tokens"].to_numpy(dtype=np.float64)
            for op in GEMM_OPS:
                k, n = gemm_dims(shape, op)
                gemm_rows.append(pd.DataFrame({"m": m, "params": float(k * n), "t": rows[op].to_numpy()}))
            for op in (*ELEMENTWISE_OPS, EMBEDDING_OP):
                if op in rows.columns:
                    elements = m * elementwise_width(shape, op)
                    elem_rows.append(pd.DataFrame({"op": op, "x": elements, "t": rows[op].to_numpy()}))
    gemms = pd.concat(gemm_rows, ignore_index=True)
    gemms = gemms[gemms["t"] > 0]
    ms, fixed, per_param = [], [], []
    for rows_m, group in gemms.groupby("m"):
        if len(group) < 3:
            continue
        design = np.column_stack([np.ones(len(group)), group["params"].to_numpy()])
        a, b = _relative_lstsq(design, group["t"].to_numpy())
        ms.append(float(str(rows_m)))
        fixed.append(float(a))
        per_param.append(max(float(b), 0.0))
    elems = pd.concat(elem_rows, ignore_index=True)
    elems = elems[elems["t"] > 0]
    elementwise: dict[str, tuple[float, float]] = {}
    for op_name, group in elems.groupby("op"):
        design = np.column_stack([np.ones(len(group)), group["x"].to_numpy()])
        c0, c1 = _relative_lstsq(design, group["t"].to_numpy())
        elementwise[str(op_name)] = (max(float(c0), 0.0), max(float(c1), 0.0))
    # A model without a post-attention norm trains none: borrow the input norm's (the same kernel).
    elementwise.setdefault("post_attention_layernorm", elementwise["input_layernorm"])
    return KernelModel(
        hardware=hardware,
        trained_on=tuple(t.model for t in tables),
        sources=tuple(t.source for t in tables),
        rows=np.array(ms),
        gemm_fixed=np.array(fixed),
        gemm_per_param=np.array(per_param),
        elementwise=elementwise,
    )
