"""What the tests of the book's sources and of the built site share: the table of contents'
pages, the book tool (tools/book.py) as a module, and a stub of the book (the real configuration,
table of contents and extensions, each page a one-line page, beside decoy folders) that builds in
seconds."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def toc_pages() -> list[str]:
    """Every page the table of contents lists (docnames, without suffix), sorted."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("chapters"))
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return sorted(pages)


def book_tool() -> ModuleType:
    """A fresh copy of tools/book.py as a module (a test may change its ``ROOT``)."""
    spec = importlib.util.spec_from_file_location("d2lattn_book_tool", ROOT / "tools" / "book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DECOYS = [
    ".venv/lib/python3.11/site-packages/numpy/random/LICENSE.md",
    ".venv/lib/python3.11/site-packages/pkg/README.md",
    "venv/lib/python3.11/site-packages/pkg/README.md",
    "env-3.11/share/jupyter/lab/README.md",
    "node_modules/some-package/README.md",
    "node_modules/some-package/docs/guide.ipynb",
    ".tox/py311/README.md",
    ".cache/notes.md",
    ".ipynb_checkpoints/ch1-checkpoint.ipynb",
    "book/.ipynb_checkpoints/ch1_attention_cues-checkpoint.ipynb",
    "book/drafts/unlisted.md",
    "notes.md",
]


def notebook(*cells: str) -> str:
    """A notebook (JSON text) of markdown cells, one per string."""
    return json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": [c]}
                                 for c in cells],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def new_stub_book(tmp_path_factory) -> Path:
    """A fresh folder holding :func:`stub_book`; skips the test without ``jupyter-book``."""
    if shutil.which("jupyter-book") is None:
        pytest.skip("jupyter-book is not installed")
    folder = tmp_path_factory.mktemp("book")
    stub_book(folder)
    return folder


def stub_book(folder: Path) -> None:
    """The book's configuration and table of contents, each page a one-line stub, and decoys."""
    shutil.copy(ROOT / "_config.yml", folder / "_config.yml")
    shutil.copy(ROOT / "_toc.yml", folder / "_toc.yml")
    shutil.copytree(ROOT / "book" / "_ext", folder / "book" / "_ext")
    shutil.copytree(ROOT / "book" / "assets", folder / "book" / "assets")
    shutil.copy(ROOT / "book" / "references.bib", folder / "book" / "references.bib")
    for page in toc_pages():
        suffix = ".ipynb" if (ROOT / f"{page}.ipynb").exists() else ".md"
        path = folder / f"{page}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(notebook(f"# {page}\n") if suffix == ".ipynb" else f"# {page}\n", encoding="utf-8")
    for decoy in DECOYS:
        path = folder / decoy
        path.parent.mkdir(parents=True, exist_ok=True)
        text = notebook("# Decoy\n") if decoy.endswith(".ipynb") else "# Decoy\n\nNot the book.\n"
        path.write_text(text, encoding="utf-8")


def build_html(folder: Path, config: Path) -> Path:
    """Build a stub book's website with ``config``; the folder of its HTML pages."""
    out = folder / "_html"
    subprocess.run(
        ["jupyter-book", "build", str(folder), "--path-output", str(out), "--config", str(config),
         "-qq"],
        check=True, cwd=folder, capture_output=True, text=True,
    )
    return out / "_build" / "html"


def config_with(folder: Path, url: str) -> Path:
    """The book's ``_config.yml`` with the repository address ``url``, written into ``folder``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["repository"]["url"] = url
    path = folder / f"_config_{'set' if url else 'unset'}.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path
