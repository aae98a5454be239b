"""What-if: change the load, the fleet, the engine or the router of one scenario and see what happens."""

from __future__ import annotations

import streamlit as st

from dashboard import widgets
from dashboard.data import choices, results, scenario_base, trace_files, what_if

P = "wi_"  # widget key prefix of this page

st.title("What-if")

with st.sidebar:
    base = widgets.pick_base(P)
if base is None:
    st.stop()

defaults = {name: getattr(what_if.controls_from_raw(base.raw), name) for name in what_if.CONTROL_FIELDS}
widgets.sync_values(P, base, defaults, what_if.CONTROL_FIELDS)
values = widgets.read_values(P, what_if.CONTROL_FIELDS)

with st.sidebar:
    st.subheader("Load")
    st.radio("Requests from", ["synthetic", "trace"], key=f"{P}load_source", horizontal=True,
             format_func=lambda v: "arrival process" if v == "synthetic" else "trace replay")
    source = st.session_state[f"{P}load_source"]
    is_vidur = False
    if source == "trace":
        traces = trace_files.list_traces()
        current = st.session_state.get(f"{P}trace_file")
        options = traces + ([current] if current and current not in traces else [])
        if st.session_state.get(f"{P}trace_file") not in options:
            st.session_state[f"{P}trace_file"] = options[0] if options else None
        st.selectbox("Trace", options, key=f"{P}trace_file",
                     help="The public traces found here (`fleetsim traces` lists them and fetches the missing ones)")
        trace_file = st.session_state.get(f"{P}trace_file") or ""
        is_vidur = trace_files.guess_trace_format(trace_file) is trace_files.TraceFormat.VIDUR
        if is_vidur:
            st.caption("A length-only trace: arrivals are Poisson at the rate below.")
        else:
            st.number_input("Time scale", min_value=0.001, step=0.1, format="%.3f", key=f"{P}time_scale",
                            help="Multiplies every arrival time: 0.5 doubles the load")
    if source == "synthetic" or (source == "trace" and is_vidur):
        no_rate = values.get("rate_rps") is None and source == "synthetic"
        st.number_input("Arrival rate (requests/s)", min_value=0.01, step=1.0, value=None, key=f"{P}rate_rps",
                        disabled=no_rate,
                        help="The scenario's arrival curve sets its own rates" if no_rate else None)
    st.number_input("Requests", min_value=1, step=100, key=f"{P}num_requests",
                    help=f"Capped at {what_if.DEFAULT_MAX_REQUESTS} by default so a run takes seconds")

    st.subheader("Fleet")
    st.number_input("Replicas", min_value=1, step=1, key=f"{P}replicas")
    hw_options = choices.hardware_names()
    st.selectbox("Hardware", hw_options + [h for h in [values["hardware"]] if h not in hw_options],
                 key=f"{P}hardware")
    models = choices.model_names()
    st.selectbox("Model", models + [m for m in [values["model"]] if m not in models], key=f"{P}model")
    st.selectbox("Tensor parallel (GPUs per replica)", choices.tp_choices(), key=f"{P}tp")
    profiles = choices.profile_choices()
    st.selectbox("Cost-model profile", profiles + [p for p in [values["profile"]] if p not in profiles],
                 key=f"{P}profile", help="auto = the shipped profile for this hardware, model and tp")

    st.subheader("Engine")
    st.selectbox("Preset", choices.PRESET_CHOICES, key=f"{P}preset", help="Start from an engine's own defaults")
    st.selectbox("Batching", choices.BATCHING_CHOICES, key=f"{P}batching")
    st.number_input("Token budget per step", min_value=1, step=512, value=None, key=f"{P}max_num_batched_tokens",
                    placeholder="preset default", help="max_num_batched_tokens")
    st.selectbox("KV policy", choices.KV_POLICY_CHOICES, key=f"{P}kv_policy")
    st.number_input("KV block size (tokens)", min_value=1, step=1, value=None, key=f"{P}block_size",
                    placeholder="preset default", help="A power of two")
    st.selectbox("Prefix caching", choices.PREFIX_CHOICES, key=f"{P}prefix_caching")

    st.subheader("Router and SLO")
    st.selectbox("Router", choices.ROUTER_CHOICES, key=f"{P}router")
    st.number_input("TTFT target (ms)", min_value=0.001, step=50.0, value=None, key=f"{P}ttft_ms",
                    placeholder="none")
    st.number_input("TPOT target (ms)", min_value=0.001, step=5.0, value=None, key=f"{P}tpot_ms", placeholder="none")
    st.slider("Target attainment", 0.0, 1.0, step=0.01, key=f"{P}target_attainment")

values = widgets.read_values(P, what_if.CONTROL_FIELDS)
description = str(base.raw.get("description") or "").strip()
if description:
    st.caption(description)
if base.raw.get("variants"):
    st.caption(f"This scenario also defines variants ({', '.join(base.raw['variants'])}); the Compare page runs them.")

chosen: scenario_base.Base = base  # narrowed above; the lambda below reads it later
raw, run_raw, result = widgets.run_panel(
    lambda: what_if.apply_controls(chosen.raw, what_if.Controls(**values)), base, prefix=P, run_label="Run simulation",
    export_suffix="", hint="Set the controls in the sidebar, then press **Run simulation**.")
summary = next(iter(result.variants.values())).summary
verdict = results.slo_verdict(summary, run_raw)
if verdict.met is None:
    st.info(verdict.text)
elif verdict.met:
    st.success(verdict.text, icon=":material/check_circle:")
else:
    st.error(verdict.text, icon=":material/cancel:")
widgets.analytic_note(result)

columns = st.columns(6)
for column, attr, label in zip(
    columns,
    ("ttft_p50_ms", "ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms", "throughput_tok_s", "cost_per_mtok_usd"),
    ("TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p99 (ms)", "E2E p99 (ms)", "output tok/s", "$ / M output tokens"),
    strict=True,
):
    value, _ = results.metric_delta(attr, summary, summary)
    column.metric(label, value)

widgets.plots(result, key=f"{P}plot")
with st.expander("Summary table"):
    st.dataframe(results.summary_table(result))
st.download_button("Download per-request table (CSV)", result.requests_df().to_csv(index=False),
                   file_name="requests.csv", mime="text/csv", key=f"{P}requests_csv")
