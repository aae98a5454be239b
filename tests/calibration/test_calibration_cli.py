"""``fleetsim calibrate`` / ``validate`` without PyTorch: one line naming the extra, exit 2, no traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from simulator.cli.main import EXIT_USAGE, main


@pytest.mark.parametrize("argv", [["calibrate", "--model", "tiny", "--out", "P.yaml"],
                                  ["validate", "--profile", "cpu-small-tp1-measured"]])
def test_without_torch_the_command_says_which_extra(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "torch" else real(name, *args)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e '.[engine]'" in err
    assert list(tmp_path.iterdir()) == []
