"""Serving on CPU: `fleetsim serve --model small` in its own process, `fleetsim bench` against it, and the
client's TTFT / ITL / E2E held against the engine's own step log (what HTTP adds).

    OMP_NUM_THREADS=1 python benchmarks/serving.py --out runs/serving          # ~2 min: 300 requests at 4.5/s
    python benchmarks/serving.py --rate 6 --num-requests 200 --out runs/serving-6

Numbers, never pass/fail: on a shared 2-core machine other processes move every figure. The server runs
the scheduler settings of ``scenarios/serve_cpu.yaml`` (``--scenario``); its log goes to OUT/server-log and
the bench's run folder to OUT/bench; ``overhead.json`` holds the comparison.

Runs of 2026-12-02 on this project's 2-core VM:
- quiet host (the CPU profile re-measured on it the same hour), ``--rate 14 --max-concurrency 64
  --num-requests 400``: 400/400 completed, no error, 64 streams in flight (the cap) for most of the run: the
  server sustains about 6.4 requests/s there (862 output tok/s, TPOT p50 69 ms at 64 streams); TTFT p50/p99
  154/293 ms. Client minus engine: TTFT +22.8 ms p50 / +43.4 ms p99, E2E +13.1 / +30.0 ms, ITL -0.05 ms p50
  / +10.8 ms p99 (each gap matches the engine's).
- loaded host (four other sessions, load average 3-6; engine steps at 2.05x the profile of then),
  ``--rate 4 --max-concurrency 64 --num-requests 200``: 200/200, 64 streams; TTFT p50/p99 414/1095 ms;
  client minus engine TTFT +55.8 / +127 ms, ITL -0.01 / +28.7 ms: the HTTP path costs more on a busy host.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: str, scenario: Path, log_dir: Path, port: int) -> subprocess.Popen[str]:
    import httpx

    command = [sys.executable, "-m", "simulator.cli.main", "serve", "--model", model, "--port", str(port),
               "--scenario", str(scenario), "--log-dir", str(log_dir)]
    server = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit("the server exited")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.terminate()
    raise SystemExit("the server did not come up")


def main() -> None:
    from calibration.endpoint.overhead import client_vs_engine, format_overhead
    from simulator.cli.main import main as fleetsim

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "serve_cpu.yaml")
    parser.add_argument("--rate", type=float, default=None, help="Poisson rate instead of the scenario's")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "serving")
    args = parser.parse_args()
    port = free_port()
    log_dir = args.out / "server-log"
    server = start_server(args.model, args.scenario, log_dir, port)
    try:
        bench = ["bench", "--endpoint", f"http://127.0.0.1:{port}", "--scenario", str(args.scenario),
                 "--out", str(args.out / "bench"), "--overwrite"]
        for flag, value in (("--rate", args.rate), ("--num-requests", args.num_requests),
                            ("--max-concurrency", args.max_concurrency)):
            if value is not None:
                bench += [flag, str(value)]
        code = fleetsim(bench)
        if code:
            raise SystemExit(code)
        time.sleep(2.0)  # the server flushes its log about once a second
    finally:
        server.terminate()
        server.wait(30)
    overhead = client_vs_engine(args.out / "bench", log_dir)
    (args.out / "overhead.json").write_text(json.dumps(overhead, indent=2) + "\n")
    print(format_overhead(overhead))


if __name__ == "__main__":
    main()
