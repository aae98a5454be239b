"""What the dashboard pages compute: scenarios from control values, runs, and tables for display.

Plain functions over plain data, importable and testable without a running Streamlit. The few cached
wrappers (``st.cache_data``) only memoise a plain function of the same name without the ``cached_``
prefix. Every user mistake surfaces as one ``ConfigError`` — the same text the CLI prints — raised by the
simulator's own strict loader; nothing here validates a scenario a second way.

One module per concept: ``scenario_base`` (where a page's scenario comes from, and its YAML),
``choices`` (what the controls offer), ``what_if`` (the What-if controls <-> a scenario),
``comparison`` (the Compare page's variants), ``runs`` (validating, running and caching), ``results``
(verdicts and tables of a run), ``profiles`` (the Calibration page's data) and ``trace_files`` (trace
files and the Trace explorer's data).

Nothing in this package renders (no ``st.`` call besides the cache decorators).
"""
