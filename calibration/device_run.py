"""The whole GPU calibration in one run of about six minutes: ``python -m calibration.device_run --out DIR``.

Stages, each writing its raw CSV to ``DIR`` as it goes and a line to ``DIR/summary.json`` when it ends:

1. ceilings — device-to-device copy bandwidth and a large bf16 GEMM (what every fitted rate is read against);
2. kernel correctness — the GPU attention backend (triton_paged) against sdpa_gather on the same weights,
   KV pool and steps (prefill chunks, then decodes), on a 2-layer Llama-3-8B;
3. the gpu grid for Llama-3-8B TP 1 (research §7.3), CUDA-graph decode, then the fit → a measured profile;
4. per-layer grids for Llama-3-70B and -405B at TP-8 shapes, with k = 2 and 4 distinct layers each, scaled
   to the full depth with calibration/scale.py (plus the analytic all-reduce term) → measured profiles;
5. the layer-scaling check on 8B: T(k) at k = 4, 8, 16, 32 layers (B 32, context 1024), linearity R²;
6. validation of stage 3's profile: ``fleetsim validate`` on the same device (200 Azure-conversation requests,
   lock-step then real time, twice: the engine's own spread), into ``DIR/validation/`` — what
   ``python -m calibration.rescore`` scores again later with a refitted profile, on any machine.

Every stage runs inside its own guard: a failure is recorded (with its traceback) and the next stage still
runs, because device time is scarce. A wall-clock deadline skips stages that would not finish.

``--dry-run`` runs the same code path on CPU with tiny shapes in seconds (tested in CI).

On the lent H200 (its image has torch and triton but not pydantic, plotly or simpy, and no shared traces),
with those wheels downloaded for Python 3.12 into an ignored ``.whl/`` beside a copy of
``azure_llm_2023_conv.csv`` (``/work/.library/device/README.md`` says how), one call does everything:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD;
    python3 -m calibration.device_run --out /tmp/dr --trace $PWD/.whl/azure_llm_2023_conv.csv > $OUT/log.txt 2>&1;
    tar czf $OUT/results.tgz -C /tmp dr

(2026-12-04: stages 1-5 took 101 s and the validation 370 s of a 7.5-minute call.)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_DEADLINE_S = 420.0
"""Stages not started by then are skipped (a 10-minute command limit, ~6 minutes of work planned)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What one run does: sizes differ between the device run and the dry run, the code path does not."""

    device: str
    dtype: str
    backend: str
    cuda_graphs: bool
    copy_bytes: int
    gemm_size: int
    check_model: str
    check_layers: int
    grid: str
    grid_model: str
    layer_models: tuple[str, ...]
    layer_tp: int
    layer_counts: tuple[int, ...]
    layer_grid_quick: bool
    scaling_model: str
    scaling_layers: tuple[int, ...]
    scaling_batch: int
    scaling_context: int
    validate_requests: int
    validate_repeat: bool
    validate_max_prompt: int
    validate_max_output: int
    threads: int | None = None


def gpu_plan() -> Plan:
    return Plan(
        device="cuda", dtype="bfloat16", backend="triton_paged", cuda_graphs=True, copy_bytes=1 << 30,
        gemm_size=8192, check_model="llama-3-8b", check_layers=2, grid="gpu", grid_model="llama-3-8b",
        layer_models=("llama-3-70b", "llama-3-405b"), layer_tp=8, layer_counts=(2, 4), layer_grid_quick=False,
        scaling_model="llama-3-8b", scaling_layers=(4, 8, 16, 32), scaling_batch=32, scaling_context=1024,
        validate_requests=200, validate_repeat=True, validate_max_prompt=1024, validate_max_output=128,
    )


def dry_plan() -> Plan:
    return Plan(
        device="cpu", dtype="float32", backend="sdpa_gather", cuda_graphs=False, copy_bytes=8 << 20,
        gemm_size=256, check_model="tiny", check_layers=2, grid="ci", grid_model="tiny",
        layer_models=("tiny",), layer_tp=2, layer_counts=(1, 2), layer_grid_quick=True,
        scaling_model="tiny", scaling_layers=(1, 2, 4), scaling_batch=4, scaling_context=64, threads=1,
        validate_requests=6, validate_repeat=False, validate_max_prompt=48, validate_max_output=6,
    )


@dataclass(slots=True)
class Summary:
    """What summary.json holds: one entry per stage, written after every stage (a kill keeps the rest)."""

    path: Path
    stages: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def record(self, stage: str, result: Any) -> None:
        self.stages[stage] = result
        self.path.write_text(json.dumps({"meta": self.meta, "stages": self.stages}, indent=2, default=str) + "\n")


def _dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ----- stages ------------------------------------------------------------------------------------------


def stage_ceilings(plan: Plan, out: Path) -> dict[str, Any]:
    """Copy bandwidth (read + write bytes / time) and GEMM FLOP/s on random data (never zeros)."""
    import torch

    from calibration.timing import RepeatPolicy, make_timer, repeat, summarize, time_call

    dtype = _dtype(plan.dtype)
    policy = RepeatPolicy(num_warmup=3, num_repeats=10, min_repeats=5)
    n = plan.copy_bytes // torch.empty((), dtype=dtype).element_size()
    src = torch.randn(n, device=plan.device, dtype=torch.float32).to(dtype)
    dst = torch.empty_like(src)
    timer = make_timer(plan.device)
    copy = summarize(repeat(lambda: time_call(timer, lambda: dst.copy_(src))[1], policy))
    m = plan.gemm_size
    a = torch.randn(m, m, device=plan.device, dtype=torch.float32).to(dtype)
    b = torch.randn(m, m, device=plan.device, dtype=torch.float32).to(dtype)
    gemm = summarize(repeat(lambda: time_call(timer, lambda: a @ b)[1], policy))
    result = {
        "copy_bytes": plan.copy_bytes,
        "copy_Bps": 2 * plan.copy_bytes / copy.median_s,
        "copy_rel_iqr": copy.rel_iqr,
        "gemm_size": m,
        "gemm_flops": 2 * m**3 / gemm.median_s,
        "gemm_rel_iqr": gemm.rel_iqr,
    }
    (out / "ceilings.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def stage_correctness(plan: Plan, out: Path) -> dict[str, Any]:
    """The plan's attention backend (and sdpa_gather, when they differ) against the dense oracle, and the
    two against each other, on identical weights, pools and steps: prompt chunks, then decodes."""
    import torch

    from calibration.engine.attention import ScheduledSeq, step_positions
    from calibration.engine.attention.dense import dense_last_logits
    from calibration.engine.configs import get_model
    from calibration.engine.runner import ModelRunner

    shape = get_model(plan.check_model)
    dtype = _dtype(plan.dtype)
    bs = 16
    names = [plan.backend] + (["sdpa_gather"] if plan.backend != "sdpa_gather" else [])
    runners = {
        name: ModelRunner(shape, device=plan.device, dtype=dtype, num_blocks=512, block_size=bs, backend=name,
                          seed=3, num_layers=plan.check_layers)
        for name in names
    }
    rng = torch.Generator().manual_seed(0)
    vocab = shape.vocab_size
    prompts = [int(x) for x in torch.randint(40, 300, (6,), generator=rng)]
    num_decodes = 8
    tables, next_block = [], 0
    for p in prompts:
        need = -(-(p + num_decodes) // bs)
        tables.append(tuple(range(next_block, next_block + need)))
        next_block += need
    tokens = [torch.randint(0, vocab, (p + num_decodes,), generator=rng).tolist() for p in prompts]
    steps = [[ScheduledSeq(num_new_tokens=p, num_computed_tokens=0, block_table=t)
              for p, t in zip(prompts, tables, strict=True)]]
    steps += [[ScheduledSeq(num_new_tokens=1, num_computed_tokens=p + k, block_table=t)
               for p, t in zip(prompts, tables, strict=True)] for k in range(num_decodes - 1)]
    worst = dict.fromkeys([*names, "pair"], 0.0)
    agree, total = 0, 0
    first = runners[names[0]]
    for seqs in steps:
        ids = [tok for s, toks in zip(seqs, tokens, strict=True) for tok in toks[s.num_computed_tokens : s.seq_len]]
        logits = {}
        with torch.inference_mode():
            for name, runner in runners.items():
                meta = runner.backend.prepare(seqs)
                x = torch.tensor(ids, device=runner.device)
                logits[name] = runner.model(x, step_positions(seqs, runner.device), meta, runner.kv_cache).float()
            ref = dense_last_logits(first.model, [toks[: s.seq_len] for s, toks in zip(seqs, tokens,
                                                                                        strict=True)]).float()
        for name in names:
            worst[name] = max(worst[name], float((logits[name] - ref).norm() / ref.norm()))
        if len(names) > 1:
            a, b = logits[names[0]], logits[names[1]]
            worst["pair"] = max(worst["pair"], float((a - b).norm() / b.norm()))
        agree += int((logits[names[0]].argmax(-1) == ref.argmax(-1)).sum())
        total += len(seqs)
    tolerance = 1e-2 if plan.dtype != "float32" else 1e-4
    result = {"backends": names, "reference": "dense", "model": plan.check_model, "layers": plan.check_layers,
              "steps": len(steps), "max_rel_err": worst, "argmax_agreement_vs_dense": agree / total,
              "tolerance": tolerance, "ok": max(worst.values()) < tolerance}
    (out / "correctness.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _runner(plan: Plan, model: str, *, tp: int = 1, num_layers: int | None = None, num_blocks: int) -> Any:
    from calibration.engine.configs import get_model
    from calibration.engine.runner import ModelRunner

    return ModelRunner(get_model(model, tp), device=plan.device, dtype=_dtype(plan.dtype), num_blocks=num_blocks,
                       block_size=16, backend=plan.backend, seed=0, num_layers=num_layers,
                       cuda_graphs=plan.cuda_graphs)


def _pool_blocks(plan: Plan, model: str, tp: int, want: int, *, num_layers: int | None = None,
                 fraction: float = 0.8) -> int:
    """``want`` blocks, or as many as fit next to the weights on a GPU."""
    if not plan.device.startswith("cuda"):
        return want
    import torch

    from calibration.engine.configs import get_model

    shape = get_model(model, tp)
    if num_layers is not None:
        shape = shape.with_layers(num_layers)
    nbytes = torch.empty((), dtype=_dtype(plan.dtype)).element_size()
    free, _ = torch.cuda.mem_get_info()
    room = free * fraction - shape.num_params * nbytes - (6 << 30)
    return max(16, min(want, int(room // (16 * shape.kv_bytes_per_token(nbytes)))))


def _info(plan: Plan, model: str, grid: str, num_layers: int, extra: dict[str, Any]) -> Any:
    from calibration.profiler import RunInfo, device_name, git_revision, library_versions

    return RunInfo(model=model, dtype=plan.dtype, backend=plan.backend, device_type=plan.device.split(":")[0],
                   grid=grid, block_size=16, num_layers=num_layers, cuda_graphs=plan.cuda_graphs,
                   device_name=device_name(plan.device), library_versions=library_versions(),
                   git_revision=git_revision(), extra=extra)


def stage_grid(plan: Plan, out: Path, *, progress: bool) -> dict[str, Any]:
    """The full-model grid through ``fleetsim calibrate``'s own code path: raw CSV, fit, measured profile."""
    from calibration.calibrate import calibrate, hardware_label

    hw = hardware_label(plan.device)
    outputs = calibrate(device=plan.device, model=plan.grid_model, grid=plan.grid, dtype=plan.dtype,
                        backend=plan.backend, cuda_graphs=plan.cuda_graphs, threads=plan.threads,
                        out=out / f"{hw.lower()}-{plan.grid_model}-tp1-measured.yaml", progress=progress)
    _free(plan)
    profile = outputs.profile
    err = profile.fit_error
    return {"profile": outputs.profile_path.name, "csv": outputs.csv_path.name, "points": err.num_points,
            "skipped": outputs.skipped, "mape": err.mape, "max_error": err.max_error, "r2": err.r2,
            "device_s": profile.device_s.model_dump(exclude_none=True),
            "host_s": profile.host_s.model_dump(exclude_none=True),
            "kv_capacity_tokens": profile.memory.kv_capacity_tokens}


