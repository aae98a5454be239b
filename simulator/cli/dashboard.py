"""``fleetsim dashboard``: start the Streamlit dashboard (``dashboard/app.py``) in a subprocess.

The simulator never imports the dashboard package: the app is found by path beside the ``simulator``
package, and Streamlit is only needed when this command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
from pathlib import Path

from simulator.errors import ConfigError


def app_path() -> Path:
    """Where the dashboard's router lives: ``<repo>/dashboard/app.py``."""
    import simulator

    return Path(simulator.__file__).resolve().parent.parent / "dashboard" / "app.py"


DEFAULT_HOST = "127.0.0.1"
"""The dashboard runs simulations and reads files for whoever reaches it: loopback only unless asked."""


def command(port: int | None = None, *, headless: bool = False, host: str = DEFAULT_HOST) -> list[str]:
    """The ``streamlit run`` command line (the current interpreter's Streamlit), listening on ``host``."""
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_path()), "--server.address", host]
    if port is not None:
        cmd += ["--server.port", str(port)]
    if headless:
        cmd += ["--server.headless", "true"]
    cmd += ["--browser.gatherUsageStats", "false"]
    return cmd


def cmd_dashboard(args: argparse.Namespace) -> int:
    if not app_path().is_file():
        raise ConfigError(f"dashboard not found at {app_path()} (it ships with the source checkout)")
    if importlib.util.find_spec("streamlit") is None:
        raise ConfigError("the dashboard needs Streamlit: pip install 'fleetsim[dashboard]'")
    return run_until_stopped(command(args.port, headless=args.headless, host=args.host))


def run_until_stopped(cmd: list[str]) -> int:
    """Run ``cmd`` (Streamlit) as our child; SIGTERM or SIGHUP to us stops it too, and Ctrl-C (which the
    terminal sends to both) is the user quitting: exit 0 either way, never an orphaned server."""
    stopped: list[int] = []
    children: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        for started in children:
            started.terminate()

    # Handlers first: a signal that arrives while the child starts still reaches it.
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        child = subprocess.Popen(cmd)
        children.append(child)
        if stopped:
            child.terminate()
        try:
            code = child.wait()
            return 0 if stopped else code
        except KeyboardInterrupt:
            child.terminate()
            return 0
        finally:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fleetsim dashboard [--host H] [--port N] [--headless]``."""
    p = subparsers.add_parser("dashboard", help="open the what-if dashboard in the browser (Streamlit)")
    p.add_argument("--port", type=int, default=None, help="port to serve on (default: Streamlit's, 8501)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0: every interface)")
    p.add_argument("--headless", action="store_true", help="do not open a browser window")
    p.set_defaults(func=cmd_dashboard)
