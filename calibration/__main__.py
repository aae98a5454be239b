"""``python -m calibration COMMAND ...``: ``fleetsim`` with the calibration commands (calibrate, validate, serve,
bench) from a checkout that was never installed, such as the bare copy a lent GPU runs: ``fleetsim`` finds
them through the installed distribution's entry point, which such a copy lacks. Installed, the two agree."""

from __future__ import annotations

import sys

from calibration.cli import register
from simulator.cli.main import main

if __name__ == "__main__":
    sys.exit(main(plugins=(register,)))
