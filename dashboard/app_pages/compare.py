"""Compare: two to four variants of one scenario, side by side on the identical request stream."""

from __future__ import annotations

import math
from typing import Any

import streamlit as st

from dashboard import widgets
from dashboard.data import choices, comparison, results, scenario_base, what_if

P = "cmp_"  # widget key prefix of this page


def _key(i: int, name: str) -> str:
    return f"v{i}_{name}"


def _as_base(value: str) -> str:
    return "as the base" if value == choices.DEFAULT else value


st.title("Compare")
st.caption("Every variant replays the same requests (same seed, arrivals and lengths); only what it overrides "
           "differs. Deltas are against the first variant.")

with st.sidebar:
    base = widgets.pick_base(P)
if base is None:
    st.stop()

own = comparison.default_variants(base.raw)
padding = [comparison.VariantControls(name=f"variant {i + 1}") for i in range(len(own), comparison.MAX_VARIANTS)]
variant_defaults = own + padding
names = ["num_variants", "num_requests",
         *(_key(i, f) for i in range(comparison.MAX_VARIANTS) for f in comparison.VARIANT_FIELDS)]
defaults: dict[str, Any] = {
    "num_variants": max(2, len(own)),
    "num_requests": what_if.controls_from_raw(base.raw).num_requests,
}
for i, variant in enumerate(variant_defaults):
    for f in comparison.VARIANT_FIELDS:
        defaults[_key(i, f)] = getattr(variant, f)
widgets.sync_values(P, base, defaults, names)

with st.sidebar:
    st.number_input("Variants", min_value=2, max_value=comparison.MAX_VARIANTS, step=1, key=f"{P}num_variants")
    st.number_input("Requests", min_value=1, step=100, key=f"{P}num_requests",
                    help=f"Capped at {what_if.DEFAULT_MAX_REQUESTS} by default so a run takes seconds")

count = int(st.session_state[f"{P}num_variants"])
hw_options = choices.hardware_names()
last = st.session_state.get(f"{P}last")
columns = st.expander("Variants", expanded=last is None).columns(count)
for i, column in enumerate(columns):
    with column:
        st.text_input("Name", key=f"{P}{_key(i, 'name')}")
        st.selectbox("Preset", choices.PRESET_CHOICES, key=f"{P}{_key(i, 'preset')}",
                     format_func=_as_base)
        st.selectbox("Batching", choices.BATCHING_CHOICES, key=f"{P}{_key(i, 'batching')}",
                     format_func=_as_base)
        st.selectbox("KV policy", choices.KV_POLICY_CHOICES, key=f"{P}{_key(i, 'kv_policy')}",
                     format_func=_as_base)
        st.selectbox("Prefix caching", choices.PREFIX_CHOICES, key=f"{P}{_key(i, 'prefix_caching')}",
                     format_func=_as_base)
        st.number_input("Token budget per step", min_value=1, step=512, value=None,
                        key=f"{P}{_key(i, 'max_num_batched_tokens')}", placeholder="as the base")
        st.number_input("Replicas", min_value=1, step=1, value=None, key=f"{P}{_key(i, 'replicas')}",
                        placeholder="as the base")
        st.selectbox("Hardware", [choices.DEFAULT, *hw_options], key=f"{P}{_key(i, 'hardware')}",
                     format_func=_as_base)
        st.selectbox("Router", [choices.DEFAULT, *choices.ROUTER_CHOICES], key=f"{P}{_key(i, 'router')}",
                     format_func=_as_base)
        if i < len(own) and own[i].other:
            st.caption("Also overrides: " + ", ".join(f"`{k}={v}`" for k, v in own[i].other))

values = widgets.read_values(P, names)
variants = [
    comparison.VariantControls(other=variant_defaults[i].other,
                               **{f: values[_key(i, f)] for f in comparison.VARIANT_FIELDS})
    for i in range(count)
]

chosen: scenario_base.Base = base  # narrowed above; the lambda below reads it later
raw, run_raw, result = widgets.run_panel(
    lambda: comparison.compare_raw(chosen.raw, variants, int(values["num_requests"])), base, prefix=P,
    run_label="Run comparison", export_suffix="-compare", hint="Set up the variants, then press **Run comparison**.")
widgets.analytic_note(result)

summaries = {name: v.summary for name, v in result.variants.items()}
baseline = next(iter(summaries.values()))
for column, (name, summary) in zip(st.columns(len(summaries)), summaries.items(), strict=True):
    with column:
        st.subheader(name)
        verdict = results.slo_verdict(summary, run_raw)
        if verdict.met is not None:
            (st.success if verdict.met else st.error)("SLO met" if verdict.met else "SLO missed")
        for attr, label in (("ttft_p99_ms", "TTFT p99 (ms)"), ("tpot_p99_ms", "TPOT p99 (ms)"),
                            ("throughput_tok_s", "output tok/s"), ("cost_per_mtok_usd", "$ / M output tokens")):
            value, delta = results.metric_delta(attr, baseline, summary)
            st.metric(label, value, delta, delta_color="inverse" if results.lower_is_better(attr) else "normal")

st.subheader("Deltas")
table = results.delta_table(result)
st.dataframe(table.style.format(lambda v: "—" if isinstance(v, float) and math.isnan(v) else f"{v:,.4g}"))
widgets.plots(result, key=f"{P}plot")
with st.expander("Summary table"):
    st.dataframe(results.summary_table(result))
