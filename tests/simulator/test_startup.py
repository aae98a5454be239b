"""Start-up: a plain short run imports only what it uses (each module a run does not need costs its start,
and every worker of plan and sweep pays it again: ``benchmarks/startup.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

NOT_FOR_A_PLAIN_RUN = (
    # features a plain scenario does not have: imported by the code that runs them
    "simulator.fleet.dynamic", "simulator.fleet.pooled", "simulator.fleet.kv_store", "simulator.fleet.autoscaler",
    "simulator.fleet.lifecycle", "simulator.fleet.disaggregation", "simulator.results.day",
    "simulator.results.pools", "simulator.results.handoffs", "simulator.results.kv_tiers",
    # what only some saves, errors or runs need
    "simulator.results.report", "pandas", "pyarrow", "plotly", "tqdm", "numpy.ma", "ctypes.util", "difflib",
    "multiprocessing", "concurrent.futures",
)

CHILD = """
import sys

import pytest
from simulator.cli.main import main
sys.argv = ["fleetsim", "run", "scenarios/quickstart.yaml", "--summary-only", "--out", sys.argv[1],
            "--set", "workload.num_requests=10"]
code = main()
print(__import__("json").dumps([code, sorted(sys.modules)]))
"""


def test_a_short_summary_only_run_imports_only_what_it_uses(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    code, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0
    loaded = set(modules)
    assert "simulator.simulation" in loaded and "numpy" in loaded  # the run did run
    unexpected = sorted(name for name in NOT_FOR_A_PLAIN_RUN if name in loaded)
    assert not unexpected, f"a plain 10-request run imported {unexpected}"


PARSERS = """
import os, sys
from simulator.cli.main import build_parser, main
for command in ("run", "plan", "sweep"):
    build_parser([command, "scenario.yaml"])
print("numpy" in sys.modules)
sys.argv = ["fleetsim", "profiles"]
main()
print(os.environ.get("OPENBLAS_NUM_THREADS"))
"""


def test_the_blas_setting_comes_before_numpy_and_only_for_simulations() -> None:
    """``main`` sets numpy's OpenBLAS to one thread after parsing, so parsing a simulating command must not
    import numpy; a command that is not a simulation (here ``profiles``; ``calibrate`` runs torch) keeps the
    environment as it was."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", PARSERS], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True)
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "False"
    assert lines[-1] == "None"


SAVING = """
import sys

import pytest
from simulator.cli.main import main
sys.argv = ["fleetsim", "run", "scenarios/quickstart.yaml", *sys.argv[2:], "--out", sys.argv[1],
            "--set", "workload.num_requests=10"]
code = main()
print(__import__("json").dumps([code, sorted(sys.modules)]))
"""


@pytest.mark.parametrize("flags", [["--no-report"], []], ids=["tables", "tables-and-report"])
def test_saving_a_run_needs_neither_pandas_nor_plotly(tmp_path: Path, flags: list[str]) -> None:
    """The tables are written through Arrow and the report's figures as plotly.js JSON: pandas' import
    (~0.2 s) and plotly's figure objects (~0.25 s for a report) would be most of a small run's time."""
    done = subprocess.run([sys.executable, "-c", SAVING, str(tmp_path / "run"), *flags], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    code, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0
    written = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"requests.parquet", "series.parquet", "summary.json"} <= written
    assert ("report.html" in written) == (not flags)
    loaded = set(modules)
    assert "pyarrow" in loaded
    avoidable = {"pandas", "plotly", "numpy.ma"} & loaded  # numpy.ma: np.unique's and np.percentile's first call
    assert not avoidable, f"saving imported {sorted(avoidable)}"
