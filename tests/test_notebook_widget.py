"""The interactive figures move in a real JupyterLab (d2lattn.interactive's anywidget widget).

The test starts JupyterLab itself (a free port on 127.0.0.1, a random token, a temporary folder
holding copies of the notebooks, its own settings and workspaces folders) and drives it with
headless Chromium:

- **a whole chapter**: chapter 3 (no files to read, two figures, about 10 s) is run cell by cell
  in a fresh kernel; both figures come up as widgets, not as the static table, and moving the
  first one's slider redraws it with exactly the numbers the committed notebook stores for that
  setting (the numbers the website draws);
- **a figure that recomputes**: the cells of chapter 12 that its next-character figure needs
  (loading the trained checkpoint, about 10 s) run, a prompt typed into the widget is sent to
  the kernel, and the figure comes back with that prompt added and chosen; an empty prompt and
  a character the play never uses give a message in the widget, not a traceback.

No request leaves the machine. Chromium and playwright as in tests/test_site.py (Debian's
chromium, no browser download); skipped where Chromium, JupyterLab or anywidget is missing
(failed in CI, like the other browser tests).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CHAPTER = "ch3_masked_softmax.ipynb"
GPT_CHAPTER = "ch12_gpt.ipynb"
#: The cells of chapter 12 that its next-character figure needs (imports, the corpora and their
#: tokenizers, the recipes, the script's runs, the checkpoints, the figure), by id.
GPT_CELLS = ("63fb158a", "af926905", "62d20832", "ebe78da6", "a1ccd686", "9f92d6df")
#: A figure drawn by the widget (JupyterLab gives a widget's output no data-mime-type).
WIDGET = ".jp-OutputArea-output > .d2lattn-viz-widget .d2lattn-viz[data-ready]"
START_TIMEOUT_S = 90
RUN_TIMEOUT_MS = 180_000  # a chapter's run, 3x its time on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _needs() -> None:
    from test_site import _missing

    for module in ("jupyterlab", "anywidget", "playwright"):
        try:
            __import__(module)
        except ImportError:
            _missing(f"the `{module}` Python package is not installed")


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A JupyterLab server of its own, on copies of the notebooks."""
    from test_site import _chromium

    _needs()
    _chromium()
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(BOOK / CHAPTER, root / CHAPTER)
    # chapter 12's cells, next to the data they read (a link: the checkpoints stay where they are)
    (root / "data").symlink_to(BOOK / "data", target_is_directory=True)
    notebook = json.loads((BOOK / GPT_CHAPTER).read_text(encoding="utf-8"))
    cells = {c["id"]: c for c in notebook["cells"]}
    missing = [i for i in GPT_CELLS if i not in cells]
    assert not missing, f"chapter 12 lost the cells {missing}: update GPT_CELLS"
    notebook["cells"] = [cells[i] for i in GPT_CELLS]
    (root / "gpt_figure.ipynb").write_text(json.dumps(notebook), encoding="utf-8")

    home = tmp_path_factory.mktemp("lab-home")
    # every cell in the page (JupyterLab 4 leaves cells out of view out of the DOM), and no
    # news fetched from the internet
    settings = home / "settings" / "@jupyterlab"
    (settings / "notebook-extension").mkdir(parents=True)
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}), encoding="utf-8")
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "OMP_NUM_THREADS": "1"}
    env.pop("D2LATTN_WIDGETS", None)  # the frontend decides, as for a reader
    port, token = _free_port(), secrets.token_hex(16)
    log = open(home / "lab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--expose-app-in-browser",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.allow_root=True", "--LabApp.news_url=None",
         "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("JupyterLab did not start:\n"
                                + (home / "lab.log").read_text(errors="replace")[-3000:])
                time.sleep(0.5)
        yield SimpleNamespace(base=base, token=token, root=root, log=home / "lab.log")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory) -> Iterator[SimpleNamespace]:
    from playwright.sync_api import sync_playwright
    from test_site import CHROMIUM_ARGS, DESKTOP, Recorder, _chromium

    profile = tmp_path_factory.mktemp("chromium-profile-lab")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=_chromium(), headless=True, args=CHROMIUM_ARGS,
            viewport=DESKTOP, service_workers="block", accept_downloads=False)
        recorder = Recorder(lab.base + "/")
        recorder.attach(context)
        try:
            yield SimpleNamespace(context=context, recorder=recorder)
        finally:
            context.close()


def _open_and_run(lab, browser, name: str):
    """Open a notebook in JupyterLab (alone: ``reset`` forgets the tabs of the last one), run
    all its cells in a fresh kernel, wait until done; the page, and the notebook's panel."""
    page = browser.context.new_page()
    page.goto(f"{lab.base}/lab/tree/{name}?reset&token={lab.token}", wait_until="load")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
                           timeout=START_TIMEOUT_S * 1000)
    page.evaluate("""async () => {
      const panel = window.jupyterapp.shell.currentWidget;
      await panel.sessionContext.ready;
      await window.jupyterapp.commands.execute('notebook:run-all-cells');
    }""")
    # every code cell has run: it shows an execution count, and none is queued or running
    page.wait_for_function("""() => {
      const panel = window.jupyterapp.shell.currentWidget;
      const cells = panel.content.widgets.filter(c => c.model.type === 'code');
      return cells.every(c => typeof c.model.executionCount === 'number'
                               && !c.node.querySelector('.jp-InputPrompt').textContent.includes('*'));
    }""", timeout=RUN_TIMEOUT_MS)
    panel = page.locator("#" + page.evaluate("() => window.jupyterapp.shell.currentWidget.id"))
    assert panel.count() == 1
    errors = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert tracebacks == [], tracebacks
    return page, panel


