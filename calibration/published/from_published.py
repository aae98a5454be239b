"""``fleetsim calibrate --from-published vidur``: a fitted-published profile of one model × GPU × TP.

1. Read every operator file of the GPU and fit its ``KernelModel`` (and the A100's, for attention).
2. Compose whole-model step samples (``steps``): the model's own rows where the data has them, else the
   kernel model; LM head, attention and all-reduces by the stated rules.
3. Fit the curve form with ``calibration.fit.fit_curve_device`` (token curve, k, q; the sequence curve
   and the all-reduce curve priced outside the fit) and cross-validate it (k-fold, held-out error stored).
4. Memory by vLLM's rule, the host term of the chosen engine preset, provenance with every file's sha256,
   the rows used and the rule for each term nothing measured.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.analytic import memory_figures
from calibration.engine.configs import get_model
from calibration.fit import TOKEN_KNOTS, cross_validate_curve, fit_curve_device, valid_range
from calibration.published import vidur
from calibration.published.attention import AttentionScale, fit_attention
from calibration.published.collectives import comm_model
from calibration.published.kernels import KernelModel, fit_kernels
from calibration.published.steps import StepParts, step_parts, step_samples
from simulator.cost.curve import PiecewiseLinear
from simulator.cost.profile import (
    DeviceCoefficients,
    FitError,
    HostCoefficients,
    Profile,
    ProfileKind,
    Provenance,
    SourceFile,
    get_accelerator,
    load_hardware,
)
from simulator.errors import ConfigError

SOURCES = ("vidur",)
"""Published datasets ``--from-published`` reads."""

SEQ_KNOTS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
"""Knots of the sequence curve (the LM head over B rows)."""

DEVICE_NAMES = {"A100": "NVIDIA A100-SXM4-80GB", "H100": "NVIDIA H100-SXM5-80GB"}


@dataclass(frozen=True, slots=True)
class PublishedFit:
    profile: Profile
    samples: pd.DataFrame
    held_out_s: np.ndarray
    parts: StepParts


def kernel_models(data: Path, hardware: str, *, leave_out: str | None = None) -> tuple[KernelModel, KernelModel]:
    """(this GPU's kernel model, the A100's) fitted on every published model but ``leave_out``."""
    return _kernel_models(data.resolve(), hardware.upper(), leave_out)


@functools.lru_cache(maxsize=16)
def _kernel_models(data: Path, hardware: str, leave_out: str | None) -> tuple[KernelModel, KernelModel]:
    def fit(gpu: str) -> KernelModel:
        tables = [vidur.load_operators(data, gpu, m) for m in vidur.available_models(data, gpu) if m != leave_out]
        if not tables:
            raise ConfigError(f"no operator files (*/*/mlp.csv) of the catalogue's models for {gpu}",
                              file=data / "compute" / vidur.gpu_folder(gpu))
        return fit_kernels(tables)

    own = fit(hardware)
    return own, (own if hardware.upper() == "A100" else fit("A100"))


def seq_curve(parts: StepParts) -> PiecewiseLinear:
    knots = np.array(SEQ_KNOTS, dtype=np.float64)
    values = np.maximum.accumulate(parts.seq_seconds(knots))
    return PiecewiseLinear(x=tuple(float(k) for k in knots), y=tuple(float(v) for v in values))


def fit_published(model: str, hardware: str, tp: int, *, data: Path | None = None, source: str = "vidur",
                  engine: str | None = None, folds: int = 5, seed: int = 0, date: str | None = None) -> PublishedFit:
    if source not in SOURCES:
        raise ConfigError(f"unknown published source {source!r}; known: {', '.join(SOURCES)}", field="from-published")
    data = vidur.check_data_dir(data or vidur.DEFAULT_DATA)
    hardware = hardware.upper()
    vidur.gpu_folder(hardware)
    try:
        shape = get_model(model, tp)
    except ValueError as err:
        raise ConfigError(str(err), field="model") from None
    own_data = model in vidur.available_models(data, hardware)
    table = vidur.load_operators(data, hardware, model) if own_data else None
    if table is not None:
        table.at(tp)  # a TP degree the file lacks is an error here, not a silent kernel-model fallback
    kernels, a100 = kernel_models(data, hardware)
    allreduce = vidur.load_allreduce(data, hardware) if tp > 1 else None
    comm = comm_model(allreduce, shape, tp) if allreduce is not None else None
    attention = vidur.load_attention(data)
    attention_fit = fit_attention(attention)
    scale = AttentionScale.to(attention, shape, gpu=kernels, a100=a100)
    parts = step_parts(model, tp, kernels, table, comm)
    samples = step_samples(parts, attention, attention_fit, scale, seed=seed)
    sequences = parts.seq_seconds(samples["num_seqs"].to_numpy(dtype=np.float64))
    offset = sequences + parts.comm_seconds(samples["num_new_tokens"].to_numpy(dtype=np.float64))
    # Attention's context and pair terms are the published rows' (scaled): held, not refitted.
    k = shape.num_layers * attention_fit.per_ctx_token * scale.ctx
    q = shape.num_layers * attention_fit.per_pair * scale.pairs
    # Knots at every measured token count where the model's rows exist: GEMM kernel choices make steps
    # jump between neighbouring counts (Qwen-72B at TP 4 on the H100: 39 ms at 512 tokens, 63 ms at 544),
    # and a sparser curve would smooth that away.
    knots = (tuple(int(n) for n in table.layer_seconds(tp)[0] if n <= 64 or n % 32 == 0)
             if table is not None else TOKEN_KNOTS)
    error, held_out = cross_validate_curve(samples, offset_s=offset, num_folds=folds, seed=seed, knots=knots,
                                           per_ctx_token_s=k, per_attn_pair_s=q)
    fit = fit_curve_device(samples, offset_s=offset, knots=knots, per_ctx_token_s=k, per_attn_pair_s=q)
    token_curve = extended(fit.token_curve)
    seqs = seq_curve(parts)
    device = DeviceCoefficients(
        a0_s=0.0, weight_s=token_curve.y[0], per_token_s=token_curve.last_slope,
        per_ctx_token_s=fit.per_ctx_token_s, per_attn_pair_s=fit.per_attn_pair_s,
        per_seq_s=seqs.last_slope, token_curve=token_curve, seq_curve=seqs,
    )
    host, overlap = _host_terms(engine)
    hw = get_accelerator(hardware, load_hardware())
    memory = memory_figures(hw, shape, where="model")
    files = _sources(table, kernels, attention.source, allreduce)
    origin = ("this model's own rows" if table is not None else
              "no rows of this model: the kernel model of the other models predicts its operators from its shape")
    profile = Profile(
        name=profile_name(hardware, model, tp),
        hardware=hardware,
        model=model,
        tp=tp,
        dtype="bfloat16",
        kind=ProfileKind.FITTED_PUBLISHED,
        device_s=device,
        host_s=host,
        overlap_host=overlap,
        comm=comm,
        memory=memory,
        host_link_Bps=hw.host_link_bidirectional_Bps / 2,
        valid_range=valid_range(samples),
        fit_error=FitError(mape=error.mape, max_error=error.max_error, r2=error.r2, num_points=error.num_points,
                           num_folds=error.num_folds),
        provenance=Provenance(
            device_name=f"{DEVICE_NAMES.get(hardware, hardware)}",
            date=date or datetime.date.today().isoformat(),
            source=(f"Fitted to Vidur's published per-operator GPU profiles (microsoft/vidur data/profiling, MIT "
                    f"licence) on {hardware}: {origin}, "
                    f"composed into {len(samples)} whole steps and fitted with calibration.fit.fit_curve_device; "
                    f"held-out error from {error.num_folds}-fold cross-validation over those steps."),
            sources=files,
            rules=rules(table is not None, hardware, tp, kernels, attention_fit.median_error),
        ),
    )
    return PublishedFit(profile=profile, samples=samples, held_out_s=held_out, parts=parts)


EXTEND_FROM = 3072
"""Past the data's last token count the curve continues at its mean slope from this count on."""


