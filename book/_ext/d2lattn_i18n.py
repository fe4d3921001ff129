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
   page, ``../book/ch1.html`` back), so they work offline and from ``file://``.
"""

from __future__ import annotations

import html

from docutils import nodes
from sphinx.search.zh import SearchChinese
from sphinx.transforms import SphinxTransform

#: The subdirectory of the English site that holds the Chinese one.
ZH_DIR = "zh"
_LABEL = {"en": "English", "zh": "中文"}
_UNTRANSLATED_CLASSES = {"cell_output", "notranslate"}


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
        f'hreflang="{there}" lang="{there}">{_LABEL[there]}</a></div>\n'
    )
    if "body" in context:
        context["body"] = link + context["body"]


def setup(app):
    app.add_transform(KeepOutputsUntranslated)
    app.add_search_language(SearchChineseQueries)
    app.connect("html-page-context", _switcher)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
