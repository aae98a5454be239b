"""Figures as plain plotly JSON: typed arrays plotly.js decodes to the same numbers, no NaN in plain JSON,
nothing that closes a script element, plotly's own style and library, and styles never shared by mutation."""

from __future__ import annotations

import base64
import importlib.util
import json
import math
from pathlib import Path

import numpy as np

from simulator.results.figure import (
    WHITE_TEMPLATE,
    add_hline,
    add_scatter,
    add_vline,
    figure,
    figure_html,
    plotly_js,
    titles,
    to_json,
)


def test_arrays_become_typed_arrays_and_nan_outside_them_null() -> None:
    values = np.array([1.5, np.nan, -2.25, 1e30], dtype=np.float32)
    doc = json.loads(to_json({"x": values, "y": [1.0, math.nan, math.inf], "n": np.int64(3), "e": np.zeros(0),
                              "i": np.arange(5), "big": np.array([2**40, 1]), "t": (1, 2)}))
    assert doc["x"]["dtype"] == "f4"
    decoded = np.frombuffer(base64.b64decode(doc["x"]["bdata"]), dtype="<f4")
    assert np.array_equal(decoded, values, equal_nan=True)  # NaN stays a gap inside the binary
    assert doc["y"] == [1.0, None, None] and doc["n"] == 3 and doc["e"] == [] and doc["t"] == [1, 2]
    assert doc["i"]["dtype"] == "i4"  # plotly.js has no 64-bit integers
    assert np.array_equal(np.frombuffer(base64.b64decode(doc["i"]["bdata"]), dtype="<i4"), np.arange(5))
    assert doc["big"]["dtype"] == "f8"


def test_json_never_closes_the_script_it_sits_in() -> None:
    text = to_json({"name": "</script><!-- & -->"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": "</script><!-- & -->"}


def test_white_template_is_plotlys_own() -> None:
    """The trimmed ``plotly_white`` equals plotly's file in every entry it keeps."""
    spec = importlib.util.find_spec("plotly")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations))) / "package_data"
    theirs = json.loads((folder / "templates" / "plotly_white.json").read_text())
    assert {k: theirs["layout"][k] for k in WHITE_TEMPLATE["layout"]} == WHITE_TEMPLATE["layout"]
    assert theirs["data"]["scatter"] == WHITE_TEMPLATE["data"]["scatter"]


def test_plotly_js_is_the_installed_packages() -> None:
    from plotly.offline import get_plotlyjs

    assert plotly_js() == get_plotlyjs()


def test_a_figure_owns_its_layout() -> None:
    style = {"xaxis": {"showgrid": True}, "legend": {"y": -0.2}, "height": 360}
    one = figure(style, titles("one", "time (s)", "rate"), {"legend": {"orientation": "h"}})
    two = figure(style, titles("two", "time (s)", "rate"))
    one["layout"]["xaxis"]["type"] = "log"
    add_vline(one, 3.0, color="#000", text="answer: 3")
    add_hline(one, 0.9, color="#c00", text="target 0.9", position="bottom right")
    assert style == {"xaxis": {"showgrid": True}, "legend": {"y": -0.2}, "height": 360}
    assert two["layout"] == {"xaxis": {"showgrid": True, "title": {"text": "time (s)"}}, "legend": {"y": -0.2},
                             "height": 360, "title": {"text": "two"}, "yaxis": {"title": {"text": "rate"}}}
    assert one["layout"]["legend"] == {"y": -0.2, "orientation": "h"}
    assert [a["text"] for a in one["layout"]["annotations"]] == ["answer: 3", "target 0.9"]
    # a style's lists of dicts are copied too: a template's traces are a list of dicts
    shared = {"template": WHITE_TEMPLATE}
    figure(shared)["layout"]["template"]["data"]["scatter"][0]["mode"] = "markers"
    assert "mode" not in WHITE_TEMPLATE["data"]["scatter"][0]


def test_the_library_is_inlined_once_before_the_first_plot() -> None:
    figures = {}
    for name in ("a", "b", "c"):
        fig = figure({"height": 300}, titles(name, "x"))
        add_scatter(fig, np.arange(3.0), np.ones(3), name=name)
        figures[name] = fig
    page = figure_html(figures)
    assert page.count("plotly.js v") == 1 and page.index("plotly.js v") < page.index('id="a"')
    assert page.count('style="height:300px; width:100%;"') == 3 and page.count("Plotly.newPlot(") == 3
    assert figure_html({}) == ""


def test_a_line_label_sits_on_its_line_on_a_log_axis() -> None:
    """On a log axis plotly.js places a shape at the data value and an annotation at its log10."""
    linear, log = figure(), figure({"yaxis": {"type": "log"}})
    for fig in (linear, log):
        add_hline(fig, 250.0, color="#c0392b", text="limit", position="top left")
    assert linear["layout"]["shapes"][0]["y0"] == log["layout"]["shapes"][0]["y0"] == 250.0
    assert linear["layout"]["annotations"][0]["y"] == 250.0
    assert log["layout"]["annotations"][0]["y"] == math.log10(250.0)
