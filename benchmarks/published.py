"""Held-out accuracy of the fitted-published cost models: ``python benchmarks/published.py``.

1. **Leave one model out**, per GPU: the kernel model is fitted on the other models' operator rows and
   predicts the left-out model's whole step (layers × its operators + embedding + two all-reduces per
   layer) at every token count 1–4,096 and TP degree the data has; measured = the same sum over its own
   rows. The all-reduce term is the same measured curve on both sides (it is not model-specific); the
   compute-only error is printed beside the step error.
2. **All-reduce curves held out by size**: each binned size predicted from its neighbours.
3. **Decode step vs TP** for Llama-2-70B on the A100 (B = 32, 1,024 tokens of context each): the shipped
   fitted-published profile against the composed measurement, and the analytic profile's ideal scaling.

Prints median / p90 / worst per GPU and TP degree; writes ``published.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.analytic import analytic_profile
from calibration.engine.configs import get_model
from calibration.published import vidur
from calibration.published.attention import AttentionScale, decode_seconds, fit_attention
from calibration.published.collectives import comm_model, held_out_by_size
from calibration.published.from_published import fit_published, kernel_models
from calibration.published.steps import step_parts
from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel


def leave_one_model_out(data: Path) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for hardware in vidur.GPU_FOLDERS:
        curves = vidur.load_allreduce(data, hardware)
        errors: dict[int, list[np.ndarray]] = {}
        compute: dict[int, list[np.ndarray]] = {}
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
        gpu: dict[str, dict[str, float]] = {}
        for tp in sorted(errors):
            e = np.concatenate(errors[tp])
            c = np.concatenate(compute[tp])
            gpu[f"tp{tp}"] = {"median": float(np.median(e)), "p90": float(np.quantile(e, 0.9)),
                              "worst": float(e.max()), "points": len(e), "over_15pct": int((e > 0.15).sum()),
                              "compute_median": float(np.median(c)), "compute_worst": float(c.max())}
        every = np.concatenate([np.concatenate(v) for v in errors.values()])
        gpu["all"] = {"median": float(np.median(every)), "p90": float(np.quantile(every, 0.9)),
                      "worst": float(every.max()), "points": len(every), "over_15pct": int((every > 0.15).sum())}
        out[hardware] = gpu
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=vidur.DEFAULT_DATA, help="Vidur's published profiles")
    parser.add_argument("--out", type=Path, default=Path("published.json"))
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"published data not found at {args.data} (pass --data)", file=sys.stderr)
        return 2
    lomo = leave_one_model_out(args.data)
    print("leave-one-model-out step time (1-4096 tokens): median / p90 / worst, points over 15 %")
    for hw, table in lomo.items():
        for key, e in table.items():
            extra = (f"   compute only: median {e['compute_median']:.1%} worst {e['compute_worst']:.1%}"
                     if "compute_median" in e else "")
            print(f"  {hw} {key:4s} {e['median']:6.1%} {e['p90']:6.1%} {e['worst']:6.1%}  "
                  f"{e['over_15pct']}/{e['points']}{extra}")
    ar = allreduce_held_out(args.data)
    print("all-reduce held out by size: median / p90 / worst")
    for hw, table in ar.items():
        for key, e in table.items():
            print(f"  {hw} {key:8s} {e['median']:6.1%} {e['p90']:6.1%} {e['worst']:6.1%}")
    tp_rows = decode_vs_tp(args.data)
    print("Llama-2-70B A100 decode step, B=32, 1,024 context each: composed from rows / fitted profile / analytic")
    for key, r in tp_rows.items():
        print(f"  {key}: {r['composed_ms']:7.2f} ms  {r['fitted_profile_ms']:7.2f} ms  {r['analytic_ms']:7.2f} ms")
    args.out.write_text(json.dumps({"leave_one_model_out": lomo, "allreduce_held_out": ar,
                                    "decode_vs_tp_llama_2_70b_a100": tp_rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
