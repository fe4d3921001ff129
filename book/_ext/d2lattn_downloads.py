"""Sphinx extension: notebooks that run where they land (part of ``d2lattn_reader``).

1. The download button of a chapter carries the ``download`` attribute (over ``file://`` the
   browser would otherwise show the JSON).
2. The downloadable copy of each chapter (``_sources/``) starts with a note on how to run it:
   from the archive below, or from the repository when ``repository: url:`` is set. The Chinese
   copy also gets a first code cell that makes its interactive figures Chinese when it is run
   again (``d2lattn.interactive.set_language``; the build translates the committed ones). The
   notebooks in ``book/`` are untouched.
3. **The archive of the book's notebooks** (``ARCHIVE_NAME`` at the root of each language's
   site, linked from every chapter): every chapter's notebook as the site offers it, next to
   what the chapters read (``book/data/``, ``book/figures/``, ``book/assets/fonts/``) and the
   library with its requirements (``d2lattn/``, ``requirements.txt``, ``pyproject.toml``) and the
   figures' script and styles (their live widgets in JupyterLab draw with them), so
   that a chapter downloaded from a site without a public repository still runs. One archive
   for all chapters: the library and the trained checkpoints are most of its size, and
   per-chapter archives would repeat them fifteen times. The Chinese notebooks are named
   ``ch1_....zh_CN.ipynb``; ``tools/book.py build`` adds them to the English site's archive
   and the Chinese pages link that one (one archive for both languages).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

from d2lattn_common import ARCHIVE_NAME, lang, repository_url

_TEXT = {
    "en": {
        "note": (
            "**This notebook is a chapter of *How Attention Works*,** an executable textbook "
            "on attention. It imports the book's library, `d2lattn`, and reads files that sit "
            "next to it (`data/`, `figures/`, `assets/`).\n\n"
            "To run it, get the book's files: the archive `{archive}` (linked at the end of "
            "every chapter's page of the website; it holds every chapter's notebook, its data "
            "and the library){where}. Then, from the folder that holds `requirements.txt`, run "
            "`python -m pip install -r requirements.txt` (Python 3.11; this also installs "
            "JupyterLab with `jupyterlab-myst`, which renders the book's roles such as "
            "`{{term}}` and `{{cite}}`), and open this chapter as `book/{name}` with "
            "`jupyter lab book/`. The book's page \"Run it yourself\" says more."
        ),
        "where_url": ", or the repository: `git clone {url}`",
        "where_none": "",
    },
    "zh": {
        "note": (
            "**这个 notebook 是《注意力如何工作》的一章，** 它导入本书的库 `d2lattn`，"
            "并读取旁边的文件（`data/`、`figures/`、`assets/`）。\n\n"
            "要运行它，请先获取本书的文件：压缩包 `{archive}`（网站上每一章页面的末尾都有链接；"
            "其中有各章的 notebook、数据和库）{where}。然后在含有 `requirements.txt` 的文件夹中运行 "
            "`python -m pip install -r requirements.txt`（Python 3.11；这也会安装 JupyterLab "
            "和 `jupyterlab-myst`，用来显示书中的 `{{term}}`、`{{cite}}` 等角色），"
            "然后用 `jupyter lab book/` 打开 `book/{name}`。书中“自己运行”一页有更多说明。"
        ),
        "where_url": "，或者克隆仓库：`git clone {url}`",
        "where_none": "",
    },
}

#: The Chinese notebook's first code cell: its interactive figures, drawn again, in Chinese.
LANGUAGE_CELL = (
    "# 重新运行时，本章的交互图也用中文绘制（译文来自 locale/zh_CN/LC_MESSAGES/interactive.po）\n"
    "import d2lattn.interactive\n"
    "\n"
    "d2lattn.interactive.set_language(\"zh_CN\")"
)


def _t(app, key: str) -> str:
    return _TEXT[lang(app.config)][key]


def notebook_note(app, name: str) -> str:
    url = repository_url(app.config)
    where = (_t(app, "where_url").format(url=url) if url else _t(app, "where_none"))
    if lang(app.config) != "en":  # its name in the archive (the repository has the English)
        name = archive_name(name, app.config.language)
    return _t(app, "note").format(where=where, name=name, archive=ARCHIVE_NAME)


def add_note_to_notebook(path: Path, note: str, language_cell: str = "") -> None:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    cells = notebook.get("cells", [])
    if cells and cells[0].get("metadata", {}).get("d2lattn_download_note"):
        return
    added = [{"cell_type": "markdown", "id": "d2lattn-download-note",
              "metadata": {"d2lattn_download_note": True}, "source": note}]
    if language_cell:
        added.append({"cell_type": "code", "id": "d2lattn-language", "execution_count": None,
                      "metadata": {"d2lattn_language_cell": True}, "outputs": [],
                      "source": language_cell})
    notebook["cells"] = added + cells
    path.write_text(json.dumps(notebook, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


_DOWNLOAD_LINK = re.compile(
    r'<a href="([^"]+\.ipynb)" target="_blank"\s+class="btn btn-sm btn-download-source-button')


def with_download_attribute(text: str) -> str:
    return _DOWNLOAD_LINK.sub(
        r'<a href="\1" download class="btn btn-sm btn-download-source-button', text)


# ---------------------------------------------------------------------------------------------
# the archive

#: What the chapters need besides their notebooks, relative to the source folder.
ARCHIVE_FOLDERS = ("book/data", "book/figures", "book/assets/fonts", "d2lattn")
ARCHIVE_FILES = ("requirements.txt", "pyproject.toml", "README.md", "LICENSE",
                 # the README's test command, `python -m pytest book/ch3_....ipynb`, reads the
                 # options in pyproject.toml, which name the sanitizer of nbval's comparisons
                 "conftest.py", "tests/sanitize.cfg",
                 "locale/zh_CN/LC_MESSAGES/interactive.po",
                 # the script and styles that draw the figures as live widgets in JupyterLab
                 "book/assets/static/d2lattn-viz.js", "book/assets/static/d2lattn.css",
                 # chapter 17 runs its sweep's recipe live (imports torch and d2lattn only)
                 "experiments/__init__.py", "experiments/ch17_sparse.py")
#: The archive's top folder.
ARCHIVE_ROOT = "how-attention-works"


def _tracked(srcdir: Path, folder: str) -> list[Path]:
    """The files of ``folder`` that git tracks (all but caches when it is no git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=srcdir,
                             capture_output=True, timeout=30)
        if out.returncode == 0 and out.stdout:
            return [srcdir / p for p in out.stdout.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        pass
    return [p for p in sorted((srcdir / folder).rglob("*")) if p.is_file()
            and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def archive_name(name: str, language: str) -> str:
    """A notebook's name in the archive: ``ch1_x.ipynb``, or ``ch1_x.zh_CN.ipynb`` for the
    Chinese one (next to the English, so that both read the same ``data/``)."""
    return name if language == "en" else name.replace(".ipynb", f".{language}.ipynb")


def write_archive(srcdir: Path, outdir: Path, notebooks: list[Path], language: str = "en") -> Path:
    """Write ``ARCHIVE_NAME`` into ``outdir``: the notebooks under ``book/``, and what they need.
    Entries are sorted and dated ``SOURCE_DATE_EPOCH`` (or 1980), so a rebuild gives the same
    bytes."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    import time

    stamp = time.gmtime(max(epoch, 315532800))[:6]
    entries: dict[str, Path] = {}
    for folder in ARCHIVE_FOLDERS:
        for path in _tracked(srcdir, folder):
            if path.is_file():
                entries[path.relative_to(srcdir).as_posix()] = path
    for name in ARCHIVE_FILES:
        if (srcdir / name).is_file():
            entries[name] = srcdir / name
    for notebook in notebooks:
        entries[f"book/{archive_name(notebook.name, language)}"] = notebook
    target = outdir / ARCHIVE_NAME
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(f"{ARCHIVE_ROOT}/{name}", date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, entries[name].read_bytes())
    return target


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder.format != "html" or app.builder.name != "html":
        return
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        new = with_download_attribute(text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    cell = LANGUAGE_CELL if lang(app.config) == "zh" else ""
    chapters = sorted((out / "_sources" / "book").glob("ch*.ipynb"))
    for notebook in (out / "_sources").rglob("*.ipynb"):
        add_note_to_notebook(notebook, notebook_note(app, notebook.name),
                             cell if notebook in chapters else "")
    if chapters:
        write_archive(Path(app.srcdir), out, chapters,
                      "en" if lang(app.config) == "en" else app.config.language)


def setup(app):
    # after d2lattn_i18n's Chinese notebooks (default priority) and sphinx-external-toc's root
    app.connect("build-finished", _build_finished, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
