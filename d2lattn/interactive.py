"""Figures a reader can move: numbers computed in Python, drawn in the browser.

A chapter cell computes every number of a small figure for every setting of its controls (a
slider, a menu, a row of tokens to pick from) and returns an :class:`InteractiveFigure`. On the
book's website the script ``d2lattn-viz.js`` (``book/assets/static``, loaded only on pages that
use it) replaces the figure's HTML table by the figure and redraws it from the stored numbers
whenever the reader moves a control. Nothing is recomputed in the browser, so what is drawn for a
setting is exactly what PyTorch computed for it, and the site's browser test checks that it is.

In a notebook run in JupyterLab (or Jupyter Notebook 7, VS Code, Colab) the same script draws the
figure as a live widget (`anywidget <https://anywidget.dev>`_), and a figure given
:meth:`InteractiveFigure.with_input` also recomputes for text the reader types (the kernel runs the
chapter's model on it). Elsewhere (nbval, ``nbconvert --execute``, print, a frontend without a
widget manager) the figure is the HTML table of its first setting, exactly as before: see
:func:`use_widgets`.

Data layout (all of it JSON, numbers rounded to ``digits`` decimals):

* ``controls``: a list of ``{"name", "label", "type", "values", "initial"}``. ``type`` is
  ``"slider"``, ``"select"`` or ``"tokens"`` (a radio group: click, tap or arrow keys); ``values``
  are the labels shown for each choice; ``initial`` is the index chosen at first.
* ``panels``: a list of ``{"name", "type", "title", ...}``. ``type`` is ``"bars"`` (needs
  ``labels``; optional ``ymin``/``ymax``, and ``groups``: for each bar the index of its group,
  or None, drawn in the colour of a grid's group of that index, so that a bar and the grid's
  cells of one request share a colour), ``"grid"`` (needs ``rows`` and ``cols``; optional
  ``vmax``, ``boolean``, and ``groups``: the names of the groups a cell may belong to, each
  drawn in its own colour with a legend, plus ``ungrouped``: the legend's name for cells of no
  group), ``"lines"`` (needs ``x``; optional ``static``: a list of ``{"label", "y"}``, and
  ``points``: ``{"x", "y"}`` drawn as dots), ``"scatter"`` (a picture of points, such as a
  point cloud seen from one side: needs ``x`` and ``y``, the coordinates of every point, the
  same in every frame; optional ``vmax``) or ``"readout"``.
* ``frames``: one entry per combination of control indices, keyed ``"i,j,..."`` (see
  :func:`frame_key`), mapping each panel name to its numbers for that setting: a list (bars), a
  list of rows (grid), ``{label: list}`` (lines), ``{label: number}`` (readout) or, for a
  scatter, ``{"focus": i, "points": [j, ...], "values": [v, ...]}``: point ``i`` is marked
  with a cross, and each point ``j`` is joined to it and coloured by its value (a weight: 0
  pale, ``vmax`` dark), the others drawn small and grey. A grid's
  cells may also carry a label and a group each: its entry is then ``{"values": rows,
  "labels": rows of strings, "groups": rows of group indices or None}`` (either of the last two
  may be left out; a label is drawn in its cell instead of the number, "" draws none).

Counts are shown as integers: the numbers of a panel (of a readout, each name's) that are whole
in every frame are written without decimals ("5", not "5.00"), in the static table as by the
script (:func:`integer_parts`).
"""

from __future__ import annotations

import copy
import html
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ._checks import check_choice, check_grid_entry, grid_parts  # grid_parts: public here

__all__ = ["InteractiveFigure", "frame_key", "grid_parts", "integer_parts", "set_language",
           "translate_data", "use_widgets", "widgets_enabled"]

CONTROL_TYPES = ("slider", "select", "tokens")
PANEL_TYPES = ("bars", "grid", "lines", "readout", "scatter")


def frame_key(*indices: int) -> str:
    """The key of the frame shown when control ``k`` has its choice ``indices[k]`` selected.

    >>> frame_key(2, 0)
    '2,0'
    """
    return ",".join(str(int(i)) for i in indices)


def _whole(value: Any) -> bool:
    # A number with no fractional part (a bool, a boolean grid's cell, is 0 or 1).
    return isinstance(value, (int, float)) and float(value).is_integer()


