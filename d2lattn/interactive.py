"""Figures a reader can move: numbers computed in Python, drawn in the browser.

A chapter cell computes every number of a small figure for every setting of its controls (a
slider, a menu, a row of tokens to pick from) and returns an :class:`InteractiveFigure`. In a
notebook it shows as an HTML table of the first setting (the static fallback: JupyterLab, print);
on the book's website the script ``d2lattn-viz.js`` (``book/assets/static``, loaded only on pages
that use it) replaces the table by the figure and redraws it from the stored numbers whenever the
reader moves a control. Nothing is recomputed in the browser, so what is drawn for a setting is
exactly what PyTorch computed for it, and the site's browser test checks that it is.

Data layout (all of it JSON, numbers rounded to ``digits`` decimals):

* ``controls``: a list of ``{"name", "label", "type", "values", "initial"}``. ``type`` is
  ``"slider"``, ``"select"`` or ``"tokens"`` (a radio group: click, tap or arrow keys); ``values``
  are the labels shown for each choice; ``initial`` is the index chosen at first.
* ``panels``: a list of ``{"name", "type", "title", ...}``. ``type`` is ``"bars"`` (needs
  ``labels``; optional ``ymin``/``ymax``), ``"grid"`` (needs ``rows`` and ``cols``; optional
  ``vmax``, ``boolean``, and ``groups``: the names of the groups a cell may belong to, each
  drawn in its own colour with a legend, plus ``ungrouped``: the legend's name for cells of no
  group), ``"lines"`` (needs ``x``; optional ``static``: a list of ``{"label", "y"}``, and
  ``points``: ``{"x", "y"}`` drawn as dots) or ``"readout"``.
* ``frames``: one entry per combination of control indices, keyed ``"i,j,..."`` (see
  :func:`frame_key`), mapping each panel name to its numbers for that setting: a list (bars), a
  list of rows (grid), ``{label: list}`` (lines) or ``{label: number}`` (readout). A grid's
  cells may also carry a label and a group each: its entry is then ``{"values": rows,
  "labels": rows of strings, "groups": rows of group indices or None}`` (either of the last two
  may be left out; a label is drawn in its cell instead of the number, "" draws none).
"""

from __future__ import annotations

import copy
import html
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["InteractiveFigure", "frame_key", "grid_parts", "set_language", "translate_data"]

CONTROL_TYPES = ("slider", "select", "tokens")
PANEL_TYPES = ("bars", "grid", "lines", "readout")


def frame_key(*indices: int) -> str:
    """The key of the frame shown when control ``k`` has its choice ``indices[k]`` selected.

    >>> frame_key(2, 0)
    '2,0'
    """
    return ",".join(str(int(i)) for i in indices)


def grid_parts(value: Any) -> tuple[list, list | None, list | None]:
    """(values, labels, groups) of a grid panel's entry in a frame: a plain list of rows has
    neither labels nor groups (None).

    >>> grid_parts({"values": [[0.5, 0.0]], "labels": [["a0", ""]], "groups": [[0, None]]})
    ([[0.5, 0.0]], [['a0', '']], [[0, None]])
    >>> grid_parts([[1.0]])
    ([[1.0]], None, None)
    """
    if isinstance(value, Mapping):
        return list(value["values"]), value.get("labels"), value.get("groups")
    return list(value), None, None