def stage_layers(plan: Plan, out: Path, model: str, *, progress: bool) -> dict[str, Any]:
    """Per-layer grids at k distinct layers (TP shapes), fits per k, lines in k, the full-depth profile."""
    from calibration.engine.configs import get_model
    from calibration.fit import fit_timings
    from calibration.grid import layer_grid
    from calibration.profiler import run_grid
    from calibration.scale import fit_layer_scaling

    grid = layer_grid(model, quick=plan.layer_grid_quick)
    fits = {}
    errors = []
    per_k: dict[str, Any] = {}
    for k in plan.layer_counts:
        blocks = _pool_blocks(plan, model, plan.layer_tp, grid.max_blocks(16), num_layers=k)
        runner = _runner(plan, model, tp=plan.layer_tp, num_layers=k, num_blocks=blocks)
        csv_path = out / f"layers-{model}-tp{plan.layer_tp}-k{k}.csv"
        info = _info(plan, model, grid.name, k, {"tp": plan.layer_tp})
        run = run_grid(runner, grid, csv_path, info, vocab_size=runner.shape.vocab_size, progress=progress)
        fit = fit_timings(run.points_frame())
        fits[k] = fit.device
        errors.append(fit.error)
        per_k[str(k)] = {"csv": csv_path.name, "points": len(run.points_frame()), "mape": fit.error.mape,
                         "skipped": run.skipped}
        del runner
        _free(plan)
    scaling = fit_layer_scaling(fits)
    full = get_model(model, plan.layer_tp)
    profile = _layer_profile(plan, model, scaling, errors)
    path = profile.save(out / f"{profile.name}.yaml")
    return {"tp": plan.layer_tp, "per_k": per_k, "min_linearity_r2": scaling.min_r2,
            "full_layers": full.num_layers, "profile": path.name,
            "device_s_full": profile.device_s.model_dump(exclude_none=True)}


