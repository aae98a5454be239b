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


def test_a_cycle_the_paused_block_dropped_is_freed_by_a_young_pass() -> None:
    """What the block made stays young: a cycle it made and dropped is freed by the young passes that
    allocations start, with no full pass (promoted to the oldest generation, it waited for full passes that a
    process running simulation after simulation hardly ever starts)."""
    collected: list[str] = []

    class Node:
        def __init__(self) -> None:
            self.other: Node | None = None

        def __del__(self) -> None:
            collected.append("node")

    with cycle_collector_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
    gc.collect(1)  # a young pass (generations 0 and 1), as the next allocations would start
    assert collected == ["node", "node"] and gc.get_freeze_count() == 0


def test_finished_fleets_are_freed_in_a_long_lived_process() -> None:
    """Simulation after simulation in one process (a notebook, the dashboard): a finished fleet's replicas,
    schedulers and KV pools (cycles among them) go with the young passes, not only with a full pass."""
    from simulator.core.kv_manager import KVManager
    from simulator.scenario import load_scenario
    from simulator.simulation import run

    def live_kv_managers() -> int:
        return sum(isinstance(o, KVManager) for o in gc.get_objects())

    gc.collect()
    before = live_kv_managers()
    for seed in range(3):
        result = run(load_scenario(ROOT / "scenarios" / "routing.yaml", ["workload.num_requests=40", f"seed={seed}"]))
        del result
        gc.collect(1)
    # routing.yaml: four variants of four replicas. Left to a full pass, three runs would leave 48.
    assert live_kv_managers() - before <= 16


ONE_COMMAND = (
    "import gc\n"
    "from simulator.collector import cycle_collector_paused, start_up\n"
    "with start_up(freeze=True):\n"
    "    pass\n"
    "after_start_up = gc.get_freeze_count()\n"
    "with cycle_collector_paused():\n"
    "    made = [[i] for i in range(1000)]\n"
    "print(gc.get_freeze_count() - after_start_up >= 1000, gc.isenabled())\n"
)


def test_a_one_command_process_freezes_what_the_event_loop_made() -> None:
    """After ``start_up(freeze=True)`` (the CLI's own process), a paused block's objects are frozen as it
    ends rather than left to a young pass over all of them (the process exits before their cycles matter);
    an in-process command freezes nothing (above)."""
    done = subprocess.run([sys.executable, "-c", ONE_COMMAND], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"]