def _drawn(figure) -> list:
    """The numbers a figure draws now, in order (each bar, cell or readout carries its value)."""
    return figure.evaluate(
        "root => Array.from(root.querySelectorAll('.d2lattn-viz-bar, .d2lattn-viz-cell, "
        ".d2lattn-viz-readout .d2lattn-viz-num')).map(n => n.getAttribute('data-value'))")


def test_a_chapter_run_in_jupyterlab_shows_figures_that_move(lab, browser):
    page, panel = _open_and_run(lab, browser, CHAPTER)
    figures = panel.locator(WIDGET)
    committed = [o for c in json.loads((BOOK / CHAPTER).read_text(encoding="utf-8"))["cells"]
                 for o in c.get("outputs", []) if 'class="d2lattn-viz"' in
                 "".join(o.get("data", {}).get("text/html", ""))]
    figures.nth(len(committed) - 1).wait_for(state="attached", timeout=30_000)
    assert figures.count() == len(committed) == 2
    # the widget, not the table: no output shows the static fallback's HTML
    assert panel.locator(".jp-RenderedHTMLCommon .d2lattn-viz-fallback").count() == 0
    html = "".join(committed[0]["data"]["text/html"])
    spec = json.loads(html.split('class="d2lattn-viz-data">', 1)[1].split("</script>", 1)[0]
                      .replace("<\\/", "</"))
    figure = figures.first
    before, drawn_before = figure.get_attribute("data-frame"), _drawn(figure)
    slider = figure.locator("input[type=range]").first
    k = [c["type"] for c in spec["controls"]].index("slider")
    control = spec["controls"][k]
    target = (control["initial"] + 1) % len(control["values"])
    slider.fill(str(target))
    choice = before.split(",")
    choice[k] = str(target)
    assert figure.get_attribute("data-frame") == ",".join(choice) != before
    drawn = _drawn(figure)
    assert drawn != drawn_before
    # exactly the numbers the committed notebook stores for that setting
    frame = spec["frames"][",".join(choice)]
    expected = []
    for panel in spec["panels"]:
        values = frame[panel["name"]]
        if panel["type"] == "bars":
            expected += values
        elif panel["type"] == "grid":
            expected += [v for row in values for v in row]
        elif panel["type"] == "readout":
            expected += list(values.values())
    assert [float(v) for v in drawn if v not in ("true", "false")] == \
        pytest.approx([float(v) for v in expected], abs=0)
    # the keyboard: an arrow key on the focused slider moves the slider, not JupyterLab's cell
    # selection (command mode would take ArrowLeft/ArrowRight/ArrowUp/ArrowDown for itself)
    active = "() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].findIndex(" \
             "c => c.classList.contains('jp-mod-active'))"
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    cell_before = page.evaluate(active)
    slider.focus()
    step = 1 if target + 1 < len(control["values"]) else -1
    page.keyboard.press("ArrowRight" if step == 1 else "ArrowLeft")
    choice[k] = str(target + step)
    assert figure.get_attribute("data-frame") == ",".join(choice)
    page.keyboard.press("ArrowUp" if step == 1 else "ArrowDown")
    page.wait_for_timeout(300)
    assert page.evaluate(active) == cell_before
    assert browser.recorder.foreign_hosts() == set()
    page.close()


def test_a_figure_recomputes_for_a_prompt_the_reader_types(lab, browser):
    page, panel = _open_and_run(lab, browser, "gpt_figure.ipynb")
    figure = panel.locator(WIDGET)
    figure.wait_for(timeout=30_000)
    widget = panel.locator(".d2lattn-viz-widget")
    box, button = widget.locator("textarea"), widget.locator("button[type=submit]")
    message = widget.locator(".d2lattn-viz-message")
    prompt = widget.locator("[data-control=prompt] select")
    assert prompt.locator("option").count() == 3 and box.input_value().startswith("JULIET:")
    drawn_before = _drawn(figure)

    # typed key by key, as a reader does (JupyterLab's own keys, like A for a new cell, must
    # not fire), and sent with Shift+Enter (which must not run the cell again)
    cells = panel.locator(".jp-Cell").count()
    prompts = panel.locator(".jp-InputPrompt").all_inner_texts()
    box.fill("")
    box.press_sequentially("KING HENRY:")
    box.press("Enter")
    box.press_sequentially("What sa")
    assert box.input_value() == "KING HENRY:\nWhat sa"
    box.press("Shift+Enter")
    prompt.locator("option").nth(3).wait_for(state="attached", timeout=60_000)
    assert prompt.locator("option").nth(3).inner_text() == "KING HENRY: ⏎ What sa"
    assert prompt.input_value() == "3" and message.inner_text() == ""
    assert panel.locator(".jp-Cell").count() == cells
    assert panel.locator(".jp-InputPrompt").all_inner_texts() == prompts
    assert figure.get_attribute("data-frame").startswith("3,")
    assert _drawn(figure) != drawn_before

    for text, expected in [("", "type a prompt of at least one character"),
                           ("naïve", "character 'ï' is not in the vocabulary")]:
        box.fill(text)
        button.click()
        page.wait_for_function("([node, want]) => node.textContent === want",
                               arg=[message.element_handle(), expected], timeout=60_000)
    # the figure of the last good prompt stays, and no traceback was printed anywhere
    assert prompt.locator("option").count() == 4
    assert panel.locator(".jp-OutputArea-output", has_text="Traceback").count() == 0
    assert browser.recorder.foreign_hosts() == set()
    page.close()
