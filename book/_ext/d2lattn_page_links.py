"""Sphinx extension: what surrounds every page (part of ``d2lattn_reader``).

1. **Version and build date in every footer**: the version of ``d2lattn``, the commit the site
   was built from (when the source is a git checkout) and the build date (UTC; honours
   ``SOURCE_DATE_EPOCH``).
2. **Links to the source**, when ``repository: url:`` is set in ``_config.yml`` (no address is
   set until the book has a public home): the theme's repository, issue and edit buttons, and at
   the end of every page "report an error on this page" (a new issue whose title names the
   page), "edit this page" (the Chinese pages edit their catalogue) and the repository.
3. **Links to the whole book**: its PDF (``tools/book.py build`` prints it) and, on a chapter,
   the archive of every chapter's notebook with the files it needs (``d2lattn_downloads.py``).
"""

from __future__ import annotations

import datetime
import html
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import quote

from d2lattn_common import ARCHIVE_NAME, PDF_NAME, lang, repository_url

_TEXT = {
    "en": {
        "version": "Version",
        "commit": "commit",
        "built": "built",
        "pdf": "The whole book as a PDF",
        "archive": "Every chapter's notebook, with its data and the library (zip)",
        "issue": "Report an error on this page",
        "edit": "Edit this page",
        "repo": "Source repository",
        "links": "This page",
        "issue_title": "Error on page {page}",
        "issue_body": "Page: {page} (source: {source})\n\nWhat is wrong, and where:\n",
    },
    "zh": {
        "version": "版本",
        "commit": "提交",
        "built": "构建于",
        "pdf": "整本书的 PDF",
        "archive": "各章的 notebook，连同数据和库（zip）",
        "issue": "报告本页的错误",
        "edit": "编辑本页（翻译）",
        "repo": "源代码仓库",
        "links": "本页",
        "issue_title": "页面 {page} 有误",
        "issue_body": "页面：{page}（源文件：{source}）\n\n哪里有误：\n",
    },
}


def _t(app, key: str) -> str:
    return _TEXT[lang(app.config)][key]


def _version(srcdir: Path) -> str:
    init = srcdir / "d2lattn" / "__init__.py"
    if init.is_file():
        match = re.search(r'^__version__\s*=\s*"([^"]+)"', init.read_text(encoding="utf-8"), re.M)
        if match:
            return match.group(1)
    return ""


def _commit(srcdir: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=srcdir,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def build_date() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch
            else datetime.datetime.now(datetime.timezone.utc))
    return when.strftime("%Y-%m-%d")


def footer_html(app) -> str:
    srcdir = Path(app.srcdir)
    version, commit = _version(srcdir), _commit(srcdir)
    bits = []
    if version:
        bits.append(f"{_t(app, 'version')} {html.escape(version)}")
    if commit:
        bits.append(f"{_t(app, 'commit')} <code>{html.escape(commit)}</code>")
    bits.append(f"{_t(app, 'built')} <time datetime=\"{build_date()}\">{build_date()}</time>")
    return f'<p class="d2lattn-build-info">{" · ".join(bits)}</p>'


_BUTTONS = ("use_repository_button", "use_issues_button", "use_edit_page_button")


def _config_inited(app, config) -> None:
    options = dict(config.html_theme_options or {})
    if repository_url(config):
        # Jupyter Book refuses these switches without an address, so _config.yml leaves them
        # off and they follow the address here.
        for button in _BUTTONS:
            options[button] = True
    options["extra_footer"] = (options.get("extra_footer") or "") + footer_html(app)
    config.html_theme_options = options


def _source_path(app, pagename: str) -> str:
    try:
        path = app.env.doc2path(pagename, False)
    except Exception:  # noqa: BLE001 - pages without a source (search, genindex)
        return ""
    return str(path).replace(os.sep, "/")


def page_links(app, pagename: str, pathto) -> str:
    """The links at the end of a page: the PDF, and the source links when an address is set."""
    links = [f'<a class="d2lattn-pdf-link" href="{html.escape(pathto(PDF_NAME, 1))}">'
             f'{_t(app, "pdf")}</a>']
    if pagename.rsplit("/", 1)[-1].startswith("ch"):  # a chapter: its notebook runs with these
        links.append(f'<a class="d2lattn-archive-link" href="{html.escape(pathto(ARCHIVE_NAME, 1))}" '
                     f'download>{_t(app, "archive")}</a>')
    url = repository_url(app.config)
    source = _source_path(app, pagename)
    if url and source:
        options = app.config.html_theme_options or {}
        branch = options.get("repository_branch") or "main"
        book = str(options.get("path_to_docs") or "").strip("/")
        if lang(app.config) == "zh":  # the Chinese text lives in the page's catalogue
            source_file = f"locale/{app.config.language}/LC_MESSAGES/{pagename}.po"
        else:
            source_file = "/".join(p for p in (book, source) if p)
        title = _t(app, "issue_title").format(page=pagename)
        body = _t(app, "issue_body").format(page=f"{pagename}.html", source=source_file)
        if "gitlab" in url:
            issue = (f"{url}/-/issues/new?issue[title]={quote(title)}"
                     f"&issue[description]={quote(body)}")
            edit = f"{url}/-/edit/{branch}/{source_file}"
        else:
            issue = f"{url}/issues/new?title={quote(title)}&body={quote(body)}"
            edit = f"{url}/edit/{branch}/{source_file}"
        links += [
            f'<a class="d2lattn-issue-link" href="{html.escape(issue)}">{_t(app, "issue")}</a>',
            f'<a class="d2lattn-edit-link" href="{html.escape(edit)}">{_t(app, "edit")}</a>',
            f'<a class="d2lattn-repo-link" href="{html.escape(url)}">{_t(app, "repo")}</a>',
        ]
    return (f'<nav class="d2lattn-page-links" aria-label="{_t(app, "links")}">'
            + " · ".join(links) + "</nav>")


def _page_context(app, pagename, templatename, context, doctree) -> None:
    if "body" in context:
        context["body"] = context["body"] + page_links(app, pagename, context["pathto"])


def setup(app):
    app.connect("config-inited", _config_inited, priority=900)
    app.connect("html-page-context", _page_context)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
