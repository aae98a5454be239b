"""Plotly figures as plain data, and the HTML that draws them offline.

A ``Figure`` is the JSON plotly.js draws (``{"data": [traces], "layout": {...}}``) held as a dict, with
numeric columns as numpy arrays until it is written: ``figure_html`` encodes each array as a plotly.js typed
array (``{"dtype": "f4", "bdata": <base64>}``, read by plotly.js since 2.28) and inlines plotly.js once,
read from the installed plotly package's data folder. The same dict goes to ``st.plotly_chart`` unchanged
(Streamlit builds plotly's figure object from it).

Never imports plotly (the Python package: its figure objects validate every property, ~0.25 s for a plain
run's figures on top of its import) or pandas. Inlined JSON never closes its script element: ``<``, ``>``
and ``&`` travel as ``\\u`` escapes, so a variant named ``</script>`` stays text.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np

__all__ = [
    "CONFIG",
    "NO_TEMPLATE",
    "WHITE_TEMPLATE",
    "Figure",
    "add_hline",
    "add_scatter",
    "add_vline",
    "add_vrect",
    "figure",
    "figure_html",
    "plotly_js",
    "titles",
    "to_json",
]


class Figure(TypedDict):
    """One plot as plotly.js takes it; arrays stay numpy arrays until ``to_json``."""

    data: list[dict[str, Any]]
    layout: dict[str, Any]


CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True}
"""plotly.js's config for every plot of a page: no plotly logo, redrawn when its grid cell resizes."""

NO_TEMPLATE: dict[str, Any] = {"data": {"scatter": [{"type": "scatter"}]}}
"""plotly.js's bare defaults (what plotly's ``template="none"`` writes): the layout spells out its style."""

WHITE_TEMPLATE: dict[str, Any] = {
    "data": {"scatter": [{"fillpattern": {"fillmode": "overlay", "size": 10, "solidity": 0.2}, "type": "scatter"}]},
    "layout": {
        "annotationdefaults": {"arrowcolor": "#2a3f5f", "arrowhead": 0, "arrowwidth": 1},
        "autotypenumbers": "strict",
        "colorway": ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
                     "#FF97FF", "#FECB52"],
        "font": {"color": "#2a3f5f"},
        "hoverlabel": {"align": "left"},
        "hovermode": "closest",
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "shapedefaults": {"line": {"color": "#2a3f5f"}},
        "title": {"x": 0.05},
        "xaxis": {"automargin": True, "gridcolor": "#EBF0F8", "linecolor": "#EBF0F8", "ticks": "",
                  "title": {"standoff": 15}, "zerolinecolor": "#EBF0F8", "zerolinewidth": 2},
        "yaxis": {"automargin": True, "gridcolor": "#EBF0F8", "linecolor": "#EBF0F8", "ticks": "",
                  "title": {"standoff": 15}, "zerolinecolor": "#EBF0F8", "zerolinewidth": 2},
    },
}
"""plotly's ``plotly_white`` template, the parts a 2-D scatter plot reads (its polar, geo, ternary, 3-D and
colour-scale settings left out: ~1 kB instead of ~10 kB a figure). A test compares it with plotly's file."""


def figure(*layouts: Mapping[str, Any]) -> Figure:
    """An empty figure whose layout is ``layouts`` merged in order, nested entries key by key as plotly's
    ``update_layout`` merges them (``{"yaxis": {"range": [0, 1]}}`` keeps the axis's title). The layout is
    the figure's own copy: changing it never changes a shared style."""
    layout: dict[str, Any] = {}
    for part in layouts:
        layout = _merged(layout, part)
    return {"data": [], "layout": layout}


def titles(title: str, xaxis: str, yaxis: str | None = None) -> dict[str, Any]:
    """The layout entries naming a plot and its axes."""
    axes = {"xaxis": {"title": {"text": xaxis}}}
    if yaxis is not None:
        axes["yaxis"] = {"title": {"text": yaxis}}
    return {"title": {"text": title}, **axes}


def _merged(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: _copy(value) for key, value in base.items()}
    for key, value in update.items():
        below = out.get(key)
        out[key] = _merged(below, value) if isinstance(value, Mapping) and isinstance(below, Mapping) else _copy(value)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _merged({}, value)
    return [_copy(item) for item in value] if isinstance(value, list) else value  # a template's list of dicts too


def add_scatter(fig: Figure, x: Any, y: Any, **trace: Any) -> None:
    """Append a scatter trace (``trace`` holds plotly's scatter attributes: name, mode, line, ...)."""
    fig["data"].append({"type": "scatter", "x": x, "y": y, **trace})


def _shape(fig: Figure, shape: dict[str, Any], label: dict[str, Any] | None) -> None:
    fig["layout"].setdefault("shapes", []).append(shape)
    if label is not None:
        fig["layout"].setdefault("annotations", []).append({"showarrow": False, **label})