def _layer_profile(plan: Plan, model: str, scaling: Any, errors: list[Any]) -> Any:
    """The full-depth measured profile from per-layer lines: memory and link figures from the analytic
    profile of the same hardware/model/tp when one exists (the weights of a TP-8 model cannot be loaded on
    one device, so its KV capacity is not measurable here), the all-reduce term analytic."""
    import datetime as dt

    from calibration.analytic import ALLREDUCE_ALPHA_S
    from calibration.calibrate import hardware_label, measure_copy_bandwidth
    from calibration.engine.configs import get_model
    from calibration.profiler import device_name, git_revision, library_versions
    from calibration.scale import comm_model, full_model_profile
    from simulator.cost.profile import MemoryFigures, Provenance, list_profiles, load_profile

    hw = hardware_label(plan.device)
    shape = get_model(model, plan.layer_tp)
    analytic = f"{hw.lower()}-{model}-tp{plan.layer_tp}-analytic"
    if analytic in list_profiles():
        reference = load_profile(analytic)
        memory, link = reference.memory, reference.host_link_Bps
        bus = reference.comm.bus_bandwidth_Bps if reference.comm else 450e9
    else:  # the dry run's tiny model: nominal figures, said so in the source
        nbytes = 4 if plan.dtype == "float32" else 2
        memory = MemoryFigures(kv_bytes_per_token=shape.kv_bytes_per_token(nbytes), kv_capacity_tokens=4096,
                               weight_bytes=shape.num_params * nbytes, device_memory_bytes=1 << 30)
        link, bus = measure_copy_bandwidth(plan.device), 450e9
    worst = max(errors, key=lambda e: e.mape)
    return full_model_profile(
        scaling, name=f"{hw.lower()}-{model}-tp{plan.layer_tp}-measured", hardware=hw, model=shape,
        tp=plan.layer_tp, comm=comm_model(shape, plan.layer_tp, alpha_s=ALLREDUCE_ALPHA_S, bus_bandwidth_Bps=bus),
        memory=memory, host_link_Bps=link, fit_error=worst, dtype=plan.dtype,
        provenance=Provenance(
            device_name=device_name(plan.device), library_versions=library_versions(),
            date=dt.date.today().isoformat(), git_revision=git_revision(),
            source=(f"per-layer grid '{scaling.layer_counts}' layers of {model} at tp={plan.layer_tp} shapes on one "
                    f"device; memory and host link from {analytic if analytic in list_profiles() else 'nominal'}; "
                    "fit_error = the worst per-k held-out error"),
        ),
    )


