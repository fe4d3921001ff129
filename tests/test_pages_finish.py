"""The English build's finishing step (book/_ext/d2lattn_pages.py) leaves a nested site alone.

The Chinese site is built into ``zh/`` inside the English one, by its own Sphinx run, which
finishes its own pages. An English-only build (``tools/book.py build --language en``) over an
existing Chinese site used to walk into ``zh/`` as well and strip the search scripts from
``zh/search.html``, breaking Chinese search until the next full build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))

import d2lattn_pages  # noqa: E402

SCRIPTS = ('<script src="_static/searchtools.js"></script>\n'
           '<script src="searchindex.js"></script>\n')


def test_an_english_build_does_not_touch_the_chinese_site(tmp_path):
    out = tmp_path / "html"
    (out / "zh").mkdir(parents=True)
    (out / "searchindex.js").write_text("x")
    (out / "zh" / "searchindex.js").write_text("x")
    (out / "ch1.html").write_text(f"<head>{SCRIPTS}</head>")
    (out / "search.html").write_text(f"<head>{SCRIPTS}</head>")
    for name in ("search.html", "ch1.html"):
        (out / "zh" / name).write_text(f"<head>{SCRIPTS}</head>")
    app = SimpleNamespace(outdir=str(out), builder=SimpleNamespace(format="html"),
                          config=SimpleNamespace(html_title="", project="",
                                                 html_theme_options={}))
    d2lattn_pages._build_finished(app, None)
    assert "searchindex.js" not in (out / "ch1.html").read_text()  # finished here
    assert "searchindex.js" in (out / "search.html").read_text()  # the search page keeps it
    for name in ("search.html", "ch1.html"):  # the nested site: its own build's business
        assert (out / "zh" / name).read_text() == f"<head>{SCRIPTS}</head>"


def test_printed_tables_are_marked_to_keep_their_columns():
    """Output laid out in columns gets the class that keeps its lines (d2lattn.css); a message,
    code, and an output of one or two lines do not."""
    from d2lattn_pages import is_table, mark_table_outputs

    table = ("<div class=\"output stream highlight-myst-ansi notranslate\"><div class=\"highlight\">"
             "<pre><span></span>decoding     bits   distinct\ngreedy       2.10   0.31\n"
             "top-p 0.9    2.31   0.64\n</pre></div></div>")
    assert 'pre class="d2lattn-table-output"' in mark_table_outputs(table)
    message = table.replace("decoding     bits   distinct\ngreedy       2.10   0.31\n"
                            "top-p 0.9    2.31   0.64\n",
                            "check_causal: position 3 reads position 5. A leak of 1e-06 was "
                            "found\nin the output, where a causal model must show exactly "
                            "zero.\nSee chapter 13.\n")
    assert mark_table_outputs(message) == message
    code = table.replace("output stream", "cell_input")
    assert mark_table_outputs(code) == code
    assert not is_table("a  b\nc  d") and is_table("a  b\nc  d\ne f")
