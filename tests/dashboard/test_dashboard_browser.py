"""One real-browser check: the app served on localhost, headless Chromium runs the default What-if and
finds its plots. Skips only when Chromium or Playwright is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("streamlit")

from dashboard import browser

CHROMIUM = browser.find_chromium()
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="playwright is not installed (pip install playwright)"),
    pytest.mark.skipif(CHROMIUM is None,
                       reason="no Chromium at /usr/bin/chromium (apt-get install chromium, or set FLEETSIM_CHROMIUM)"),
]


def test_default_whatif_run_draws_plots_in_a_real_browser(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    with browser.serve(log=tmp_path / "streamlit.log") as url, browser.browser_page(CHROMIUM) as page:
        num_plots = browser.open_page(page, url, "whatif")
        shot = tmp_path / "dashboard-whatif.png"
        page.screenshot(path=str(shot))
        text = page.locator('[data-testid="stMain"]').inner_text()
        assert page.locator('[data-testid="stException"]').count() == 0
    assert num_plots >= 7
    assert "TTFT CDF" in text and "SLO met" in text
    assert shot.stat().st_size > 10_000