def stage_scaling(plan: Plan, out: Path) -> dict[str, Any]:
    """T(k) for k layers of the same model at one decode shape; a line through them and its R²."""
    import csv

    from calibration.grid import decode_point
    from calibration.profiler import measure_point
    from calibration.scale import fit_layer_times
    from calibration.timing import RepeatPolicy

    point = decode_point(plan.scaling_batch, plan.scaling_context)
    policy = RepeatPolicy(num_warmup=5, num_repeats=15, min_repeats=5, budget_s=1.0)
    rows: list[dict[str, Any]] = []
    for k in plan.scaling_layers:
        runner = _runner(plan, plan.scaling_model, num_layers=k, num_blocks=point.num_blocks(16))
        timings = measure_point(runner, point, policy, vocab_size=runner.shape.vocab_size)
        device, cycle = timings.device, timings.cycle
        rows.append({"num_layers": k, "device_s": device.median_s, "cycle_s": cycle.median_s,
                     "device_iqr_s": device.iqr_s})
        del runner
        _free(plan)
    with (out / f"layer-scaling-{plan.scaling_model}.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    line = fit_layer_times([r["num_layers"] for r in rows], [r["device_s"] for r in rows])
    return {"point": point.name, "rows": rows, "fixed_s": line.fixed_s, "per_layer_s": line.per_layer_s,
            "r2": line.r2}


def stage_validate(plan: Plan, out: Path, *, trace: str | None, progress: bool) -> dict[str, Any]:
    """``fleetsim validate`` of the grid stage's profile on the same device: its fidelity summary, the
    files in ``out/validation``."""
    from calibration.calibrate import hardware_label
    from calibration.validate import ValidationOptions, validate

    profile = out / f"{hardware_label(plan.device).lower()}-{plan.grid_model}-tp1-measured.yaml"
    if not profile.is_file():
        raise FileNotFoundError(f"{profile.name}: the grid stage wrote no profile to validate")
    options = ValidationOptions(profile=str(profile), device=plan.device, num_requests=plan.validate_requests,
                                repeat_realtime=plan.validate_repeat, max_prompt_tokens=plan.validate_max_prompt,
                                max_output_tokens=plan.validate_max_output, threads=plan.threads)
    if trace:
        options = dataclasses.replace(options, trace=trace)
    report = validate(options, out_dir=out / "validation", progress=progress)
    _free(plan)
    fidelity = report.fidelity
    result: dict[str, Any] = {"profile": profile.name, "requests": plan.validate_requests,
                              "rate_rps": fidelity["rate_rps"], "folder": "validation"}
    for metric in ("ttft", "tpot", "e2e"):
        if metric in fidelity:
            result[metric] = {k: v for k, v in fidelity[metric].items() if k.endswith("_err")}
    if "lockstep" in fidelity:
        result["lockstep_per_step_device_mape"] = fidelity["lockstep"]["per_step_device"]["mape"]
    if "repeat" in fidelity:
        result["engine_vs_engine"] = {m: {k: v for k, v in fidelity["repeat"]["engine_vs_engine"][m].items()
                                          if k.endswith("_err")} for m in ("ttft", "tpot", "e2e")}
    return result


def _free(plan: Plan) -> None:
    import gc

    gc.collect()
    if plan.device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


# ----- driver ------------------------------------------------------------------------------------------


def run(out: str | Path, *, dry_run: bool = False, deadline_s: float = DEFAULT_DEADLINE_S,
        progress: bool = True, stages: tuple[str, ...] | None = None, trace: str | None = None) -> dict[str, Any]:
    """Run every stage (or those named) in order; returns the summary (also in ``out/summary.json``).
    ``trace``: the Azure-format trace the validation replays (default: the shared traces folder's)."""
    import torch

    plan = dry_plan() if dry_run else gpu_plan()
    if not dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --dry-run to exercise this script on CPU")
    if plan.threads:
        torch.set_num_threads(plan.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from calibration.profiler import device_name, git_revision, library_versions

    summary = Summary(out / "summary.json")
    summary.meta = {"dry_run": dry_run, "device_name": device_name(plan.device), "versions": library_versions(),
                    "git_revision": git_revision(), "date": datetime.datetime.now(datetime.UTC).isoformat(),
                    "plan": {k: getattr(plan, k) for k in plan.__dataclass_fields__}}
    t0 = time.perf_counter()
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("ceilings", lambda: stage_ceilings(plan, out)),
        ("correctness", lambda: stage_correctness(plan, out)),
        ("grid", lambda: stage_grid(plan, out, progress=progress)),
        *[(f"layers-{m}", (lambda m=m: stage_layers(plan, out, m, progress=progress))) for m in plan.layer_models],
        ("scaling", lambda: stage_scaling(plan, out)),
        ("validate", lambda: stage_validate(plan, out, trace=trace, progress=progress)),
    ]
    for name, job in jobs:
        if stages is not None and not any(name.startswith(s) for s in stages):
            continue
        elapsed = time.perf_counter() - t0
        if elapsed > deadline_s:
            summary.record(name, {"status": "skipped", "reason": f"deadline {deadline_s:.0f} s passed"})
            continue
        start = time.perf_counter()
        try:
            result = {"status": "ok", **job()}
        except Exception as err:  # one stage's failure must not cost the others their device time
            result = {"status": "failed", "error": repr(err), "traceback": traceback.format_exc()}
            _free(plan)
        result["seconds"] = time.perf_counter() - start
        summary.record(name, result)
        print(f"[{time.perf_counter() - t0:6.1f} s] {name}: {result['status']} ({result['seconds']:.1f} s)",
              flush=True)
    return {"meta": summary.meta, "stages": summary.stages}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="output folder (raw CSVs + summary.json)")
    parser.add_argument("--dry-run", action="store_true", help="same code path on CPU, tiny shapes, seconds")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="skip stages after this")
    parser.add_argument("--stages", nargs="*", default=None, help="only these stages (prefix match)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--trace", default=None, help="Azure-format trace the validation replays (default: shared)")
    args = parser.parse_args(argv)
    result = run(args.out, dry_run=args.dry_run, deadline_s=args.deadline, progress=not args.quiet,
                 stages=tuple(args.stages) if args.stages else None, trace=args.trace)
    failed = [n for n, s in result["stages"].items() if s.get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