def extended(curve: PiecewiseLinear) -> PiecewiseLinear:
    """The curve with one knot at twice its last token count, on its mean slope over the last
    ``EXTEND_FROM``–end stretch: steps are compute-bound (linear) there, and one fitted segment's slope
    alone is noise (it can be 0 between two close knots)."""
    xs, ys = np.array(curve.x), np.array(curve.y)
    start = float(np.interp(EXTEND_FROM, xs, ys)) if xs[-1] > EXTEND_FROM else ys[0]
    span = xs[-1] - (EXTEND_FROM if xs[-1] > EXTEND_FROM else xs[0])
    slope = (ys[-1] - start) / span if span > 0 else 0.0
    return PiecewiseLinear(x=(*curve.x, 2 * curve.x[-1]), y=(*curve.y, curve.y[-1] + slope * curve.x[-1]))


def profile_name(hardware: str, model: str, tp: int) -> str:
    return f"{hardware.lower()}-{model}-tp{tp}-fitted-published"


def _host_terms(engine: str | None) -> tuple[HostCoefficients, bool]:
    from simulator.cost import engines

    return engines.host_coefficients(engine)


def _sources(table: vidur.OperatorTable | None, kernels: KernelModel, attention: SourceFile,
             allreduce: vidur.AllReduceCurves | None) -> tuple[SourceFile, ...]:
    """Every file the profile read: the model's own rows first, then the kernel model's training files."""
    files = [table.source] if table is not None else []
    files += [f for f in kernels.sources if all(f.path != g.path for g in files)]
    files.append(attention)
    if allreduce is not None:
        files.append(allreduce.source)
    return tuple(files)


