"""fleetsim dashboard: the router. Run with ``fleetsim dashboard`` or ``streamlit run dashboard/app.py``.

Each page lives in ``app_pages/`` and only renders; what the pages compute lives in ``dashboard/data/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

# `streamlit run dashboard/app.py` puts dashboard/ on sys.path, not the repository: make `import dashboard`
# and `import simulator` work from a plain checkout too (an installed fleetsim needs nothing).
_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

_PAGES = Path(__file__).resolve().parent / "app_pages"

st.set_page_config(page_title="fleetsim", page_icon=":material/dns:", layout="wide")
navigation = st.navigation(
    [
        st.Page(_PAGES / "whatif.py", title="What-if", icon=":material/tune:", default=True),
        st.Page(_PAGES / "compare.py", title="Compare", icon=":material/compare_arrows:"),
        st.Page(_PAGES / "calibration.py", title="Calibration", icon=":material/straighten:"),
        st.Page(_PAGES / "traces.py", title="Trace explorer", icon=":material/timeline:"),
    ]
)
navigation.run()
