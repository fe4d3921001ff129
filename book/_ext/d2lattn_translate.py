"""The Chinese edition beyond the prose: interactive figures and downloadable notebooks.

Pure functions, no Sphinx: ``d2lattn_i18n.py`` (the Sphinx extension) and ``tools/book.py``
(``update-po``, ``check-po``, ``build``) both use them.

**Interactive figures.** A chapter cell's ``d2lattn.interactive.InteractiveFigure`` stores its
strings (title, the sentence telling the reader what to try, control labels, panel titles,
readout names, line labels) in English in the notebook's output. Their translations live in one
gettext catalogue, ``locale/zh_CN/LC_MESSAGES/interactive.po``, keyed by the English string;
``update-po`` adds a figure's new strings to it and ``check-po`` fails while one is missing.
The Chinese build rewrites each figure's data through that table (and redraws its static
fallback table from the translated data), so the browser script draws a Chinese figure on a
Chinese page and the English one, untouched, on an English page. Strings that name data rather
than describe the figure (the tokens of a ``tokens`` control, a menu's choices, grid row and
column names, bar labels) are translated only where the catalogue has an entry for them: the
chapter's query words stay the words the model saw, "head 0" becomes 头 0.

**Notebooks.** :func:`translate_notebook` writes the Chinese copy of a chapter: every Markdown
cell translated paragraph by paragraph from the page's catalogue, code, outputs and figures as
committed (interactive figures translated as above), the notebook's language set to zh_CN.
"""

from __future__ import annotations

import copy
import html
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
VIZ_CATALOGUE = "interactive"  # locale/<lang>/LC_MESSAGES/interactive.po
_VIZ = re.compile(r'(<div class="d2lattn-viz">)<script type="application/json" '
                  r'class="d2lattn-viz-data">(.*?)</script>.*?</div></div>', re.S)

Table = Mapping[str, str]


# ---------------------------------------------------------------------------------------------
# catalogues


def load_catalogue(path: Path) -> Dict[str, str]:
    """English -> translation for the translated, non-fuzzy entries of one ``.po`` file."""
    import polib

    if not path.exists():
        return {}
    return {e.msgid: e.msgstr for e in polib.pofile(str(path))
            if e.msgid and e.msgstr.strip() and "fuzzy" not in e.flags and not e.obsolete}


# ---------------------------------------------------------------------------------------------
# interactive figures


def viz_specs(html_text: str) -> Iterator[dict]:
    """The data of every interactive figure in an HTML fragment."""
    for match in _VIZ.finditer(html_text):
        yield json.loads(match.group(2).replace("<\\/", "</"))


def viz_strings(spec: Mapping[str, Any]) -> Tuple[List[str], List[str]]:
    """(strings that must be translated, strings that may be) of one figure's data."""
    required: List[str] = [spec["title"]] + ([spec["caption"]] if spec.get("caption") else [])
    optional: List[str] = []
    for control in spec["controls"]:
        required.append(control["label"])
        if control.get("type") == "select":
            optional += control["values"]
        else:  # tokens and slider positions are data
            optional += [v for v in control["values"] if re.search(r"[A-Za-z]{2}", v)]
    first = next(iter(spec["frames"].values()))
    for panel in spec["panels"]:
        if panel.get("title"):
            required.append(panel["title"])
        if panel.get("ungrouped"):  # a grid's legend entry for cells of no group ("free")
            required.append(panel["ungrouped"])
        for field in ("rows", "cols", "labels", "groups"):
            optional += [str(v) for v in panel.get(field, []) if isinstance(v, str)]
        if panel["type"] in ("readout", "lines"):
            required += list(first[panel["name"]])
        required += [s["label"] for s in panel.get("static", [])]
    return _unique(required), [s for s in _unique(optional) if s not in required]


def _unique(items: Iterable[str]) -> List[str]:
    return list(dict.fromkeys(items))


def translate_viz_spec(spec: Mapping[str, Any], table: Table) -> dict:
    """A copy of a figure's data with every string the table translates replaced (the library's
    ``d2lattn.interactive.translate_data``, which a re-run Chinese notebook uses too)."""
    try:
        from d2lattn.interactive import translate_data
    except ImportError:  # building from a checkout without the package installed
        sys.path.insert(0, str(ROOT))
        from d2lattn.interactive import translate_data
    return translate_data(spec, table)


def _figure_html(spec: Mapping[str, Any]) -> str:
    # The same HTML the chapter's cell wrote, from the translated data (fallback table included).
    try:
        from d2lattn.interactive import InteractiveFigure
    except ImportError:  # building from a checkout without the package installed
        sys.path.insert(0, str(ROOT))
        from d2lattn.interactive import InteractiveFigure
    figure = InteractiveFigure(spec["title"], controls=spec["controls"], panels=spec["panels"],
                               frames=spec["frames"], digits=spec["digits"],
                               caption=spec.get("caption", ""))
    return figure._repr_html_()