def add_vline(fig: Figure, x: float, *, color: str, text: str | None = None) -> None:
    """A dashed vertical line across the plot at ``x``, labelled at its top right (plotly's ``add_vline``)."""
    label = None if text is None else {"text": text, "x": x, "xanchor": "left", "xref": "x", "y": 1,
                                       "yanchor": "top", "yref": "y domain"}
    _shape(fig, {"line": {"color": color, "dash": "dash"}, "type": "line", "x0": x, "x1": x, "xref": "x",
                 "y0": 0, "y1": 1, "yref": "y domain"}, label)


def add_hline(fig: Figure, y: float, *, color: str, text: str,
              position: Literal["top left", "bottom right"]) -> None:
    """A dashed horizontal line across the plot at ``y``, labelled above its left end or below its right
    end (plotly's ``add_hline``). Set a log y axis first: on one, a shape takes the data value and an
    annotation its log10 (plotly.js's rule)."""
    x, anchors = (0, ("left", "bottom")) if position == "top left" else (1, ("right", "top"))
    log_y = fig["layout"].get("yaxis", {}).get("type") == "log"
    _shape(fig, {"line": {"color": color, "dash": "dash"}, "type": "line", "x0": 0, "x1": 1, "xref": "x domain",
                 "y0": y, "y1": y, "yref": "y"},
           {"text": text, "x": x, "xanchor": anchors[0], "xref": "x domain", "y": math.log10(y) if log_y else y,
            "yanchor": anchors[1], "yref": "y"})


def add_vrect(fig: Figure, x0: float, x1: float, *, fillcolor: str, opacity: float, text: str) -> None:
    """A borderless band from ``x0`` to ``x1`` across the plot, labelled inside its top left corner (plotly's
    ``add_vrect``)."""
    _shape(fig, {"fillcolor": fillcolor, "line": {"width": 0}, "opacity": opacity, "type": "rect", "x0": x0,
                 "x1": x1, "xref": "x", "y0": 0, "y1": 1, "yref": "y domain"},
           {"text": text, "x": x0, "xanchor": "left", "xref": "x", "y": 1, "yanchor": "top", "yref": "y domain"})


# --------------------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------------------

_TYPED = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4", "uint32": "u4",
          "float32": "f4", "float64": "f8"}
"""numpy dtypes plotly.js reads as typed arrays, by their plotly.js names (it has no 64-bit integers)."""
_INT32 = np.iinfo(np.int32)


def _typed_array(values: np.ndarray) -> Any:
    """A 1-D numeric array as a plotly.js typed array; anything else (and an empty array) as a plain list."""
    if values.ndim != 1 or values.size == 0:
        return _plain(values.tolist())
    if values.dtype.kind in "iub" and values.dtype.name not in _TYPED:  # int64, bool: int32 when it fits
        fits = values.dtype.kind == "b" or (values.min() >= _INT32.min and values.max() <= _INT32.max)
        values = values.astype(np.int32 if fits else np.float64)
    code = _TYPED.get(values.dtype.name)
    if code is None:
        return _plain(values.tolist())
    little = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    return {"dtype": code, "bdata": base64.b64encode(little.tobytes()).decode("ascii")}


def _plain(value: Any) -> Any:
    """``value`` with arrays as typed arrays, tuples as lists, numpy scalars as Python numbers, and NaN or
    infinity as null (plotly.js draws a gap; plain JSON has no NaN)."""
    if isinstance(value, np.ndarray):
        return _typed_array(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


_HTML_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def to_json(value: Any) -> str:
    """``value`` (a figure, or any part of one) as JSON that is safe inside a ``<script>`` element."""
    return json.dumps(_plain(value), allow_nan=False, separators=(",", ":")).translate(_HTML_SAFE)


# --------------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------------


def plotly_js() -> str:
    """The plotly.js that the installed plotly package ships (``package_data/plotly.min.js``), found without
    importing the package."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the plotly package is not installed: the report inlines its plotly.js "
                           "(pip install plotly)")
    return (Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js").read_text(
        encoding="utf-8")


def _div(div_id: str, fig: Figure, *, head: str) -> str:
    """What ``plotly.io.to_html(full_html=False)`` writes: a box as high as the layout asks, ``head`` (the
    library, for the first plot), the plot's div and the script that draws it."""
    layout = fig["layout"]
    css_height = f"{layout['height']}px" if "height" in layout else "100%"
    target = to_json(div_id)
    return (f'<div style="height:{css_height}; width:100%;">{head}'
            f'<div id="{html.escape(div_id)}" class="plotly-graph-div" style="height:100%; width:100%;"></div>'
            f"<script>window.PLOTLYENV=window.PLOTLYENV || {{}};if (document.getElementById({target})) "
            f"{{Plotly.newPlot({target}, {to_json(fig['data'])}, {to_json(layout)}, {to_json(CONFIG)})}};"
            "</script></div>")


def figure_html(figures: Mapping[str, Figure]) -> str:
    """Every figure as its own div, keyed by div id, in order; plotly.js inlined once, before the first, so
    the page opens with no network."""
    if not figures:
        return ""
    library = f"<script>window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script><script>{plotly_js()}</script>"
    return "".join(_div(div_id, fig, head=library if i == 0 else "") for i, (div_id, fig) in enumerate(figures.items()))
