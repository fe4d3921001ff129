"""Sphinx extension: what a reader needs around the pages (both languages).

1. **Alt text for every plot.** A notebook's matplotlib output is a PNG whose alt text would be
   its file name. Each image in a cell's output gets a description built at build time from the
   cell that drew it (the titles, axis labels and legend labels its code writes, the plotting
   function it calls) and the section it is in. The notebooks are not changed.
2. **Version and build date in every footer**: the version of ``d2lattn``, the commit the site
   was built from (when the source is a git checkout) and the build date (UTC; honours
   ``SOURCE_DATE_EPOCH``).
3. **Links to the source**, when ``repository: url:`` is set in ``_config.yml`` (no address is
   set until the book has a public home): the theme's repository, issue and edit buttons, and at
   the end of every page "report an error on this page" (a new issue whose title names the
   page), "edit this page" (the Chinese pages edit their catalogue) and the repository.
4. **A link to the PDF of the whole book** at the end of every page (``tools/book.py build``
   prints it; see ``PDF_NAME``).
5. **Notebooks that work when downloaded**: the download link carries the ``download``
   attribute (over ``file://`` the browser would otherwise show the JSON), and the downloadable
   copy of each chapter (``_sources/``) starts with a note on how to get the repository and
   run it. The notebooks in ``book/`` are untouched.
6. The redirecting root ``index.html`` gets a language and a title, and the landing page the
   book's title once.
7. The search page takes its snippets from the article text, and over ``file://`` (where a
   browser refuses to fetch the pages snippets are cut from) lists results without snippets and
   says how to get them, instead of logging an error per result (``d2lattn-search.js``).
8. **Search ranks by how often a page uses the words.** Sphinx's index records only *which*
   pages hold a word, so every page that mentions it once ties with the chapter about it, and
   ties are broken by title (a page that names "rotary" once outranked the chapter that uses
   it 47 times). The build also counts, for each word, how many times each page uses it
   (``_static/d2lattn-search-counts.js``, loaded by the search page alone: the theme loads
   the index itself on every page; only counts of 2 or more, as a page listed for a word uses
   it at least once), and the search page adds to Sphinx's score a bonus that grows with that
   count n, 9.9 (1 - 1/n) (``d2lattn-search.js``): pages rank by their number of uses, and
   Sphinx's own weights stay, a word in a page's headings still counts 15 against 5 for the
   text, which the bonus (below 10) does not undo.
9. **No Font Awesome script.** The theme loads ``fontawesome.js`` (1.5 MB) on every page to
   turn its icons into SVG, "so that users can add custom icons"; the book adds none, and the
   theme's stylesheet draws the same icons from Font Awesome's web font (fetched only where an
   icon shows, about 150 kB). The script's tag is taken out of every page.
"""

from __future__ import annotations

import datetime
import functools
import html
import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import quote

from docutils import nodes
from sphinx.search import IndexBuilder
from sphinx.transforms.post_transforms import SphinxPostTransform

#: The search page's script (book/assets/static): snippets from the article text, and a note
#: instead of console errors when the site is opened from file://.
SEARCH_SCRIPT = "d2lattn-search.js"
#: How often each page uses each word (section 8): a script the search page loads before
#: SEARCH_SCRIPT, which reads the variable.
COUNTS_SCRIPT = "d2lattn-search-counts.js"
COUNTS_VARIABLE = "D2LATTN_SEARCH_COUNTS"

#: The file name of the whole book as a PDF, at the root of each language's site.
PDF_NAME = "how-attention-works.pdf"

