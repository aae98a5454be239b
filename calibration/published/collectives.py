"""All-reduce curves from the published collective profiles, as a profile's ``CommModel``.

The files hold one NCCL all-reduce time (median of repeats, under CUDA graphs) per message size for each
rank count, ranks in one NVSwitch node: 993 sizes from 4 KiB to 128 MiB in steps of 16 KiB. The curve of a
profile is built by one rule: drop the smallest size (each series' first measurement is a warm-up outlier:
62 µs at 4 KiB against 25 µs at 20 KiB on a100_dgx at 8 ranks), group the rest into log-spaced bins
(``BINS_PER_DECADE``) and take each bin's median size and time, then a running maximum (a larger message
never takes less time) so the curve can be extended along its last segment. An α–β fit to the same
points is kept beside it as a summary. ``held_out_by_size`` predicts each bin from the curve without it.

These are NCCL's times. vLLM's custom all-reduce kernel (one-shot, for small messages on NVLink) is faster
at decode sizes; it is not modelled, and a profile says so in its rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibration.engine.configs import ModelShape
from calibration.published.vidur import AllReduceCurves
from simulator.cost.curve import PiecewiseLinear
from simulator.cost.profile import CommModel

ALLREDUCES_PER_LAYER = 2
"""Megatron tensor parallelism: one all-reduce after attention's O projection, one after the MLP."""


BINS_PER_DECADE = 8
"""Log-spaced bins of message size per factor of ten: 36 knots over 20 KiB – 128 MiB."""


def monotone(seconds: np.ndarray) -> np.ndarray:
    return np.maximum.accumulate(seconds)


def binned(curves: AllReduceCurves, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, seconds) of the curve's knots by the module's rule, before the running maximum."""
    nbytes, seconds = curves.at(ranks)
    nbytes, seconds = nbytes[1:], seconds[1:]
    edges = np.logspace(np.log10(nbytes[0]), np.log10(nbytes[-1]) + 1e-9,
                        int(np.ceil(np.log10(nbytes[-1] / nbytes[0]) * BINS_PER_DECADE)) + 1)
    index = np.clip(np.searchsorted(edges, nbytes, side="right") - 1, 0, len(edges) - 2)
    xs, ys = [], []
    for i in np.unique(index):
        members = index == i
        xs.append(float(np.median(nbytes[members])))
        ys.append(float(np.median(seconds[members])))
    return np.array(xs), np.array(ys)


def curve_of(curves: AllReduceCurves, ranks: int) -> PiecewiseLinear:
    nbytes, seconds = binned(curves, ranks)
    return PiecewiseLinear(x=tuple(float(b) for b in nbytes), y=tuple(float(s) for s in monotone(seconds)))


def alpha_beta(nbytes: np.ndarray, seconds: np.ndarray, ranks: int) -> tuple[float, float]:
    """(α seconds, bus bandwidth bytes/s) of ``α + 2(p−1)/p · bytes / BW`` fitted on relative error."""
    factor = 2.0 * (ranks - 1) / ranks
    design = np.column_stack([np.ones_like(nbytes), factor * nbytes]) / seconds[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    return max(float(alpha), 0.0), 1.0 / max(float(inv_bw), 1e-30)


def comm_model(curves: AllReduceCurves, shape: ModelShape, ranks: int, *, dtype_bytes: int = 2) -> CommModel:
    """The all-reduce term of ``shape`` at ``ranks``-way TP: the measured curve, α–β as its summary."""
    nbytes, seconds = binned(curves, ranks)
    alpha, bus = alpha_beta(nbytes, monotone(seconds), ranks)
    return CommModel(
        alpha_s=alpha, bus_bandwidth_Bps=bus, num_allreduce_per_layer=ALLREDUCES_PER_LAYER,
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, dtype_bytes=dtype_bytes,
        curve=curve_of(curves, ranks), topology=curves.topology,
    )


@dataclass(frozen=True, slots=True)
class HeldOutError:
    ranks: int
    median: float
    p90: float
    worst: float
    points: int


def held_out_by_size(curves: AllReduceCurves) -> list[HeldOutError]:
    """Each interior knot predicted from the curve without it (linear between its neighbours)."""
    out = []
    for ranks in sorted(curves.curves):
        nbytes, seconds = binned(curves, ranks)
        seconds = monotone(seconds)
        errors = []
        for i in range(1, len(nbytes) - 1):
            keep = np.r_[0:i, i + 1:len(nbytes)]
            predicted = np.interp(nbytes[i], nbytes[keep], seconds[keep])
            errors.append(abs(predicted / seconds[i] - 1.0))
        e = np.array(errors)
        out.append(HeldOutError(ranks, float(np.median(e)), float(np.quantile(e, 0.9)), float(e.max()), len(e)))
    return out
