"""Engine speed: decode tokens/s and step times at several batch sizes, and prefill, on any device.

    python benchmarks/engine.py                                  # small model, fp32, CPU
    python benchmarks/engine.py --device cuda --model llama-3-8b --dtype bf16 --batch-sizes 1,8,32,128,256

Every step is run through the real ModelRunner (paged KV pool, the device's default backend; decode under
CUDA graphs on a GPU unless --no-cuda-graphs), timed as the calibration profiler times it: device time
(CUDA events on a GPU, the wall clock on CPU) and cycle time (host preparation and sync included).
Achieved bytes/s and FLOP/s are printed against ceilings measured here first: a device copy (read + write)
and a square GEMM. Numbers, never pass/fail.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from calibration.engine.attention import ScheduledSeq
from calibration.engine.configs import MODELS, get_model
from calibration.engine.gpu_check import copy_bandwidth, decode_steps, matmul_flops, step_bytes, step_flops
from calibration.engine.runner import ModelRunner

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--batch-sizes", type=_ints, default=_ints("1,4,16,64"))
    parser.add_argument("--context", type=int, default=512, help="decode context length in tokens")
    parser.add_argument("--prefill-lens", type=_ints, default=_ints("128,512,2048"))
    parser.add_argument("--backend", default=None, help="default: triton_paged on cuda, sdpa_gather on cpu")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--num-layers", type=int, default=None, help="build fewer layers than the model has")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if cuda else "fp32")]
    backend = args.backend or ("triton_paged" if cuda else "sdpa_gather")
    graphs = cuda and backend == "triton_paged" and not args.no_cuda_graphs
    shape = get_model(args.model)
    if args.num_layers is not None:
        shape = shape.with_layers(args.num_layers)
    bs = args.block_size
    pages = -(-args.context // bs)
    num_blocks = max(max(args.batch_sizes) * pages, max(-(-n // bs) for n in args.prefill_lens)) + 1

    print(f"device {device} ({torch.cuda.get_device_name(device) if cuda else f'{torch.get_num_threads()} threads'})"
          f", torch {torch.__version__}, model {shape.name} ({shape.num_layers} layers), {dtype}, backend {backend}"
          f"{', CUDA graphs' if graphs else ''}")
    copy_bw = copy_bandwidth(device, (1 << 30) if cuda else (256 << 20))
    gemm = matmul_flops(device, 8192 if cuda else 1024, dtype)
    print(f"ceilings: copy {copy_bw / 1e9:.1f} GB/s (read + write), GEMM {gemm / 1e12:.3f} TFLOP/s")

    runner = ModelRunner(
        shape, device=str(device), dtype=dtype, num_blocks=num_blocks, block_size=bs, backend=backend,
        cuda_graphs=graphs, max_graph_batch=max(args.batch_sizes),
    )
    header = f"{'case':>16} {'tokens':>7} {'step ms':>9} {'cycle ms':>9} {'tok/s':>10} {'GB/s':>8} {'%copy':>6} " \
             f"{'TFLOP/s':>8} {'%gemm':>6}"
    print(header)

    def row(case: str, seqs: list[ScheduledSeq], step_s: float, cycle_s: float) -> None:
        tokens = sum(s.num_new_tokens for s in seqs)
        bps = step_bytes(shape, dtype, seqs) / step_s
        fps = step_flops(shape, seqs) / step_s
        print(f"{case:>16} {tokens:>7} {step_s * 1e3:>9.3f} {cycle_s * 1e3:>9.3f} {tokens / step_s:>10.0f} "
              f"{bps / 1e9:>8.2f} {100 * bps / copy_bw:>6.1f} {fps / 1e12:>8.3f} {100 * fps / gemm:>6.1f}",
              flush=True)

    for batch in args.batch_sizes:
        seqs, step_s, cycle_s = decode_steps(runner, batch, args.context, warmup=args.warmup, iters=args.iters)
        row(f"decode b={batch}", seqs, step_s, cycle_s)
    for n in args.prefill_lens:
        seqs = [ScheduledSeq(num_new_tokens=n, num_computed_tokens=0, block_table=list(range(-(-n // bs))))]
        ids = [i % shape.vocab_size for i in range(n)]
        for _ in range(max(1, args.warmup // 2)):
            runner.execute(seqs, ids)
        timings = [runner.execute_timed(seqs, ids)[1] for _ in range(max(3, args.iters // 2))]
        row(f"prefill n={n}", seqs, statistics.median(t.device_s for t in timings),
            statistics.median(t.cycle_s for t in timings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
