"""Sphinx extension: one source, two languages (English at the site root, Chinese under ``zh/``).

The Chinese site is built from the same notebooks and Markdown pages with Sphinx's gettext
workflow (``tools/book.py`` drives it; ``locale/zh_CN/LC_MESSAGES/`` holds the translations).
This extension does two things for both builds:

1. **Outputs stay as computed.** Only prose is translated. Every node inside a notebook cell's
   output (a table a cell printed as Markdown, say) and inside any element with the class
   ``notranslate`` (the chapter-times table, read from a file the tests rewrite) is marked
   untranslatable, so it is neither extracted into the catalogues nor replaced at build time.
2. **Chinese search that finds Chinese words.** Sphinx indexes Chinese text split into words by
   jieba, but the search page splits a query only at spaces and punctuation, so a query such
   as 注意力汇聚 (one run of characters) matched nothing unless it was itself one indexed word.
   The search language below splits each run of Chinese characters in the query into the
   longest words the index holds, left to right, the way jieba split the text.
3. **A language switcher on every page**: a visible link to the same page in the other
   language, with ``hreflang`` and ``lang``, plus a ``<link rel="alternate">`` for each
   language in the page head. The links are relative (``zh/book/ch1.html`` from the English
   page, ``../book/ch1.html`` back), so they work offline and from ``file://``; following it
   keeps the section anchor (the ``#...`` of the address), so a reader switching language
   lands on the same section.

And, for the Chinese build only (``language`` zh_CN):

4. **Interactive figures in Chinese**: each figure's data is rewritten through the catalogue
   ``locale/zh_CN/LC_MESSAGES/interactive.po`` (see ``d2lattn_translate.py``).
5. **Chinese notebooks**: the download button of a chapter serves a Chinese ``.ipynb``, its
   Markdown cells from the page's catalogue, its code and outputs as committed.
6. **Chinese citations**: ``{cite:t}`` reads "Bahdanau 等人 [2015]" (the reference style
   ``author_year_zh``, registered here and selected by ``tools/book.py``).
7. **The interface in mainland Chinese**: strings of the theme and of Sphinx the book
   overrides live in ``locale/zh_CN/LC_MESSAGES/{booktheme,sphinx}.po`` (打印, not 列印;
   "Link to this heading" and its siblings), and an exercise's solution is titled
   练习 1.1 解答, not 解答 练习 1.1.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from docutils import nodes
from sphinx.search.zh import SearchChinese
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform

#: The subdirectory of the English site that holds the Chinese one.
ZH_DIR = "zh"
_LABEL = {"en": "English", "zh": "中文"}
_UNTRANSLATED_CLASSES = {"cell_output", "notranslate"}
#: The switcher link's click handler: go to the same section (the page's current #anchor);
#: both languages' pages have the same ids (Sphinx keeps the English ids of translated titles).
_KEEP_ANCHOR = "if(location.hash){this.href=this.href.split('#')[0]+location.hash}"


class KeepOutputsUntranslated(SphinxTransform):
    """Mark notebook outputs and ``notranslate`` elements as not translatable.

    Runs before Sphinx's ``Locale`` transform (priority 20), which replaces translatable text,
    and therefore also before the gettext builder extracts messages.
    """

    default_priority = 10

    def apply(self, **kwargs) -> None:
        for element in list(self.document.findall(nodes.Element)):
            if _UNTRANSLATED_CLASSES.intersection(element.get("classes", ())):
                for node in element.findall(nodes.TextElement):
                    node["translatable"] = False


class TranslateDisplayMath(SphinxTransform):
    """Put a display formula's translation (its words in ``\\text{}``) into the page.

    Sphinx's ``Locale`` transform translates a ``math_block`` by parsing ``"::"`` plus the
    indented message as reStructuredText's literal-block notation; the pages are MyST, where
    that parses as the paragraph ``::``, so every translated display formula came out as
    ``\\[::\\]``. This transform runs first (priority 19 < 20) and replaces the formula's
    text with the catalogue's message; ``Locale`` then finds no message for the new text and
    leaves it alone. Untranslated formulas (message equal to the source) are left as they are.
    """

    default_priority = 19

    def apply(self, **kwargs) -> None:
        from os import path

        from sphinx.locale import init as init_locale
        from sphinx.util.i18n import docname_to_domain

        language = self.config.language
        if not language or language == "en" or self.app.builder.name == "gettext":
            return
        textdomain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        dirs = [path.join(self.env.srcdir, d) for d in self.config.locale_dirs]
        catalog, has_catalog = init_locale(dirs, language, textdomain)
        if not has_catalog:
            return
        for node in list(self.document.findall(nodes.math_block)):
            msg = node.rawsource or node.astext()
            msgstr = catalog.gettext(msg)
            if msgstr and msgstr != msg:
                node.children = []
                node += nodes.Text(msgstr)
                node.rawsource = msgstr


class SearchChineseQueries(SearchChinese):
    """Sphinx's Chinese search, with a query splitter that knows the index's words."""

    js_splitter_code = r"""
