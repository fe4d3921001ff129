"""Sphinx extension: fixes to the pages the theme writes (part of ``d2lattn_reader``).

1. The redirecting root ``index.html`` gets a language and a title, and the landing page the
   book's title once.
2. **No Font Awesome script.** The theme loads ``fontawesome.js`` (1.5 MB) on every page to
   turn its icons into SVG, "so that users can add custom icons"; the book adds none, and the
   theme's stylesheet draws the same icons from Font Awesome's web font (fetched only where an
   icon shows, about 150 kB). The script's tag is taken out of every page.
3. **The search index on the search page only.** The theme loads Sphinx's search scripts and
   the whole index (``searchindex.js``, 178 kB English, 293 kB Chinese) on every page, for its
   search-as-you-type panel; that panel is off (``search_as_you_type`` unset), and the search
   box of every page opens ``search.html``, which loads them itself. So the other pages no
   longer load them (unless ``search_as_you_type`` is switched on).
4. A plot on a phone keeps at least half its drawn size: each plot's ``<img>`` carries its
   minimum width (``MIN_SCALE``, read from the PNG; ``d2lattn.css`` applies it below 640 px).
5. sphinx-exercise gives every exercise's and solution's body the same id; they are numbered.
6. The one-page build of the PDF (singlehtml) draws every node the HTML build draws.
7. **No test markers in the code shown**: a ``# NBVAL_IGNORE_OUTPUT`` line tells the test
   runner not to compare a cell's printed figures; it is no part of the code a reader reads or
   copies, so the pages show the cell without it (the notebooks keep it).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

from d2lattn_common import lang

_MARKER = re.compile(r"^[ \t]*#[ \t]*NBVAL_IGNORE_OUTPUT[ \t]*\n?", re.M)


def without_test_markers(code: str) -> str:
    """The code with its ``# NBVAL_IGNORE_OUTPUT`` lines taken out."""
    return _MARKER.sub("", code)


class HideTestMarkers(SphinxPostTransform):
    """Take ``# NBVAL_IGNORE_OUTPUT`` out of the code cells shown (section 7)."""

    default_priority = 400

    def run(self, **kwargs) -> None:
        for block in list(self.document.findall(nodes.literal_block)):
            text = block.astext()
            if "NBVAL_IGNORE_OUTPUT" not in text:
                continue
            parent = block.parent
            while parent is not None and "cell_input" not in parent.get("classes", ()):
                parent = parent.parent
            if parent is None:
                continue  # prose that names the marker keeps it
            new = without_test_markers(text)
            block.rawsource = new
            block.children = [nodes.Text(new)]

_PLOT_IMG = re.compile(r'<img alt="([^"]*)" src="((?:\.\./)*_images/[^"/]+\.png)" />')
#: On a phone a plot keeps at least this fraction of its size in pixels (the chapters draw at
#: 150 dpi, so 10-point labels stay about 10 px high).
MIN_SCALE = 0.5


def _png_width(path: Path) -> int:
    with path.open("rb") as f:
        head = f.read(24)
    return int.from_bytes(head[16:20], "big") if head[:8] == b"\x89PNG\r\n\x1a\n" else 0


def _with_min_width(match: re.Match, out: Path) -> str:
    path = out / "_images" / match.group(2).rsplit("/", 1)[-1]
    width = _png_width(path) if path.is_file() else 0
    if not width:
        return match.group(0)
    return (f'<img alt="{match.group(1)}" src="{match.group(2)}" '
            f'style="--d2lattn-min-width: {round(width * MIN_SCALE)}px" />')


_REPEATED_IDS = re.compile(r'id="(exercise-content|solution-content)"')


def _unique_ids(text: str) -> str:
    """sphinx-exercise gives every exercise's and solution's body the same id; number them."""
    seen: dict = {}

    def number(match: re.Match) -> str:
        seen[match.group(1)] = seen.get(match.group(1), 0) + 1
        n = seen[match.group(1)]
        return match.group(0) if n == 1 else f'id="{match.group(1)}-{n}"'

    return _REPEATED_IDS.sub(number, text)


_OUTPUT_PRE = re.compile(
    r'(<div class="output (?:stream|text_plain)[^"]*"><div class="highlight"><pre)>(.*?)(</pre>)',
    re.S)