_TEXT = {
    "en": {
        "plot": "Plot",
        "drawn": "drawn by the code cell above",
        "in": "in the section",
        "titles": "titles",
        "x": "horizontal axis",
        "y": "vertical axis",
        "legend": "legend",
        "version": "Version",
        "commit": "commit",
        "built": "built",
        "pdf": "The whole book as a PDF",
        "issue": "Report an error on this page",
        "edit": "Edit this page",
        "repo": "Source repository",
        "links": "This page",
        "issue_title": "Error on page {page}",
        "issue_body": "Page: {page} (source: {source})\n\nWhat is wrong, and where:\n",
        "note": (
            "**This notebook is a chapter of *How Attention Works*,** an executable textbook "
            "on attention, and it needs the rest of the book's repository: the `d2lattn` "
            "library it imports, and the figures and data next to it (`figures/`, `data/`).\n\n"
            "To run it, get the repository{where}, then from its root run "
            "`python -m pip install -r requirements.txt` (Python 3.11; this also installs "
            "JupyterLab with `jupyterlab-myst`, which renders the book's roles such as "
            "`{{term}}` and `{{cite}}`), and open this chapter as `book/{name}` with "
            "`jupyter lab book/`. The book's page \"Run it yourself\" says more."
        ),
        "where_url": " ({url}, e.g. `git clone {url}`)",
        "where_none": " (the source of the website you downloaded this from)",
    },
    "zh": {
        "plot": "图",
        "drawn": "由上面的代码单元绘制",
        "in": "所在小节",
        "titles": "标题",
        "x": "横轴",
        "y": "纵轴",
        "legend": "图例",
        "version": "版本",
        "commit": "提交",
        "built": "构建于",
        "pdf": "整本书的 PDF",
        "issue": "报告本页的错误",
        "edit": "编辑本页（翻译）",
        "repo": "源代码仓库",
        "links": "本页",
        "issue_title": "页面 {page} 有误",
        "issue_body": "页面：{page}（源文件：{source}）\n\n哪里有误：\n",
        "note": (
            "**这个 notebook 是《注意力如何工作》的一章，** 它需要本书仓库的其余部分："
            "它导入的 `d2lattn` 库，以及旁边的图和数据（`figures/`、`data/`）。\n\n"
            "要运行它，请获取仓库{where}，在仓库根目录运行 "
            "`python -m pip install -r requirements.txt`（Python 3.11；这也会安装 JupyterLab "
            "和 `jupyterlab-myst`，用来显示书中的 `{{term}}`、`{{cite}}` 等角色），"
            "然后用 `jupyter lab book/` 打开 `book/{name}`。书中“自己运行”一页有更多说明。"
        ),
        "where_url": "（{url}，例如 `git clone {url}`）",
        "where_none": "（即你下载这个文件的网站的源代码）",
    },
}


def _lang(config) -> str:
    return "zh" if (config.language or "en").lower().startswith("zh") else "en"


def _t(app, key: str) -> str:
    return _TEXT[_lang(app.config)][key]


# ---------------------------------------------------------------------------------------------
# 1. alt text for plots

