"""Sphinx extension: load the interactive-figure script only on pages that have such a figure.

A chapter cell that returns a ``d2lattn.interactive.InteractiveFigure`` writes an element with
the class ``d2lattn-viz`` into its output; this extension adds ``d2lattn-viz.js`` (from
``book/assets/static``, which ``html_static_path`` copies to ``_static``) to those pages alone.
"""

from __future__ import annotations

SCRIPT = "d2lattn-viz.js"


def _add_script(app, pagename, templatename, context, doctree) -> None:
    # Called for every page; add_js_file here adds the script to this page only (Sphinx >= 3.5).
    if doctree is not None and 'class="d2lattn-viz"' in context.get("body", ""):
        app.add_js_file(SCRIPT, loading_method="defer")


def setup(app):
    app.connect("html-page-context", _add_script)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
