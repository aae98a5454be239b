"""The cycle collector around start-up and the event loop: back as it was, frozen only in a process of its own."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from simulator.cli.main import main
from simulator.collector import before_exit, cycle_collector_paused, start_up

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("pause", [cycle_collector_paused, lambda: start_up(freeze=False)])
def test_back_as_it_was_even_after_an_error(pause: Callable[[], AbstractContextManager[None]]) -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), pause():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with pause():
            pass
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_an_in_process_command_freezes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A test or a notebook calling the command line keeps its garbage collectable."""
    frozen = gc.get_freeze_count()
    code = main(["run", str(ROOT / "scenarios/quickstart.yaml"), "--summary-only", "--quiet", "--out",
                 str(tmp_path / "run"), "--set", "workload.num_requests=10"])
    assert code == 0
    assert gc.get_freeze_count() == frozen and gc.isenabled()


CHILD = (
    "import gc, os, sys\n"
    "from simulator.cli.main import main\n"
    "sys.argv = ['fleetsim', 'run', 'scenarios/quickstart.yaml', '--summary-only', '--quiet', '--out', sys.argv[1],"
    " '--set', 'workload.num_requests=10']\n"
    "assert main() == 0\n"
    "print(gc.get_freeze_count() > 10_000, gc.isenabled(), os.environ['OPENBLAS_NUM_THREADS'])\n"
)


def _child(out: Path, blas_threads: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = blas_threads
    done = subprocess.run([sys.executable, "-c", CHILD, str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.splitlines()[-1]


def test_the_command_line_freezes_start_up_and_keeps_one_blas_thread(tmp_path: Path) -> None:
    """As its own process, ``fleetsim run`` freezes what start-up made and numpy's OpenBLAS runs one thread;
    a user's own setting is kept."""
    assert _child(tmp_path / "a", None) == "True True 1"
    assert _child(tmp_path / "b", "2") == "True True 2"


def test_before_exit_freezes_what_is_alive() -> None:
    """What a one-command process holds at its end is out of the shutdown collection's reach."""
    frozen = gc.get_freeze_count()
    alive = [[i] for i in range(1000)]
    try:
        before_exit()
        assert gc.get_freeze_count() >= frozen + len(alive)
    finally:
        gc.unfreeze()
