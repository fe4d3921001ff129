"""Search ranks a page by how often it uses the query's words (book/_ext/d2lattn_search.py, 2).

Sphinx's search index records only which pages hold a word: every page that names it once tied
with the chapter about it, and ties went by title, so "rotary" listed the induction-heads
chapter (one mention) above the Transformer chapter (47). This test builds a stub of the book
(the real configuration and extensions, each page a one-line stub, as in
``book_helpers.stub_book``) in which three pages use a made-up word: one names it once and has
the title that sorts first, one uses it twelve times, and one has it in a heading. It checks
the counts in the index, and the order of the results in headless Chromium: the heading first
(Sphinx's own rule, kept), then the page that uses the word most, then the single mention.
The same stub checks that no page loads the theme's Font Awesome script (section 9).
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
from book_helpers import build_html, config_with, new_stub_book, notebook

from test_site import CHROMIUM_ARGS, LOCAL_HOST, SEARCH_RESULTS, _chromium, _missing, _QuietHandler

WORD = "zorbital"  # in no dictionary, so that only the three pages below hold it
ONCE = "book/ch11_induction_heads"
MOST = "book/ch8_transformer"
HEADING = "book/ch6_positional_encoding"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = new_stub_book(tmp_path_factory)
    # the page with one mention has the title that sorts first: Sphinx alone ranks it first
    (folder / f"{ONCE}.ipynb").write_text(
        notebook("# A page that names it once\n", f"An aside on {WORD} things.\n"))
    sentences = " ".join(f"Sentence {i} uses {WORD} again." for i in range(12))
    (folder / f"{MOST}.ipynb").write_text(
        notebook("# The page that uses it most\n", sentences + "\n"))
    (folder / f"{HEADING}.ipynb").write_text(
        notebook("# Positions\n", f"## The {WORD} section\n", "Nothing more here.\n"))
    return build_html(folder, config_with(folder, ""))


def _index(site: Path) -> dict:
    text = (site / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1:text.rindex(")")])


def _counts(site: Path) -> dict:
    text = (site / "_static" / "d2lattn-search-counts.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("=") + 1:text.rindex(";")])


def test_the_index_counts_each_pages_uses_of_a_word(site):
    index = _index(site)
    doc = {name: i for i, name in enumerate(index["docnames"])}
    stemmed = "zorbit"  # Sphinx's English stemmer, as the search page applies it
    assert stemmed in index["terms"], sorted(w for w in index["terms"] if w.startswith("zorb"))
    counts = _counts(site)[stemmed]
    assert counts == {str(doc[MOST]): 12}, counts  # counts of 1 are implied by the index
    # the table is for the search page alone: the index the theme loads on every page is
    # Sphinx's own, and only the search page loads the counts
    assert "d2lattn" not in (site / "searchindex.js").read_text(encoding="utf-8")
    assert "d2lattn-search-counts.js" in (site / "search.html").read_text(encoding="utf-8")
    assert "d2lattn-search-counts.js" not in (site / f"{MOST}.html").read_text(encoding="utf-8")


def test_no_page_loads_the_font_awesome_script(site):
    pages = [p for p in site.rglob("*.html") if "_static" not in p.parts]
    assert len(pages) > 20
    for page in pages:
        assert "scripts/fontawesome.js" not in page.read_text(encoding="utf-8"), page
    # the icons come from the theme's stylesheet and web font instead
    css = (site / "_static" / "styles" / "pydata-sphinx-theme.css").read_text(encoding="utf-8")
    assert "fa-solid-900.woff2" in css and ".fa-magnifying-glass" in css


def test_search_ranks_by_heading_then_by_uses(site):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the `playwright` Python package is not installed")
    executable = _chromium()
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    errors: list = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True,
                                         args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://{LOCAL_HOST}:{server.server_address[1]}/search.html"
                      f"?q={quote(WORD)}", wait_until="load")
            hits = page.evaluate(SEARCH_RESULTS)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert errors == [], errors
    pages = []  # the pages in the order of their first result
    for hit in hits:
        path = hit.split("#")[0].split("?")[0]
        name = next((n for n in (HEADING, MOST, ONCE) if path.endswith(f"{n}.html")), path)
        if name not in pages:
            pages.append(name)
    assert pages == [HEADING, MOST, ONCE], hits


def test_chinese_stemming_keeps_its_answers_and_stops_scanning_a_list():
    """Sphinx's Chinese search kept every Latin word it split in a list and scanned it on each
    stem() call (most of the Chinese build's time); the index builder swaps in a set. The answers
    are the same, word for word, and the lookup no longer walks a list."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
    import d2lattn_search
    from sphinx.search.zh import SearchChinese

    text = "注意力 attention softmax ALiBi GQA KV cache 的 RoPE ids GPT mha " * 3
    words = ["attention", "ids", "GPT", "mha", "KV", "RoPE", "caching", "zz", "softmax"]
    plain = SearchChinese({})
    plain.latin_terms = []
    plain.split(text)
    fast = SearchChinese({})
    d2lattn_search._fast_latin_terms(fast)
    assert isinstance(fast.latin_terms, set)
    fast.latin_terms.clear()
    fast.split(text)
    assert [fast.stem(w) for w in words] == [plain.stem(w) for w in words]
    assert "GPT" in fast.latin_terms and len(fast.latin_terms) < len(plain.latin_terms)
