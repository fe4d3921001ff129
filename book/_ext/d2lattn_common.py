"""What the book's reader extensions share (see ``d2lattn_reader.py``): the page's language, the
repository's address, and the names of the files the build writes for readers."""

from __future__ import annotations

#: The whole book as a PDF, at the root of each language's site (``tools/book.py`` prints it).
PDF_NAME = "how-attention-works.pdf"
#: Every chapter's notebook with the files it reads and the library it imports, at the root of
#: each language's site (``d2lattn_downloads.py`` writes it).
ARCHIVE_NAME = "how-attention-works-notebooks.zip"


def lang(config) -> str:
    """``"zh"`` for the Chinese build, ``"en"`` otherwise."""
    return "zh" if (config.language or "en").lower().startswith("zh") else "en"


def repository_url(config) -> str:
    """The repository's public address (``repository: url:`` of ``_config.yml``), or ``""``."""
    return str((config.html_theme_options or {}).get("repository_url") or "").rstrip("/")
