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

    monkeypatch.setattr(cli_dashboard, "run_until_stopped", call)
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
    monkeypatch.setattr(cli_dashboard, "run_until_stopped", lambda cmd: calls.append(cmd) or 0)
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


STOPPABLE = """
import sys, time
from pathlib import Path
from simulator.cli import dashboard
pid_file = Path(sys.argv[1])
write_pid = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
sleeper = [sys.executable, "-c", write_pid]
sys.exit(dashboard.run_until_stopped(sleeper))
"""


def test_sigterm_to_the_dashboard_command_stops_streamlit_too(tmp_path: Path) -> None:
    """``kill <fleetsim dashboard>`` must not leave the server it started running."""
    import os
    import signal
    import time

    pid_file = tmp_path / "server.pid"
    parent = subprocess.Popen([sys.executable, "-c", STOPPABLE, str(pid_file)])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        server = int(pid_file.read_text())
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 0  # stopped as asked: not an error
    finally:
        parent.kill()
    time.sleep(0.2)
    try:
        os.kill(server, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "the server outlived the dashboard command"
