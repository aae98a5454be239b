"""Fit the research §4.3 step-time form to a timings table, and report held-out error.

Device time:  T = a0 + smoothmax(W, f·N) + k·Σctx + q·Σpairs + s·B   (relative least squares, soft_l1)
              [+ m·[N > 1] with ``multi_token``: CPU matmuls switch from matrix-vector to matrix-matrix
               kernels beyond one token, a step the linear terms cannot bend to]
              [at least E for a step run without a CUDA graph, with ``graph_max``: its kernels launched one by
               one from the host, which the device waits on unless its own work takes longer]
Host time:    cycle − device = h0 + h1·B + h2·N                        (non-negative linear least squares)

Rows are grid points (one measured step shape each, median over repeats). Coefficients are bounded at 0
and start from roofline guesses, so fitted values read as effective bandwidth and FLOP rate. Error is
reported on held-out points (k-fold over the grid), never on the points fitted.

Torch-free: fitting runs on any machine after the device run.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from scipy.optimize import least_squares, lsq_linear, nnls

from calibration.profiler import SHAPE_COLUMNS
from simulator.cost.curve import PiecewiseLinear
from simulator.cost.profile import (
    CommModel,
    DeviceCoefficients,
    FitError,
    HostCoefficients,
    MemoryFigures,
    Profile,
    ProfileKind,
    Provenance,
    ValidRange,
)
from simulator.errors import ConfigError

LINEAR_PARAMS: tuple[str, ...] = (
    "a0_s", "weight_s", "per_token_s", "per_ctx_token_s", "per_attn_pair_s", "per_seq_s", "multi_token_s",
    "eager_floor_s",
)
"""DeviceCoefficients fitted, in the order of the parameter vector (knee_p appended when fitted)."""

KNEE_BOUNDS = (1.0, 16.0)
"""Range of the smoothmax exponent when it is fitted: 1 is a plain sum, 16 nearly a hard max."""

SOFT_L1_SCALE = 0.05
"""Relative residual beyond which soft_l1 starts to discount a point (5 %: outliers, not noise)."""


@dataclass(frozen=True, slots=True)
class Features:
    """The columns the form reads, as float arrays."""

    num_seqs: np.ndarray
    num_tokens: np.ndarray
    ctx_sum: np.ndarray
    pairs: np.ndarray
    eager: np.ndarray
    """Rows run without a CUDA graph where the engine captures them (``graph_max`` > 0), else all False."""


def eager_rows(num_seqs: np.ndarray, num_tokens: np.ndarray, graph_max: int) -> np.ndarray:
    """Steps the engine cannot replay as a CUDA graph when it captures decode batches up to ``graph_max`` (0: no
    graphs, nothing flagged): a row of more than one new token, or more rows than that — the rule
    ``CostModel.eager_floor`` prices, over arrays."""
    if graph_max <= 0:
        return np.zeros(len(num_seqs), dtype=bool)
    return (num_tokens != num_seqs) | (num_seqs > graph_max)


def features(df: pd.DataFrame, *, target: str = "device_s", graph_max: int = 0) -> Features:
    """Columns of ``df`` as arrays; a missing column or a bad value is a ConfigError. ``graph_max``: the
    largest decode batch replayed as a CUDA graph (0: none), which flags the eager rows."""
    missing = [c for c in (*SHAPE_COLUMNS, target) if c not in df.columns]
    if missing:
        raise ConfigError(f"timings table lacks columns: {', '.join(missing)}", field=missing[0])
    for col in (*SHAPE_COLUMNS, target):
        values = df[col].to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ConfigError("values must be finite and >= 0", field=col)
    if np.any(df[target].to_numpy(dtype=np.float64) <= 0):
        raise ConfigError("step times must be > 0", field=target)
    num_seqs = df["num_seqs"].to_numpy(dtype=np.float64)
    num_tokens = df["num_new_tokens"].to_numpy(dtype=np.float64)
    return Features(
        num_seqs=num_seqs,
        num_tokens=num_tokens,
        ctx_sum=df["decode_context_sum"].to_numpy(dtype=np.float64),
        pairs=df["prefill_attention_pairs"].to_numpy(dtype=np.float64),
        eager=eager_rows(num_seqs, num_tokens, graph_max),
    )


def _smoothmax(x: np.ndarray | float, y: np.ndarray, p: float) -> np.ndarray:
    """(x^p + y^p)^(1/p), computed relative to the larger term so high p cannot underflow."""
    m = np.maximum(x, y)
    safe = np.where(m > 0, m, 1.0)
    return np.where(m > 0, safe * ((x / safe) ** p + (y / safe) ** p) ** (1.0 / p), 0.0)


def _predict(x: np.ndarray, p: float, feats: Features) -> np.ndarray:
    a0, w, f, k, q, s, m, e = x[:8]
    multi = m * (feats.num_tokens > 1)
    t = (a0 + _smoothmax(w, f * feats.num_tokens, p) + multi + k * feats.ctx_sum + q * feats.pairs
         + s * feats.num_seqs)
    return np.where(feats.eager, np.maximum(t, e), t) if e > 0 else t


def predict_device(coeffs: DeviceCoefficients, df: pd.DataFrame, *, graph_max: int = 0) -> np.ndarray:
    """Device seconds the coefficients give for every row of ``df`` (vectorised §4.3 form); ``graph_max``:
    the largest decode batch replayed as a CUDA graph (0: none), for the eager floor."""
    feats = features(df.assign(device_s=1.0) if "device_s" not in df.columns else df, graph_max=graph_max)
    x = np.array([getattr(coeffs, name) for name in LINEAR_PARAMS])
    return _predict(x, coeffs.knee_p, feats)


def initial_guess(df: pd.DataFrame, *, multi_token: bool = False) -> DeviceCoefficients:
    """A data-driven start when no roofline guess is given: a non-negative linear fit of
    T ≈ c + f·N + k·Σctx + q·Σpairs + s·B (+ m·[N > 1]) on relative error, its intercept split 10 / 90 into
    a0 and W."""
    feats = features(df)
    obs = df["device_s"].to_numpy(dtype=np.float64)
    columns = [np.ones_like(obs), feats.num_tokens, feats.ctx_sum, feats.pairs, feats.num_seqs]
    if multi_token:
        columns.append((feats.num_tokens > 1).astype(np.float64))
    design = np.column_stack(columns)
    scale = np.maximum(np.abs(design).max(axis=0), 1e-300)
    # Dividing rows by the observation makes this a relative-error fit, as the real one is.
    coef, _ = nnls(design / scale / obs[:, None], np.ones_like(obs))
    c, f, k, q, s = (coef / scale)[:5]
    m = float((coef / scale)[5]) if multi_token else 0.0
    return DeviceCoefficients(
        a0_s=0.1 * c, weight_s=0.9 * c, per_token_s=f, per_ctx_token_s=k, per_attn_pair_s=q, per_seq_s=s,
        multi_token_s=m,
    )


def _param_scales(start: np.ndarray, feats: Features, obs: np.ndarray) -> np.ndarray:
    """Typical magnitude of each parameter, so the optimiser works on O(1) numbers: the start value, or,
    where the start is 0, the value at which its term would be 0.1 % of a typical step."""
    typical = float(np.median(obs))
    reach = [1.0, 1.0, feats.num_tokens.max(), feats.ctx_sum.max(), feats.pairs.max(), feats.num_seqs.max(), 1.0,
             1.0]
    fallback = np.array([1e-3 * typical / r if r > 0 else 1.0 for r in reach])
    return np.where(start > 0, start, fallback)


def fit_device(
    df: pd.DataFrame,
    *,
    initial: DeviceCoefficients | None = None,
    knee_p: float | None = None,
    fit_knee: bool = False,
    multi_token: bool = False,
    graph_max: int = 0,
) -> DeviceCoefficients:
    """Least squares on relative residuals (pred − obs) / obs, soft_l1 loss, every coefficient ≥ 0.

    ``initial``: roofline start (e.g. an analytic profile's coefficients); default a linear guess.
    ``knee_p``: smoothmax exponent, fixed unless ``fit_knee``; default the initial guess's.
    ``multi_token``: also fit m, the fixed extra time of steps with more than one new token (CPU); it
    needs rows on both sides (one-token and multi-token steps), else it stays at its start value.
    ``graph_max``: the largest decode batch the engine replayed as a CUDA graph (0: no graphs); the eager
    floor E is then fitted too, from rows on both sides (graph-replayed and eager), else it stays 0.
    """
    feats = features(df, graph_max=graph_max)
    obs = df["device_s"].to_numpy(dtype=np.float64)
    start = initial or initial_guess(df, multi_token=multi_token)
    p0 = knee_p if knee_p is not None else start.knee_p
    x0 = np.array([getattr(start, name) for name in LINEAR_PARAMS], dtype=np.float64)
    floor_active = bool(feats.eager.any()) and not bool(feats.eager.all())
    if floor_active and x0[7] <= 0:
        # A floor starts where a quarter of the eager steps sit: with none held at it, its gradient is zero.
        x0[7] = float(np.quantile(obs[feats.eager], 0.25))
    scales = _param_scales(x0, feats, obs)
    # A term whose feature is zero on every row (no decode rows, no prefill rows) cannot be fitted: it
    # keeps its start value instead of wandering, and the optimiser sees only the others.
    one_token = feats.num_tokens <= 1
    active = np.array([True, True, True, feats.ctx_sum.any(), feats.pairs.any(), True,
                       multi_token and bool(one_token.any()) and bool((~one_token).any()), floor_active])
    if not active[6]:
        x0[6] = 0.0
    if not active[7]:
        x0[7] = 0.0
    theta0 = np.where(x0 > 0, x0 / scales, 0.0)[active]
    lower = np.zeros(int(active.sum()))
    upper = np.full(int(active.sum()), np.inf)
    if fit_knee:
        theta0 = np.append(theta0, np.clip(p0, *KNEE_BOUNDS))
        lower = np.append(lower, KNEE_BOUNDS[0])
        upper = np.append(upper, KNEE_BOUNDS[1])
    num_linear = int(active.sum())

    def unpack(theta: np.ndarray) -> np.ndarray:
        x = x0.copy()
        x[active] = theta[:num_linear] * scales[active]
        return x

    def residuals(theta: np.ndarray) -> np.ndarray:
        p = theta[num_linear] if fit_knee else p0
        return _predict(unpack(theta), p, feats) / obs - 1.0

    # least_squares needs a start strictly inside the bounds; a zero start sits on one, so nudge it.
    theta0 = np.clip(theta0, lower + 1e-9, upper)
    result = least_squares(
        residuals, theta0, bounds=(lower, upper), loss="soft_l1", f_scale=SOFT_L1_SCALE, x_scale=1.0,
        xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000,
    )
    x = np.maximum(unpack(result.x), 0.0)
    p = float(result.x[num_linear]) if fit_knee else p0
    fitted: dict[str, Any] = dict(zip(LINEAR_PARAMS, map(float, x), strict=True))
    return DeviceCoefficients(**fitted, knee_p=p)


def fit_host(df: pd.DataFrame) -> HostCoefficients:
    """Host overhead from cycle − device time: h0 + h1·B + h2·N, non-negative least squares.

    Rows without a cycle time are skipped; with none at all the host terms are 0.
    """
    if "cycle_s" not in df.columns:
        return HostCoefficients()
    rows = df[np.isfinite(df["cycle_s"].to_numpy(dtype=np.float64))]
    if rows.empty:
        return HostCoefficients()
    y = (rows["cycle_s"] - rows["device_s"]).to_numpy(dtype=np.float64)
    design = np.column_stack([np.ones(len(rows)), rows["num_seqs"], rows["num_new_tokens"]]).astype(np.float64)
    scale = np.maximum(design.max(axis=0), 1.0)
    solution = lsq_linear(design / scale, y, bounds=(0.0, np.inf), method="bvls").x / scale
    h0, hs, hn = (max(float(v), 0.0) for v in solution)
    return HostCoefficients(h0_s=h0, per_seq_s=hs, per_token_s=hn)


def error_summary(predicted: np.ndarray, observed: np.ndarray, *, num_folds: int) -> FitError:
    """MAPE, largest relative error and R² of predictions against observations."""
    rel = np.abs(predicted - observed) / observed
    ss_res = float(np.sum((predicted - observed) ** 2))
    ss_tot = float(np.sum((observed - observed.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return FitError(
        mape=float(rel.mean()), max_error=float(rel.max()), r2=r2, num_points=len(observed), num_folds=num_folds
    )


def cross_validate(
    df: pd.DataFrame,
    *,
    num_folds: int = 5,
    seed: int = 0,
    initial: DeviceCoefficients | None = None,
    knee_p: float | None = None,
    fit_knee: bool = False,
    multi_token: bool = False,
    graph_max: int = 0,
) -> tuple[FitError, np.ndarray]:
    """k-fold over grid points: each point is predicted by a fit that never saw it.
    Returns the error summary and the held-out prediction of every row."""
    n = len(df)
    folds = max(2, min(num_folds, n))
    order = np.random.default_rng(seed).permutation(n)
    held_out = np.empty(n)
    for fold in np.array_split(order, folds):
        train = df.iloc[np.setdiff1d(order, fold)]
        coeffs = fit_device(train, initial=initial, knee_p=knee_p, fit_knee=fit_knee, multi_token=multi_token,
                            graph_max=graph_max)
        held_out[fold] = predict_device(coeffs, df.iloc[fold], graph_max=graph_max)
    observed = df["device_s"].to_numpy(dtype=np.float64)
    return error_summary(held_out, observed, num_folds=folds), held_out


# ---------------------------------------------------------------------------------------------------------
# The curve form: a measured token curve in place of a0 + smoothmax(W, f·N)

TOKEN_KNOTS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 320, 384, 448,
                                512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096)
"""Knots of a fitted token curve: dense where GEMM efficiency climbs (up to ~1k rows), sparse once linear."""


def curve_values(values: np.ndarray, knots: np.ndarray, heights: np.ndarray) -> np.ndarray:
    """``PiecewiseLinear.at`` over an array: linear between knots, flat before the first, along the last
    segment past the end."""
    values = np.asarray(values, dtype=np.float64)
    inside = np.interp(values, knots, heights)
    if len(knots) < 2:
        return inside
    slope = (heights[-1] - heights[-2]) / (knots[-1] - knots[-2])
    return np.where(values > knots[-1], heights[-1] + slope * (values - knots[-1]), inside)


def hat_basis(values: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Column j: the weight of knot j in linear interpolation at each value (the curve is linear in its knot
    values), extended along the last segment past the end and flat before the first, as ``PiecewiseLinear``."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros((len(values), len(knots)))
    i = np.clip(np.searchsorted(knots, values, side="right"), 1, len(knots) - 1)
    x0, x1 = knots[i - 1], knots[i]
    w = (values - x0) / (x1 - x0)
    w = np.where(values < knots[0], 0.0, w)
    rows = np.arange(len(values))
    out[rows, i - 1] = 1.0 - w
    out[rows, i] += w
    return out


@dataclass(frozen=True, slots=True)
class CurveFit:
    token_curve: PiecewiseLinear
    per_ctx_token_s: float
    per_attn_pair_s: float


def fit_curve_device(df: pd.DataFrame, *, offset_s: np.ndarray, knots: tuple[int, ...] = TOKEN_KNOTS,
                     per_ctx_token_s: float | None = None, per_attn_pair_s: float | None = None) -> CurveFit:
    """``device_s − offset = token_curve(N) + k·Σctx + q·Σpairs`` by linear least squares on relative error.

    The curve is fitted as non-negative increments between knots, so it never falls (a step with more new
    tokens never takes less time), and k, q >= 0. ``offset_s``: terms priced outside the fit (the
    sequence curve and the all-reduces). A k or q given is held at that value, not fitted (a prefill
    chunk's pairs grow as n², which the curve could otherwise absorb and then miss a long prefix)."""
    feats = features(df)
    obs = df["device_s"].to_numpy(dtype=np.float64)
    used = np.array([k for k in knots if k <= max(feats.num_tokens.max(), knots[1])], dtype=np.float64)
    hats = hat_basis(feats.num_tokens, used)
    # Increment parametrisation: value_j = sum_{i <= j} delta_i, so column i is the sum of hats j >= i.
    cumulative = np.cumsum(hats[:, ::-1], axis=1)[:, ::-1]
    columns = [cumulative]
    target = obs - offset_s
    if per_ctx_token_s is None:
        columns.append(feats.ctx_sum[:, None])
    else:
        target = target - per_ctx_token_s * feats.ctx_sum
    if per_attn_pair_s is None:
        columns.append(feats.pairs[:, None])
    else:
        target = target - per_attn_pair_s * feats.pairs
    weights = 1.0 / obs
    if len(columns) == 1:
        # Only the curve is free: rows of one token count differ only in their target, so the relative
        # least squares collapses exactly onto one row per count (weight sqrt(Σ 1/obs²), target the
        # weighted mean) — the same solution from a few hundred rows instead of thousands.
        counts, inverse = np.unique(feats.num_tokens, return_inverse=True)
        w2 = np.bincount(inverse, weights=weights**2)
        target = np.bincount(inverse, weights=weights**2 * target) / w2
        weights = np.sqrt(w2)
        hats = hat_basis(counts, used)
        columns = [np.cumsum(hats[:, ::-1], axis=1)[:, ::-1]]
    design = np.hstack(columns)
    scale = np.maximum(np.abs(design).max(axis=0), 1e-300)
    weighted = design / scale * weights[:, None]
    solution = lsq_linear(weighted, target * weights, bounds=(0.0, np.inf), method="bvls").x / scale
    values = np.cumsum(solution[: len(used)])
    rest = iter(solution[len(used):])
    k = per_ctx_token_s if per_ctx_token_s is not None else float(next(rest))
    q = per_attn_pair_s if per_attn_pair_s is not None else float(next(rest))
    return CurveFit(
        token_curve=PiecewiseLinear(x=tuple(float(v) for v in used), y=tuple(float(v) for v in values)),
        per_ctx_token_s=k,
        per_attn_pair_s=q,
    )


def predict_curve(fit: CurveFit, df: pd.DataFrame, offset_s: np.ndarray) -> np.ndarray:
    feats = features(df.assign(device_s=1.0) if "device_s" not in df.columns else df)
    tokens = curve_values(feats.num_tokens, np.array(fit.token_curve.x), np.array(fit.token_curve.y))
    return tokens + fit.per_ctx_token_s * feats.ctx_sum + fit.per_attn_pair_s * feats.pairs + offset_s


def cross_validate_curve(df: pd.DataFrame, *, offset_s: np.ndarray, num_folds: int = 5, seed: int = 0,
                         knots: tuple[int, ...] = TOKEN_KNOTS, per_ctx_token_s: float | None = None,
                         per_attn_pair_s: float | None = None) -> tuple[FitError, np.ndarray]:
    """k-fold held-out error of ``fit_curve_device`` (each row predicted by a fit that never saw it)."""
    n = len(df)
    folds = max(2, min(num_folds, n))
    order = np.random.default_rng(seed).permutation(n)
    held_out = np.empty(n)
    for fold in np.array_split(order, folds):
        train = np.setdiff1d(order, fold)
        fit = fit_curve_device(df.iloc[train], offset_s=offset_s[train], knots=knots,
                               per_ctx_token_s=per_ctx_token_s, per_attn_pair_s=per_attn_pair_s)
        held_out[fold] = predict_curve(fit, df.iloc[fold], offset_s[fold])
    observed = df["device_s"].to_numpy(dtype=np.float64)
    return error_summary(held_out, observed, num_folds=folds), held_out


def valid_range(df: pd.DataFrame) -> ValidRange:
    """Largest shapes of the grid. Per-sequence context is read from a ``max_context`` column when the
    profiler writes one; otherwise it is bounded by the mean decode context and the prefill extent."""
    decode = df[df["num_decode_seqs"] > 0]
    mean_ctx = (decode["decode_context_sum"] / decode["num_decode_seqs"]).max() if not decode.empty else 0
    if "max_context" in df.columns:
        max_context = int(df["max_context"].max())
    else:
        max_context = int(max(mean_ctx, df["num_prefill_tokens"].max(), 1))
    max_chunk = int(df["max_chunk"].max()) if "max_chunk" in df.columns else int(df["num_prefill_tokens"].max())
    return ValidRange(max_batch=int(df["num_seqs"].max()), max_context=max_context, max_chunk=max(max_chunk, 1))


@dataclass(frozen=True, slots=True)
class FitResult:
    """Coefficients fitted on every point, with the held-out error of the same procedure."""

    device: DeviceCoefficients
    host: HostCoefficients
    error: FitError
    valid_range: ValidRange
    held_out_s: np.ndarray
    """Held-out prediction of every row (for plots and per-point error)."""

    def effective_rates(
        self, *, weight_bytes: float, params_read: float, kv_bytes_per_token: float
    ) -> dict[str, float]:
        """Fitted coefficients read as achieved bandwidth (B/s) and FLOP rate (FLOP/s), for sanity checks
        against the device's ceilings."""
        d = self.device
        return {
            "weight_bandwidth_Bps": weight_bytes / d.weight_s if d.weight_s > 0 else float("inf"),
            "gemm_flops": 2.0 * params_read / d.per_token_s if d.per_token_s > 0 else float("inf"),
            "kv_bandwidth_Bps": kv_bytes_per_token / d.per_ctx_token_s if d.per_ctx_token_s > 0 else float("inf"),
        }

    def to_profile(
        self,
        *,
        name: str,
        hardware: str,
        model: str,
        tp: int,
        memory: MemoryFigures,
        host_link_Bps: float,
        provenance: Provenance,
        dtype: str = "bfloat16",
        comm: CommModel | None = None,
        overlap_host: bool = False,
        cuda_graph_batch_sizes: tuple[int, ...] = (),
        measured_on: str | None = None,
    ) -> Profile:
        """A measured Profile carrying these coefficients, error and range."""
        return Profile(
            name=name,
            hardware=hardware,
            model=model,
            tp=tp,
            dtype=dtype,
            kind=ProfileKind.MEASURED,
            device_s=self.device,
            host_s=self.host,
            overlap_host=overlap_host,
            comm=comm,
            memory=memory,
            host_link_Bps=host_link_Bps,
            cuda_graph_batch_sizes=cuda_graph_batch_sizes,
            measured_on=measured_on,
            valid_range=self.valid_range,
            fit_error=self.error,
            provenance=provenance,
        )


def fit_timings(
    df: pd.DataFrame,
    *,
    num_folds: int = 5,
    seed: int = 0,
    initial: DeviceCoefficients | None = None,
    knee_p: float | None = None,
    fit_knee: bool = False,
    multi_token: bool = False,
    graph_max: int = 0,
) -> FitResult:
    """Fit device and host terms on every row, and cross-validate the device fit. ``graph_max``: the largest
    decode batch the engine replayed as a CUDA graph (0: none), which adds the eager floor to the fit."""
    error, held_out = cross_validate(
        df, num_folds=num_folds, seed=seed, initial=initial, knee_p=knee_p, fit_knee=fit_knee, multi_token=multi_token,
        graph_max=graph_max,
    )
    return FitResult(
        device=fit_device(df, initial=initial, knee_p=knee_p, fit_knee=fit_knee, multi_token=multi_token,
                          graph_max=graph_max),
        host=fit_host(df),
        error=error,
        valid_range=valid_range(df),
        held_out_s=held_out,
    )


def best_fit(
    df: pd.DataFrame,
    *,
    num_folds: int = 5,
    seed: int = 0,
    initial: DeviceCoefficients | None = None,
    multi_token: bool = False,
    graph_max: int = 0,
) -> tuple[FitResult, bool]:
    """``fit_timings`` with the knee exponent fixed (the start's) and fitted, both cross-validated the same way;
    the one with the lower held-out error, and whether it is the fitted knee. (The knee is worth fitting only
    when the grid reaches the compute-bound side, which the held-out error shows.)"""
    fixed = fit_timings(df, num_folds=num_folds, seed=seed, initial=initial, multi_token=multi_token,
                        graph_max=graph_max)
    fitted = fit_timings(df, num_folds=num_folds, seed=seed, initial=initial, fit_knee=True,
                         multi_token=multi_token, graph_max=graph_max)
    knee_fitted = fitted.error.mape < fixed.error.mape
    return (fitted if knee_fitted else fixed), knee_fitted


def refit_profile(profile: Profile, df: pd.DataFrame, *, timings_name: str, timings_sha256: str,
                  initial: DeviceCoefficients | None = None, num_folds: int = 5, seed: int = 0,
                  host_from_grid: str | None = None) -> tuple[Profile, FitResult]:
    """A measured profile's device terms fitted again to its own raw timings with today's model form (the
    eager floor where it lists CUDA graph batches, the multi-token term where it has one), as ``fleetsim
    calibrate`` fits them; memory, graphs and the rest kept, the provenance saying so. Host terms are kept
    too, unless ``host_from_grid`` gives the reason to fit them again on the timings' forced steps
    (cycle − device), as ``fleetsim calibrate --host-from grid`` does. Returns the profile and the fit (its
    held-out predictions are what the profile's plot shows)."""
    if not profile.is_measured:
        raise ConfigError(f"{profile.name} is not measured: there are no raw timings to refit", field="profile")
    graph_max = max(profile.cuda_graph_batch_sizes, default=0)
    multi = profile.device_s.multi_token_s > 0
    result, knee_fitted = best_fit(df, num_folds=num_folds, seed=seed, initial=initial, multi_token=multi,
                                   graph_max=graph_max)
    err = result.error
    before = profile.fit_error
    note = (f"; refitted on {datetime.date.today().isoformat()} by calibration.fit from {timings_name} (sha256 "
            f"{timings_sha256[:12]}) with knee {'fitted' if knee_fitted else 'fixed'} at p={result.device.knee_p:.3g}"
            + (f", eager floor E={result.device.eager_floor_s * 1e3:.3g} ms for steps run without a CUDA graph"
               if result.device.eager_floor_s else "")
            + f": held-out {err.num_folds}-fold MAPE {err.mape:.2%}, max {err.max_error:.2%}"
            + (f" (was {before.mape:.2%}, max {before.max_error:.2%})" if before is not None else "") + ".")
    host = profile.host_s
    if host_from_grid:
        host = fit_host(df)
        note += (f" Host terms fitted again on the forced steps' cycle − device time (h0 {host.h0_s * 1e3:.3g} ms, "
                 f"{host.per_seq_s * 1e6:.3g} us/seq, {host.per_token_s * 1e9:.3g} ns/token): {host_from_grid}.")
    provenance = profile.provenance.model_copy(update={"source": profile.provenance.source + note,
                                                        "raw_timings_sha256": timings_sha256})
    refitted = profile.model_copy(update={"device_s": result.device, "host_s": host, "fit_error": err,
                                          "valid_range": result.valid_range, "provenance": provenance})
    return refitted, result


# ---------------------------------------------------------------------------------------------------------
# Reporting


def regime(df: pd.DataFrame) -> pd.Series:
    """'decode', 'prefill' or 'mixed' per row: what the plot colours by."""
    has_decode = df["num_decode_seqs"] > 0
    has_prefill = df["num_prefill_tokens"] > 0
    labels = np.where(has_decode & has_prefill, "mixed", np.where(has_prefill, "prefill", "decode"))
    return pd.Series(labels, index=df.index, name="regime")


def figure_measured_vs_predicted(
    df: pd.DataFrame, predicted_s: np.ndarray, *, title: str = "Measured vs predicted step time"
) -> go.Figure:
    """Log-log scatter of measured against predicted device time (held-out predictions recommended),
    coloured by regime, with the y = x line."""
    observed_ms = df["device_s"].to_numpy(dtype=np.float64) * 1e3
    predicted_ms = np.asarray(predicted_s, dtype=np.float64) * 1e3
    regimes = regime(df).to_numpy()
    fig = go.Figure()
    for name in ("decode", "prefill", "mixed"):
        mask = regimes == name
        if not mask.any():
            continue
        rows = df[mask]
        hover = [
            f"B={b} N={n} Σctx={c} pairs={p:.3g}<br>err {100 * (pr / ob - 1):+.1f}%"
            for b, n, c, p, pr, ob in zip(
                rows["num_seqs"], rows["num_new_tokens"], rows["decode_context_sum"],
                rows["prefill_attention_pairs"], predicted_ms[mask], observed_ms[mask], strict=True,
            )
        ]
        fig.add_trace(
            go.Scatter(x=observed_ms[mask], y=predicted_ms[mask], mode="markers", name=name, text=hover,
                       hovertemplate="%{text}<extra></extra>")
        )
    lo = float(min(observed_ms.min(), predicted_ms.min()))
    hi = float(max(observed_ms.max(), predicted_ms.max()))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line={"dash": "dash"}))
    fig.update_layout(title=title, xaxis_title="measured (ms)", yaxis_title="predicted (ms)")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def save_figure(fig: go.Figure, path: str | Path, *, include_plotlyjs: bool | str = True) -> Path:
    """Write the figure as a standalone HTML page, plotly.js inside it: it opens offline, as report.html does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=include_plotlyjs)
    return path


def sha256_file(path: str | Path) -> str:
    """Hash of the raw timings file, recorded in the profile's provenance."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Fit a timings CSV; print the held-out error; optionally write a measured profile and a plot.

    The memory figures of the profile come from a reference profile (``--memory-from``), typically the
    analytic one for the same hardware and model, unless the engine's measured KV capacity is given.
    """
    from simulator.cost.profile import load_profile

    parser = argparse.ArgumentParser(description="Fit the step-time model to a timings CSV.")
    parser.add_argument("timings", type=Path)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--memory-from", help="profile whose memory/comm/host link to reuse")
    source.add_argument("--refit", help="measured profile of these timings: fit its device terms again, keep the rest")
    parser.add_argument("--kv-capacity-tokens", type=int, default=None, help="as measured on the engine")
    parser.add_argument("--device-name", default="unknown")
    parser.add_argument("--name", default=None, help="profile name (default: {hw}-{model}-tp{tp}-measured)")
    parser.add_argument("--out", type=Path, default=None, help="write the profile YAML here")
    parser.add_argument("--html", type=Path, default=None, help="write the measured-vs-predicted plot here")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--host-from-grid", default=None, metavar="REASON",
                        help="with --refit: fit the host terms again on the timings' forced steps, saying why")
    args = parser.parse_args(argv)

    df = pd.read_csv(args.timings)
    if args.refit:
        return _refit(args, df)
    reference = load_profile(args.memory_from)
    result = fit_timings(df, num_folds=args.folds, initial=reference.device_s)
    err = result.error
    print(f"held-out MAPE {err.mape:.2%}  max {err.max_error:.2%}  R² {err.r2:.4f}  ({err.num_points} points)")
    print(result.device.model_dump())
    print(result.host.model_dump())
    if args.html:
        save_figure(figure_measured_vs_predicted(df, result.held_out_s), args.html)
    if args.out:
        memory = reference.memory
        if args.kv_capacity_tokens is not None:
            memory = memory.model_copy(update={"kv_capacity_tokens": args.kv_capacity_tokens})
        profile = result.to_profile(
            name=args.name or f"{reference.hardware.lower()}-{reference.model}-tp{reference.tp}-measured",
            hardware=reference.hardware,
            model=reference.model,
            tp=reference.tp,
            dtype=reference.dtype,
            memory=memory,
            host_link_Bps=reference.host_link_Bps,
            comm=reference.comm,
            provenance=Provenance(
                device_name=args.device_name,
                date=datetime.date.today().isoformat(),
                raw_timings_sha256=sha256_file(args.timings),
                source=f"fitted by calibration.fit from {args.timings.name}",
            ),
        )
        profile.save(args.out)
        print(f"wrote {args.out}")
    return 0


def _refit(args: argparse.Namespace, df: pd.DataFrame) -> int:
    """``--refit``: the measured profile's device terms fitted again (``refit_profile``), from the analytic
    profile of the same hardware/model/tp as the start when one exists, as ``fleetsim calibrate`` starts."""
    from simulator.cost.profile import list_profiles, load_profile

    profile = load_profile(args.refit)
    analytic = f"{profile.hardware.lower()}-{profile.model}-tp{profile.tp}-analytic"
    initial = load_profile(analytic).device_s if analytic in list_profiles() else None
    new, result = refit_profile(profile, df, timings_name=args.timings.name, timings_sha256=sha256_file(args.timings),
                                initial=initial, num_folds=args.folds, host_from_grid=args.host_from_grid)
    err = new.fit_error
    assert err is not None  # refit_profile sets it
    print(f"held-out MAPE {err.mape:.2%}  max {err.max_error:.2%}  R² {err.r2:.4f}  ({err.num_points} points)")
    print(new.device_s.model_dump(exclude_none=True))
    if args.html:
        title = f"{new.name}: measured vs held-out predicted device time (MAPE {err.mape:.1%})"
        # A profile's plot ships in the repository: plotly.js stays out.
        save_figure(figure_measured_vs_predicted(df, result.held_out_s, title=title), args.html, include_plotlyjs="cdn")
    if args.out:
        new.save(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