var splitQuery = (query) => {
  const han = /[\u3400-\u9fff\uf900-\ufaff]/;
  const index = (typeof Search !== "undefined" && Search._index) || null;
  const known = (w) => index !== null && (w in index.terms || w in index.titleterms);
  const out = [];
  const words = query.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu).filter(w => w);
  for (const word of words) {
    for (const run of word.match(/[\u3400-\u9fff\uf900-\ufaff]+|[^\u3400-\u9fff\uf900-\ufaff]+/g)) {
      if (!han.test(run) || index === null) { out.push(run); continue; }
      for (let i = 0; i < run.length;) {  // longest indexed word first, left to right
        let j = Math.min(run.length, i + 8);
        while (j > i + 1 && !known(run.slice(i, j))) j--;
        if (known(run.slice(i, j))) out.push(run.slice(i, j));
        i = j;  // a single character the index lacks is dropped, not required
      }
    }
  }
  return out;
};
"""


class DropMessageDocuments(SphinxTransform):
    """Translated nodes forget the little document each message was parsed in.

    Sphinx parses every translated message as a document of its own and moves its nodes into
    the page; each moved node still points at that document (``_document``: its settings, its
    reporter, every node of the message), and the page's pickled doctree carried them all:
    ch12's was 985 kB instead of 230 kB, and reading the Chinese doctrees back took most of
    the Chinese build's writing time. Without the pointer a node finds the page's document
    through its parents, as every other node does."""

    default_priority = 25  # right after Sphinx's Locale transform (20)

    def apply(self, **kwargs) -> None:
        document = self.document
        for node in document.findall():
            if getattr(node, "_document", None) not in (None, document):
                node._document = None


def _is_chinese(app) -> bool:
    return (app.config.language or "en").lower().startswith("zh")


def _switcher(app, pagename, templatename, context, doctree) -> None:
    depth = pagename.count("/")
    up = "../" * depth
    if _is_chinese(app):
        here, there = "zh", "en"
        href = f"{up}../{pagename}.html"
    else:
        here, there = "en", "zh"
        href = f"{up}{ZH_DIR}/{pagename}.html"
    own = f"{pagename.rsplit('/', 1)[-1]}.html"
    href_attr = html.escape(href, quote=True)
    context["metatags"] = context.get("metatags", "") + (
        f'\n<link rel="alternate" hreflang="{here}" href="{html.escape(own, quote=True)}" />'
        f'\n<link rel="alternate" hreflang="{there}" href="{href_attr}" />'
    )
    link = (
        f'<div class="d2lattn-lang-switch"><a class="d2lattn-lang-link" href="{href_attr}" '
        f'hreflang="{there}" lang="{there}" onclick="{_KEEP_ANCHOR}">{_LABEL[there]}</a></div>\n'
    )
    if "body" in context:
        context["body"] = link + context["body"]


# --- Chinese build: figures, notebooks, citations, interface --------------------------------


def _locale_file(app, name: str) -> Path:
    for locale_dir in app.config.locale_dirs:
        path = Path(app.srcdir, locale_dir, app.config.language, "LC_MESSAGES", name)
        if path.exists():
            return path
    return Path(app.srcdir, "locale", app.config.language or "", "LC_MESSAGES", name)


def _translate():
    import d2lattn_translate  # book/_ext, on sys.path as a local extension folder

    return d2lattn_translate


class TranslateInteractiveFigures(SphinxTransform):
    """Chinese build: rewrite each interactive figure's strings through interactive.po."""

    default_priority = 30  # after the Locale transform

    def apply(self, **kwargs) -> None:
        if not _is_chinese(self.app):
            return
        table = getattr(self.app, "_d2lattn_viz_table", None)
        if table is None:
            translate = _translate()
            table = translate.load_catalogue(_locale_file(self.app, translate.VIZ_CATALOGUE + ".po"))
            self.app._d2lattn_viz_table = table
        for raw in list(self.document.findall(nodes.raw)):
            text = raw.astext()
            if 'class="d2lattn-viz"' in text:
                new = _translate().translate_viz_html(text, table)
                raw.replace_self(nodes.raw("", new, format=raw.get("format", "html")))