def translate_viz_html(html_text: str, table: Table) -> str:
    """An HTML fragment with each interactive figure in it redrawn in the table's language."""
    if not table or 'class="d2lattn-viz"' not in html_text:
        return html_text
    return _VIZ.sub(lambda m: _figure_html(translate_viz_spec(
        json.loads(m.group(2).replace("<\\/", "</")), table)), html_text)


def notebook_viz_strings(notebooks: Iterable[Path]) -> Dict[str, Tuple[List[str], List[str]]]:
    """Per notebook: the (required, optional) strings of its interactive figures."""
    found = {}
    for path in notebooks:
        required: List[str] = []
        optional: List[str] = []
        for text in _html_outputs(json.loads(path.read_text(encoding="utf-8"))):
            for spec in viz_specs(text):
                r, o = viz_strings(spec)
                required += r
                optional += o
        if required:
            found[path.relative_to(ROOT).as_posix()] = (_unique(required), _unique(optional))
    return found


def _html_outputs(notebook: Mapping[str, Any]) -> Iterator[str]:
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {}).get("text/html")
            if data is not None:
                yield "".join(data) if isinstance(data, list) else data


# ---------------------------------------------------------------------------------------------
# notebooks


_FENCE = re.compile(r"^(```+|~~~+|:::+)")
_LABEL = re.compile(r"^\(([^)\s]+)\)=\s*$")


def _blocks(source: str) -> List[Tuple[str, str]]:
    """Split Markdown into ("text", paragraph) and ("keep", verbatim) blocks, blank lines kept.

    Paragraphs are what Sphinx's gettext builder makes messages of; fenced blocks (code,
    directives) are handed back whole for the caller to look inside.
    """
    lines = source.split("\n")
    blocks: List[Tuple[str, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line.strip())
        if fence:
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence.group(1)):
                j += 1
            blocks.append(("fence", "\n".join(lines[i:j + 1])))
            i = j + 1
        elif not line.strip():
            blocks.append(("keep", line))
            i += 1
        elif line.lstrip().startswith("$$"):
            j = i
            while j < len(lines) and not (j > i and "$$" in lines[j]) and not (
                    j == i and line.strip().endswith("$$") and line.strip() != "$$"):
                j += 1
            blocks.append(("keep", "\n".join(lines[i:j + 1])))
            i = j + 1
        elif _LABEL.match(line.strip()) or line.strip().startswith("<"):
            blocks.append(("keep", line))
            i += 1
        else:
            j = i
            while j + 1 < len(lines) and lines[j + 1].strip() and not _FENCE.match(
                    lines[j + 1].strip()) and not lines[j + 1].lstrip().startswith("$$"):
                j += 1
            blocks.append(("text", "\n".join(lines[i:j + 1])))
            i = j + 1
    return blocks


_ITEM = re.compile(r"^(\s*(?:[-*+]|\d+[.)])\s+|#{1,6}\s+|>\s?)")
_DIRECTIVE_OPTION = re.compile(r"^:[\w-]+:")


def _translate_text(block: str, table: Table, missed: List[str]) -> str:
    """A paragraph, heading, list or table translated line group by line group."""
    joined = " ".join(line.strip() for line in block.split("\n"))
    if joined in table:
        return table[joined]
    if block.lstrip().startswith("|"):  # a table: one message per cell
        return "\n".join(_translate_table_row(row, table, missed) for row in block.split("\n"))
    # a list or a sequence of headings / items: one message per item (continuation lines join it)
    items: List[List[str]] = []
    for line in block.split("\n"):
        if _ITEM.match(line) or not items:
            items.append([line])
        else:
            items[-1].append(line)
    out = []
    for item in items:
        first = item[0]
        marker = _ITEM.match(first)
        prefix = marker.group(1) if marker else ""
        text = " ".join([first[len(prefix):].strip()] + [l.strip() for l in item[1:]])
        if text in table:
            out.append(prefix + table[text])
        else:
            glossary = _translate_glossary(item, table)
            if glossary is not None:
                out.append(glossary)
            else:
                if text and not _DIRECTIVE_OPTION.match(text):
                    missed.append(text)
                out.append("\n".join(item))
    return "\n".join(out)


def _translate_glossary(lines: List[str], table: Table) -> Optional[str]:
    # term lines stay; an indented definition is one message
    body = [l for l in lines if l.startswith("  ")]
    if not body:
        return None
    text = " ".join(l.strip() for l in body)
    if text not in table:
        return None
    return "\n".join([l for l in lines if not l.startswith("  ")] + ["  " + table[text]])