def rules(own_rows: bool, hardware: str, tp: int, kernels: KernelModel, attention_error: float) -> tuple[str, ...]:
    out = [
        ("layer operators and embedding: this model's rows at this TP, linear between measured token counts"
         if own_rows else
         f"layer operators and embedding: kernel model fitted on {', '.join(kernels.trained_on)} "
         "(GEMM (a(M) + b(M)·K·N) · exp(c(M, K, N)): the trend across shapes at each token count times the "
         "departure of trained GEMMs of nearby K and N; elementwise e0(M) + e1(M)·width), from this model's "
         "shape"),
        "LM head (not measured): a GEMM over one row per sequence against hidden × vocab / TP, priced by the "
        "kernel model of this GPU",
        "attention: the A100 Llama-2-70B TP-2 attention rows; launch and per-sequence costs kept, context term "
        "scaled by KV heads × head dim per rank, prefill pairs by query heads × head dim per rank"
        + ("; to this GPU by the ratio of its weight-streaming (1 token) and compute-bound (4,096 tokens) GEMM "
           "cost per parameter to the A100's" if hardware.upper() != "A100" else "")
        + f" (per-layer attention fit, median error {attention_error:.1%} on the file's rows)",
        "each step: layers × (operators + attention) + embedding + LM head + all-reduces",
        "host overhead: not in the data; the engine preset's published figures (host_s.source)",
    ]
    if tp > 1:
        out.append(f"all-reduce: 2 per layer of tokens × hidden × 2 bytes, NCCL times measured on "
                   f"{vidur.TOPOLOGIES[hardware.upper()]} at {tp} ranks (calibration.published.collectives "
                   "rule); vLLM's custom all-reduce for small messages is not modelled")
    out.append("KV capacity: vLLM's rule (gpu_memory_utilization 0.9 of the device's memory, less weights and "
               "activations)")
    return tuple(out)
