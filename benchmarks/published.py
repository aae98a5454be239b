"""Held-out accuracy of the fitted-published cost models: ``python benchmarks/published.py``.

1. **Leave one model out**, per GPU: the kernel model is fitted on the other models' operator rows and
   predicts the left-out model's whole step (layers × its operators + embedding + two all-reduces per
   layer) at every token count 1–4,096 and TP degree the data has; measured = the same sum over its own
   rows. The all-reduce term is the same measured curve on both sides (it is not model-specific); the
   compute-only error is printed beside the step error.
2. **What the data itself allows**: the same GEMM shape measured in two models' files (how far Vidur's own
   repeat of one shape moves), and how far a model's measured step exceeds a later, larger step (a curve
   that falls as the tokens grow: no model of tokens alone follows both points).
3. **All-reduce curves held out by size**: each binned size predicted from its neighbours.
4. **Decode step vs TP** for Llama-2-70B on the A100 (B = 32, 1,024 tokens of context each): the shipped
   fitted-published profile against the composed measurement, and the analytic profile's ideal scaling.
5. **Public end-to-end figures** (``benchmarks/public_figures.yaml``, each with its source, never used in
   a fit): the configuration priced by the cost model, published against predicted.

Prints median / p90 / worst per GPU and TP degree; writes ``published.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.analytic import analytic_profile
from calibration.engine.configs import get_model
from calibration.published import vidur
from calibration.published.attention import AttentionScale, decode_seconds, fit_attention
from calibration.published.collectives import comm_model, held_out_by_size
from calibration.published.from_published import fit_published, kernel_models
from calibration.published.kernels import gemm_dims
from calibration.published.steps import step_parts
from simulator.core.step import StepShape
from simulator.cost import engines
from simulator.cost.cost_model import CostModel
from simulator.cost.dtypes import KvDtype, WeightDtype
from simulator.cost.profile import get_accelerator, load_hardware
from simulator.cost.reprice import at_dtypes

PUBLIC_FIGURES = Path(__file__).with_name("public_figures.yaml")


def _summary(errors: np.ndarray) -> dict[str, float]:
    return {"median": float(np.median(errors)), "p90": float(np.quantile(errors, 0.9)),
            "worst": float(errors.max()), "points": len(errors), "over_15pct": int((errors > 0.15).sum())}


def leave_one_model_out(data: Path) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, Any]]]:
    """(errors per GPU and TP degree, the largest fall of each GPU's measured steps with more tokens)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    falls: dict[str, dict[str, Any]] = {}
    for hardware in vidur.GPU_FOLDERS:
        curves = vidur.load_allreduce(data, hardware)
        errors: dict[int, list[np.ndarray]] = {}
        compute: dict[int, list[np.ndarray]] = {}
        worst_fall: dict[str, Any] = {"fall": 0.0}
        for model in vidur.available_models(data, hardware):
            kernels, _ = kernel_models(data, hardware, leave_out=model)
            table = vidur.load_operators(data, hardware, model)
            for tp in sorted(table.frame["tp"].unique()):
                tp = int(tp)
                shape = get_model(model, tp)
                tokens, measured_layer = table.layer_seconds(tp)
                _, measured_emb = table.embedding_seconds(tp)
                predicted = step_parts(model, tp, kernels, None, None)
                measured = shape.num_layers * measured_layer + measured_emb
                guess = predicted.token_seconds(tokens)
                comm = (step_parts(model, tp, kernels, None, comm_model(curves, shape, tp)).comm_seconds(tokens)
                        if tp > 1 else np.zeros_like(tokens))
                errors.setdefault(tp, []).append(np.abs((guess + comm) / (measured + comm) - 1.0))
                compute.setdefault(tp, []).append(np.abs(guess / measured - 1.0))
                step = measured + comm
                fall = step / np.minimum.accumulate(step[::-1])[::-1] - 1.0
                i = int(np.argmax(fall))
                if fall[i] > worst_fall["fall"]:
                    later = i + int(np.argmin(step[i:]))
                    worst_fall = {"fall": float(fall[i]), "model": model, "tp": tp, "tokens": int(tokens[i]),
                                  "lower_at_tokens": int(tokens[later])}
        gpu: dict[str, dict[str, float]] = {}
        for tp in sorted(errors):
            c = np.concatenate(compute[tp])
            gpu[f"tp{tp}"] = {**_summary(np.concatenate(errors[tp])),
                              "compute_median": float(np.median(c)), "compute_worst": float(c.max())}
        gpu["all"] = _summary(np.concatenate([np.concatenate(v) for v in errors.values()]))
        out[hardware] = gpu
        falls[hardware] = worst_fall
    return out, falls


BIASED_GEMMS: dict[str, tuple[str, ...]] = {"phi-2": vidur.GEMM_OPS, "qwen-72b": ("attn_pre_proj",)}
"""GEMMs with a bias in Vidur's model configs (``use_bias``, ``use_qkv_bias``, vidur/config/model_config.py):
an addmm, which cuBLAS serves with other kernels than a plain GEMM of the same shape."""


def same_shape_spread(data: Path) -> dict[str, dict[str, float]]:
    """Per GPU: one (tokens, K, N) GEMM without bias measured in two or more models' files, max/min − 1 of
    their times; and, where one file holds a shape with and without bias, the ratio of the two."""
    out: dict[str, dict[str, float]] = {}
    for hardware in vidur.GPU_FOLDERS:
        plain: dict[tuple[int, int, int], dict[str, float]] = {}
        biased: dict[tuple[str, int, int, int], float] = {}
        for model in vidur.available_models(data, hardware):
            table = vidur.load_operators(data, hardware, model)
            for tp, rows in table.frame.groupby("tp"):
                shape = get_model(model, int(str(tp)))
                for op in vidur.GEMM_OPS:
                    k, n = gemm_dims(shape, op)
                    bias = op in BIASED_GEMMS.get(model, ())
                    for m, t in zip(rows["num_tokens"], rows[op], strict=True):
                        if bias:
                            biased[(model, int(m), k, n)] = float(t)
                        else:
                            plain.setdefault((int(m), k, n), {})[model] = float(t)
        spread = np.array([max(t.values()) / min(t.values()) - 1.0 for t in plain.values() if len(t) > 1])
        out[hardware] = {"shapes": len(spread), "median": float(np.median(spread)),
                         "p99": float(np.quantile(spread, 0.99)), "worst": float(spread.max())}
        pairs = np.array([t / plain[key[1:]][key[0]] for key, t in biased.items()
                          if key[0] in plain.get(key[1:], {})])
        if len(pairs):
            out[hardware].update(bias_pairs=len(pairs), bias_ratio_min=float(pairs.min()),
                                 bias_ratio_max=float(pairs.max()))
    return out


def allreduce_held_out(data: Path) -> dict[str, dict[str, dict[str, float]]]:
    return {hw: {f"{e.ranks}_ranks": {"median": e.median, "p90": e.p90, "worst": e.worst, "points": e.points}
                 for e in held_out_by_size(vidur.load_allreduce(data, hw))} for hw in vidur.GPU_FOLDERS}


def decode_vs_tp(data: Path, batch: int = 32, context: int = 1024) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    shape_of = StepShape(batch, batch, batch, batch * context, 0, 0.0)
    attention = vidur.load_attention(data)
    for tp in (2, 4, 8):
        fitted = fit_published("llama-2-70b", "A100", tp, data=data)
        parts = fitted.parts
        b = np.array([float(batch)])
        scale = AttentionScale.to(attention, parts.shape)
        # The attention fit at this shape: its context term scaled as the profile's rule scales it.
        att = fit_attention(attention)
        att = replace(att, per_ctx_token=att.per_ctx_token * scale.ctx)
        attention_s = float(decode_seconds(att, b, b * context)[0])
        composed = float((parts.token_seconds(b) + parts.seq_seconds(b) + parts.comm_seconds(b))[0]
                         + parts.shape.num_layers * attention_s)
        profile_s = CostModel(fitted.profile).device_time(shape_of)
        analytic_s = CostModel(analytic_profile("A100", "llama-2-70b", tp)).device_time(shape_of)
        rows[f"tp{tp}"] = {"composed_ms": composed * 1e3, "fitted_profile_ms": profile_s * 1e3,
                           "analytic_ms": analytic_s * 1e3}
    return rows


def _step_ms(cost: CostModel, shape: StepShape) -> float:
    return (cost.device_time(shape) + cost.host_time(shape)) * 1e3


def public_figures(data: Path, path: Path = PUBLIC_FIGURES) -> list[dict[str, Any]]:
    """Each published first-token latency against the cost model: the fitted-published (bf16) profile of the
    configuration with the engine preset's host term, one prefill step of the input; priced as it is, and
    repriced to the figure's dtypes as a scenario's ``fleet.weight_dtype`` / ``engine.kv.dtype`` would."""
    hardware_table = load_hardware()
    out = []
    for figure in yaml.safe_load(path.read_text()):
        if figure["metric"] != "first-token latency" or figure["batch"] != 1:
            raise ValueError(f"{path}: {figure['id']}: only batch-1 first-token latencies are priced")
        profile = fit_published(figure["model"], figure["hardware"], figure["tp"], data=data).profile
        host, overlap = engines.host_coefficients(figure["engine"])
        profile = profile.model_copy(update={"host_s": host, "overlap_host": overlap})
        repriced = at_dtypes(profile, get_accelerator(figure["hardware"], hardware_table),
                             weight_dtype=WeightDtype(figure["weight_dtype"]), kv_dtype=KvDtype(figure["kv_dtype"]))
        n = int(figure["input_tokens"])
        prefill = StepShape(1, n, 0, 0, n, n * n / 2.0)
        published = float(figure["published_ms"])
        as_profile, as_scenario = (_step_ms(CostModel(p), prefill) for p in (profile, repriced))
        out.append({"id": figure["id"], "published_ms": published, "bf16_profile_ms": as_profile,
                    "repriced_ms": as_scenario, "bf16_profile_error": as_profile / published - 1.0,
                    "repriced_error": as_scenario / published - 1.0, "profile": repriced.label,
                    "source": " ".join(figure["source"].split())})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=vidur.DEFAULT_DATA, help="Vidur's published profiles")
    parser.add_argument("--out", type=Path, default=Path("published.json"))
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"published data not found at {args.data} (pass --data)", file=sys.stderr)
        return 2
    lomo, falls = leave_one_model_out(args.data)
    print("leave-one-model-out step time (1-4096 tokens): median / p90 / worst, points over 15 %")
    for hw, table in lomo.items():
        for key, e in table.items():
            extra = (f"   compute only: median {e['compute_median']:.1%} worst {e['compute_worst']:.1%}"
                     if "compute_median" in e else "")
            print(f"  {hw} {key:4s} {e['median']:6.1%} {e['p90']:6.1%} {e['worst']:6.1%}  "
                  f"{e['over_15pct']}/{e['points']}{extra}")
    spread = same_shape_spread(args.data)
    print("what the data allows: one GEMM shape (no bias) in two models' files, max/min - 1; the same shape with "
          "and without bias in one file; the largest fall of a measured step as its tokens grow")
    for hw, s in spread.items():
        f = falls[hw]
        bias = (f"; with/without bias x{s['bias_ratio_min']:.2f}-{s['bias_ratio_max']:.2f} ({s['bias_pairs']})"
                if "bias_pairs" in s else "")
        print(f"  {hw} same shape: median {s['median']:.1%} p99 {s['p99']:.1%} worst {s['worst']:.1%} "
              f"({s['shapes']} shapes){bias}")
        print(f"  {hw} fall: {f['model']} tp{f['tp']}: the step at {f['tokens']} tokens is {f['fall']:.1%} above "
              f"its step at {f['lower_at_tokens']}")
    ar = allreduce_held_out(args.data)
    print("all-reduce held out by size: median / p90 / worst")
    for hw, table in ar.items():
        for key, e in table.items():
            print(f"  {hw} {key:8s} {e['median']:6.1%} {e['p90']:6.1%} {e['worst']:6.1%}")
    tp_rows = decode_vs_tp(args.data)
    print("Llama-2-70B A100 decode step, B=32, 1,024 context each: composed from rows / fitted profile / analytic")
    for key, r in tp_rows.items():
        print(f"  {key}: {r['composed_ms']:7.2f} ms  {r['fitted_profile_ms']:7.2f} ms  {r['analytic_ms']:7.2f} ms")
    figures = public_figures(args.data)
    print("public end-to-end figures (never fitted): published / bf16 profile / repriced to the figure's dtypes "
          "(device + host)")
    for f in figures:
        print(f"  {f['id']:42s} {f['published_ms']:6.0f} ms  {f['bf16_profile_ms']:6.1f} ms "
              f"({f['bf16_profile_error']:+.0%})  {f['repriced_ms']:6.1f} ms ({f['repriced_error']:+.0%})")
    args.out.write_text(json.dumps({"leave_one_model_out": lomo, "same_shape_spread": spread,
                                    "largest_fall_with_tokens": falls, "allreduce_held_out": ar,
                                    "decode_vs_tp_llama_2_70b_a100": tp_rows, "public_figures": figures},
                                   indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
