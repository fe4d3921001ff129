"""Sphinx extension: alt text for every plot (part of ``d2lattn_reader``).

A notebook's matplotlib output is a PNG whose alt text would be its file name. Each image in a
cell's output gets a description built at build time from the cell that drew it: the titles,
axis labels and legend labels its code writes (``ax.set_title``, ``plt.title``, ``plt.xlabel``,
``xlabel=`` and so on), the plotting function it calls, and the section it is in. The notebooks
are not changed and nothing is executed.

An f-string's fields are filled in where the code says what they hold: a name assigned a
literal earlier in the notebook (``SEEDS = 5``), or a loop variable of the cell over literal
values (``for layer in range(2)``: "layer 0/1"). A string with a field that the code does not
determine is left out rather than shown with a placeholder.
"""

from __future__ import annotations

import ast
import re

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

from d2lattn_common import lang

_TEXT = {
    "en": {"plot": "Plot", "drawn": "drawn by the code cell above", "in": "in the section",
           "titles": "titles", "x": "horizontal axis", "y": "vertical axis", "legend": "legend",
           # punctuation: between parts, after a name, between items, at the end, quotes
           "sep": ", ", "colon": ": ", "items": "; ", "end": ".", "quote": "“{}”"},
    # Chinese typography (locale/README.md): full-width punctuation, no spaces around it
    "zh": {"plot": "图", "drawn": "由上面的单元格绘制", "in": "所在小节", "titles": "标题",
           "x": "横轴", "y": "纵轴", "legend": "图例",
           "sep": "，", "colon": "：", "items": "；", "end": "。", "quote": "“{}”"},
}

_STRING = r"""(?<!\w)([rRfF]{0,2})(?:"([^"\n]+)"|'([^'\n]+)')"""
_CALLS = {
    "titles": [r"set_title\(\s*" + _STRING, r"suptitle\(\s*" + _STRING,
               r"\bplt\.title\(\s*" + _STRING, r"\btitle=" + _STRING],
    "x": [r"(?:set_|plt\.)xlabel\(\s*" + _STRING, r"\bxlabel=" + _STRING],
    "y": [r"(?:set_|plt\.)ylabel\(\s*" + _STRING, r"\bylabel=" + _STRING],
    "legend": [r"\blabel=" + _STRING],
}
_LIST_ARG = re.compile(r"\btitles=\[([^\]]*)\]")
_PLOT_FUNCTIONS = {
    "show_heatmaps": "heatmaps",
    "show_fits": "regression fits",
    "imshow": "image",
    "matshow": "matrix",
    "hist": "histogram",
    "bar": "bar chart",
    "scatter": "scatter plot",
    "plot": "line plot",
}
#: A loop variable is spelled out when it takes at most this many values.
MAX_LOOP_VALUES = 6


def _parse(code: str):
    # IPython lines (%magic, !shell) are not Python
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in code.split("\n")]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOTHING


_NOTHING = object()


def constants(code: str) -> dict:
    """``{name: value}`` for the top-level assignments of a literal in ``code``."""
    tree, found = _parse(code), {}
    for stmt in getattr(tree, "body", []):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            value = _literal(stmt.value)
            if value is not _NOTHING:
                found[stmt.targets[0].id] = value
            else:
                found.pop(stmt.targets[0].id, None)
    return found


def _iterable(node, known: dict):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        args = [_literal(a) if not isinstance(a, ast.Name) else known.get(a.id, _NOTHING)
                for a in node.args]
        if args and all(isinstance(a, int) for a in args):
            return list(range(*args))
        return _NOTHING
    if isinstance(node, ast.Name):
        value = known.get(node.id, _NOTHING)
        return list(value) if isinstance(value, (list, tuple)) else _NOTHING
    value = _literal(node)
    return list(value) if isinstance(value, (list, tuple)) else _NOTHING


def loop_values(code: str, known: dict) -> dict:
    """``{name: [values]}`` for the cell's ``for`` loops over literal values (``range(2)``, a
    literal list, ``enumerate`` of one; tuple targets unpacked)."""
    tree, found = _parse(code), {}
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.For):
            continue
        target, source = node.target, node.iter
        if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) \
                and source.func.id == "enumerate" and source.args:
            values = _iterable(source.args[0], known)
            if values is _NOTHING:
                continue
            values = list(enumerate(values))
        else:
            values = _iterable(source, known)
            if values is _NOTHING:
                continue
        if isinstance(target, ast.Name):
            found[target.id] = values
        elif isinstance(target, ast.Tuple):
            for k, element in enumerate(target.elts):
                if isinstance(element, ast.Name) and all(
                        isinstance(v, (list, tuple)) and len(v) == len(target.elts) for v in values):
                    found[element.id] = [v[k] for v in values]
    return found


