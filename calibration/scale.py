"""Per-layer profiles scaled to the full model, plus the tensor-parallel all-reduce term (research §5).

A model too big for one GPU is profiled as a few distinct layers at its TP-sharded shapes (embedding, LM
head at V/tp and sampler included). Each coefficient of the §4.3 form, fitted on runs of k layers, is a
line in k: c(k) = c_fixed + k·c_layer. The full model is that line at L layers, and every step adds
2L all-reduces of N·hidden·dtype bytes (no compute/communication overlap, as vLLM runs them).

The composition is linear coefficient by coefficient; the smoothmax knee is then applied to the composed
W and f, which is exact in both regimes and an approximation only around the knee.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from calibration.engine.configs import ModelShape
from simulator.cost.cost_model import allreduce_time_s
from simulator.cost.profile import (
    CommModel,
    DeviceCoefficients,
    FitError,
    HostCoefficients,
    MemoryFigures,
    Profile,
    ProfileKind,
    Provenance,
)

__all__ = [
    "LayerFit",
    "LayerScaling",
    "allreduce_time_s",
    "comm_model",
    "fit_layer_scaling",
    "fit_layer_times",
    "full_model_profile",
    "step_time_at_layers",
]

LINEAR_PARAMS: tuple[str, ...] = ("a0_s", "weight_s", "per_token_s", "per_ctx_token_s", "per_attn_pair_s", "per_seq_s")


@dataclass(frozen=True, slots=True)
class LayerFit:
    """T(k) = fixed_s + k · per_layer_s, fitted over runs of k layers."""

    fixed_s: float
    per_layer_s: float
    r2: float
    """Linearity of T in k: ≈ 1 when layers add up; lower means cross-layer effects the scaling misses."""

    def at(self, num_layers: int) -> float:
        return self.fixed_s + num_layers * self.per_layer_s


def fit_layer_times(num_layers: Sequence[int], times_s: Sequence[float]) -> LayerFit:
    """Line through (k, T(k)) with non-negative intercept and slope (least squares)."""
    k = np.asarray(num_layers, dtype=np.float64)
    t = np.asarray(times_s, dtype=np.float64)
    if k.shape != t.shape or len(np.unique(k)) < 2:
        raise ValueError("need times at two or more distinct layer counts")
    if not np.all(np.isfinite(t)):
        raise ValueError("layer times must be finite")
    # Both axes normalised to O(1): lsq_linear's tolerances are absolute, and coefficients here range
    # from milliseconds down to 1e-12 seconds per attention pair.
    k_scale = max(float(k.max()), 1.0)
    t_scale = float(np.abs(t).max()) or 1.0
    design = np.column_stack([np.ones_like(k), k / k_scale])
    fixed, slope = lsq_linear(design, t / t_scale, bounds=(0.0, np.inf), method="bvls").x * t_scale
    fixed = float(fixed)
    per_layer = float(slope) / k_scale
    predicted = fixed + per_layer * k
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    ss_res = float(np.sum((t - predicted) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LayerFit(fixed_s=fixed, per_layer_s=per_layer, r2=r2)


@dataclass(frozen=True, slots=True)
class LayerScaling:
    """Each device coefficient as a line in the number of layers."""

    fits: dict[str, LayerFit]
    """Per coefficient name (DeviceCoefficients field): its intercept and per-layer slope."""
    knee_p: float
    """Smoothmax exponent of the composed model (the runs' median)."""
    layer_counts: tuple[int, ...]
    """Layer counts of the runs the lines were fitted on."""

    def at(self, num_layers: int) -> DeviceCoefficients:
        """Device coefficients of a model of ``num_layers`` layers (communication excluded)."""
        values: dict[str, Any] = {name: max(0.0, fit.at(num_layers)) for name, fit in self.fits.items()}
        return DeviceCoefficients(**values, knee_p=self.knee_p)

    @property
    def min_r2(self) -> float:
        return min(fit.r2 for fit in self.fits.values())


def fit_layer_scaling(runs: Mapping[int, DeviceCoefficients]) -> LayerScaling:
    """Lines c(k) = c_fixed + k·c_layer through coefficient sets fitted on k-layer runs."""
    if len(runs) < 2:
        raise ValueError("need coefficient sets from runs at two or more layer counts")
    counts = sorted(runs)
    fits = {
        name: fit_layer_times(counts, [getattr(runs[k], name) for k in counts]) for name in LINEAR_PARAMS
    }
    knee = float(np.median([runs[k].knee_p for k in counts]))
    return LayerScaling(fits=fits, knee_p=knee, layer_counts=tuple(counts))


def step_time_at_layers(fixed_s: float, per_layer_s: float, num_layers: int, *, allreduce_s: float = 0.0,
                        num_allreduce_per_layer: int = 2) -> float:
    """T_step(L) = T_fixed + L·T_layer + 2L·t_AR."""
    return fixed_s + num_layers * per_layer_s + num_allreduce_per_layer * num_layers * allreduce_s


def comm_model(full: ModelShape, tp: int, *, alpha_s: float, bus_bandwidth_Bps: float,
               dtype_bytes: int = 2, num_allreduce_per_layer: int = 2) -> CommModel:
    """The profile's all-reduce terms for ``full`` (unsharded or sharded: hidden and layers are the same)."""
    if tp < 2:
        raise ValueError("an all-reduce model needs tp >= 2")
    return CommModel(
        alpha_s=alpha_s,
        bus_bandwidth_Bps=bus_bandwidth_Bps,
        num_allreduce_per_layer=num_allreduce_per_layer,
        num_layers=full.num_layers,
        hidden_size=full.hidden_size,
        dtype_bytes=dtype_bytes,
    )


def full_model_profile(
    scaling: LayerScaling,
    *,
    name: str,
    hardware: str,
    model: ModelShape,
    tp: int,
    comm: CommModel,
    memory: MemoryFigures,
    host_link_Bps: float,
    provenance: Provenance,
    host: HostCoefficients | None = None,
    overlap_host: bool = False,
    fit_error: FitError | None = None,
    dtype: str = "bfloat16",
) -> Profile:
    """A measured profile of the whole model at ``tp``: per-layer coefficients at the model's layer count
    plus the all-reduce model; ``fit_error`` is the per-layer fit's (the scaling adds its own error)."""
    counts = ", ".join(map(str, scaling.layer_counts))
    source = (
        f"{provenance.source}; scaled from runs of k = {counts} layers at tp={tp} shapes to "
        f"{model.num_layers} layers (min linearity R² {scaling.min_r2:.4f}); all-reduce modelled as "
        f"alpha + 2(p-1)/p * bytes / BW, {comm.num_allreduce_per_layer} per layer"
    )
    return Profile(
        name=name,
        hardware=hardware,
        model=model.name,
        tp=tp,
        dtype=dtype,
        kind=ProfileKind.MEASURED,
        device_s=scaling.at(model.num_layers),
        host_s=host or HostCoefficients(),
        overlap_host=overlap_host,
        comm=comm,
        memory=memory,
        host_link_Bps=host_link_Bps,
        fit_error=fit_error,
        provenance=provenance.model_copy(update={"source": source}),
    )
