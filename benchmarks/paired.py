"""Speed of this checkout against a git revision, measured in pairs: both at the same time, one per core.

    python benchmarks/paired.py HEAD~1 -- benchmarks/day.py speed --replicas 64 --hours 6
    python benchmarks/paired.py main --pairs 7 -- benchmarks/sim_speed.py --sizes 30000 --cases chat

On a shared machine the same run moves by up to 2x from one minute to the next, so runs one after another
(even alternated) hide a 10 % change. Two runs started together see the same moment of the machine: their
ratio is steady where their times are not. For each pair this prints the CPU seconds of the revision's run
and of this checkout's (from the operating system's accounting of each child, not from the benchmark's
output) and their ratio; then the median ratio and its range. Below 1 this checkout is faster.

The revision is checked out into a temporary git worktree (removed after; beside it, a link to this
checkout's ``../shared`` so that benchmarks reading the shared data find it). When this checkout runs the
compiled hot path, the revision's is built too, into its own cache folder (about a minute), so that both
run compiled; otherwise both run pure Python. Needs two cores or more (with one, the pair would share it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from simulator import native

ROOT = Path(__file__).resolve().parents[1]


def _worktree(revision: str, scratch: Path) -> Path:
    """The revision checked out under ``scratch`` (``scratch/shared`` links to this checkout's shared data)."""
    tree = scratch / "checkout"
    done = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"paired.py: cannot check out {revision!r}: {done.stderr.strip().splitlines()[-1]}")
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (scratch / "shared").symlink_to(shared)
    return tree


def _environment(tree: Path, native_cache: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    if native_cache is None:
        env[native.PURE_ENV] = "1"
    else:
        env[native.CACHE_ENV] = str(native_cache)
    return env


def _build(tree: Path, env: dict[str, str]) -> None:
    print("building the revision's compiled hot path (about a minute)...", file=sys.stderr)
    code = "import simulator.native as n; n.build(lambda message: None)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"paired.py: the revision's build failed: {(done.stdout + done.stderr).strip()[-300:]}")


def _run_pair(command: Sequence[str], sides: Sequence[tuple[Path, dict[str, str]]]) -> list[float]:
    """Start the command in every checkout at once; the CPU seconds of each (user + system)."""
    # Error output to files, not pipes: a benchmark writing more than a pipe holds would block until read.
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in sides]
        children = [subprocess.Popen([sys.executable, *command], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=log) for (cwd, env), log in zip(sides, logs, strict=True)]
        seconds: list[float] = []
        failed: list[str] = []
        for child, log in zip(children, logs, strict=True):
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            seconds.append(usage.ru_utime + usage.ru_stime)
            if child.returncode != 0:
                log.seek(0)
                failed.append(log.read().decode(errors="replace").strip()[-300:])
    if failed:
        raise SystemExit(f"paired.py: the benchmark failed: {failed[0]}")
    return seconds


def main(argv: Sequence[str] | None = None) -> None:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args_in:
        raise SystemExit("usage: paired.py REVISION [--pairs N] -- BENCHMARK.py [its options]")
    split = args_in.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision to compare this checkout with")
    parser.add_argument("--pairs", type=int, default=5, help="runs of each, in pairs (5)")
    parser.add_argument("--keep", action="store_true", help="keep the revision's worktree (printed)")
    args = parser.parse_args(args_in[:split])
    command = args_in[split + 1:]
    if not command:
        raise SystemExit("paired.py: no benchmark given after --")
    if args.pairs < 1:
        raise SystemExit("paired.py: --pairs must be >= 1")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("paired.py: needs two cores or more (with one, both runs would share it)")
    compiled = native.active()  # this checkout's build loaded at import: its sources are compiled
    scratch = Path(tempfile.mkdtemp(prefix="fleetsim-paired-"))
    try:
        tree = _worktree(args.revision, scratch)
        revision_env = _environment(tree, scratch / "native" if compiled else None)
        here_env = dict(os.environ)
        if not compiled:
            here_env[native.PURE_ENV] = "1"
        if compiled:
            _build(tree, revision_env)
        print(f"{args.revision} against this checkout ({'compiled' if compiled else 'pure Python'}): "
              f"{' '.join(command)}")
        ratios = []
        for number in range(1, args.pairs + 1):
            theirs, ours = _run_pair(command, [(tree, revision_env), (ROOT, here_env)])
            ratios.append(ours / theirs)
            print(f"pair {number}: {args.revision} {theirs:7.2f} s   this checkout {ours:7.2f} s   "
                  f"ratio {ours / theirs:.3f}", flush=True)
        print(f"median ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
              "below 1: this checkout is faster")
    finally:
        if args.keep:
            print(f"kept: {scratch}")
        else:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / "checkout")],
                           capture_output=True, check=False)
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