def _write_chinese_notebooks(app, exception) -> None:
    """Chinese build: the download button's ``_sources/<page>.ipynb`` becomes the Chinese
    notebook (Markdown from the page's catalogue; code, outputs and figures as committed)."""
    if exception is not None or not _is_chinese(app) or app.builder.format != "html":
        return
    translate = _translate()
    viz = translate.load_catalogue(_locale_file(app, translate.VIZ_CATALOGUE + ".po"))
    for docname in sorted(app.env.found_docs):
        source = Path(app.env.doc2path(docname))
        target = Path(app.outdir, "_sources", docname + ".ipynb")
        if source.suffix != ".ipynb" or not target.exists():
            continue
        table = translate.load_catalogue(_locale_file(app, docname + ".po"))
        notebook = json.loads(source.read_text(encoding="utf-8"))
        chinese = translate.translate_notebook(notebook, table, viz, language=app.config.language)
        target.write_text(json.dumps(chinese, ensure_ascii=False, indent=1) + "\n",
                          encoding="utf-8")


def _register_citation_style() -> None:
    """``author_year_zh``: sphinxcontrib-bibtex's author-year style with 等人 for "et al.",
    和 for "and", and full-width separators: {cite:t} reads "Bahdanau 等人 [2015]"."""
    import sphinxcontrib.bibtex.plugin
    from sphinxcontrib.bibtex.style.referencing import BracketStyle, PersonStyle
    from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

    def chinese_person() -> PersonStyle:
        return PersonStyle(sep="、", sep2=" 和 ", last_sep=" 和 ", other=" 等人")

    def chinese_bracket() -> BracketStyle:
        return BracketStyle(sep="；", sep2="；", last_sep="；")

    @dataclass
    class ChineseAuthorYearStyle(AuthorYearReferenceStyle):
        person: PersonStyle = field(default_factory=chinese_person)
        bracket_parenthetical: BracketStyle = field(default_factory=chinese_bracket)
        bracket_textual: BracketStyle = field(default_factory=chinese_bracket)
        author_year_sep: str = "，"

    sphinxcontrib.bibtex.plugin.register_plugin(
        "sphinxcontrib.bibtex.style.referencing", "author_year_zh", ChineseAuthorYearStyle)


#: Message catalogues of other packages whose Chinese the book overrides (file in
#: locale/zh_CN/LC_MESSAGES/ -> gettext domain); Sphinx's own ``sphinx.po`` there is loaded by
#: Sphinx itself.
_OVERRIDDEN_CATALOGUES = {"booktheme.po": "booktheme"}