_COLUMN_GAP = re.compile(r"\S {2,}\S")


def is_table(text: str) -> bool:
    """Printed output laid out in columns: at least three lines, and at least half of them
    (and two or more) with a gap of two or more spaces between words."""
    lines = [line for line in text.splitlines() if line.strip()]
    gapped = sum(1 for line in lines if _COLUMN_GAP.search(line))
    return len(lines) >= 3 and gapped >= 2 and 2 * gapped >= len(lines)


def mark_table_outputs(text: str) -> str:
    """Give each printed output that is a table the class ``d2lattn-table-output``: printed
    output wraps at the column's edge (a long message is read, not scrolled), but a table that
    wraps loses its columns, so a table keeps its lines and scrolls in its own box
    (d2lattn.css), on a phone too."""
    def mark(match: re.Match) -> str:
        plain = html.unescape(re.sub(r"<[^>]+>", "", match.group(2)))
        if not is_table(plain):
            return match.group(0)
        return f'{match.group(1)} class="d2lattn-table-output">{match.group(2)}{match.group(3)}'

    return _OUTPUT_PRE.sub(mark, text)


_FONTAWESOME_SCRIPT = re.compile(
    r'[ \t]*<script defer src="(?:\.\./)*_static/scripts/fontawesome\.js[^"]*"></script>\n?')


def without_fontawesome_script(text: str) -> str:
    return _FONTAWESOME_SCRIPT.sub("", text)


_SEARCH_SCRIPTS = re.compile(
    r'[ \t]*<script src="(?:\.\./)*(?:_static/searchtools\.js|_static/language_data\.js'
    r'|searchindex\.js)"></script>\n?')


def without_search_scripts(text: str) -> str:
    """A page without the theme's search scripts and index (section 3)."""
    return _SEARCH_SCRIPTS.sub("", text)


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    title = html.escape(app.config.html_title or "")
    twice = f"<title>{title} &#8212; {title}</title>"
    as_you_type = (app.config.html_theme_options or {}).get("search_as_you_type")
    # another site built inside this one (the Chinese site at zh/) is finished by its own build
    nested = {index.parent for index in out.glob("*/searchindex.js")}
    for page in out.rglob("*.html"):
        if nested.intersection(page.parents):
            continue
        text = page.read_text(encoding="utf-8")
        new = _PLOT_IMG.sub(lambda m: _with_min_width(m, out), text)
        new = _unique_ids(new)
        new = mark_table_outputs(new)
        new = without_fontawesome_script(new)
        if not as_you_type and page.relative_to(out).as_posix() != "search.html":
            new = without_search_scripts(new)
        # the landing page's title is the book's title, once (the theme appends it to every
        # page's own title)
        new = new.replace(twice, f"<title>{title}</title>") if title else new
        if new != text:
            page.write_text(new, encoding="utf-8")
    root = out / "index.html"
    if root.is_file():
        text = root.read_text(encoding="utf-8")
        if "<html" not in text:
            code = "zh-CN" if lang(app.config) == "zh" else "en"
            title = html.escape(app.config.html_title or app.config.project or "")
            root.write_text(f'<!DOCTYPE html>\n<html lang="{code}">\n<head>\n'
                            f'<meta charset="utf-8" />\n<title>{title}</title>\n{text.strip()}\n'
                            "</head>\n<body></body>\n</html>\n", encoding="utf-8")


def _singlehtml_handlers(app) -> None:
    """The one-page build of the PDF (singlehtml) draws every node the HTML build draws.

    Sphinx uses a builder's own node handlers when any extension registered one for it, and
    falls back to the format's ("html") only otherwise. sphinx-exercise registers its nodes for
    singlehtml, so sphinx-design's dropdowns (and others) had none there; they get the html ones.
    """
    handlers = app.registry.translation_handlers
    if app.builder.name != "html" and app.builder.name in handlers and "html" in handlers:
        for node, pair in handlers["html"].items():
            handlers[app.builder.name].setdefault(node, pair)


def setup(app):
    app.add_post_transform(HideTestMarkers)
    app.connect("builder-inited", _singlehtml_handlers)
    # after sphinx-external-toc's own handler, which writes the redirecting index.html
    app.connect("build-finished", _build_finished, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
