"""The shipped notebook executes top to bottom on the project's own interpreter and prints its answer.

(In tests/notebooks/, not tests/: a test module directly in tests/ puts tests/ on sys.path, where
tests/simulator would shadow the simulator package under pytest's default import mode.)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from simulator.workload.traces import traces_dir

nbformat = pytest.importorskip("nbformat", reason="nbformat is a dev dependency")
nbclient = pytest.importorskip("nbclient", reason="nbclient is a dev dependency")
pytest.importorskip("ipykernel", reason="ipykernel is a dev dependency")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "capacity_planning.ipynb"
KERNEL = "fleetsim-test"


@pytest.mark.skipif(not traces_dir().is_dir(), reason="shared traces not found (set FLEETSIM_TRACES)")
def test_capacity_planning_notebook_answers_its_question(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel spec for *this* interpreter, found first on JUPYTER_PATH: a fresh CI venv needs no
    # `ipykernel install`, and a system-wide "python3" kernel of another Python is never picked up.
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fleetsim (test)",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    text = "\n".join(
        output.get("text", "") if output.get("output_type") == "stream" else str(output.get("data", {}))
        for cell in nb.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    )
    match = re.search(r"Answer: (\d+) H200 replica\(s\) .* at ([0-9.]+) \$ per million output tokens", text)
    assert match, text[-2000:]
    assert int(match.group(1)) >= 1 and float(match.group(2)) > 0
