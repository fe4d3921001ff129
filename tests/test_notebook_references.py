"""Citations readable in JupyterLab: each chapter ends with a cell that lists the works it cites.

JupyterLab (even with jupyterlab-myst) shows a ``{cite}`` role as its bare key, such as
``zhang2023d2l``. Each chapter notebook therefore ends with a Markdown cell, written by
``python tools/book.py refs`` from ``book/references.bib``, that gives every cited key its work;
the cell carries the ``remove-cell`` tag, so the website and the PDF (which format citations
themselves) leave it out (checked by tests/test_site.py).
"""

from __future__ import annotations

import json

import pytest
from book_helpers import book_tool

BOOK = book_tool()


def test_every_chapter_lists_exactly_the_works_it_cites():
    stale = BOOK.refs(check=True)
    assert stale == [], f"run `python tools/book.py refs`: {[p.name for p in stale]}"


@pytest.mark.parametrize("path", BOOK._chapter_notebooks(), ids=lambda p: p.stem)
def test_the_references_cell_is_last_and_hidden_from_the_site(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    keys = BOOK.cited_keys(notebook)
    marked = [i for i, c in enumerate(notebook["cells"])
              if c.get("metadata", {}).get(BOOK.REFERENCES_MARK)]
    if not keys:
        assert marked == []
        return
    assert marked == [len(notebook["cells"]) - 1]
    cell = notebook["cells"][-1]
    assert "remove-cell" in cell["metadata"]["tags"]
    text = "".join(cell["source"])
    assert [line.split("`")[1] for line in text.splitlines() if line.startswith("- `")] == keys


def test_a_stale_or_missing_cell_is_found_and_rewritten(tmp_path, monkeypatch):
    book = book_tool()
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "references.bib").write_text(
        "@book{a2020, author = {Doe, Jane}, title = {A Title}, publisher = {P}, year = {2020},"
        " doi = {10.1/x}}\n", encoding="utf-8")
    monkeypatch.setattr(book, "ROOT", tmp_path)
    monkeypatch.setattr(book, "BIBLIOGRAPHY", tmp_path / "book" / "references.bib")
    chapter = tmp_path / "book" / "ch1_x.ipynb"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["As {cite:t}`a2020` shows."]}]
    chapter.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                   "nbformat_minor": 5}), encoding="utf-8")
    assert book.refs(check=True) == [chapter]
    book.refs()
    assert book.refs(check=True) == []
    last = "".join(json.loads(chapter.read_text(encoding="utf-8"))["cells"][-1]["source"])
    assert "- `a2020`: Jane Doe. A Title. P, 2020. doi:10.1/x. <https://doi.org/10.1/x>" in last
    cells[0]["source"] = ["Nothing cited now; {cite}`b1999` would be an unknown key."]
    chapter.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                   "nbformat_minor": 5}), encoding="utf-8")
    with pytest.raises(ValueError, match="b1999"):
        book.refs(check=True)


def test_the_chinese_notebook_has_a_chinese_header_and_the_same_works():
    translate = BOOK._translate_module()
    path = BOOK.ROOT / "book" / "ch12_gpt.ipynb"
    cell = json.loads(path.read_text(encoding="utf-8"))["cells"][-1]
    zh = translate.translate_notebook({"cells": [cell]}, {}, {})["cells"][0]
    english, chinese = "".join(cell["source"]), "".join(zh["source"])
    assert chinese.startswith("**本笔记本引用的文献**") and "`radford2019`" in chinese
    assert chinese.partition("\n\n")[2] == english.partition("\n\n")[2]
    assert BOOK.REFERENCES_MARK == translate.REFERENCES_MARK
