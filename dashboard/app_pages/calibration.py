"""Calibration: a cost-model profile's curves, its measured points (when shipped), error and provenance."""

from __future__ import annotations

import streamlit as st

from dashboard import figures, widgets
from dashboard.data import profiles
from simulator.cost.profile import list_profiles
from simulator.errors import ConfigError

st.title("Calibration")

DEFAULT_CONTEXTS = "512, 2048, 8192"
DEFAULT_PREFIXES = "0, 4096"

names = list_profiles()
if not names:
    st.error("No shipped profiles found in calibration/profiles/.")
    st.stop()

with st.sidebar:
    name = st.selectbox("Profile", names, index=profiles.default_profile_index(names), key="cal_profile")
    contexts_text = st.text_input("Decode contexts (tokens)", DEFAULT_CONTEXTS, key="cal_contexts",
                                  help="One decode curve per context length, comma-separated")
    prefixes_text = st.text_input("Prefill cached prefixes (tokens)", DEFAULT_PREFIXES, key="cal_prefixes",
                                  help="One prefill curve per cached-prefix length, comma-separated")

try:
    profile = profiles.cached_profile(name)
    contexts = profiles.parse_int_list(contexts_text, field="decode contexts")
    prefixes = profiles.parse_int_list(prefixes_text, field="prefill prefixes", minimum=0)
    csv_path = profiles.timings_path(name)
    points = profiles.measured_points(profile, csv_path) if csv_path is not None else None
except ConfigError as err:
    widgets.show_error(err)
    st.stop()

st.subheader(profile.label)
if not profile.is_measured:
    carried = f" Efficiency factors are carried over from {profile.derived_from}." if profile.derived_from else ""
    st.warning(
        f"**Analytic profile, not measured.** {profile.name} comes from datasheet figures and assumed "
        f"efficiencies, never from timings on a real engine.{carried} Treat every latency and cost it "
        "predicts as an estimate.",
        icon=":material/warning:",
    )
elif profile.fit_error is not None:
    st.success(f"Measured on {profile.provenance.device_name}: held-out MAPE "
               f"{100 * profile.fit_error.mape:.2f} %, max error {100 * profile.fit_error.max_error:.2f} %.")

if points is None:
    st.caption("No raw timings ship with this profile: the curves below are the cost model alone."
               if profile.is_measured else "Curves of the cost model (no measured points exist).")
else:
    st.caption(f"Measured points from {csv_path.name if csv_path else ''} ({len(points)} grid points); the curves "
               "are drawn where most points are until other contexts or prefixes are typed in the sidebar.")
    # Draw the curves where most points are, so each point sits on (or beside) its curve; values the user typed
    # win.
    if contexts_text == DEFAULT_CONTEXTS:
        contexts = profiles.common_values(points["context"]) or contexts
    if prefixes_text == DEFAULT_PREFIXES:
        prefixes = profiles.common_values(points["prefix"]) or prefixes

left, right = st.columns(2)
with left:
    st.plotly_chart(
        figures.step_time_figure(profiles.decode_curves(profile, contexts), points, x="batch", group="context",
                                 title="Decode step time vs batch", xaxis="sequences in the step",
                                 group_label="context"),
        key="cal_decode",
    )
with right:
    st.plotly_chart(
        figures.step_time_figure(profiles.prefill_curves(profile, prefixes), points, x="chunk", group="prefix",
                                 title="Prefill step time vs chunk", xaxis="prefill chunk (tokens)",
                                 group_label="prefix"),
        key="cal_prefill",
    )
if points is not None:
    st.plotly_chart(figures.measured_vs_predicted_figure(points), key="cal_scatter")

st.subheader("Error and provenance")
st.dataframe(profiles.profile_facts(profile))
with st.expander("How the numbers were obtained"):
    st.write(profile.provenance.source)
with st.expander("Coefficients"):
    st.json(profile.model_dump(mode="json", include={"device_s", "host_s", "comm", "memory", "overlap_host"}))
