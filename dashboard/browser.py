"""Serve the dashboard on localhost and drive it with headless Chromium (Playwright).

Used by the real-browser test and to refresh the screenshots in ``docs/``:

    python -m dashboard.browser docs/        # writes docs/dashboard-{whatif,compare,calibration,traces}.png

Chromium comes from the system (Debian's ``chromium`` package); Playwright's own browser download is not
needed. Nothing here is imported by the pages.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

APP = Path(__file__).resolve().parent / "app.py"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PAGES: dict[str, str] = {"whatif": "", "compare": "compare", "calibration": "calibration", "traces": "traces"}
"""Screenshot name -> URL path of the page (st.Page derives it from the file name; What-if is the default)."""
RUN_BUTTONS: dict[str, str] = {"whatif": "Run simulation", "compare": "Run comparison"}
PLOT = ".js-plotly-plot"
"""A rendered plotly chart."""


def find_chromium() -> str | None:
    """The system Chromium, or None."""
    env = os.environ.get("FLEETSIM_CHROMIUM")
    for candidate in (env, *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def serve(port: int | None = None, *, timeout_s: float = 60.0, log: Path | None = None) -> Iterator[str]:
    """Run ``streamlit run dashboard/app.py`` headless on localhost; yield its URL; stop it afterwards."""
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
        "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
    ]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=APP.parent.parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"streamlit exited with status {process.returncode} (log: {log})")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"streamlit did not answer on {url} within {timeout_s:.0f} s (log: {log})")
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log is not None and hasattr(out, "close"):
            out.close()


@contextlib.contextmanager
def browser_page(chromium: str, *, width: int = 1600, height: int = 1200) -> Iterator[Any]:
    """A Playwright page in headless system Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            yield context.new_page()
        finally:
            browser.close()


def open_page(page: Any, url: str, name: str, *, timeout_ms: int = 90_000) -> int:
    """Open one dashboard page, press its run button if it has one, wait for its plots; the plot count."""
    page.goto(f"{url}/{PAGES[name]}", wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stSidebar"]', timeout=timeout_ms)
    button = RUN_BUTTONS.get(name)
    if button is not None:
        page.get_by_role("button", name=button).click(timeout=timeout_ms)
    page.wait_for_selector(PLOT, timeout=timeout_ms)
    # Let the remaining charts of the run draw and the script finish before counting.
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=timeout_ms)
    page.wait_for_timeout(1500)
    count: int = page.locator(PLOT).count()
    return count


def screenshot_all(out_dir: Path, chromium: str) -> list[Path]:
    """One full-page PNG per dashboard page in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with serve(log=out_dir / ".streamlit.log") as url, browser_page(chromium, height=2000) as page:
        for name in PAGES:
            open_page(page, url, name)
            path = out_dir / f"dashboard-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            written.append(path)
    (out_dir / ".streamlit.log").unlink(missing_ok=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot every dashboard page with headless Chromium.")
    parser.add_argument("out_dir", type=Path, nargs="?", default=Path("docs"))
    args = parser.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("no Chromium found (apt-get install chromium, or set FLEETSIM_CHROMIUM)", file=sys.stderr)
        return 2
    for path in screenshot_all(args.out_dir, chromium):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
