"""``fleetsim dashboard``: the subcommand finds dashboard/app.py by path and never imports the dashboard."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import dashboard as cli_dashboard


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetsim")
    cli_dashboard.register(p.add_subparsers(dest="command", required=True))
    return p


def test_app_is_found_by_path() -> None:
    assert cli_dashboard.app_path() == Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    assert cli_dashboard.app_path().is_file()


def test_subcommand_runs_streamlit_on_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def call(cmd: list[str]) -> int:
        calls.append(cmd)
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    args = parser().parse_args(["dashboard", "--port", "8600", "--headless"])
    assert args.func(args) == 0
    (cmd,) = calls
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert cmd[4] == str(cli_dashboard.app_path())
    assert cmd[cmd.index("--server.port") + 1] == "8600"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    args = parser().parse_args(["dashboard"])
    assert args.port is None and "--server.port" not in cli_dashboard.command(args.port)


def test_dashboard_listens_on_loopback_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    for argv, host in ((["dashboard"], "127.0.0.1"), (["dashboard", "--host", "0.0.0.0"], "0.0.0.0")):
        args = parser().parse_args(argv)
        assert args.func(args) == 0
        cmd = calls.pop()
        assert cmd[cmd.index("--server.address") + 1] == host


def test_simulator_never_imports_the_dashboard() -> None:
    code = (
        "import sys, simulator.cli.main, simulator.cli.dashboard, simulator.fleet.fleet, simulator.results.report; "
        "print(sorted(m for m in sys.modules if m == 'dashboard' or m.startswith('dashboard.') "
        "or m == 'streamlit' or m.startswith('streamlit.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