_STRING = r"""[rf]?(?:"([^"\n]+)"|'([^'\n]+)')"""
_CALLS = {
    "titles": [r"set_title\(\s*" + _STRING, r"suptitle\(\s*" + _STRING, r"\btitle=" + _STRING],
    "x": [r"set_xlabel\(\s*" + _STRING, r"\bxlabel=" + _STRING],
    "y": [r"set_ylabel\(\s*" + _STRING, r"\bylabel=" + _STRING],
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


def _strings(code: str, patterns) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        for match in re.finditer(pattern, code):
            text = next(g for g in match.groups() if g is not None)
            text = re.sub(r"\{[^}]*\}", "…", text)  # f-string fields: not known here
            text = " ".join(text.replace("\\n", " ").split())
            if text and text not in found:
                found.append(text)
    return found


def describe_plot(code: str, section: str, lang: str = "en") -> str:
    """Alt text for a plot: what the drawing code says it shows, and where it is."""
    text = _TEXT[lang]
    kinds = [name for fn, name in _PLOT_FUNCTIONS.items() if re.search(rf"\.?\b{fn}\(", code)]
    titles = _strings(code, _CALLS["titles"])
    for listed in _LIST_ARG.findall(code):
        titles += [t for t in _strings(listed, [_STRING]) if t not in titles]
    parts = [text["plot"] + (f" ({', '.join(kinds[:2])})" if kinds and lang == "en" else "")]
    if titles:
        parts.append(f"{text['titles']}: " + "; ".join(titles[:6]))
    for key in ("x", "y", "legend"):
        found = _strings(code, _CALLS[key])
        if found:
            parts.append(f"{text[key]}: " + "; ".join(found[:6]))
    parts.append(text["drawn"])
    if section:
        parts.append(f"{text['in']} “{section}”")
    return ", ".join(parts) + "."


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


class PlotAltText(SphinxPostTransform):
    """Give every image of a notebook cell's output a description (see the module's 1.)."""

    default_priority = 400
    formats = ("html",)

    def run(self, **kwargs) -> None:
        lang = _lang(self.config)
        for image in list(self.document.findall(nodes.image)):
            cell = image.parent
            while cell is not None and "cell" not in cell.get("classes", ()):
                cell = cell.parent
            if cell is None:
                continue
            alt = image.get("alt", "")
            if alt and not alt.endswith((".png", ".jpg", ".jpeg", ".svg")):
                continue  # a description given by the author wins
            image["alt"] = describe_plot(_cell_code(cell), _section_title(image), lang)


# ---------------------------------------------------------------------------------------------
# 2. footer: version, commit, build date


def _version(srcdir: Path) -> str:
    init = srcdir / "d2lattn" / "__init__.py"
    if init.is_file():
        match = re.search(r'^__version__\s*=\s*"([^"]+)"', init.read_text(encoding="utf-8"), re.M)
        if match:
            return match.group(1)
    return ""


def _commit(srcdir: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=srcdir,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def build_date() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch
            else datetime.datetime.now(datetime.timezone.utc))
    return when.strftime("%Y-%m-%d")


def footer_html(app) -> str:
    srcdir = Path(app.srcdir)
    version, commit = _version(srcdir), _commit(srcdir)
    bits = []
    if version:
        bits.append(f"{_t(app, 'version')} {html.escape(version)}")
    if commit:
        bits.append(f"{_t(app, 'commit')} <code>{html.escape(commit)}</code>")
    bits.append(f"{_t(app, 'built')} <time datetime=\"{build_date()}\">{build_date()}</time>")
    return f'<p class="d2lattn-build-info">{" · ".join(bits)}</p>'


# ---------------------------------------------------------------------------------------------
# 3, 4. links to the source and to the PDF

_BUTTONS = ("use_repository_button", "use_issues_button", "use_edit_page_button")


def repository_url(config) -> str:
    return str((config.html_theme_options or {}).get("repository_url") or "").rstrip("/")


def _config_inited(app, config) -> None:
    options = dict(config.html_theme_options or {})
    if repository_url(config):
        # Jupyter Book refuses these switches without an address, so _config.yml leaves them
        # off and they follow the address here.
        for button in _BUTTONS:
            options[button] = True
    options["extra_footer"] = (options.get("extra_footer") or "") + footer_html(app)
    config.html_theme_options = options


def _source_path(app, pagename: str) -> str:
    try:
        path = app.env.doc2path(pagename, False)
    except Exception:  # noqa: BLE001 - pages without a source (search, genindex)
        return ""
    return str(path).replace(os.sep, "/")


def page_links(app, pagename: str, pathto) -> str:
    """The links at the end of a page: the PDF, and the source links when an address is set."""
    links = [f'<a class="d2lattn-pdf-link" href="{html.escape(pathto(PDF_NAME, 1))}">'
             f'{_t(app, "pdf")}</a>']
    url = repository_url(app.config)
    source = _source_path(app, pagename)
    if url and source:
        options = app.config.html_theme_options or {}
        branch = options.get("repository_branch") or "main"
        book = str(options.get("path_to_docs") or "").strip("/")
        if _lang(app.config) == "zh":  # the Chinese text lives in the page's catalogue
            source_file = f"locale/{app.config.language}/LC_MESSAGES/{pagename}.po"
        else:
            source_file = "/".join(p for p in (book, source) if p)
        title = _t(app, "issue_title").format(page=pagename)
        body = _t(app, "issue_body").format(page=f"{pagename}.html", source=source_file)
        if "gitlab" in url:
            issue = (f"{url}/-/issues/new?issue[title]={quote(title)}"
                     f"&issue[description]={quote(body)}")
            edit = f"{url}/-/edit/{branch}/{source_file}"
        else:
            issue = f"{url}/issues/new?title={quote(title)}&body={quote(body)}"
            edit = f"{url}/edit/{branch}/{source_file}"
        links += [
            f'<a class="d2lattn-issue-link" href="{html.escape(issue)}">{_t(app, "issue")}</a>',
            f'<a class="d2lattn-edit-link" href="{html.escape(edit)}">{_t(app, "edit")}</a>',
            f'<a class="d2lattn-repo-link" href="{html.escape(url)}">{_t(app, "repo")}</a>',
        ]
    return (f'<nav class="d2lattn-page-links" aria-label="{_t(app, "links")}">'
            + " · ".join(links) + "</nav>")


def _page_context(app, pagename, templatename, context, doctree) -> None:
    if pagename == "search":  # snippets from the article; a note instead of errors on file://
        # ranking by use (section 8; the file is written when the index is, after this page)
        if isinstance(getattr(app.builder, "indexer", None), CountingIndexBuilder):
            app.add_js_file(COUNTS_SCRIPT, loading_method="defer")
        app.add_js_file(SEARCH_SCRIPT, loading_method="defer")
    if "body" in context:
        context["body"] = context["body"] + page_links(app, pagename, context["pathto"])


# ---------------------------------------------------------------------------------------------
# 5, 6. downloads and the root page


def notebook_note(app, name: str) -> str:
    url = repository_url(app.config)
    where = (_t(app, "where_url").format(url=url) if url else _t(app, "where_none"))
    return _t(app, "note").format(where=where, name=name)


def add_note_to_notebook(path: Path, note: str) -> None:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    cells = notebook.get("cells", [])
    if cells and cells[0].get("metadata", {}).get("d2lattn_download_note"):
        return
    cells.insert(0, {"cell_type": "markdown", "id": "d2lattn-download-note",
                     "metadata": {"d2lattn_download_note": True}, "source": note})
    notebook["cells"] = cells
    path.write_text(json.dumps(notebook, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


_DOWNLOAD_LINK = re.compile(
    r'<a href="([^"]+\.ipynb)" target="_blank"\s+class="btn btn-sm btn-download-source-button')


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


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    _write_counts(app)
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        new = _DOWNLOAD_LINK.sub(
            r'<a href="\1" download class="btn btn-sm btn-download-source-button', text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    title = html.escape(app.config.html_title or "")
    twice = f"<title>{title} &#8212; {title}</title>"
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        new = _PLOT_IMG.sub(lambda m: _with_min_width(m, out), text)
        new = _unique_ids(new)
        new = without_fontawesome_script(new)
        # the landing page's title is the book's title, once (the theme appends it to every
        # page's own title)
        new = new.replace(twice, f"<title>{title}</title>") if title else new
        if new != text:
            page.write_text(new, encoding="utf-8")
    for notebook in (out / "_sources").rglob("*.ipynb"):
        add_note_to_notebook(notebook, notebook_note(app, notebook.name))
    root = out / "index.html"
    if root.is_file():
        text = root.read_text(encoding="utf-8")
        if "<html" not in text:
            lang = "zh-CN" if _lang(app.config) == "zh" else "en"
            title = html.escape(app.config.html_title or app.config.project or "")
            root.write_text(f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n'
                            f'<meta charset="utf-8" />\n<title>{title}</title>\n{text.strip()}\n'
                            "</head>\n<body></body>\n</html>\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# 8. search ranking: how often each page uses each word


class CountingIndexBuilder(IndexBuilder):
    """Sphinx's search index, which also counts how many times each page uses each word.

    The words are counted exactly as Sphinx indexes them (the same collector, splitter,
    stemmer and filter), in the headings and the text. ``freeze`` leaves the index as Sphinx
    writes it (the theme loads ``searchindex.js`` on every page) and keeps the table
    ``{word: {document index: count}}``, counts of 2 or more, for ``_write_counts``.
    An incremental build counts only the pages it rewrites (``tools/book.py`` builds all).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._d2lattn_counts: dict = {}
        self.d2lattn_table: dict | None = None
        _fast_latin_terms(self.lang)

    def prune(self, docnames) -> None:
        super().prune(docnames)
        keep = set(docnames)
        self._d2lattn_counts = {d: c for d, c in self._d2lattn_counts.items() if d in keep}

    def feed(self, docname, filename, title, doctree) -> None:
        super().feed(docname, filename, title, doctree)
        self._d2lattn_counts[docname] = self.term_counts(doctree)

    def term_counts(self, doctree) -> dict:
        """``{indexed word: occurrences}`` in the page's text, headings included (the collector
        takes a heading's words once more for the titles alone, not counted here)."""
        store = self._word_collector(doctree)
        keep, stem = self.lang.word_filter, functools.cache(lambda w: self.lang.stem(w).lower())
        counts: dict = {}
        for word in store.words:
            stemmed = stem(word)
            if not keep(stemmed) and keep(word):
                stemmed = word
            if keep(stemmed):
                counts[stemmed] = counts.get(stemmed, 0) + 1
        return counts

    def freeze(self) -> dict:
        frozen = super().freeze()
        index = {docname: i for i, docname in enumerate(frozen["docnames"])}
        table: dict = {}
        for docname, counts in sorted(self._d2lattn_counts.items()):
            if docname not in index:
                continue
            for word, count in counts.items():
                if count > 1:
                    table.setdefault(word, {})[index[docname]] = count
        self.d2lattn_table = {word: table[word] for word in sorted(table)}
        return frozen


class _TermSet(set):
    """A set that takes ``list.extend``: Sphinx's Chinese search keeps every Latin word it has
    split in a list (``SearchChinese.latin_terms``, which only ``split`` extends and only
    ``stem`` reads, as ``word in latin_terms``) and scans it on every ``stem`` call. The list
    grows with every page split, so the Chinese build spent most of its time in that scan
    (401 of 477 s in one profile). A set answers the same question at once."""

    extend = set.update


def _fast_latin_terms(lang) -> None:
    """Swap the Chinese search's list of Latin words for a ``_TermSet`` (same answers)."""
    terms = getattr(lang, "latin_terms", None)
    if isinstance(terms, list) and not isinstance(terms, _TermSet):
        lang.latin_terms = _TermSet(terms)


def _counting_index(app) -> None:
    """Let the HTML builder's search index count words (it imports IndexBuilder when it makes
    the index, so the subclass takes its place in ``sphinx.search`` for this build)."""
    import sphinx.search

    if app.builder.format == "html":
        sphinx.search.IndexBuilder = CountingIndexBuilder


# ---------------------------------------------------------------------------------------------
# 9. no Font Awesome script: the theme's stylesheet draws its icons from the web font

_FONTAWESOME_SCRIPT = re.compile(
    r'[ \t]*<script defer src="(?:\.\./)*_static/scripts/fontawesome\.js[^"]*"></script>\n?')


def without_fontawesome_script(text: str) -> str:
    return _FONTAWESOME_SCRIPT.sub("", text)


def _write_counts(app) -> None:
    """The counts of section 8, for the search page only (``_static/`` + ``COUNTS_SCRIPT``)."""
    table = getattr(getattr(app.builder, "indexer", None), "d2lattn_table", None)
    if table is None:
        return
    path = Path(app.outdir) / "_static" / COUNTS_SCRIPT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"var {COUNTS_VARIABLE} = "
                    + json.dumps(table, ensure_ascii=False, separators=(",", ":")) + ";\n",
                    encoding="utf-8")


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
    app.connect("builder-inited", _singlehtml_handlers)
    app.connect("builder-inited", _counting_index)
    app.add_post_transform(PlotAltText)
    app.connect("config-inited", _config_inited, priority=900)
    app.connect("html-page-context", _page_context)
    # after sphinx-external-toc's own handler, which writes the redirecting index.html
    app.connect("build-finished", _build_finished, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
