"""Trace explorer: a real trace's arrival rate over time and its length distributions."""

from __future__ import annotations

import streamlit as st

from dashboard import figures, widgets
from dashboard.data import trace_files
from simulator.errors import ConfigError
from simulator.workload.trace_sources import trace_folders
from simulator.workload.traces import TraceFormat

st.title("Trace explorer")

files = trace_files.list_traces()
if not files:
    st.error(f"No trace files found in {' or '.join(str(f) for f in trace_folders())}: `fleetsim traces` lists the "
             "public traces and `fleetsim traces --download all` fetches them.")
    st.stop()

with st.sidebar:
    filename = st.selectbox("Trace", files, key="tr_file")
    guessed = trace_files.guess_trace_format(filename)
    choice = st.selectbox("Format", [trace_files.AUTO_FORMAT, *(f.value for f in TraceFormat)], key="tr_format",
                          format_func=lambda v: f"auto ({guessed.value if guessed else '?'})"
                          if v == trace_files.AUTO_FORMAT else v, help="auto = from the file name")
    fmt = (guessed.value if guessed else None) if choice == trace_files.AUTO_FORMAT else choice
    time_scale = st.number_input("Time scale", min_value=0.001, value=1.0, step=0.1, format="%.3f", key="tr_scale",
                                 help="Multiplies every arrival time, as workload.trace.time_scale does")
    bin_s = st.number_input("Rate bin (s)", min_value=0.1, value=60.0, step=10.0, key="tr_bin")

try:
    frame = trace_files.cached_trace_frame(filename, fmt)
    rate = trace_files.arrival_rate(frame, bin_s, time_scale)
    stats = trace_files.trace_stats(frame, time_scale)
except ConfigError as err:
    widgets.show_error(err)
    st.stop()

st.caption(f"{trace_files.trace_path(filename)} · format {fmt or guessed}")
left, right = st.columns(2)
with left:
    if rate.empty:
        st.info("This trace has no timestamps (lengths only): a scenario gives it an arrival process.")
    else:
        st.plotly_chart(figures.rate_figure(rate, f"Arrival rate ({bin_s:g} s bins)"), key="tr_rate")
with right:
    st.plotly_chart(figures.length_figure(frame), key="tr_lengths")
st.dataframe(stats)