def _check_grid(panel: Mapping[str, Any], value: Any, where: str) -> None:
    # A grid's entry in one frame: rows of numbers, or {"values", "labels", "groups"} of one shape.
    if isinstance(value, Mapping):
        unknown = set(value) - {"values", "labels", "groups"}
        if "values" not in value or unknown:
            raise ValueError(f"{where}: a grid entry that is a dict needs 'values' and may have "
                             f"'labels' and 'groups', got the keys {sorted(value)}")
    values, labels, groups = grid_parts(value)
    shape = [len(row) for row in values]
    for name, rows in (("labels", labels), ("groups", groups)):
        if rows is not None and [len(row) for row in rows] != shape:
            raise ValueError(f"{where}: {name} must have the shape of values (rows of "
                             f"{shape}), got rows of {[len(row) for row in rows]}")
    if labels is not None and not all(isinstance(x, str) for row in labels for x in row):
        raise ValueError(f"{where}: labels must be strings (\"\" for none)")
    if groups is not None:
        n = len(panel.get("groups", []))
        bad = [g for row in groups for g in row
               if g is not None and (isinstance(g, bool) or not isinstance(g, int)
                                     or not 0 <= g < n)]
        if bad:
            raise ValueError(f"{where}: groups must be None or an index into the panel's "
                             f"{n} groups, got {bad[0]!r}")


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

    Source: the book's interactive figures (chapters 1-3, 5 and 6); the script that draws
    them is ``book/assets/static/d2lattn-viz.js``.

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
                if panel["type"] == "grid":
                    _check_grid(panel, frame[panel["name"]], f"frames[{key!r}][{panel['name']!r}]")
            self.frames[key] = _rounded({n: frame[n] for n in names}, digits)

    @staticmethod
    def _check_control(control: dict[str, Any]) -> dict[str, Any]:
        for field in ("name", "label", "values"):
            if field not in control:
                raise ValueError(f"a control lacks the field {field!r}: {control}")
        control.setdefault("type", "slider")
        if control["type"] not in CONTROL_TYPES:
            raise ValueError(f"control type must be one of {CONTROL_TYPES}, got {control['type']!r}")
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
        required = {"bars": ("labels",), "grid": ("rows", "cols"), "lines": ("x",), "readout": ()}
        if panel.get("type") not in PANEL_TYPES:
            raise ValueError(f"panel type must be one of {PANEL_TYPES}, got {panel.get('type')!r}")
        for field in ("name",) + required[panel["type"]]:
            if field not in panel:
                raise ValueError(f"a {panel['type']} panel lacks the field {field!r}")
        panel.setdefault("title", "")
        if panel["type"] == "grid" and "groups" in panel:
            if not panel["groups"] or not all(isinstance(g, str) for g in panel["groups"]):
                raise ValueError(f"grid panel {panel['name']!r}: groups must be a non-empty "
                                 f"list of names, got {panel['groups']!r}")
        return panel

    def __repr__(self) -> str:
        return f"InteractiveFigure({self.title!r}, {len(self.frames)} frames)"

    def data(self) -> dict[str, Any]:
        """The JSON-ready description the browser script reads."""
        return {"title": self.title, "caption": self.caption, "digits": self.digits,
                "controls": self.controls, "panels": self.panels, "frames": self.frames}

    def _fallback(self) -> str:
        # The first setting's numbers as plain HTML tables: what a reader without the script sees.
        key = frame_key(*(c["initial"] for c in self.controls))
        setting = ", ".join(f"{c['label']} = {c['values'][c['initial']]}" for c in self.controls)
        parts = [f"<p><strong>{html.escape(self.title)}</strong> ({html.escape(setting)})</p>"]
        fmt = f"{{:.{self.digits}f}}"
        for panel in self.panels:
            values = self.frames[key][panel["name"]]
            parts.append(f"<p>{html.escape(panel['title'])}</p>")
            if panel["type"] == "bars":
                rows = zip(panel["labels"], values)
                body = "".join(f"<tr><td>{html.escape(str(a))}</td><td>{fmt.format(b)}</td></tr>"
                               for a, b in rows)
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
                    number = fmt.format(v)
                    return f"{html.escape(name)} ({number})" if name else number

                body = head + "".join(
                    f"<tr><th>{html.escape(str(r))}</th>"
                    + "".join(f"<td>{cell(i, j, v)}</td>" for j, v in enumerate(row)) + "</tr>"
                    for i, (r, row) in enumerate(zip(panel["rows"], values)))
            elif panel["type"] == "readout":
                body = "".join(f"<tr><td>{html.escape(k)}</td><td>{fmt.format(v)}</td></tr>"
                               for k, v in values.items())
            else:  # lines: too many numbers for a table; name the series
                body = "".join(f"<tr><td>{html.escape(k)}</td><td>{len(v)} points</td></tr>"
                               for k, v in values.items())
            parts.append(f"<table>{body}</table>")
        return "".join(parts)

    def _repr_html_(self) -> str:
        if _LANGUAGE["code"] and not getattr(self, "_translated", False):
            data = translate_data(self.data(), _LANGUAGE["table"])
            figure = InteractiveFigure(data["title"], controls=data["controls"],
                                       panels=data["panels"], frames=data["frames"],
                                       digits=data["digits"], caption=data["caption"])
            figure._translated = True
            figure._lang = _LANGUAGE["code"]
            return figure._repr_html_()
        data = self.data()
        if getattr(self, "_lang", None):
            data["lang"] = self._lang  # the script's own words (": ", "points") follow it
        payload = json.dumps(data, ensure_ascii=False, sort_keys=True,
                             separators=(",", ":")).replace("</", "<\\/")
        return ('<div class="d2lattn-viz">'
                f'<script type="application/json" class="d2lattn-viz-data">{payload}</script>'
                f'<div class="d2lattn-viz-fallback">{self._fallback()}</div></div>')
