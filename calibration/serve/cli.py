"""``fleetsim serve``: argparse glue only (the server is ``calibration.serve.server``)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError


def require_serve(command: str) -> None:
    """One line naming the install instead of an import traceback."""
    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client", "httpx", "httpx_sse")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"fleetsim {command} needs the serve extra ({', '.join(missing)} missing): "
                          "pip install -e '.[serve]'")


def cmd_serve(args: argparse.Namespace) -> int:
    from calibration.serve.server import ServeOptions, serve

    if importlib.util.find_spec("torch") is None:
        raise ConfigError("fleetsim serve runs the real engine, which needs PyTorch: pip install -e '.[engine,serve]'")
    require_serve("serve")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}", field="port")
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1", field=name)
    if args.kv_gib is not None and not args.kv_gib > 0:
        raise ConfigError("--kv-gib must be > 0", field="kv_gib")
    if args.scenario is not None and not Path(args.scenario).is_file():
        raise ConfigError(f"no scenario file {args.scenario}", field="scenario")
    serve(ServeOptions(
        model=args.model, device=args.device, host=args.host, port=args.port, dtype=args.dtype,
        backend=args.backend, kv_gib=args.kv_gib, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        prefix_caching=not args.no_prefix_caching, max_model_len=args.max_model_len,
        scenario=Path(args.scenario) if args.scenario else None, threads=args.threads, seed=args.seed,
        log_dir=Path(args.log_dir) if args.log_dir else None,
    ))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="serve the real engine behind an OpenAI-compatible streaming API")
    p.add_argument("--model", required=True, help="catalogue model: tiny, small, llama-3-8b, ...")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default: no auth)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16 (GPU default), float16")
    p.add_argument("--backend", default=None, help="attention backend (sdpa_gather on CPU, triton_paged on GPU)")
    p.add_argument("--kv-gib", type=float, default=None,
                   help="KV pool budget, GiB (default 0.25 on CPU, 90%% of free GPU memory less the weights)")
    p.add_argument("--max-num-seqs", type=int, default=128, help="most sequences in one step (128)")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget of one step (512)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (16)")
    p.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output (the model's limit)")
    p.add_argument("--scenario", default=None,
                   help="take the scheduler settings (batching, limits, KV pool) from this scenario's engine "
                        "section and profile, so `fleetsim validate --endpoint` simulates the same policy")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1, as the CPU profile was measured)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--log-dir", default=None,
                   help="write the engine's steps.csv and requests.jsonl (every token's time) here")
    p.set_defaults(func=cmd_serve)
