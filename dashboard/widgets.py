"""Rendering pieces shared by the pages: the "Start from" picker, control state, errors, run output.

Only renders and keeps widget state; every value shown is computed in ``dashboard.data``.

Widget state: Streamlit forgets a widget's value when a run does not draw it (another page, a hidden
control). Each page keeps its control values in a plain session entry (``<prefix>values``) and puts a value
back into a widget's key before drawing it, so leaving a page or hiding a control loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import streamlit as st

from dashboard.data import runs, scenario_base
from simulator.errors import ConfigError
from simulator.results.report import build_figures
from simulator.results.run_result import RunResult


def show_error(err: ConfigError) -> None:
    """A user mistake, as the CLI prints it (without the ``fleetsim: error:`` prefix)."""
    st.error(str(err), icon=":material/error:")


def pick_base(prefix: str, *, container: Any = st) -> scenario_base.Base | None:
    """The "Start from" selectbox (shipped scenarios, from scratch, upload); None until there is one."""
    options = [*scenario_base.list_scenarios(), scenario_base.FROM_SCRATCH, scenario_base.UPLOAD]
    key = f"{prefix}source"
    if st.session_state.get(key) not in options:
        default = scenario_base.DEFAULT_SCENARIO if scenario_base.DEFAULT_SCENARIO in options else options[0]
        st.session_state[key] = st.session_state.get(f"{prefix}source_kept", default)
    choice = container.selectbox("Start from", options, key=key,
                                 help="A shipped scenario (scenarios/*.yaml), the built-in default, or your own file")
    st.session_state[f"{prefix}source_kept"] = choice
    if choice != scenario_base.UPLOAD:
        try:
            return scenario_base.base_for(choice)
        except ConfigError as err:
            show_error(err)
            return None
    upload = container.file_uploader("Scenario YAML", type=["yaml", "yml"], key=f"{prefix}upload",
                                     help="Read by the same strict loader as `fleetsim run`")
    if upload is None:
        kept = st.session_state.get(f"{prefix}uploaded_base")
        if kept is None:
            container.info("Upload a scenario YAML file to start from it.")
        return kept  # type: ignore[no-any-return]
    try:
        base = scenario_base.uploaded_base(upload.name, upload.getvalue())
    except ConfigError as err:
        show_error(err)
        return None
    st.session_state[f"{prefix}uploaded_base"] = base
    return base


def sync_values(prefix: str, base: scenario_base.Base, defaults: Mapping[str, Any], names: Iterable[str]) -> None:
    """Put each control's value into its widget key before the widgets are drawn.

    A new starting point resets every control to ``defaults``; otherwise a widget key Streamlit dropped
    gets back the value it last had."""
    store_key = f"{prefix}values"
    if st.session_state.get(f"{prefix}base_key") != base.key:
        st.session_state[f"{prefix}base_key"] = base.key
        st.session_state[store_key] = dict(defaults)
        for name in names:
            st.session_state[f"{prefix}{name}"] = defaults[name]
        return
    store: dict[str, Any] = st.session_state.setdefault(store_key, dict(defaults))
    for name in names:
        if f"{prefix}{name}" not in st.session_state:
            st.session_state[f"{prefix}{name}"] = store.get(name, defaults.get(name))


def read_values(prefix: str, names: Iterable[str]) -> dict[str, Any]:
    """The controls' current values (widgets drawn this run, else the stored ones); stored for next time."""
    store: dict[str, Any] = st.session_state.setdefault(f"{prefix}values", {})
    for name in names:
        key = f"{prefix}{name}"
        if key in st.session_state:
            store[name] = st.session_state[key]
    return dict(store)


def run_with_progress(raw: dict[str, Any], source: Any) -> RunResult | None:
    """Run a scenario behind a progress bar; a ConfigError is shown, not raised."""
    bar = st.progress(0.0, text="starting…")
    shown = [0.0]

    def progress(fraction: float, text: str) -> None:
        if fraction - shown[0] >= 0.05 or fraction >= 1.0:  # each update is a message to the browser
            shown[0] = fraction
            bar.progress(fraction, text=text)

    try:
        result = runs.cached_simulate(scenario_base.raw_key(raw), str(source) if source else None, progress)
    except ConfigError as err:
        bar.empty()
        show_error(err)
        return None
    bar.empty()
    return result


def analytic_note(result: RunResult) -> None:
    if result.fitted_published:
        labels = sorted({v.profile.label or v.profile.name for v in result.variants.values()
                         if v.profile.kind == "fitted-published"})
        st.info(f"Cost model fitted to published GPU measurements: {', '.join(labels)}. Operator and collective "
                "timings were measured by others and composed into steps by stated rules (see the profile's "
                "provenance); not timed on this engine.", icon=":material/info:")
    if result.analytic:
        names = sorted({v.profile.name for v in result.variants.values() if v.profile.kind == "analytic"})
        st.warning(f"Cost model analytic, not measured: step times for {', '.join(names)} come from datasheet "
                   "figures, not from timings on a real engine. Read latencies and costs as estimates.",
                   icon=":material/warning:")


def plots(result: RunResult, key: str) -> None:
    """The report's plots: latency CDFs, throughput and queue over time, KV use per replica."""
    figures = build_figures(result)
    order = ["ttft-cdf", "tpot-cdf", "e2e-cdf", "throughput", "queue",
             *(k for k in figures if k.startswith("kv-util-")), "prefix-hit"]
    for i in range(0, len(order), 2):
        columns = st.columns(2)
        for column, name in zip(columns, order[i : i + 2], strict=False):
            with column:
                st.plotly_chart(figures[name], key=f"{key}-{name}", config={"displaylogo": False})


def run_panel(build: Callable[[], dict[str, Any]], base: scenario_base.Base, *, prefix: str, run_label: str,
              export_suffix: str, hint: str) -> tuple[dict[str, Any] | None, dict[str, Any], RunResult]:
    """Validate the settings ``build`` makes (an error shows in the page and disables the buttons), offer
    Run and Export, run with a progress bar, and return (current settings or None, the settings of the
    shown run, its result). Stops the page with ``hint`` until a first run exists."""
    raw: dict[str, Any] | None = None
    try:
        raw = build()
        runs.validate(raw, base.source)
    except ConfigError as err:
        show_error(err)
        raw_ok = False
    else:
        raw_ok = True
    left, right = st.columns([1, 1])
    run_clicked = left.button(run_label, type="primary", key=f"{prefix}run", disabled=not raw_ok)
    right.download_button("Export settings as YAML", scenario_base.to_yaml(raw) if raw is not None else "",
                          file_name=f"{(raw or base.raw).get('name', 'scenario')}{export_suffix}.yaml",
                          mime="application/x-yaml", key=f"{prefix}export", disabled=not raw_ok)
    if run_clicked and raw is not None:
        result = run_with_progress(raw, base.source)
        if result is not None:
            st.session_state[f"{prefix}last"] = (scenario_base.raw_key(raw), raw, result)
    last = st.session_state.get(f"{prefix}last")
    if last is None:
        st.info(hint)
        st.stop()
    key, run_raw, result = last
    if raw is not None and key != scenario_base.raw_key(raw):
        st.info(f"The settings changed since this run: press **{run_label}** to update it.")
    return raw, run_raw, result