def integer_parts(panels: Sequence[Mapping[str, Any]],
                  frames: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Which numbers of a figure are counts, to be written without decimals: for each bars,
    grid or lines panel, whether all its numbers are whole in every frame; for each readout, a
    dict saying so of each of its names. The browser script (``integerParts``) decides alike.

    Source: the book's interactive figures (chapter 15's counts of requests and tokens).

    >>> integer_parts([{"name": "r", "type": "readout"}, {"name": "b", "type": "bars"}],
    ...               {"0": {"r": {"kept": 3, "loss": 0.5}, "b": [1.0, 2]},
    ...                "1": {"r": {"kept": 4, "loss": 1.0}, "b": [0.0, 7]}})
    {'r': {'kept': True, 'loss': False}, 'b': True}
    """
    frames = list(frames.values())
    out: dict[str, Any] = {}
    for panel in panels:
        name = panel["name"]
        if panel["type"] == "readout":
            out[name] = {key: all(_whole(f[name][key]) for f in frames)
                         for key in (frames[0][name] if frames else {})}
        elif panel["type"] == "grid":
            out[name] = all(_whole(v) for f in frames for row in grid_parts(f[name])[0]
                            for v in row)
        elif panel["type"] == "lines":
            out[name] = all(_whole(v) for f in frames for ys in f[name].values() for v in ys)
        elif panel["type"] == "scatter":
            out[name] = all(_whole(v) for f in frames for v in f[name]["values"])
        else:
            out[name] = all(_whole(v) for f in frames for v in f[name])
    return out


def _rounded(obj: Any, digits: int) -> Any:
    # Plain JSON values, floats rounded (and -0.0 written as 0.0: the same text on every CPU).
    if isinstance(obj, torch.Tensor):
        return _rounded(obj.tolist(), digits)
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"figure data must be finite numbers, got {obj}")
        value = round(obj, digits)
        return 0.0 if value == 0 else value
    if isinstance(obj, Mapping):
        return {str(k): _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, Sequence):
        return [_rounded(v, digits) for v in obj]
    raise ValueError(f"figure data must be numbers, strings, lists or dicts, got {type(obj).__name__}")


#: The language figures are drawn in (None: as written, English) and its table of strings.
_LANGUAGE: dict[str, Any] = {"code": None, "table": {}}
#: Where the translations live in the book's repository (and in its notebooks' archive).
LOCALE = Path(__file__).resolve().parents[1] / "locale"
#: The script that draws the figures, on the website and in the notebook's widget (one source),
#: and the stylesheet whose figure rules the widget takes (book's repository and archive).
SCRIPT = Path(__file__).resolve().parents[1] / "book" / "assets" / "static" / "d2lattn-viz.js"
STYLESHEET = SCRIPT.with_name("d2lattn.css")
#: The widget's own few rules: the text box of a figure that recomputes.
_WIDGET_CSS = """
.d2lattn-viz-input { display: flex; flex-wrap: wrap; align-items: flex-end; gap: 0.3rem 0.6rem;
  margin: 0.3rem 0; font-size: 0.9rem; }
