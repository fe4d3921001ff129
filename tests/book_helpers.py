"""What the tests of the book's sources and of the built site share: the table of contents'
pages and the book tool (tools/book.py) as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

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
