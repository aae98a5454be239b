"""The Streamlit what-if dashboard: ``app.py`` routes, ``app_pages/`` render, ``data/`` computes.

Nothing in ``simulator`` imports this package; ``fleetsim dashboard`` starts it by path.
"""
