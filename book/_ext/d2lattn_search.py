"""Sphinx extension: the search page (part of ``d2lattn_reader``).

1. The search page takes its snippets from the article text, and over ``file://`` (where a
   browser refuses to fetch the pages snippets are cut from) lists results without snippets and
   says how to get them, instead of logging an error per result (``d2lattn-search.js``).
2. **Search ranks by how often a page uses the words.** Sphinx's index records only *which*
   pages hold a word, so every page that mentions it once ties with the chapter about it, and
   ties are broken by title (a page that names "rotary" once outranked the chapter that uses
   it 47 times). The build also counts, for each word, how many times each page uses it
   (``_static/d2lattn-search-counts.js``, loaded by the search page alone; only counts of 2 or
   more, as a page listed for a word uses it at least once), and the search page adds to
   Sphinx's score a bonus that grows with that count n, 9.9 (1 - 1/n) (``d2lattn-search.js``):
   pages rank by their number of uses, and Sphinx's own weights stay, a word in a page's
   headings still counts 15 against 5 for the text, which the bonus (below 10) does not undo.
3. **A Chinese index in seconds**: Sphinx's Chinese search language scans a list of every Latin
   word split so far on each ``stem`` call; it gets a set instead (``_TermSet``).

The pages other than the search page do not load the index (``d2lattn_pages.py``, 3.).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from sphinx.search import IndexBuilder

#: The search page's script (book/assets/static): snippets from the article text, and a note
#: instead of console errors when the site is opened from file://.
SEARCH_SCRIPT = "d2lattn-search.js"
#: How often each page uses each word (2.): a script the search page loads before
#: SEARCH_SCRIPT, which reads the variable.
COUNTS_SCRIPT = "d2lattn-search-counts.js"
COUNTS_VARIABLE = "D2LATTN_SEARCH_COUNTS"


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
        self._d2lattn_words = None
        super().feed(docname, filename, title, doctree)
        self._d2lattn_counts[docname] = self.term_counts(doctree)
        self._d2lattn_words = None

    def _word_collector(self, doctree):
        # Sphinx's feed and term_counts read the same page's words: split them once (jieba
        # splitting is most of the Chinese index's time)
        cached = getattr(self, "_d2lattn_words", None)
        if cached is not None and cached[0] is doctree:
            return cached[1]
        store = super()._word_collector(doctree)
        self._d2lattn_words = (doctree, store)
        return store

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


def _write_counts(app) -> None:
    """The counts of 2., for the search page only (``_static/`` + ``COUNTS_SCRIPT``)."""
    table = getattr(getattr(app.builder, "indexer", None), "d2lattn_table", None)
    if table is None:
        return
    path = Path(app.outdir) / "_static" / COUNTS_SCRIPT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"var {COUNTS_VARIABLE} = "
                    + json.dumps(table, ensure_ascii=False, separators=(",", ":")) + ";\n",
                    encoding="utf-8")


def _page_context(app, pagename, templatename, context, doctree) -> None:
    if pagename == "search":  # snippets from the article; a note instead of errors on file://
        # ranking by use (2.; the file is written when the index is, after this page)
        if isinstance(getattr(app.builder, "indexer", None), CountingIndexBuilder):
            app.add_js_file(COUNTS_SCRIPT, loading_method="defer")
        app.add_js_file(SEARCH_SCRIPT, loading_method="defer")


def _build_finished(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        _write_counts(app)


def setup(app):
    app.connect("builder-inited", _counting_index)
    app.connect("html-page-context", _page_context)
    app.connect("build-finished", _build_finished)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