def _field(expr: str, known: dict, loops: dict) -> str | None:
    """The text of one f-string field ``expr[!r][:spec]``, or None if the code does not say."""
    match = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*(?:!(\w))?\s*(?::(.*))?", expr, re.S)
    if not match:
        return None
    name, conversion, spec = match.group(1), match.group(2), match.group(3) or ""

    def show(value) -> str | None:
        if conversion == "r":
            value = repr(value)
        try:
            return format(value, spec)
        except (TypeError, ValueError):
            return None

    if name in loops:
        values = loops[name]
        if not values or len(values) > MAX_LOOP_VALUES:
            return None
        shown = [show(v) for v in values]
        return None if None in shown else "/".join(dict.fromkeys(shown))
    if name in known and isinstance(known[name], (int, float, str)):
        return show(known[name])
    return None


def fill_fields(text: str, known: dict, loops: dict) -> str | None:
    """An f-string's text with its fields filled in, or None if one cannot be."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("{{", i) or text.startswith("}}", i):
            out.append(text[i])
            i += 2
        elif text[i] == "{":
            depth, j = 1, i + 1
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            value = _field(text[i + 1:j - 1], known, loops)
            if value is None:
                return None
            out.append(value)
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _strings(code: str, patterns, known: dict, loops: dict) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        for match in re.finditer(pattern, code):
            prefix = match.group(1).lower()
            text = match.group(2) if match.group(2) is not None else match.group(3)
            if "f" in prefix:
                text = fill_fields(text, known, loops)
                if text is None:
                    continue
            text = " ".join(text.replace("\\n", " ").split())
            if text and text not in found:
                found.append(text)
    return found


def describe_plot(code: str, section: str, lang: str = "en", known: dict | None = None) -> str:
    """Alt text for a plot: what the drawing code says it shows, and where it is.

    ``known``: names assigned literals earlier in the notebook, for the code's f-strings."""
    text = _TEXT[lang]
    known = dict(known or {})
    known.update(constants(code))
    loops = loop_values(code, known)
    kinds = [name for fn, name in _PLOT_FUNCTIONS.items() if re.search(rf"\.?\b{fn}\(", code)]
    titles = _strings(code, _CALLS["titles"], known, loops)
    for listed in _LIST_ARG.findall(code):
        titles += [t for t in _strings(listed, [_STRING], known, loops) if t not in titles]
    labels = {"x": [], "y": [], "legend": []}
    if re.search(r"\bshow_fits\(", code):  # d2lattn.plotting.show_fits: a panel per dict key
        titles += [t for t in re.findall(r'\{\s*"([^"\n]+)"\s*:', code) if t not in titles]
        titles += [t for t in re.findall(r',\s*"([^"\n]+)"\s*:', code) if t not in titles]
        labels = {"x": ["x"], "y": ["y"], "legend": ["training pairs", "truth", "prediction"]}
    parts = [text["plot"] + (f" ({', '.join(kinds[:2])})" if kinds and lang == "en" else "")]
    if titles:
        parts.append(text["titles"] + text["colon"] + text["items"].join(titles[:6]))
    for key in ("x", "y", "legend"):
        found = _strings(code, _CALLS[key], known, loops)
        found += [t for t in labels[key] if t not in found]
        if found:
            parts.append(text[key] + text["colon"] + text["items"].join(found[:6]))
    parts.append(text["drawn"])
    if section:
        parts.append(f"{text['in']} " + text["quote"].format(section) if lang == "en"
                     else text["in"] + text["quote"].format(section))
    return text["sep"].join(parts) + text["end"]


def _cell_code(cell: nodes.Element) -> str:
    for child in cell.findall(nodes.literal_block):
        parent = child.parent
        while parent is not None and parent is not cell:
            if "cell_input" in parent.get("classes", ()):
                return child.astext()
            parent = parent.parent
    return ""


def _section_title(node: nodes.Node) -> str:
    while node is not None:
        if isinstance(node, nodes.section) and node.children:
            title = node.next_node(nodes.title)
            if title is not None:
                return title.astext()
        node = node.parent
    return ""


def _cell_of(node: nodes.Node):
    while node is not None and "cell" not in node.get("classes", ()):
        node = node.parent
    return node


class PlotAltText(SphinxPostTransform):
    """Give every image of a notebook cell's output a description (see the module's docstring)."""

    default_priority = 400
    formats = ("html",)

    def run(self, **kwargs) -> None:
        language = lang(self.config)
        cells = [c for c in self.document.findall(nodes.container)
                 if "cell" in c.get("classes", ())]
        known_before: dict = {}
        known_at = {}
        for cell in cells:  # the literals assigned before each cell, in reading order
            known_at[id(cell)] = dict(known_before)
            known_before.update(constants(_cell_code(cell)))
        for image in list(self.document.findall(nodes.image)):
            cell = _cell_of(image.parent)
            if cell is None:
                continue
            alt = image.get("alt", "")
            if alt and not alt.endswith((".png", ".jpg", ".jpeg", ".svg")):
                continue  # a description given by the author wins
            image["alt"] = describe_plot(_cell_code(cell), _section_title(image), language,
                                         known_at.get(id(cell), {}))


def setup(app):
    app.add_post_transform(PlotAltText)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