def _translate_table_row(row: str, table: Table, missed: List[str]) -> str:
    if re.fullmatch(r"\s*\|?[\s:|-]+\|?\s*", row):
        return row
    cells = row.strip().strip("|").split("|")
    out = []
    for cell in cells:
        text = cell.strip()
        if text and text in table:
            out.append(f" {table[text]} ")
        else:
            if text and re.search(r"[A-Za-z]{3}", text) and not text.startswith("`"):
                missed.append(text)
            out.append(cell)
    return "|" + "|".join(out) + "|"


def translate_markdown(source: str, table: Table, missed: Optional[List[str]] = None) -> str:
    """Markdown with each paragraph, heading, list item and table cell the table translates
    replaced; directives' bodies (exercises, solutions, notes, figures' captions) included."""
    missed = [] if missed is None else missed
    out = []
    for kind, block in _blocks(source):
        if kind == "keep" and block.lstrip().startswith("$$") and block.count("$$") >= 2:
            # a display formula: its message is the text between the $$ (words in \\text{})
            start = block.index("$$") + 2
            end = block.rindex("$$")
            formula = block[start:end]
            out.append(block[:start] + table.get(formula, formula) + block[end:])
        elif kind == "keep":
            out.append(block)
        elif kind == "text":
            out.append(_translate_text(block, table, missed))
        else:  # a fence: code stays; a MyST directive's body is Markdown
            lines = block.split("\n")
            head = lines[0].strip()
            if re.match(r"^(```+|~~~+|:::+)\{(code-cell|code|math|raw)\}", head) or not re.match(
                    r"^(```+|~~~+|:::+)\{", head):
                out.append(block)
                continue
            name = re.match(r"^(?:```+|~~~+|:::+)\{([^}]+)\}\s*(.*)$", head)
            argument = name.group(2) if name else ""
            first = lines[0]
            if argument and argument in table:
                first = first[: len(first) - len(argument)] + table[argument]
            body_lines = lines[1:-1]
            options = []
            while body_lines and _DIRECTIVE_OPTION.match(body_lines[0]):
                options.append(body_lines.pop(0))
            if head.startswith("```{figure}") or head.startswith(":::{figure}"):
                options = [_translate_option(o, table) for o in options]
            body = translate_markdown("\n".join(body_lines), table, missed)
            out.append("\n".join([first] + options + ([body] if body_lines else []) + lines[-1:]))
    return "\n".join(out)


def _translate_option(option: str, table: Table) -> str:
    match = re.match(r"^(:alt:\s*)(.*)$", option)
    if match and match.group(2).strip() in table:
        return match.group(1) + table[match.group(2).strip()]
    return option


#: The metadata key of a chapter's references cell (``tools/book.py refs`` writes it, under the
#: same name): its list of works is the same in every language, its header is translated here.
REFERENCES_MARK = "d2lattn_references"
_REFERENCES_HEADERS = {
    "zh_CN": ("**本笔记本引用的文献**。JupyterLab 把引用显示为它的键，例如 `{key}`；下面给出每个键"
              "对应的文献。网站和 PDF 会排好引用的格式、列入全书的参考文献，并略去这个单元。"),
}


def references_header(source: str, language: str) -> str:
    """A references cell with its first paragraph (the header) in ``language``; the list of
    works, written by pybtex from the bibliography, stays as it is."""
    header, sep, works = source.partition("\n\n")
    if language not in _REFERENCES_HEADERS:
        return source
    key = re.search(r"`([^`]+)`", header)
    return _REFERENCES_HEADERS[language].format(key=key.group(1) if key else "") + sep + works


def translate_notebook(notebook: Mapping[str, Any], table: Table, viz_table: Table,
                       *, language: str = "zh_CN",
                       missed: Optional[List[str]] = None) -> dict:
    """The notebook in another language: Markdown cells from the page's catalogue, code and
    outputs as they are (interactive figures redrawn in that language), its language set."""
    out = copy.deepcopy(dict(notebook))
    for cell in out.get("cells", []):
        if cell.get("metadata", {}).get(REFERENCES_MARK):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = _as_lines(references_header(source, language))
        elif cell.get("cell_type") == "markdown":
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = _as_lines(translate_markdown(source, table, missed))
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/html" in data:
                text = "".join(data["text/html"]) if isinstance(data["text/html"], list) \
                    else data["text/html"]
                new = translate_viz_html(text, viz_table)
                if new != text:
                    data["text/html"] = _as_lines(new)
    out.setdefault("metadata", {})["language_info"] = dict(
        out.get("metadata", {}).get("language_info", {}), name="python")
    out["metadata"]["d2lattn"] = {"language": language,
                                  "translated_from": "the English notebook of the same name"}
    return out


def _as_lines(text: str) -> List[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