.d2lattn-viz-input textarea { min-width: 16rem; font-family: var(--jp-code-font-family, monospace); }
.d2lattn-viz-message { margin: 0.2rem 0; font-size: 0.9rem; color: #a00; }
"""
#: Figures as live widgets: None decides by the frontend (:func:`widgets_enabled`).
_WIDGETS: dict[str, bool | None] = {"mode": None}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def set_language(language: str | None, *, catalogue: str | Path | None = None) -> None:
    """Draw the figures made from now on in ``language`` (``"zh_CN"``), or as written (None).

    The website's Chinese pages translate the committed figures when the book is built; a
    Chinese notebook downloaded from them calls this in its first cell, so that its figures,
    drawn again, are Chinese too. The strings come from the gettext catalogue
    ``locale/<language>/LC_MESSAGES/interactive.po`` of the book's repository (or
    ``catalogue``); a string it lacks stays English.

    Raises:
        ValueError: if ``language`` has no such catalogue (it names the file looked for).

    Source: the book's Chinese edition (``locale/README.md``).
    """
    if language in (None, "", "en"):
        _LANGUAGE.update(code=None, table={})
        return
    path = Path(catalogue) if catalogue is not None else (
        LOCALE / str(language) / "LC_MESSAGES" / "interactive.po")
    if not path.is_file():
        raise ValueError(f"language {language!r}: no catalogue at {path} (the figures' "
                         "translations live in the book's repository, under locale/)")
    import polib

    table = {e.msgid: e.msgstr for e in polib.pofile(str(path))
             if e.msgid and e.msgstr.strip() and "fuzzy" not in e.flags and not e.obsolete}
    _LANGUAGE.update(code=str(language), table=table)


def translate_data(data: Mapping[str, Any], table: Mapping[str, str]) -> dict[str, Any]:
    """A copy of a figure's data (:meth:`InteractiveFigure.data`) with every string that
    ``table`` translates replaced: title, caption, control labels and values, panel titles,
    row, column and bar labels, a grid's group names, line and readout names. Numbers and the
    labels of a grid's cells (data, like a request's name) are untouched.

    >>> translate_data({"title": "weights", "caption": "", "controls": [], "panels": [],
    ...                 "frames": {}}, {"weights": "权重"})["title"]
    '权重'
    """
    t = lambda s: table.get(s, s) if isinstance(s, str) else s  # noqa: E731
    out = copy.deepcopy(dict(data))
    out["title"], out["caption"] = t(out["title"]), t(out.get("caption", ""))
    for control in out["controls"]:
        control["label"] = t(control["label"])
        control["values"] = [t(v) for v in control["values"]]
    keyed = []
    for panel in out["panels"]:
        panel["title"] = t(panel.get("title", ""))
        if "ungrouped" in panel:
            panel["ungrouped"] = t(panel["ungrouped"])
        for field in ("rows", "cols", "labels", "groups"):
            if field in panel:
                panel[field] = [t(v) for v in panel[field]]
        for series in panel.get("static", []):
            series["label"] = t(series["label"])
        if panel["type"] in ("readout", "lines"):
            keyed.append(panel["name"])
    for frame in out["frames"].values():
        for name in keyed:
            frame[name] = {t(k): v for k, v in frame[name].items()}
    return out


def use_widgets(enabled: bool | None) -> None:
    """Show the figures made from now on as live widgets (True), as static tables (False), or as
    the frontend allows (None, the default: see :func:`widgets_enabled`).

    The environment variable ``D2LATTN_WIDGETS=1`` (or ``0``) does the same for a whole session.

    Raises:
        ValueError: if ``enabled`` is not True, False or None.

    Source: the book's page "Run it yourself".
    """
    if enabled not in (True, False, None):
        raise ValueError(f"enabled must be True, False or None, got {enabled!r}")
    _WIDGETS["mode"] = enabled


def widgets_enabled() -> bool:
    """Whether a figure displayed now becomes a live widget.

    It does when :func:`use_widgets` (or ``D2LATTN_WIDGETS``) says so; otherwise when the code
    runs in an IPython kernel that a frontend with a widget manager drives: a Jupyter server's
    kernel (JupyterLab, Notebook 7: ``JPY_SESSION_NAME`` is set), Colab or VS Code. Never under
    nbval or ``nbconvert --execute`` (their kernels have no such frontend), so that the saved
    outputs stay the static table. It also needs ``anywidget`` and the script
    ``d2lattn-viz.js`` (the book's repository or its notebooks' archive).

    >>> use_widgets(False); widgets_enabled()
    False
    >>> use_widgets(None)
    """
    mode = _WIDGETS["mode"]
    if mode is None:
        env = os.environ.get("D2LATTN_WIDGETS", "").strip()
        mode = env == "1" if env in ("0", "1") else _widget_frontend()
    return bool(mode) and SCRIPT.is_file() and _anywidget_available()


def _widget_frontend() -> bool:
    # An IPython kernel driven by a frontend that renders widgets.
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    return bool(os.environ.get("JPY_SESSION_NAME") or "google.colab" in sys.modules
                or "__vsc_ipynb_file__" in getattr(shell, "user_ns", {})
                or os.environ.get("VSCODE_PID"))


def _anywidget_available() -> bool:
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return False
    return True


def _css_rules(css: str) -> str:
    """The top-level rules of ``css`` that style the figures alone (every selector starts with
    ``.d2lattn-viz`` or ``.d2lattn-visually-hidden``), with the theme's monospace font replaced
    by JupyterLab's.

    >>> _css_rules(".a { x: 1 } .d2lattn-viz-title { y: 2 } @media print { .d2lattn-viz { z: 3 } }")
    '.d2lattn-viz-title { y: 2 }'
    """
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules, depth, start = [], 0, 0
    for i, ch in enumerate(css):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                rule = css[start:i + 1].strip()
                selectors = [x.strip() for x in rule.split("{", 1)[0].split(",")]
                if all(x.startswith((".d2lattn-viz", ".d2lattn-visually-hidden")) for x in selectors):
                    rules.append(rule)
                start = i + 1
    return "\n".join(rules).replace("var(--pst-font-family-monospace)",
                                     "var(--jp-code-font-family, monospace)")


@lru_cache(maxsize=None)
def _widget_class() -> type:
    """The anywidget class of a live figure (built on first use: anywidget is imported then)."""
    import anywidget
    import traitlets

    esm = ("const D2LATTN_VIZ_EXPORTS = {};\n" + SCRIPT.read_text(encoding="utf-8")
           + "\nexport default { render: (ctx) => D2LATTN_VIZ_EXPORTS.render(ctx) };\n")
    css = (_css_rules(STYLESHEET.read_text(encoding="utf-8")) if STYLESHEET.is_file() else "")

    class FigureWidget(anywidget.AnyWidget):  # type: ignore[misc]
        """A live figure: ``spec`` is the figure's data; a figure that recomputes gets the
        reader's text in ``query`` and answers with a new ``spec`` or a ``message``."""

        _esm = esm
        _css = css + _WIDGET_CSS
        spec = traitlets.Dict().tag(sync=True)
        input = traitlets.Dict().tag(sync=True)
        query = traitlets.Unicode("").tag(sync=True)
        message = traitlets.Unicode("").tag(sync=True)
        revision = traitlets.Int(0).tag(sync=True)

        def __init__(self, figure: "InteractiveFigure", **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.figure = figure

        @traitlets.observe("query")
        def _recompute(self, change: dict[str, Any]) -> None:
            self.message = ""
            self.spec, self.message = self.figure._answer(change["new"], self.spec)
            self.revision += 1

    return FigureWidget


#: CJK ideographs and full-width punctuation: text that takes Chinese typography.
_CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")


def _parenthesised(text: str, after: str = "") -> str:
    """`` (text)`` after Latin text; ``（text）`` (full-width, no space) when ``text`` or the text
    it follows, ``after``, is Chinese, as the Chinese edition's typography asks
    (locale/README.md)."""
    return f"（{text}）" if _CJK.search(text + after) else f" ({text})"


class InteractiveFigure:
    """A figure whose numbers are precomputed for every setting of its controls.

    Args:
        title: a one-line title shown above the figure.
        controls: the controls, as described in the module docstring.
        panels: the panels, as described in the module docstring.
        frames: the numbers of every panel for every combination of control indices.
        digits: decimals kept in the data and shown in the figure (default 3).
        caption: a sentence under the figure telling the reader what to look for.

    Raises:
        ValueError: if a control or panel has an unknown ``type`` or lacks a required field,
            if a combination of control indices has no frame, or if a frame lacks a panel or
            holds a non-finite number.

    Source: the book's interactive figures (chapters 1-3, 5, 6, 9, 12, 14 and 15); the script
    that draws them is ``book/assets/static/d2lattn-viz.js``, on the website and in a notebook's
    live widget (:func:`widgets_enabled`).

    >>> fig = InteractiveFigure(
    ...     "softmax", controls=[{"name": "t", "label": "temperature", "type": "slider",
    ...                           "values": ["0.5", "1"]}],
    ...     panels=[{"name": "w", "type": "bars", "title": "weights", "labels": ["a", "b"]}],
    ...     frames={"0": {"w": [0.1192, 0.8808]}, "1": {"w": [0.2689, 0.7311]}})
    >>> fig
    InteractiveFigure('softmax', 2 frames)
    """

    def __init__(self, title: str, *, controls: Sequence[Mapping[str, Any]],
                 panels: Sequence[Mapping[str, Any]], frames: Mapping[str, Mapping[str, Any]],
                 digits: int = 3, caption: str = "") -> None:
        if not isinstance(digits, int) or not 0 <= digits <= 8:
            raise ValueError(f"digits must be an integer in [0, 8], got {digits!r}")
        self.title, self.caption, self.digits = str(title), str(caption), digits
        self.controls = [self._check_control(dict(c)) for c in controls]
        self.panels = [_rounded(self._check_panel(dict(p)), digits) for p in panels]
        if not self.controls:
            raise ValueError("controls must hold at least one control")
        names = [p["name"] for p in self.panels]
        if len(set(names)) != len(names):
            raise ValueError(f"panels must have distinct names, got {names}")
        combos = itertools.product(*(range(len(c["values"])) for c in self.controls))
        self.frames: dict[str, Any] = {}
        for combo in combos:
            key = frame_key(*combo)
            if key not in frames:
                raise ValueError(f"frames has no entry for the control indices {key!r}")
            frame = frames[key]
            missing = [n for n in names if n not in frame]
            if missing:
                raise ValueError(f"frames[{key!r}] lacks the panels {missing}")
            for panel in self.panels:
                where = f"frames[{key!r}][{panel['name']!r}]"
                if panel["type"] == "grid":
                    check_grid_entry(panel, frame[panel["name"]], where)
                elif panel["type"] == "scatter":
                    self._check_scatter_entry(panel, frame[panel["name"]], where)
            self.frames[key] = _rounded({n: frame[n] for n in names}, digits)

    @staticmethod
    def _check_control(control: dict[str, Any]) -> dict[str, Any]:
        for field in ("name", "label", "values"):
            if field not in control:
                raise ValueError(f"a control lacks the field {field!r}: {control}")
        control.setdefault("type", "slider")
        check_choice("control type", control["type"], CONTROL_TYPES)
        control["values"] = [str(v) for v in control["values"]]
        if not control["values"]:
            raise ValueError(f"control {control['name']!r} has no values")
        initial = control.setdefault("initial", 0)
        if not isinstance(initial, int) or not 0 <= initial < len(control["values"]):
            raise ValueError(f"control {control['name']!r}: initial must index its values, "
                             f"got {initial!r}")
        return control

    @staticmethod
    def _check_panel(panel: dict[str, Any]) -> dict[str, Any]:
        required = {"bars": ("labels",), "grid": ("rows", "cols"), "lines": ("x",),
                    "readout": (), "scatter": ("x", "y")}
        check_choice("panel type", panel.get("type"), PANEL_TYPES)
        for field in ("name",) + required[panel["type"]]:
            if field not in panel:
                raise ValueError(f"a {panel['type']} panel lacks the field {field!r}")
        panel.setdefault("title", "")
        if panel["type"] == "grid" and "groups" in panel:
            if not panel["groups"] or not all(isinstance(g, str) for g in panel["groups"]):
                raise ValueError(f"grid panel {panel['name']!r}: groups must be a non-empty "
                                 f"list of names, got {panel['groups']!r}")
        if panel["type"] == "bars" and "groups" in panel:
            groups = panel["groups"]
            if (not isinstance(groups, Sequence) or isinstance(groups, str)
                    or len(groups) != len(panel["labels"])
                    or not all(g is None or (isinstance(g, int) and not isinstance(g, bool)
                                             and g >= 0) for g in groups)):
                raise ValueError(f"bars panel {panel['name']!r}: groups must give each of its "
                                 f"{len(panel['labels'])} bars a group index (an integer >= 0) "
                                 f"or None, got {groups!r}")
            panel["groups"] = list(groups)
        if panel["type"] == "scatter":
            x, y = panel["x"], panel["y"]
            if (isinstance(x, (str, Mapping)) or isinstance(y, (str, Mapping))
                    or not isinstance(x, (Sequence, torch.Tensor))
                    or not isinstance(y, (Sequence, torch.Tensor))
                    or len(x) != len(y) or not len(x)):
                raise ValueError(f"scatter panel {panel['name']!r}: x and y must be lists of "
                                 f"the same non-zero length (one entry a point)")
        return panel

    @staticmethod
    def _check_scatter_entry(panel: Mapping[str, Any], value: Any, where: str) -> None:
        # {"focus": i, "points": [j, ...], "values": [v, ...]}: indices of the panel's points
        n = len(panel["x"])
        index = lambda i: isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n  # noqa: E731
        if not isinstance(value, Mapping) or set(value) != {"focus", "points", "values"}:
            raise ValueError(f"{where} must be {{'focus', 'points', 'values'}}, got {value!r}")
        points, values = list(value["points"]), list(value["values"])
        if not index(value["focus"]) or not all(index(j) for j in points):
            raise ValueError(f"{where}: focus and points must be indices of the panel's {n} "
                             f"points, got {value['focus']!r} and {points!r}")
        if len(values) != len(points) or len(set(points)) != len(points):
            raise ValueError(f"{where}: points must be distinct, one value each; got "
                             f"{len(points)} points and {len(values)} values")

    def __repr__(self) -> str:
        return f"InteractiveFigure({self.title!r}, {len(self.frames)} frames)"

    def data(self) -> dict[str, Any]:
        """The JSON-ready description the browser script reads."""
        return {"title": self.title, "caption": self.caption, "digits": self.digits,
                "controls": self.controls, "panels": self.panels, "frames": self.frames}

    def _fallback(self) -> str:
        # The first setting's numbers as plain HTML tables: what a reader without the script sees.
        key = frame_key(*(c["initial"] for c in self.controls))
        chinese = bool(_CJK.search(self.title + "".join(c["label"] for c in self.controls)))
        setting = ("，" if chinese else ", ").join(f"{c['label']} = {c['values'][c['initial']]}"
                                                   for c in self.controls)
        parts = [f"<p><strong>{html.escape(self.title)}</strong>"
                 f"{_parenthesised(html.escape(setting), self.title)}</p>"]
        integers = integer_parts(self.panels, self.frames)

        def number(v: float, integer: bool) -> str:
            return str(int(v)) if integer else f"{v:.{self.digits}f}"

        for panel in self.panels:
            values = self.frames[key][panel["name"]]
            whole = integers[panel["name"]]
            parts.append(f"<p>{html.escape(panel['title'])}</p>")
            if panel["type"] == "bars":
                rows = zip(panel["labels"], values)
                body = "".join(f"<tr><td>{html.escape(str(a))}</td><td>{number(b, whole)}</td>"
                               "</tr>" for a, b in rows)
            elif panel["type"] == "grid":
                values, labels, groups = grid_parts(values)
                # headers over the columns this setting has (a grid may shrink with a control)
                cols = panel["cols"][: len(values[0]) if values else 0]
                head = "<tr><th></th>" + "".join(f"<th>{html.escape(str(c))}</th>"
                                                 for c in cols) + "</tr>"

                def cell(i: int, j: int, v: float) -> str:
                    # a cell's own label, else its group's name, then its number
                    name = labels[i][j] if labels is not None else ""
                    if not name and groups is not None:
                        g = groups[i][j]
                        name = panel["groups"][g] if g is not None else panel.get("ungrouped", "")
                    shown = number(v, whole)
                    return (html.escape(name) + _parenthesised(shown, name)) if name else shown

                body = head + "".join(
                    f"<tr><th>{html.escape(str(r))}</th>"
                    + "".join(f"<td>{cell(i, j, v)}</td>" for j, v in enumerate(row)) + "</tr>"
                    for i, (r, row) in enumerate(zip(panel["rows"], values)))
            elif panel["type"] == "readout":
                body = "".join(f"<tr><td>{html.escape(k)}</td><td>{number(v, whole[k])}</td>"
                               "</tr>" for k, v in values.items())
            elif panel["type"] == "scatter":  # the marked point (x), then each coloured one
                body = f"<tr><td>×</td><td>{values['focus']}</td></tr>" + "".join(
                    f"<tr><td>{j}</td><td>{number(v, whole)}</td></tr>"
                    for j, v in zip(values["points"], values["values"]))
            else:  # lines: too many numbers for a table; name the series
                body = "".join(f"<tr><td>{html.escape(k)}</td><td>{len(v)} points</td></tr>"
                               for k, v in values.items())
            parts.append(f"<table>{body}</table>")
        return "".join(parts)

    def with_input(self, recompute: Callable[[str], InteractiveFigure], *,
                   value: str = "") -> InteractiveFigure:
        """Let a reader of the live widget type text for which the kernel recomputes the figure.

        The widget shows a text box (starting with ``value``) above the figure; the reader's text
        goes to ``recompute(text)``, which returns the new figure (the chapter's model run on
        that text). A ``ValueError`` it raises (an empty text, a character outside the model's
        vocabulary) is shown in the widget as its message, as is any other error, by its type
        and message: never a traceback. The static table and the website are unchanged: they
        show the figure as built.

        Args:
            recompute: text -> :class:`InteractiveFigure`.
            value: the text the box starts with.

        Returns:
            this figure (so that a cell can end with ``figure.with_input(...)``).

        Raises:
            ValueError: if ``recompute`` is not callable or ``value`` is not a string.

        Source: the book's live figures (chapter 12's next character, on the reader's prompt).

        >>> fig = InteractiveFigure("f", controls=[{"name": "c", "label": "c", "values": [0]}],
        ...                         panels=[{"name": "r", "type": "readout"}],
        ...                         frames={"0": {"r": {"length": 0}}})
        >>> fig.with_input(lambda text: InteractiveFigure(
        ...     "f", controls=[{"name": "c", "label": "c", "values": [0]}],
        ...     panels=[{"name": "r", "type": "readout"}],
        ...     frames={"0": {"r": {"length": len(text)}}})) is fig
        True
        """
        if not callable(recompute):
            raise ValueError(f"recompute must be callable (text -> InteractiveFigure), "
                             f"got {type(recompute).__name__}")
        if not isinstance(value, str):
            raise ValueError(f"value must be a string, got {type(value).__name__}")
        self._recompute, self._input_value = recompute, value
        return self

    def _answer(self, text: str, current: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The widget's new spec and message for the reader's ``text`` (``current`` kept on an
        error)."""
        recompute = getattr(self, "_recompute", None)
        if recompute is None:
            return current, "this figure does not recompute"
        try:
            figure = recompute(text)
            if not isinstance(figure, InteractiveFigure):
                raise TypeError(f"recompute returned {type(figure).__name__}, "
                                "not an InteractiveFigure")
            return figure._spec(), ""
        except ValueError as err:
            return current, _LANGUAGE["table"].get(str(err), str(err))
        except Exception as err:  # noqa: BLE001: the reader sees a message, not a traceback
            return current, f"{type(err).__name__}: {err}"

    def _shown(self) -> InteractiveFigure:
        # The figure as drawn now: translated into the language set by set_language, if any.
        if _LANGUAGE["code"] and not getattr(self, "_translated", False):
            data = translate_data(self.data(), _LANGUAGE["table"])
            figure = InteractiveFigure(data["title"], controls=data["controls"],
                                       panels=data["panels"], frames=data["frames"],
                                       digits=data["digits"], caption=data["caption"])
            figure._translated = True
            figure._lang = _LANGUAGE["code"]
            return figure
        return self

    def _spec(self) -> dict[str, Any]:
        # What the script draws: the data, translated, with the language of the script's words,
        # its keys sorted as in the website's JSON (the order of a readout's rows).
        figure = self._shown()
        data = figure.data()
        if getattr(figure, "_lang", None):
            data["lang"] = figure._lang  # the script's own words (": ", "points") follow it
        return json.loads(json.dumps(data, ensure_ascii=False, sort_keys=True))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        """The live widget plus this HTML (see :func:`widgets_enabled`); None otherwise, so
        that the notebook shows :meth:`_repr_html_` alone, as it always did."""
        if not widgets_enabled():
            return None
        widget = _widget_class()(self, spec=self._spec(), input=(
            {"value": self._input_value} if hasattr(self, "_recompute") else {}))
        self._widget = widget  # the figure keeps its last view's model
        data, metadata = widget._repr_mimebundle_()
        return ({WIDGET_MIME: data[WIDGET_MIME], "text/html": self._repr_html_()},
                metadata)

    def _repr_html_(self) -> str:
        shown = self._shown()
        payload = json.dumps(self._spec(), ensure_ascii=False, sort_keys=True,
                             separators=(",", ":")).replace("</", "<\\/")
        return ('<div class="d2lattn-viz">'
                f'<script type="application/json" class="d2lattn-viz-data">{payload}</script>'
                f'<div class="d2lattn-viz-fallback">{shown._fallback()}</div></div>')