def _override_interface_catalogues(app) -> None:
    if not _is_chinese(app):
        return
    import gettext

    from sphinx import locale
    from sphinx.util.i18n import CatalogInfo

    for name, domain in _OVERRIDDEN_CATALOGUES.items():
        po = _locale_file(app, name)
        if not po.exists():
            continue
        info = CatalogInfo(str(po.parent), domain, "utf-8")
        if info.is_outdated():
            info.write_mo(app.config.language)
        ours = gettext.translation(domain, localedir=str(po.parent.parent.parent),
                                   languages=[app.config.language])
        theirs = locale.translators.get(("general", domain))
        if theirs is not None:
            ours.add_fallback(theirs)
        locale.translators[("general", domain)] = ours


class ChineseSolutionTitles(SphinxPostTransform):
    """Chinese build: sphinx-exercise titles a solution "Solution to" + "Exercise 1.1", which
    reads 解答 练习 1.1; Chinese puts it the other way round: 练习 1.1 解答."""

    default_priority = 25  # after sphinx-exercise resolves the titles (21, 22)

    def run(self, **kwargs) -> None:
        if not _is_chinese(self.app):
            return
        try:
            from sphinx_exercise.nodes import solution_node
        except ImportError:
            return
        from sphinx.locale import get_translation

        solution_to = get_translation("exercise")("Solution to")
        for node in self.document.findall(solution_node):
            title = node.children[0] if node.children else None
            if not isinstance(title, nodes.title) or len(title.children) < 2:
                continue
            first, reference = title.children[0], title.children[1]
            if not (isinstance(first, nodes.Text) and str(first).strip() == str(solution_to)):
                continue
            title.remove(first)
            if reference.children and isinstance(reference.children[0], nodes.Text):
                reference.replace(reference.children[0],
                                  nodes.Text(str(reference.children[0]).lstrip()))
            title += nodes.Text(f" {solution_to}")


#: Interface text the themes write without a translation function (tooltips of the sidebar
#: buttons, the search box's placeholder): replaced in the Chinese pages as they are written.
_CHROME = {
    'title="Toggle primary sidebar"': 'title="显示或隐藏目录"',
    'title="Toggle secondary sidebar"': 'title="显示或隐藏本页目录"',
    'aria-label="Main"': 'aria-label="全书目录"',
    '<nav aria-label="Page">': '<nav aria-label="本页">',
}
ZH_SEARCH_BAR_TEXT = "搜索本书……"


def _chinese_theme_options(app, config) -> None:
    if _is_chinese(app):
        config.html_theme_options = dict(config.html_theme_options or {},
                                         search_bar_text=ZH_SEARCH_BAR_TEXT)


def _chinese_chrome(app) -> None:
    """Chinese build: pass every rendered page through the _CHROME replacements."""
    templates = getattr(app.builder, "templates", None)
    if not _is_chinese(app) or templates is None or getattr(templates, "_d2lattn_zh", False):
        return
    original = templates.render

    def render(template, context):
        text = original(template, context)
        for english, chinese in _CHROME.items():
            text = text.replace(english, chinese)
        return text

    templates.render = render
    templates._d2lattn_zh = True


def setup(app):
    _register_citation_style()
    app.connect("config-inited", _chinese_theme_options)
    app.connect("builder-inited", _chinese_chrome)
    app.add_transform(TranslateInteractiveFigures)
    app.add_post_transform(ChineseSolutionTitles)
    app.connect("builder-inited", _override_interface_catalogues)
    app.connect("build-finished", _write_chinese_notebooks)
    app.add_transform(KeepOutputsUntranslated)
    app.add_transform(TranslateDisplayMath)
    app.add_transform(DropMessageDocuments)
    app.add_search_language(SearchChineseQueries)
    app.connect("html-page-context", _switcher)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
