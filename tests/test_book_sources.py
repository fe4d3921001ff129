"""The book builds only the book: the table of contents' pages, whatever else the checkout holds.

The README suggests a virtual environment at the repository root (``.venv``). Every installed
package brings Markdown files (READMEs, licences) that Sphinx would render as pages of the
book. ``only_build_toc_files: true`` is meant to exclude every file the table of contents does
not list, but ``sphinx-external-toc`` finds those files with ``glob``, which skips hidden
folders, while Sphinx's own search does not: a hidden folder's pages were built (428 of them,
with ``.venv`` present). ``_config.yml`` therefore excludes hidden folders explicitly.

This test builds a stub of the book (the real ``_config.yml`` and ``_toc.yml``, each page
replaced by a one-line page, so it takes seconds) next to decoy folders that hold Markdown and
notebooks: a hidden and a plain virtual environment, ``node_modules``, caches. It checks that
both configurations, the English one and the Chinese copy ``tools/book.py`` writes, read
exactly the table of contents' pages.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from book_helpers import book_tool, build_html, config_with, new_stub_book, toc_pages

ROOT = Path(__file__).resolve().parents[1]

def _read_pages(folder: Path, *extra: str) -> list[str]:
    """Build the stub with the dummy builder; the docnames Sphinx read (one doctree each)."""
    out = folder / "_out"
    subprocess.run(
        ["jupyter-book", "build", str(folder), "--path-output", str(out), "--builder", "custom",
         "--custom-builder", "dummy", "-qq", *extra],
        check=True, cwd=folder, capture_output=True, text=True,
    )
    doctrees = out / "_build" / ".doctrees"
    return sorted(p.relative_to(doctrees).with_suffix("").as_posix()
                  for p in doctrees.rglob("*.doctree"))


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    return new_stub_book(tmp_path_factory)


def test_english_build_reads_only_the_toc_pages(stub):
    # the HTML build without an address (as committed): only the table of contents' pages are
    # read, and no page links to a repository
    site = build_html(stub, config_with(stub, ""))
    doctrees = stub / "_html" / "_build" / ".doctrees"
    read = sorted(p.relative_to(doctrees).with_suffix("").as_posix()
                  for p in doctrees.rglob("*.doctree"))
    assert read == toc_pages()
    built = sorted(p.relative_to(site).with_suffix("").as_posix() for p in site.rglob("*.html")
                   if not p.relative_to(site).parts[0].startswith("_"))
    assert built == sorted(toc_pages() + ["genindex", "index", "search"])
    for page in toc_pages():
        text = (site / f"{page}.html").read_text(encoding="utf-8")
        assert "/issues/new" not in text and "d2lattn-edit-link" not in text, page
        assert "github.com/executablebooks" not in text, page
        assert "d2lattn-build-info" in text and "d2lattn-pdf-link" in text, page


def test_chinese_build_reads_only_the_toc_pages(stub):
    tool = book_tool()
    # the Chinese configuration, written where tools/book.py writes it, relative to the stub
    tool.ROOT = stub
    config_dir = stub / "_build" / "zh"
    config = tool._config(language=tool.LANGUAGE, config_dir=config_dir)
    toc = tool._toc_zh(config_dir)
    assert _read_pages(stub, "--config", str(config), "--toc", str(toc)) == toc_pages()


# Links to the source (book/_ext/d2lattn_page_links.py) ----------------------------------------

EXAMPLE_URL = "https://github.com/example-owner/how-attention-works"


def test_the_repository_address_is_one_setting_and_not_invented():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    # present (Jupyter Book's default would name Jupyter Book's own repository), and empty
    # until the book has a public home; the README says where to set it
    assert "url" in config["repository"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "repository:" in readme and "url:" in readme


def test_every_page_links_to_its_source_when_the_address_is_set(stub):
    from urllib.parse import unquote

    site = build_html(stub, config_with(stub, EXAMPLE_URL))
    sources = {p: (p + (".ipynb" if (stub / f"{p}.ipynb").exists() else ".md"))
               for p in toc_pages()}
    for page, source in sources.items():
        text = (site / f"{page}.html").read_text(encoding="utf-8")
        issue = f'{EXAMPLE_URL}/issues/new?title='
        assert issue in text, f"{page}: no 'report an error' link"
        start = text.index(issue)
        link = unquote(text[start:text.index('"', start)].replace("&amp;", "&"))
        assert page in link, f"{page}: the new issue does not name the page: {link}"
        assert f'href="{EXAMPLE_URL}/edit/main/{source}"' in text, f"{page}: no edit link"
        assert f'href="{EXAMPLE_URL}"' in text, f"{page}: no repository link"
        assert "d2lattn-build-info" in text, f"{page}: no version and build date"
