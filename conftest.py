"""Suite-wide settings: every simulation run in the tests (in this process or a ``fleetsim`` subprocess)
checks its invariants when it ends (``simulator.results.invariants``)."""

from __future__ import annotations

import os

os.environ.setdefault("FLEETSIM_CHECK", "1")
