"""Sphinx extension: what a reader needs around the pages (both languages).

One extension for ``_config.yml``, one module per job, each a Sphinx extension of its own
(``book/_ext``):

- ``d2lattn_alt_text``: alt text for every plot, from the titles and axis labels its code writes.
- ``d2lattn_page_links``: version, commit and build date in every footer; links to the source
  (when ``repository: url:`` is set), to the PDF of the whole book and to the notebooks' archive.
- ``d2lattn_downloads``: notebooks that run where they land (the download attribute, the note
  on how to run them, the Chinese notebook's figures in Chinese, the archive of every chapter's
  notebook with its data and the library).
- ``d2lattn_search``: the search page's snippets, ranking by how often a page uses a word, and a
  Chinese index built in seconds.
- ``d2lattn_pages``: fixes to the theme's pages (the root page, no Font Awesome script, the
  search index only on the search page, plots' minimum width on a phone, unique ids, the
  one-page build for the PDF).

``d2lattn_common`` holds what they share (the language, the repository's address, the names of
the PDF and the archive).
"""

from __future__ import annotations

from d2lattn_common import ARCHIVE_NAME, PDF_NAME  # noqa: F401 - the names other code reads

MODULES = ("d2lattn_alt_text", "d2lattn_page_links", "d2lattn_downloads", "d2lattn_search",
           "d2lattn_pages")


def setup(app):
    for module in MODULES:
        app.setup_extension(module)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
