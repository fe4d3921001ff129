"""Browser test of the built website: every page opened in headless Chromium.

The site must work with the network off. This test serves the built HTML on 127.0.0.1, opens
every page and checks that

- no request goes to any host but the local server (all requests are recorded);
- every page with math shows typeset math: each math node holds MathJax output
  (``mjx-container``), no MathJax error box, no raw ``\\(`` / ``\\[`` left in the text;
- every image loads (``naturalWidth > 0``) and no local file is missing (HTTP status < 400);
- no page logs a JavaScript error;
- at phone width (390 px) no page is wider than the screen;
- exercise solutions are collapsed until opened;
- each chapter offers its notebook for download, and the ``.ipynb`` link works offline;
- every interactive figure redraws, when each control moves, exactly the numbers the chapter's
  Python code computed for that setting, and its script loads on those pages only;
- the Chinese edition (``zh/``) has every page of the English one, each page links to its
  translation and back (also from ``file://``), its prose is Chinese, its search finds Chinese
  words, and its Chinese text (the words inside formulas included) is drawn with the site's own
  subset font, which covers every CJK character the site uses. (The Chinese pages also go
  through every check above.)

The site is taken from ``$D2LATTN_SITE_DIR`` (default: ``_build/html`` in the repository); it
is built with ``python tools/book.py build`` (both languages) when missing. Chromium is Debian's ``chromium`` (or
``$D2LATTN_CHROMIUM``), driven by the ``playwright`` package without downloading any browser.
Outside CI the test is skipped when the browser or playwright is missing; in CI (``CI=true``)
that is a failure.
"""

from __future__ import annotations

import functools
import html
import html.parser
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, List, Set
from urllib.parse import urlsplit

import pytest
from book_helpers import book_tool, toc_pages

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SITE = ROOT / "_build" / "html"
SITE = Path(os.environ.get("D2LATTN_SITE_DIR", DEFAULT_SITE)).resolve()
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
LOCAL_HOST = "127.0.0.1"

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # belt and braces: even a request the test failed to notice could not reach a real host
    f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {LOCAL_HOST}",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
CHAPTER_PREFIX = "book/ch"


def _missing(reason: str) -> None:
    """Skip the test on a developer machine; fail it in CI, where the browser must exist."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing browser is a failure)")
    pytest.skip(reason)


def _chromium() -> str:
    candidates = [os.environ.get("D2LATTN_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"]
    for path in candidates:
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return path
    _missing("Chromium not found: install Debian's `chromium` or set D2LATTN_CHROMIUM")
    raise AssertionError("unreachable")


def _ensure_site() -> Path:
    """The built site; build it with jupyter-book when it is missing."""
    if (SITE / "index.html").is_file():
        return SITE
    if SITE.parts[-2:] != ("_build", "html"):
        pytest.fail(f"D2LATTN_SITE_DIR={SITE} has no index.html, and it is not a "
                    "'<folder>/_build/html' path that jupyter-book could build into")
    if SITE != DEFAULT_SITE.resolve():
        pytest.fail(f"D2LATTN_SITE_DIR={SITE} has no index.html: build it with "
                    "`python tools/book.py build` and copy _build/html there")
    subprocess.run([sys.executable, str(ROOT / "tools" / "book.py"), "build"], check=True, cwd=ROOT)
    assert (SITE / "index.html").is_file(), f"the build wrote no {SITE / 'index.html'}"
    return SITE


def _pages(site: Path) -> List[str]:
    """Every HTML page of the site, as URL paths relative to its root."""
    pages = []
    for path in sorted(site.rglob("*.html")):
        rel = path.relative_to(site)
        parts = rel.parts[1:] if rel.parts[0] == "zh" else rel.parts  # the Chinese edition
        if parts[0] in {"_static", "_sources", "_images", "_downloads"}:
            continue  # theme templates and copied sources, not pages
        pages.append(rel.as_posix())
    return pages


def _open(page, base_url: str, rel: str, site: Path) -> None:
    """Go to a page; for a redirect stub (index.html), wait until the target has loaded."""
    page.goto(base_url + rel, wait_until="load")
    if 'http-equiv="Refresh"' in (site / rel).read_text(encoding="utf-8")[:500]:
        page.wait_for_url(lambda url: url != base_url + rel, wait_until="load")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def site() -> Path:
    return _ensure_site()


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """Serve the site on 127.0.0.1 on a free port, in a thread."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOCAL_HOST}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Recorder:
    """Everything the browser did, over all pages of the session: requests, failed or
    missing loads (HTTP status >= 400), console errors and uncaught exceptions."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.requests: List[str] = []
        self.failures: List[str] = []
        self.console_errors: List[str] = []

    def _where(self, page) -> str:
        return page.url.replace(self.base_url, "/") if page is not None else "(no page)"

    def attach(self, context) -> None:
        context.on("request", lambda r: self.requests.append(r.url))
        context.on("requestfailed", self._on_failed)
        context.on("response", lambda r: r.status >= 400 and self.failures.append(
            f"{self._where(r.frame.page)}: {r.url} answered HTTP {r.status}"))
        context.on("console", lambda m: m.type == "error" and self.console_errors.append(
            f"{self._where(m.page)}: console error: {m.text}"))
        context.on("weberror", lambda e: self.console_errors.append(
            f"{self._where(e.page)}: uncaught exception: {e.error}"))

    def _on_failed(self, request) -> None:
        # net::ERR_ABORTED: cancelled because the test moved on to the next page (a late
        # favicon, say); a file that is really missing answers 404 and is caught above.
        if request.failure != "net::ERR_ABORTED":
            self.failures.append(
                f"{self._where(request.frame.page)}: {request.url} failed ({request.failure})")

    def foreign_hosts(self) -> Set[str]:
        hosts = set()
        for url in self.requests:
            parts = urlsplit(url)
            if parts.scheme in {"data", "blob", "about", "file"}:
                continue  # in-page resources and local files, no network
            if parts.hostname != LOCAL_HOST:
                hosts.add(f"{parts.scheme}://{parts.hostname}")
        return hosts


@pytest.fixture(scope="module")
def browser(tmp_path_factory, base_url: str) -> Iterator[SimpleNamespace]:
    """A headless Chromium with a fresh profile, driven by playwright (no browser download),
    and the Recorder that sees every request and console message of all its pages."""
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the `playwright` Python package is not installed (pip install playwright; "
                 "never `playwright install`: the test uses the system Chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS,
            viewport=DESKTOP, service_workers="block", accept_downloads=False,
        )
        recorder = Recorder(base_url)
        recorder.attach(context)
        try:
            yield SimpleNamespace(context=context, recorder=recorder)
        finally:
            context.close()


# JavaScript run in each page -------------------------------------------------------------

WAIT_FOR_MATHJAX = """async () => {
  if (!document.querySelector('.math')) return false;
  for (let i = 0; i < 200 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++) {
    await new Promise(r => setTimeout(r, 50));
  }
  if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) return 'MathJax never started';
  await MathJax.startup.promise;
  return true;
}"""

MATH_REPORT = """() => {
  const nodes = [...document.querySelectorAll('.math')];
  const untypeset = nodes.filter(n => !n.querySelector('mjx-container'))
                         .map(n => n.textContent.trim().slice(0, 60));
  const errors = [...document.querySelectorAll('mjx-merror')]
                   .map(e => (e.getAttribute('data-mjx-error') || e.textContent).slice(0, 80));
  // raw TeX delimiters left anywhere in the text, outside code, scripts and typeset math
  const raw = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const p = t.parentElement;
    if (p.closest('pre, code, script, style, textarea, mjx-container, .highlight')) continue;
    if (/\\\\\\(|\\\\\\[/.test(t.textContent)) raw.push(t.textContent.trim().slice(0, 60));
  }
  return {count: nodes.length,
          typeset: document.querySelectorAll('mjx-container').length,
          untypeset, errors, raw};
}"""

LOAD_IMAGES = """async () => {
  const imgs = [...document.images];
  imgs.forEach(img => { img.loading = 'eager'; });
  await Promise.all(imgs.map(img => img.complete ? null :
    new Promise(r => { img.addEventListener('load', r); img.addEventListener('error', r);
                       setTimeout(r, 5000); })));
  return imgs.map(img => ({src: img.currentSrc || img.src, width: img.naturalWidth}));
}"""

PAGE_WIDTH = """() => ({scroll: document.documentElement.scrollWidth, view: window.innerWidth,
  culprits: [...document.querySelectorAll('.bd-article *')]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
                 && !e.closest('.pst-scrollable-table-container, .highlight, pre, .output, mjx-container, .math'))
    .slice(0, 5).map(e => e.tagName + '.' + e.className)})"""


# The tests -----------------------------------------------------------------------------------

class _AssetLinks(html.parser.HTMLParser):
    """Collect the URLs a browser would load by itself: script/img/iframe/source src, every
    <link href> (stylesheets, icons, preloads, preconnects) and <object data>."""

    LOADED = {"script": "src", "img": "src", "iframe": "src", "source": "src", "embed": "src",
              "audio": "src", "video": "src", "link": "href", "object": "data"}

    def __init__(self) -> None:
        super().__init__()
        self.urls: List[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        wanted = self.LOADED.get(tag)
        for name, value in attrs:
            if value and (name == wanted or (tag == "img" and name == "srcset")):
                self.urls.append(value)


def test_no_remote_assets_in_the_html(site):
    """Static companion of the browser test (runs even without a browser): no page names a
    script, stylesheet, font, icon or image on another host."""
    remote = []
    for rel in _pages(site):
        parser = _AssetLinks()
        parser.feed((site / rel).read_text(encoding="utf-8"))
        remote += [f"{rel}: {url}" for url in parser.urls
                   if url.startswith(("http:", "https:", "//"))]
    assert remote == []


# What a reader at 1280 px cannot see without scrolling: printed outputs wider than their box
# (the width hidden, in px), and display equations wider than the column (with the overflow
# style that lets them scroll).
HIDDEN_WIDTH = """() => {
  const outputs = [], math = [];
  for (const el of document.querySelectorAll(
      '.bd-article .cell_output pre, .bd-article .cell_output .output.text_html')) {
    const hidden = el.scrollWidth - el.clientWidth;
    if (hidden > 1) outputs.push([el.textContent.trim().slice(0, 60), hidden]);
  }
  for (const m of document.querySelectorAll('.bd-article mjx-container[display="true"]')) {
    const hidden = m.scrollWidth - m.clientWidth;
    if (hidden > 1) math.push([m.textContent.slice(0, 40), hidden, getComputedStyle(m).overflowX]);
  }
  return {outputs, math};
}"""


@pytest.fixture(scope="module")
def crawl(site: Path, base_url: str, browser) -> Dict[str, object]:
    """Open every page once at desktop width and collect what each check needs."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = browser.context.new_page()
    report: Dict[str, object] = {"pages": [], "math": {}, "images": {}}
    for rel in _pages(site):
        _open(page, base_url, rel, site)
        try:  # quiet network; a busy machine may never give 500 ms of it, and that is fine
            page.wait_for_load_state("networkidle", timeout=5000)
        except PlaywrightTimeout:
            pass
        mathjax = page.evaluate(WAIT_FOR_MATHJAX)
        assert mathjax != "MathJax never started", f"{rel}: MathJax never started"
        report["math"][rel] = page.evaluate(MATH_REPORT)
        report["images"][rel] = page.evaluate(LOAD_IMAGES)
        report.setdefault("hidden", {})[rel] = page.evaluate(HIDDEN_WIDTH)
        page.evaluate("document.fonts.ready.then(() => true)")  # MathJax and icon fonts
        report["pages"].append(rel)
    page.close()
    return report


def test_every_page_opened(crawl, site):
    pages = crawl["pages"]
    assert "book/preface.html" in pages and len(pages) >= 10, pages
    chapters = sorted(p for p in pages if p.startswith(CHAPTER_PREFIX))
    assert chapters == _toc_chapters(), chapters


def _toc_chapters() -> List[str]:
    """The chapter pages the table of contents lists (``- file: book/ch...``), as .html paths."""
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    files = [line.split("file:", 1)[1].strip() for line in toc.splitlines() if "file:" in line]
    return sorted(f + ".html" for f in files if f.startswith(CHAPTER_PREFIX))


def test_math_is_typeset(crawl):
    with_math = {rel: m for rel, m in crawl["math"].items() if m["count"]}
    # the notation page and the chapters are full of math; a site with none means MathJax broke
    assert "book/notation.html" in with_math, sorted(with_math)
    for rel, m in with_math.items():
        assert m["untypeset"] == [], f"{rel}: math left as raw TeX"
        assert m["errors"] == [], f"{rel}: MathJax errors"
        assert m["typeset"] >= m["count"], f"{rel}: {m}"
    for rel, m in crawl["math"].items():
        assert m["raw"] == [], f"{rel}: raw TeX delimiters in the text"


def test_outputs_fit_at_desktop_width(crawl):
    """At 1280 px no printed output hides text sideways (long lines wrap: ch13's diagnostic
    messages were 180-385 characters, up to 2,234 px of scrolling), and a display equation
    wider than the column scrolls in its own box rather than being cut."""
    hidden = {rel: h["outputs"] for rel, h in crawl["hidden"].items() if h["outputs"]}
    total = sum(px for found in hidden.values() for _, px in found)
    assert total == 0, f"{total} px of output hidden: {hidden}"
    for rel, h in crawl["hidden"].items():
        for text, px, overflow in h["math"]:
            assert overflow in ("auto", "scroll"), f"{rel}: {text!r} cut by {px} px"


def test_every_image_loads(crawl):
    broken = [f"{rel}: {img['src']}" for rel, imgs in crawl["images"].items()
              for img in imgs if img["width"] <= 0]
    assert broken == []
    assert sum(len(imgs) for imgs in crawl["images"].values()) > 0


def test_pages_fit_a_phone_screen(site, base_url, browser):
    page = browser.context.new_page()
    page.set_viewport_size(PHONE)
    too_wide = []
    for rel in _pages(site):
        _open(page, base_url, rel, site)
        width = page.evaluate(PAGE_WIDTH)
        if width["scroll"] > width["view"] + 1:
            too_wide.append(f"{rel}: {width}")
    page.close()
    assert too_wide == []


def test_solutions_are_collapsed_until_opened(site, base_url, browser):
    page = browser.context.new_page()
    checked = 0
    for rel in _pages(site):
        if not rel.startswith(CHAPTER_PREFIX):
            continue
        page.goto(base_url + rel, wait_until="load")
        solutions = page.locator("div.solution.dropdown")
        for i in range(solutions.count()):
            solution = solutions.nth(i)
            body = solution.locator(":scope > :not(.admonition-title)").first
            assert not body.is_visible(), f"{rel}: solution {i + 1} is open before a click"
            if checked == 0:  # opening works (once is enough: the same script does all)
                solution.locator(".admonition-title").click()
                body.wait_for(state="visible", timeout=5000)
            checked += 1
    page.close()
    if checked == 0:
        pytest.skip("no chapter has a dropdown solution yet")


def test_notebooks_download_offline(site, base_url, browser):
    page = browser.context.new_page()
    chapters = [rel for rel in _pages(site) if rel.startswith(CHAPTER_PREFIX)]
    assert chapters
    for rel in chapters:
        page.goto(base_url + rel, wait_until="load")
        links = page.locator(".dropdown-download-buttons a[href$='.ipynb']")
        assert links.count() == 1, f"{rel}: no .ipynb download button"
        href = links.first.get_attribute("href")
        response = page.request.get(page.url.rsplit("/", 1)[0] + "/" + href)
        assert response.status == 200, f"{rel}: {href} answered {response.status}"
        notebook = json.loads(response.body())
        assert notebook["nbformat"] == 4 and notebook["cells"], f"{rel}: {href} is not a notebook"
    page.close()


# Interactive figures (d2lattn.interactive, drawn by book/assets/static/d2lattn-viz.js) ---------

VIZ_SCRIPT = "d2lattn-viz.js"

MOVE_AND_READ = """([index, combo]) => {
  // hidden from sight but present for screen readers: rendered, 1 px, clipped
  const visuallyHidden = (e) => {
    const r = e.getBoundingClientRect(), st = getComputedStyle(e);
    return st.display !== 'none' && st.visibility !== 'hidden' && r.width <= 1 && r.height <= 1
      && e.textContent.trim().length > 0;
  };
  const root = document.querySelectorAll('.d2lattn-viz')[index];
  const spec = JSON.parse(root.querySelector('script.d2lattn-viz-data').textContent);
  const start = performance.now();
  spec.controls.forEach((c, k) => {
    const wrap = root.querySelector(`.d2lattn-viz-control[data-control="${c.name}"]`);
    const i = combo[k];
    if (c.type === 'tokens') {
      wrap.querySelectorAll('.d2lattn-viz-token')[i].click();
    } else if (c.type === 'select') {
      const s = wrap.querySelector('select'); s.value = String(i); s.dispatchEvent(new Event('change'));
    } else {
      const r = wrap.querySelector('input[type=range]'); r.value = String(i);
      r.dispatchEvent(new Event('input'));
    }
  });
  const ms = performance.now() - start;  // the redraw is synchronous: it is done by now
  const drawn = {};
  root.querySelectorAll('.d2lattn-viz-panel').forEach(box => {
    drawn[box.dataset.panel] = {
      bars: [...box.querySelectorAll('rect.d2lattn-viz-bar')].map(
        r => [Number(r.dataset.value), Number(r.getAttribute('height'))]),
      cells: [...box.querySelectorAll('rect.d2lattn-viz-cell')].map(r => Number(r.dataset.value)),
      cellLabels: [...box.querySelectorAll('rect.d2lattn-viz-cell')].map(r => r.dataset.label ?? null),
      cellGroups: [...box.querySelectorAll('rect.d2lattn-viz-cell')].map(
        r => r.dataset.group === undefined ? null : [r.dataset.group, r.getAttribute('fill')]),
      labelsShown: [...box.querySelectorAll('text.d2lattn-viz-cell-label')].map(
        e => [e.dataset.label, e.textContent]),
      legend: [...box.querySelectorAll('rect.d2lattn-viz-legend')].map(
        r => [r.getAttribute('fill'), r.nextSibling ? r.nextSibling.textContent : '']),
      lines: Object.fromEntries([...box.querySelectorAll('path.d2lattn-viz-line')].map(
        p => [p.dataset.label, JSON.parse(p.dataset.value)])),
      nums: [...box.querySelectorAll('.d2lattn-viz-num')].map(
        e => [Number(e.dataset.value), e.textContent]),
      dots: [...box.querySelectorAll('circle.d2lattn-viz-dot')].map(
        c => [Number(c.dataset.index), Number(c.dataset.value)]),
      focus: box.querySelector('.d2lattn-viz-focus') ?
        Number(box.querySelector('.d2lattn-viz-focus').dataset.index) : null,
    };
  });
  const fallback = root.querySelector('.d2lattn-viz-fallback');
  return {frame: root.dataset.frame, ms, drawn, ready: root.dataset.ready === '1',
          fallbackText: fallback ? fallback.textContent : '',
          fallbackHidden: !fallback || visuallyHidden(fallback)};
}"""


def _viz_pages(site: Path) -> List[str]:
    return [rel for rel in _pages(site)
            if 'class="d2lattn-viz"' in (site / rel).read_text(encoding="utf-8")]


def test_viz_script_only_on_pages_with_figures(site):
    """The script is loaded by the pages that have an interactive figure, and by no other."""
    with_figures = set(_viz_pages(site))
    for rel in _pages(site):
        parser = _AssetLinks()
        parser.feed((site / rel).read_text(encoding="utf-8"))
        loads = any(url.split("?")[0].endswith(VIZ_SCRIPT) for url in parser.urls)
        assert loads == (rel in with_figures), f"{rel}: script loaded {loads}"


def _combos(controls, rng) -> List[List[int]]:
    """Each control through its choices (at most 8, evenly spread) with the others at their
    initial choice, then a few random settings of all controls at once."""
    initial = [c["initial"] for c in controls]
    combos = []
    for k, c in enumerate(controls):
        n = len(c["values"])
        for i in sorted({round(j * (n - 1) / 7) for j in range(8)} if n > 8 else range(n)):
            combos.append(initial[:k] + [i] + initial[k + 1:])
    combos += [[rng.randrange(len(c["values"])) for c in controls] for _ in range(5)]
    return combos


def _js_str(value) -> str:
    """A JSON value as JavaScript's String() writes it (1.0 -> "1")."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _close(a: float, b: float, digits: int) -> bool:
    return abs(a - b) <= 0.5 * 10.0 ** -digits + 1e-9


def _check_grid_owners(panel, parts, drawn, flat, where) -> None:
    """A grid whose cells carry labels and groups (chapter 15's memory pool): each cell shows
    its own label, each group has one colour of its own (its legend's), a cell of no group is
    white, and the legend names every group and the cells of none."""
    if "labels" in parts:
        labels = flat(parts["labels"])
        assert drawn["cellLabels"] == labels, where
        assert drawn["labelsShown"] == [[x, x] for x in labels if x], where
    if "groups" not in parts:
        assert all(g is None for g in drawn["cellGroups"]), where
        return
    names = panel["groups"] + ([panel["ungrouped"]] if panel.get("ungrouped") else [])
    assert [name for _, name in drawn["legend"]] == names, where
    legend = [fill for fill, _ in drawn["legend"]]
    assert len(set(legend)) == len(legend), f"{where}: two legend entries share a colour"
    for want, (group, fill) in zip(flat(parts["groups"]), drawn["cellGroups"]):
        assert group == ("" if want is None else str(want)), where
        assert fill == (legend[want] if want is not None else "#fff"), where


def test_interactive_figures_draw_the_computed_numbers(site, base_url, browser):
    """Every interactive figure: move each control, and check that the numbers drawn for that
    setting (bars, grid cells, lines, printed values) are the numbers the chapter's Python code
    computed for it (the JSON in the page), redrawn at once, with the static fallback hidden."""
    import random

    rng = random.Random(0)
    pages = _viz_pages(site)
    page = browser.context.new_page()
    figures, moves, times = 0, 0, []
    for rel in pages:
        _open(page, base_url, rel, site)
        page.wait_for_function(
            "[...document.querySelectorAll('.d2lattn-viz')].every(r => r.dataset.ready === '1')",
            timeout=10000)
        specs = page.evaluate("""() => [...document.querySelectorAll('.d2lattn-viz')].map(
            r => r.querySelector('script.d2lattn-viz-data').textContent)""")
        for index, text in enumerate(specs):
            spec = json.loads(text)
            digits = spec["digits"]
            figures += 1
            for combo in _combos(spec["controls"], rng):
                got = page.evaluate(MOVE_AND_READ, [index, combo])
                key = ",".join(map(str, combo))
                where = f"{rel} figure {index + 1} ({spec['title']}) at {key}"
                assert got["ready"] and got["fallbackHidden"], where
                assert got["frame"] == key, where
                # the screen reader's tables describe the setting drawn, not the first one
                comma = "，" if rel.startswith(ZH) else ", "  # the page's language
                setting = comma.join(f"{c['label']} = {_js_str(c['values'][i])}"
                                     for c, i in zip(spec["controls"], combo))
                assert setting in got["fallbackText"], where
                times.append(got["ms"])
                moves += 1
                frame = spec["frames"][key]
                for panel in spec["panels"]:
                    want, drawn = frame[panel["name"]], got["drawn"][panel["name"]]
                    if panel["type"] == "bars":
                        assert [v for v, _ in drawn["bars"]] == want, where
                        # bar heights proportional to the values (bars start at 0)
                        pos = [(v, h) for v, h in drawn["bars"] if v > 0]
                        if len(pos) > 1:
                            scale = pos[0][1] / pos[0][0]
                            assert all(abs(h - v * scale) < 0.5 for v, h in pos), where
                    elif panel["type"] == "grid":
                        parts = want if isinstance(want, dict) else {"values": want}
                        flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
                        assert drawn["cells"] == flat(parts["values"]), where
                        _check_grid_owners(panel, parts, drawn, flat, where)
                    elif panel["type"] == "lines":
                        assert drawn["lines"] == want, where
                    elif panel["type"] == "scatter":  # chapter 16's point cloud
                        assert drawn["focus"] == want["focus"], where
                        assert drawn["dots"] == [list(p) for p in zip(want["points"],
                                                                       want["values"])], where
                    else:
                        assert [v for v, _ in drawn["nums"]] == list(want.values()), where
                    for value, text_shown in drawn["nums"]:
                        assert _close(float(text_shown), value, min(digits, 2)), where
    page.close()
    assert figures >= 6 and len(pages) >= 4, (figures, pages)
    times.sort()
    assert times[len(times) // 2] < 16, f"median redraw {times[len(times) // 2]:.1f} ms"


# What each figure shows of its numbers: per panel the printed values, the axis's end labels,
# each bar's colour and group, a grid's legend; and the hidden table of the setting drawn.
SHOWN_NUMBERS = """() => [...document.querySelectorAll('.d2lattn-viz')].map(root => {
  const panels = {};
  root.querySelectorAll('.d2lattn-viz-panel').forEach(box => {
    panels[box.dataset.panel] = {
      nums: [...box.querySelectorAll('.d2lattn-viz-num')].map(e => e.textContent),
      axis: [...box.querySelectorAll('.d2lattn-viz-axis')].map(e => e.textContent),
      bars: [...box.querySelectorAll('rect.d2lattn-viz-bar')].map(
        r => [r.getAttribute('fill'), r.dataset.group ?? null, Number(r.dataset.value)]),
      legend: [...box.querySelectorAll('rect.d2lattn-viz-legend')].map(r => r.getAttribute('fill')),
    };
  });
  const hidden = [...root.querySelectorAll('.d2lattn-viz-fallback table')].map(t =>
    [...t.querySelectorAll('tr')].map(tr => [...tr.children].map(c => c.textContent)));
  return {spec: root.querySelector('script.d2lattn-viz-data').textContent, panels, hidden};
})"""


def _table_numbers(panel, rows, integers):
    """(where, text) of each number that a fallback table (rows of cell texts: the name, then
    the numbers) prints for a panel whose numbers are counts; a grid cell's number may follow
    its label, "b0 (1.00)"."""
    import re

    out = []
    for row in rows:
        if len(row) < 2 or (panel["type"] == "grid" and row[0] == ""):
            continue  # a grid's header row
        name, cells = row[0], row[1:]
        counts = (integers[panel["name"]].get(name, False) if panel["type"] == "readout"
                  else integers[panel["name"]] if panel["type"] in ("bars", "grid") else False)
        if counts:
            out += [(f"{panel['name']}: {name}", re.sub(r"^.*\((.*)\)$", r"\1", c))
                    for c in cells]
    return out


def _static_tables(html_text: str, index: int) -> List[List[List[str]]]:
    """The tables of the static fallback of the page's figure ``index``, as the HTML has it
    (what a reader without the script, or a print of it, sees): rows of cell texts."""
    import re

    fallback = html_text.split('class="d2lattn-viz-fallback">')[index + 1].split("</div>", 1)[0]
    return [[[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(
                r"<t[dh]>(.*?)</t[dh]>", tr)] for tr in re.findall(r"<tr>(.*?)</tr>", table)]
            for table in re.findall(r"<table>(.*?)</table>", fallback)]


def test_interactive_figures_write_counts_as_integers_and_colour_bars_by_owner(site, base_url,
                                                                               browser):
    """A count is written as an integer wherever a figure shows it: "requests running 5", not
    "5.00" (chapter 15), in the drawn readouts and bar values, the axis's end labels ("40", not
    "40.00"), the table hidden for screen readers, and the static table a reader without the
    script (or the PDF) gets. A number is a count when it is whole in every setting
    (d2lattn.interactive.integer_parts). A bars panel with groups (chapter 15's tokens per
    request) draws each bar in the colour of its group's cells in the figure's grid."""
    import re

    sys.path.insert(0, str(ROOT))
    from d2lattn.interactive import integer_parts

    whole = re.compile(r"-?\d+")
    page = browser.context.new_page()
    bad, counted, axes, grouped = [], 0, 0, 0
    for rel in _viz_pages(site):
        _open(page, base_url, rel, site)
        page.wait_for_function(
            "[...document.querySelectorAll('.d2lattn-viz')].every(r => r.dataset.ready === '1')",
            timeout=10000)
        text = (site / rel).read_text(encoding="utf-8")
        for index, fig in enumerate(page.evaluate(SHOWN_NUMBERS)):
            spec = json.loads(fig["spec"])
            integers = integer_parts(spec["panels"], spec["frames"])
            where = f"{rel} ({spec['title']})"
            frame = spec["frames"][",".join(str(c["initial"]) for c in spec["controls"])]
            static = _static_tables(text, index)
            shown = []
            for k, panel in enumerate(spec["panels"]):
                drawn, name = fig["panels"][panel["name"]], panel["name"]
                if panel["type"] in ("bars", "grid") and integers[name]:
                    shown += [(f"{name} drawn", t) for t in drawn["nums"]]
                elif panel["type"] == "readout":
                    shown += [(f"{name} drawn: {key}", t) for key, t in
                              zip(frame[name], drawn["nums"]) if integers[name][key]]
                shown += [(f"hidden table, {w}", t)
                          for w, t in _table_numbers(panel, fig["hidden"][k], integers)]
                shown += [(f"static table, {w}", t)
                          for w, t in _table_numbers(panel, static[k], integers)]
                ends = drawn["axis"]
                if ends and all(float(t).is_integer() for t in ends):
                    axes += 1
                    shown += [(f"{name} axis", t) for t in ends]
                if panel["type"] == "bars" and "groups" in panel:
                    grid = next(p for p in spec["panels"] if p["type"] == "grid" and "groups" in p)
                    legend = fig["panels"][grid["name"]]["legend"]
                    for (fill, group, value), g in zip(drawn["bars"], panel["groups"]):
                        grouped += 1
                        assert group == ("" if g is None else str(g)), where
                        if value != 0 and g is not None and fill != legend[g]:
                            bad.append(f"{where}: bar of group {g} is {fill}, its cells {legend[g]}")
            for what, t in shown:
                counted += 1
                if not whole.fullmatch(t):
                    bad.append(f"{where}: {what} shows {t!r}")
    page.close()
    assert bad == [], "\n".join(bad[:20])
    assert counted >= 100 and axes >= 2 and grouped >= 16, (counted, axes, grouped)


# The Chinese edition (tools/book.py builds it into zh/; book/_ext/d2lattn_i18n.py adds the
# switcher; book/assets/static/fonts holds its font) -------------------------------------------

ZH = "zh/"
CJK_CHAR = "[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]"


class _LanguageLinks(html.parser.HTMLParser):
    """The page's language, its switcher link(s) and its rel=alternate links."""

    def __init__(self) -> None:
        super().__init__()
        self.lang = None
        self.switch: List[Dict[str, str]] = []
        self.alternate: Dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs) -> None:
        a = dict(attrs)
        if tag == "html":
            self.lang = a.get("lang")
        elif tag == "a" and "d2lattn-lang-link" in (a.get("class") or "").split():
            self.switch.append(a)
        elif tag == "link" and a.get("rel") == "alternate" and a.get("hreflang"):
            self.alternate[a["hreflang"]] = a.get("href", "")


def _resolve(page: str, href: str) -> str:
    from posixpath import dirname, join, normpath

    return normpath(join(dirname(page), href))


def _split_languages(site: Path):
    pages = _pages(site)
    zh = sorted(p[len(ZH):] for p in pages if p.startswith(ZH))
    en = sorted(p for p in pages if not p.startswith(ZH))
    return en, zh


def test_both_languages_have_every_page(site):
    en, zh = _split_languages(site)
    assert zh, f"no Chinese site under {site / ZH}: build it with `python tools/book.py build`"
    assert en == zh
    assert sorted(p for p in zh if p.startswith(CHAPTER_PREFIX)) == _toc_chapters()


def test_language_switcher_links_each_page_to_its_translation(site):
    """Every page: the right lang attribute, one visible link to the same page in the other
    language (relative, with hreflang and lang), and rel=alternate links for both languages."""
    en, _ = _split_languages(site)
    problems = []
    for rel in en:
        for here, there, page, other in (("en", "zh", rel, ZH + rel), ("zh", "en", ZH + rel, rel)):
            text = (site / page).read_text(encoding="utf-8")
            if 'http-equiv="Refresh"' in text[:500]:
                continue  # the index.html stub that redirects to the preface
            parser = _LanguageLinks()
            parser.feed(text)
            if not (parser.lang or "").lower().startswith(here):
                problems.append(f"{page}: <html lang={parser.lang!r}>")
            if rel in {"genindex.html", "search.html"} and not parser.switch:
                pass  # Sphinx's generated pages: the alternate links below still apply
            elif len(parser.switch) != 1:
                problems.append(f"{page}: {len(parser.switch)} switcher links")
            else:
                link = parser.switch[0]
                if (link.get("hreflang"), link.get("lang")) != (there, there):
                    problems.append(f"{page}: switcher hreflang/lang {link}")
                if link["href"].startswith(("/", "http:", "https:", "file:")):
                    problems.append(f"{page}: switcher link is not relative: {link['href']}")
                elif _resolve(page, link["href"]) != other:
                    problems.append(f"{page}: switcher leads to {_resolve(page, link['href'])}")
            alternate = {lang: _resolve(page, href) for lang, href in parser.alternate.items()}
            if alternate != {here: page, there: other}:
                problems.append(f"{page}: rel=alternate {alternate}")
    assert problems == [], "\n".join(problems[:20])


def test_cjk_font_covers_every_character_of_the_site(site):
    """The shipped subset font has a glyph for every CJK character of both sites (pages and
    search index), so Chinese renders on a machine with no CJK font installed."""
    from fontTools.ttLib import TTFont

    tool = book_tool()
    font_file = site / "_static" / "fonts" / tool.FONT_FILE.name
    assert font_file.is_file(), f"{font_file} missing: is html_static_path copying fonts/?"
    assert font_file.read_bytes() == tool.FONT_FILE.read_bytes(), "the site's font is stale"
    cmap = TTFont(str(font_file)).getBestCmap()
    used = tool.site_cjk_characters(site)
    assert len(used) > 500, "the Chinese site has hardly any Chinese in it"
    missing = sorted(c for c in used if ord(c) not in cmap)
    assert missing == [], f"{len(missing)} characters lack a glyph (python tools/book.py font): " \
                          + "".join(missing[:50])
    assert font_file.stat().st_size < 1_000_000  # a subset, not the 19 MB collection


def test_english_cut_of_the_cjk_font_covers_the_english_site(site):
    """The English pages name first a smaller cut of the CJK font (d2lattn.css): it has a
    glyph for every CJK character of the English site, and its unicode-range in the stylesheet
    lists exactly those characters, so an English page never needs the whole subset."""
    from fontTools.ttLib import TTFont

    tool = book_tool()
    font_file = site / "_static" / "fonts" / tool.FONT_EN_FILE.name
    assert font_file.read_bytes() == tool.FONT_EN_FILE.read_bytes(), "the site's cut is stale"
    cmap = TTFont(str(font_file)).getBestCmap()
    used = tool.english_cjk_characters(site)
    missing = sorted(c for c in used if ord(c) not in cmap)
    assert missing == [], "the English cut lacks (python tools/book.py font): " + "".join(missing)
    css = (site / "_static" / "d2lattn.css").read_text(encoding="utf-8")
    assert tool.font_face_css(used) in css, "the unicode-range is stale: python tools/book.py font"
    assert font_file.stat().st_size < tool.FONT_FILE.stat().st_size / 2


FONTS_IN_USE = """() => {
  const status = {};
  for (const f of document.fonts) {
    const family = f.family.replace(/"/g, '');
    if (family.startsWith('D2lattn CJK')) status[family] = f.status;
  }
  const scripts = [...document.scripts].map(s => s.src).filter(s => s.includes('fontawesome'));
  return {status, scripts};
}"""


@pytest.mark.parametrize("prefix, rel, wanted, unwanted", [
    ("", "book/ch13_diagnostics.html", "D2lattn CJK en", "D2lattn CJK"),
    ("", "book/ch8_transformer.html", "D2lattn CJK en", "D2lattn CJK"),
    (ZH, "book/ch8_transformer.html", "D2lattn CJK", "D2lattn CJK en"),
])
def test_pages_fetch_only_the_fonts_they_need(site, base_url, browser, prefix, rel, wanted,
                                              unwanted):
    """An English page loads the English cut of the CJK font (about 100 kB), never the whole
    subset; a Chinese page the whole subset and not the cut; no page loads the theme's 1.5 MB
    Font Awesome script (its stylesheet draws the icons from the web font)."""
    page = browser.context.new_page()
    _open(page, base_url, prefix + rel, site)
    page.evaluate("document.fonts.ready.then(() => true)")
    page.wait_for_timeout(300)
    fonts = page.evaluate(FONTS_IN_USE)
    page.close()
    assert fonts["scripts"] == [], fonts
    assert fonts["status"].get(wanted) == "loaded", fonts
    assert fonts["status"].get(unwanted) == "unloaded", fonts


def test_no_markdown_left_unrendered(site):
    """No literal ``**`` in the text of any page (outside code): in CommonMark, emphasis next to
    Chinese punctuation or a role can fail to open or close (``**是什么？**这`` stays literal),
    which a translation can hit where the English did not."""
    import re

    leftover = []
    for rel in _pages(site):
        text = (site / rel).read_text(encoding="utf-8")
        text = re.sub(r"<(pre|code|script|style|textarea)\b[^>]*>.*?</\1>", " ", text, flags=re.S)
        text = re.sub(r"<[^>]+>", " ", text)
        leftover += [f"{rel}: {m.group(0)!r}" for m in re.finditer(r".{0,25}\*\*.{0,25}", text)]
    assert leftover == [], "\n".join(leftover[:20])


PROSE_LEFT_IN_ENGLISH = r"""(cjk) => {
  const re = new RegExp(cjk);
  const skip = 'pre, code, .cell_output, .output, .highlight, .d2lattn-viz, .bibliography, ' +
               '.citation, mjx-container, .math, script, style, .d2lattn-lang-switch, nav, ' +
               '.headerlink, figure img';
  return [...document.querySelectorAll('.bd-article p, .bd-article li, .bd-article h1, ' +
                                       '.bd-article h2, .bd-article h3, .bd-article dd, .bd-article td, ' +
                                       '.bd-article th, .bd-article figcaption')]
    .filter(e => !e.closest(skip))
    .map(e => {  // the element's own prose: without code, math, and quoted example sentences
      const c = e.cloneNode(true);
      c.querySelectorAll('code, .math, mjx-container, a.headerlink').forEach(x => x.remove());
      return c.textContent.replace(/\u201c[^\u201d]*\u201d/g, ' ').trim();
    })
    .filter(t => !re.test(t) && (t.match(/[A-Za-z]{2,}/g) || []).length >= 6)
    .slice(0, 5);
}"""

FONT_LOADED = """async () => {
  await document.fonts.ready;
  const faces = [...document.fonts].filter(f => f.family.replace(/"/g, '') === 'D2lattn CJK');
  return {faces: faces.map(f => f.status), check: document.fonts.check('16px "D2lattn CJK"', '注意力'),
          family: getComputedStyle(document.querySelector('.bd-article p')).fontFamily};
}"""


def test_chinese_pages_read_in_chinese_with_the_shipped_font(site, base_url, browser):
    """Each Chinese page's prose is Chinese (no paragraph of six or more English words without
    a Chinese character, outside code, outputs, figures and references), its math typesets
    (the crawl checks that), and its Chinese text is drawn with the site's own font."""
    _, zh = _split_languages(site)
    page = browser.context.new_page()
    english, fonts = [], {}
    for rel in zh:
        if not rel.startswith("book/"):
            continue
        _open(page, base_url, ZH + rel, site)
        english += [f"{ZH + rel}: {t[:80]!r}" for t in page.evaluate(PROSE_LEFT_IN_ENGLISH, CJK_CHAR)]
        fonts[rel] = page.evaluate(FONT_LOADED)
    page.close()
    assert english == [], "\n".join(english)
    for rel, font in fonts.items():
        assert "loaded" in font["faces"] and font["check"], f"{ZH + rel}: {font}"
        assert font["family"].startswith('"D2lattn CJK"'), f"{ZH + rel}: {font['family']}"


def test_switcher_works_from_file_urls(site, browser):
    """Opened from disk (file://), the switcher goes from a Chinese chapter to the English one
    and back."""
    page = browser.context.new_page()
    zh_page = (site / ZH / "book" / "ch1_attention_cues.html").resolve()
    en_page = (site / "book" / "ch1_attention_cues.html").resolve()
    page.goto(zh_page.as_uri(), wait_until="load")
    assert page.evaluate("document.documentElement.lang").startswith("zh")
    page.click(".d2lattn-lang-link")
    page.wait_for_url(en_page.as_uri(), wait_until="load")
    assert page.evaluate("document.documentElement.lang").startswith("en")
    page.click(".d2lattn-lang-link")
    page.wait_for_url(zh_page.as_uri(), wait_until="load")
    page.close()


def test_switcher_keeps_the_section_anchor(site, browser):
    """Following the switcher from a section (an address with #anchor) lands on the same
    section of the other language: both languages' pages have the same ids."""
    page = browser.context.new_page()
    en_page = (site / "book" / "ch1_attention_cues.html").resolve()
    zh_page = (site / ZH / "book" / "ch1_attention_cues.html").resolve()
    page.goto(en_page.as_uri() + "#two-kinds-of-cue", wait_until="load")
    page.click(".d2lattn-lang-link")
    page.wait_for_url(zh_page.as_uri() + "#two-kinds-of-cue", wait_until="load")
    assert page.evaluate("document.getElementById('two-kinds-of-cue') !== null")
    page.click(".d2lattn-lang-link")
    page.wait_for_url(en_page.as_uri() + "#two-kinds-of-cue", wait_until="load")
    page.close()


VIZ_TEXT = """() => [...document.querySelectorAll('.d2lattn-viz')].map(r => ({
  title: r.querySelector('.d2lattn-viz-title').textContent,
  caption: (r.querySelector('.d2lattn-viz-caption') || {textContent: ''}).textContent,
  labels: [...r.querySelectorAll('.d2lattn-viz-control > span:first-child')].map(e => e.textContent),
  panels: [...r.querySelectorAll('.d2lattn-viz-panel-title')].map(e => e.textContent),
}))"""


def test_interactive_figures_speak_the_page_language(site, base_url, browser):
    """On a Chinese page every interactive figure's title, hint, control labels and panel
    titles are Chinese; on the English page they are English (no Chinese character)."""
    import re

    cjk = re.compile(CJK_CHAR)
    page = browser.context.new_page()
    checked = 0
    for rel in _viz_pages(site):
        if rel.startswith(ZH):
            continue
        for prefix, chinese in ((ZH, True), ("", False)):
            _open(page, base_url, prefix + rel, site)
            page.wait_for_function("[...document.querySelectorAll('.d2lattn-viz')]"
                                   ".every(r => r.dataset.ready === '1')", timeout=10000)
            for figure in page.evaluate(VIZ_TEXT):
                texts = [figure["title"], figure["caption"], *figure["labels"], *figure["panels"]]
                texts = [t for t in texts if t.strip()]
                where = f"{prefix + rel}: {figure['title']!r}"
                if chinese:
                    assert all(cjk.search(t) for t in texts), (where, texts)
                else:
                    assert not any(cjk.search(t) for t in texts), (where, texts)
                checked += 1
    page.close()
    assert checked >= 14  # 7 figures, both languages


def test_chinese_download_button_gives_a_chinese_notebook(site, base_url, browser):
    """A Chinese chapter's download button serves the Chinese notebook (its Markdown in
    Chinese, marked zh_CN); its code cells are the English notebook's, cell for cell."""
    import re

    page = browser.context.new_page()
    chapters = [rel for rel in _pages(site) if rel.startswith(CHAPTER_PREFIX)]
    assert chapters
    for rel in chapters:
        notebooks = {}
        for prefix in (ZH, ""):
            page.goto(base_url + prefix + rel, wait_until="load")
            href = page.locator(".dropdown-download-buttons a[href$='.ipynb']").first.get_attribute("href")
            response = page.request.get(page.url.rsplit("/", 1)[0] + "/" + href)
            assert response.status == 200, f"{prefix + rel}: {href} answered {response.status}"
            notebooks[prefix] = json.loads(response.body())
        zh, en = notebooks[ZH], notebooks[""]
        assert zh.get("metadata", {}).get("d2lattn", {}).get("language") == "zh_CN", rel
        assert "d2lattn" not in en.get("metadata", {}), rel
        first = "".join(next(c for c in zh["cells"] if c["cell_type"] == "markdown")["source"])
        assert re.search(CJK_CHAR, first), (rel, first[:80])
        code = lambda nb: [c["source"] for c in nb["cells"] if c["cell_type"] == "code"
                           and not c["metadata"].get("d2lattn_language_cell")]
        assert code(zh) == code(en), rel
        # the Chinese one's first code cell makes its figures Chinese when it is run again
        first_code = next(c for c in zh["cells"] if c["cell_type"] == "code")
        assert first_code["metadata"].get("d2lattn_language_cell"), rel
        assert 'set_language("zh_CN")' in "".join(first_code["source"]), rel
    page.close()


def test_chinese_pages_show_the_chinese_diagrams(site):
    """The drawn diagrams: NAME.zh_CN.svg on the Chinese pages, NAME.svg on the English ones."""
    import re

    found = {"": 0, ZH: 0}
    for rel in _pages(site):
        text = (site / rel).read_text(encoding="utf-8")
        for src in re.findall(r'<img[^>]+src="([^"]+\.svg)"', text):
            name = src.rsplit("/", 1)[-1]
            if name.startswith(("attention_pooling", "masking", "multihead",
                                "positional_encoding", "transformer_block")):
                chinese = rel.startswith(ZH)
                assert name.endswith(".zh_CN.svg") == chinese, f"{rel}: {src}"
                found[ZH if chinese else ""] += 1
    assert found[""] >= 5 and found[ZH] == found[""], found


def test_chinese_citations_and_interface(site):
    """The Chinese build cites "Bahdanau 等人 [2015]", titles solutions 练习 N.M 解答, and its
    interface reads mainland Chinese (打印, the link tooltips)."""
    import re

    zh = (site / ZH / "book" / "ch1_attention_cues.html").read_text(encoding="utf-8")
    en = (site / "book" / "ch1_attention_cues.html").read_text(encoding="utf-8")
    assert "et al." in en and "等人" in zh
    prose = re.sub(r'title="[^"]*"|<div class="citation".*?</div>|<pre\b.*?</pre>', "", zh,
                   flags=re.S)  # the reference list's tooltips, the bibliography, code
    assert not re.search(r"et al\.", prose), "et al. left in the Chinese text"
    for english, chinese in (("Link to this heading", "链接到此标题"), ("Print to PDF", "打印为 PDF")):
        assert english not in zh and chinese in zh, (english, chinese)
    assert "列印" not in zh
    titles = []
    for rel in _pages(site):
        if rel.startswith(ZH + CHAPTER_PREFIX):
            text = (site / rel).read_text(encoding="utf-8")
            titles += re.findall(r"解答\s*(?:<[^>]+>\s*)*练习", text)
            assert not re.search(r'<p class="admonition-title">解答\s*<a', text), rel
    assert titles == []


# Sphinx adds the results one at a time (a 5 ms timer between them) and writes the summary
# ("Search finished, found ...") after the last; on a busy machine the first results can be
# on the page long before the rest, so the list is read once the summary is there.
SEARCH_RESULTS = """async () => {
  for (let i = 0; i < 600; i++) {
    const summary = document.querySelector('#search-results .search-summary, #search-results p');
    if (summary && summary.textContent.trim()) break;
    await new Promise(r => setTimeout(r, 50));
  }
  return [...document.querySelectorAll('#search-results ul.search li a')].map(a => a.getAttribute('href'));
}"""


@pytest.mark.parametrize("prefix, query, expected", [
    (ZH, "注意力汇聚", "book/ch1_attention_cues.html"),
    (ZH, "归纳头", "book/ch11_induction_heads.html"),
    ("", "induction heads", "book/ch11_induction_heads.html"),
])
def test_search_finds_words_in_both_languages(site, base_url, browser, prefix, query, expected):
    """Full-text search works offline in both sites; the Chinese index is split into words
    (jieba), so a Chinese word finds the chapter about it."""
    from urllib.parse import quote

    page = browser.context.new_page()
    page.goto(f"{base_url}{prefix}search.html?q={quote(query)}", wait_until="load")
    hits = page.evaluate(SEARCH_RESULTS)
    page.close()
    assert any(h.split("#")[0].split("?")[0].endswith(expected) for h in hits), (query, hits[:10])


def test_search_puts_the_chapter_that_uses_a_word_most_first(site, base_url, browser):
    """The issue's example: "rotary" lists the Transformer chapter (dozens of uses, where rotary
    positions are tested) first, not the induction-heads chapter that names it once
    (tests/test_search_ranking.py tests the rule itself on a stub)."""
    page = browser.context.new_page()
    page.goto(f"{base_url}search.html?q=rotary", wait_until="load")
    # Sphinx adds the results one by one: wait until both chapters are listed.
    page.wait_for_function(
        "['ch8_transformer', 'ch11_induction_heads'].every(name => [...document"
        ".querySelectorAll('#search-results ul.search li a')].some(a => a.href.includes(name)))",
        timeout=20000)
    hits = page.evaluate(SEARCH_RESULTS)
    page.close()
    names = [h.split("#")[0].split("?")[0].rsplit("/", 1)[-1] for h in hits]
    assert names[0] == "ch8_transformer.html", names
    assert names.index("ch11_induction_heads.html") > names.index("ch8_transformer.html")


# The reader's path: only the book's pages, figures for everyone, readable on a phone, the
# footer, the source links, downloads and the PDF (book/_ext/d2lattn_reader.py and its modules,
# book/assets/static/d2lattn-viz.js and d2lattn.css, tools/book.py pdf) ----------------------

def _toc_pages() -> Set[str]:
    """Every page the table of contents lists, as .html paths."""
    return {f"{p}.html" for p in toc_pages()}


def test_the_site_has_exactly_the_books_pages(site):
    """Both languages: the table of contents' pages, search and index, and nothing else (no
    page from a virtual environment, node_modules or a cache in the checkout)."""
    expected = _toc_pages() | {"index.html", "search.html", "genindex.html"}
    english = {p for p in _pages(site) if not p.startswith(ZH)}
    chinese = {p[len(ZH):] for p in _pages(site) if p.startswith(ZH)}
    assert english == expected, sorted(english ^ expected)
    assert chinese == expected, sorted(chinese ^ expected)


def _article_pages(site: Path) -> List[str]:
    return [p for p in _pages(site) if "/book/" in f"/{p}"]


def test_every_plot_has_alt_text(site):
    """A plot's alt text describes it (from the code that drew it), never a file name."""
    import re

    plots = described = 0
    for rel in _article_pages(site):
        text = (site / rel).read_text(encoding="utf-8")
        for alt, src in re.findall(r'<img alt="([^"]*)" src="([^"]*_images/[^"]+\.png)"', text):
            plots += 1
            assert alt and not alt.endswith(".png") and "_images/" not in alt, f"{rel}: {src}"
            assert alt.startswith(("Plot", "图")) and len(alt) > 20, f"{rel}: {alt!r}"
            assert "…" not in alt, f"{rel}: a placeholder in {alt!r}"
            described += bool(re.search(r"titles|axis|标题|横轴|纵轴", alt))
    assert plots >= 40, plots
    # nearly every plot names its titles or axes (the rest are drawn by code that writes none)
    assert described >= 0.85 * plots, (described, plots)


def test_code_cells_show_no_test_markers(site):
    """`# NBVAL_IGNORE_OUTPUT` is for the test runner: the pages show the code without it."""
    for rel in _article_pages(site):
        text = (site / rel).read_text(encoding="utf-8")
        assert "NBVAL_IGNORE_OUTPUT" not in text.replace("<span class=\"c1\">", ""), rel


def test_the_references_cell_is_for_notebooks_only(site):
    """Each chapter's last cell lists its citations for JupyterLab readers (tools/book.py refs);
    the pages leave it out, the downloadable notebook keeps it."""
    for rel in _article_pages(site):
        text = (site / rel).read_text(encoding="utf-8")
        assert "References cited in this notebook" not in text, rel
    source = (site / "_sources" / "book" / "ch12_gpt.ipynb").read_text(encoding="utf-8")
    assert "References cited in this notebook" in source and "`radford2019`" in source


def test_the_notebooks_archive_holds_what_the_chapters_read(site):
    """One archive of the notebooks for both languages, linked from every chapter page: every
    chapter in English (ch1_....ipynb) and in Chinese (ch1_....zh_CN.ipynb, next to it so that
    both read the same data), the files the chapters open (data, figures, fonts), the library
    and its requirements, and the figures' catalogue; a Chinese notebook's first code cell makes
    its figures Chinese."""
    import re
    import zipfile

    path = site / "how-attention-works-notebooks.zip"
    assert path.is_file() and not (site / ZH / path.name).exists()
    with zipfile.ZipFile(path) as archive:
        names = {n.split("/", 1)[1] for n in archive.namelist()}
        for chapter in _toc_chapters():
            for suffix in (".ipynb", ".zh_CN.ipynb"):
                name = chapter.replace(".html", suffix)
                assert name in names, name
                notebook = json.loads(archive.read("how-attention-works/" + name))
                assert notebook["cells"][0]["metadata"].get("d2lattn_download_note"), name
                if suffix != ".ipynb":
                    assert 'set_language("zh_CN")' in "".join(notebook["cells"][1]["source"])
                code = "".join("".join(c["source"]) for c in notebook["cells"]
                               if c["cell_type"] == "code")
                for needed in set(re.findall(r"(?:data|figures|assets/fonts)/[\w.-]+\.\w+", code)):
                    assert "book/" + needed in names, (name, needed)
        for needed in ("d2lattn/__init__.py", "requirements.txt", "pyproject.toml",
                       "book/data/gpt_variants.json", "book/data/ch12_gpt_tang.pt",
                       "book/figures/masking.svg", "locale/zh_CN/LC_MESSAGES/interactive.po",
                       "book/assets/static/d2lattn-viz.js", "book/assets/static/d2lattn.css"):
            assert needed in names, needed
    # what the README says of it: its size, to the megabyte it states, and the chapters in it
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"`how-attention-works-notebooks\.zip`, about\s+(\d+)\s+MB", readme)
    assert stated and abs(int(stated.group(1)) - path.stat().st_size / 1e6) <= 1, \
        (stated and stated.group(1), path.stat().st_size / 1e6)
    last = max(_toc_chapters(), key=lambda f: int(re.search(r"ch(\d+)_", f).group(1)))
    last = last.replace(".html", ".ipynb")
    assert f"… `{last}`" in readme, f"the README's chapter list should end at {last}"
    for rel in _article_pages(site):
        if rel.rsplit("/", 1)[-1].startswith("ch"):
            link = re.search(r'<a class="d2lattn-archive-link" href="([^"]+)"',
                             (site / rel).read_text(encoding="utf-8"))
            assert link and _resolve(rel, link.group(1)) == path.name, rel


def test_both_languages_share_one_mathjax_and_only_the_search_page_loads_the_index(site):
    """MathJax (24 MB) ships once: the Chinese pages load the English site's copy. The search
    index loads on the search page only."""
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert not (site / ZH / "_static" / "mathjax").exists()
    zh_page = (site / ZH / "book" / "ch1_attention_cues.html").read_text(encoding="utf-8")
    assert 'src="../../_static/mathjax/tex-chtml.js' in zh_page
    for prefix in ("", ZH):
        assert "searchindex.js" in (site / prefix / "search.html").read_text(encoding="utf-8")
        for rel in _article_pages(site):
            if rel.startswith(ZH) == bool(prefix):
                assert "searchindex.js" not in (site / rel).read_text(encoding="utf-8"), rel


def test_the_chinese_site_keeps_only_the_images_and_sources_that_differ(site):
    """The plots are the same notebooks' outputs in both languages: the Chinese site keeps
    no byte-identical copy of an English image, page source or static file (about 5 MB of
    plots and 12 MB of the theme's and the book's scripts, styles and fonts were copied twice),
    and every link of a Chinese page into _images/, _sources/ or _static/ finds its file, the
    Chinese diagrams, notebooks and language files in zh/, the shared ones in the English
    site."""
    import re

    kept = sorted(p.relative_to(site / ZH / "_static").as_posix()
                  for p in (site / ZH / "_static").rglob("*") if p.is_file())
    assert kept == ["d2lattn-search-counts.js", "documentation_options.js", "language_data.js",
                    "translations.js"], kept
    for folder in ("_images", "_sources", "_static"):
        mine, theirs = site / ZH / folder, site / folder
        twins = [p.relative_to(mine).as_posix() for p in mine.rglob("*") if p.is_file()
                 and (theirs / p.relative_to(mine)).is_file()
                 and p.read_bytes() == (theirs / p.relative_to(mine)).read_bytes()]
        assert twins == [], f"zh/{folder} copies {len(twins)} English files: {twins[:3]}"
    linked, missing = 0, []
    for rel in _pages(site):
        if not rel.startswith(ZH):
            continue
        text = (site / rel).read_text(encoding="utf-8")
        for url in re.findall(r'(?:src|href)="((?:\.\./)*(?:_images|_sources|_static)/[^"#?]+)'
                              r'[^"]*"', text):
            linked += 1
            if not (site / _resolve(rel, url)).is_file():
                missing.append(f"{rel}: {url}")
    assert missing == [] and linked >= 500, (linked, missing[:5])
    assert any((site / ZH / "_images").glob("*.zh_CN.svg")), "the Chinese diagrams stay in zh/"


def test_sharing_identical_files_relinks_the_pages(tmp_path):
    """tools/book.py's share_identical: a twin of an English file goes and its links gain one
    ../; a file that differs (a Chinese diagram, a Chinese notebook) stays, linked as before."""
    tool = book_tool()
    en, zh = tmp_path / "html", tmp_path / "html" / "zh"
    for root, diagram, notebook in ((en, b"<svg>en</svg>", b"{en}"), (zh, b"<svg>zh</svg>", b"{zh}")):
        (root / "_images").mkdir(parents=True)
        (root / "_images" / "plot.png").write_bytes(b"PNG same")
        (root / "_images" / "d.svg").write_bytes(diagram)
        (root / "_sources" / "book").mkdir(parents=True)
        (root / "_sources" / "book" / "ch1.ipynb").write_bytes(notebook)
        (root / "_sources" / "book" / "preface.md").write_bytes(b"# same")
    (zh / "book").mkdir()
    page = zh / "book" / "ch1.html"
    page.write_text('<img src="../_images/plot.png"><img src="../_images/d.svg">'
                    '<a href="../_images/plot.png">x</a><a href="../_sources/book/ch1.ipynb">'
                    '<a href="../_sources/book/preface.md">', encoding="utf-8")
    assert tool.share_identical(en, zh, "_images") == (1, 8)
    assert tool.share_identical(en, zh, "_sources") == (1, 6)
    assert page.read_text(encoding="utf-8") == (
        '<img src="../../_images/plot.png"><img src="../_images/d.svg">'
        '<a href="../../_images/plot.png">x</a><a href="../_sources/book/ch1.ipynb">'
        '<a href="../../_sources/book/preface.md">')
    assert not (zh / "_images" / "plot.png").exists() and (zh / "_images" / "d.svg").is_file()
    assert (zh / "_sources" / "book" / "ch1.ipynb").is_file()
    assert tool.share_identical(en, zh, "_images") == (0, 0)  # nothing left to share


def test_sharing_static_files_keeps_every_stylesheet_with_the_files_it_loads(tmp_path):
    """The static files are shared like the images, but a stylesheet goes to the English copy
    only with every file it loads (its url()s resolve next to the English copy to the same
    bytes), and one that stays keeps what it loads; a file a page names is relinked."""
    tool = book_tool()
    en, zh = tmp_path / "html", tmp_path / "html" / "zh"
    files = {"a.css": ("@font-face { src: url('fonts/f.woff2?v=1') } x { background: "
                       "url(data:image/png;base64,AA==) }",) * 2,
             "fonts/f.woff2": ("F",) * 2,
             "b.css": ('@import "img/x.css";',) * 2, "img/x.css": ("en", "zh"),
             "c.css": ("c { src: url(../_static/fonts/g.woff2) }", "c { src: url(fonts/g.woff2) } zh"),
             "fonts/g.woff2": ("G",) * 2,
             "same.js": ("js",) * 2, "language_data.js": ("en", "zh")}
    for name, texts in files.items():
        for root, text in zip((en, zh), texts):
            (root / "_static" / name).parent.mkdir(parents=True, exist_ok=True)
            (root / "_static" / name).write_text(text, encoding="utf-8")
    (zh / "index.html").write_text(
        '<link href="_static/a.css?v=3"><link href="_static/c.css"><script src="_static/same.js">'
        '<script src="_static/language_data.js">', encoding="utf-8")
    assert tool.share_identical(en, zh, "_static")[0] == 3  # a.css, fonts/f.woff2, same.js
    left = sorted(p.relative_to(zh / "_static").as_posix()
                  for p in (zh / "_static").rglob("*") if p.is_file())
    assert left == ["b.css", "c.css", "fonts/g.woff2", "img/x.css", "language_data.js"]
    assert (zh / "index.html").read_text(encoding="utf-8") == (
        '<link href="../_static/a.css?v=3"><link href="_static/c.css">'
        '<script src="../_static/same.js"><script src="_static/language_data.js">')


# Every element that draws Chinese text, with the font family it is drawn in.
CJK_FONTS = """(cjk) => {
  const re = new RegExp(cjk), bad = [];
  let checked = 0;
  for (const el of document.querySelectorAll('.bd-article *')) {
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('');
    if (!re.test(own)) continue;
    if (el.closest('mjx-assistive-mml')) continue;  // MathJax's hidden MathML copy: never drawn
    checked++;
    const family = getComputedStyle(el).fontFamily;
    if (!family.includes('D2lattn CJK')) bad.push([el.tagName, el.className, family.slice(0, 60)]);
  }
  return {checked, bad: bad.slice(0, 10)};
}"""


def test_chinese_text_always_falls_back_to_the_shipped_font(site, base_url, browser):
    """On screen and in print, every element of a Chinese page that holds Chinese text names the
    shipped CJK font in its font stack (a bare `monospace` drew the figures' readouts as empty
    boxes on machines without a CJK font, and in the Chinese PDF)."""
    page = browser.context.new_page()
    pages = [ZH + rel for rel in _viz_pages(site) if not rel.startswith(ZH)][:4]
    pages += [ZH + "book/ch13_diagnostics.html", ZH + "book/glossary.html"]
    for media in ("screen", "print"):
        page.emulate_media(media=media)
        for rel in pages:
            _open(page, base_url, rel, site)
            page.wait_for_function("[...document.querySelectorAll('.d2lattn-viz')]"
                                   ".every(r => r.dataset.ready === '1')", timeout=10000)
            got = page.evaluate(CJK_FONTS, CJK_CHAR)
            assert got["checked"] > 20 and got["bad"] == [], (media, rel, got)
    page.close()


# Every element of a typeset formula (not MathJax's hidden MathML copy) whose own text holds
# Chinese: its text, how many CJK characters, its font stack; each is marked for the CDP query.
MATH_CJK = """(cjk) => {
  const re = new RegExp(cjk, 'g'), out = [];
  for (const el of document.querySelectorAll('.bd-article mjx-container mjx-math *')) {
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('');
    const chars = own.match(re);
    if (!chars) continue;
    el.setAttribute('data-cjk-in-math', String(out.length));
    out.push({text: own, n: chars.length, family: getComputedStyle(el).fontFamily});
  }
  return out;
}"""


def _cjk_in_text_of_math(html_text: str) -> List[str]:
    """The Chinese words inside ``\\text{}`` (``\\textrm``, ``\\mbox``) of a page's formulas, read
    from the TeX that the page hands to MathJax."""
    import re

    args = re.findall(r"\\(?:text|textrm|mbox)\s*\{([^{}]*)\}", html_text)
    return [a for a in args if re.search(CJK_CHAR, a)]


def test_chinese_inside_formulas_is_drawn_with_the_shipped_font(site, base_url, browser):
    """The Chinese words of the formulas (``\\text{层}``) are drawn with the shipped CJK font.
    MathJax draws a character its fonts lack in its ``unknownFamily``, the generic ``serif``
    unless _config.yml says otherwise: empty boxes on a machine without a CJK font. The font
    stack alone proves little where a CJK font is installed (as here), so the browser is asked
    (Chrome DevTools Protocol, ``CSS.getPlatformFontsForNode``) which font drew each glyph: every
    CJK glyph of every formula must come from a web font, the shipped subset."""
    import re

    pages = {}
    for path in sorted((site / ZH / "book").glob("*.html")):
        words = _cjk_in_text_of_math(path.read_text(encoding="utf-8"))
        if words:
            pages[ZH + path.relative_to(site / ZH).as_posix()] = words
    # chapters 2, 3, 4, 8, 11, 14 and 15 translate the words of their formulas
    assert len(pages) >= 7, sorted(pages)
    page = browser.context.new_page()
    cdp = browser.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    problems = []
    for rel, words in pages.items():
        _open(page, base_url, rel, site)
        assert page.evaluate(WAIT_FOR_MATHJAX) is True, rel
        page.evaluate("document.fonts.ready.then(() => true)")
        drawn = page.evaluate(MATH_CJK, CJK_CHAR)
        wanted = sum(len(re.findall(CJK_CHAR, w)) for w in words)
        if sum(d["n"] for d in drawn) != wanted:
            problems.append(f"{rel}: {wanted} CJK characters in \\text{{}}, {drawn} typeset")
        root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        for d in drawn:
            if "D2lattn CJK" not in d["family"]:
                problems.append(f"{rel}: {d['text']!r} in {d['family']}")
        for node in cdp.send("DOM.querySelectorAll", {"nodeId": root,
                                                      "selector": "[data-cjk-in-math]"})["nodeIds"]:
            index = int(dict(zip(*[iter(cdp.send("DOM.getAttributes", {"nodeId": node})
                                       ["attributes"])] * 2))["data-cjk-in-math"])
            fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
            shipped = sum(f["glyphCount"] for f in fonts if f["isCustomFont"])
            if shipped != drawn[index]["n"]:
                problems.append(f"{rel}: {drawn[index]['text']!r} drawn with {fonts}")
    page.close()
    assert problems == [], "\n".join(problems[:20])


# Every text of the rendered page that holds Chinese (body text, headings, tables, captions,
# code and its outputs, figures' HTML and SVG text, formulas), grouped by what decides which
# font draws a character: the computed font-family, weight, style and stretch, and the
# language. For each group, a probe element with exactly that style, holding every Chinese
# character of the group once, is added to the page, so that the browser can say (one
# DevTools query per group) which fonts drew those glyphs. Closed <details> are opened first
# (solutions, the library's code). Left out, as never drawn as text: <title>, <option> (a
# menu's native list), attributes (aria labels), MathJax's hidden MathML copy.
CJK_TEXT_BY_STYLE = """(cjk) => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const skip = 'script, style, title, noscript, textarea, option, template, mjx-assistive-mml';
  const re = new RegExp(cjk, 'g'), groups = {};
  let runs = 0, glyphs = 0;
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const el = t.parentElement;
    if (!el || el.closest(skip)) continue;
    const chars = t.textContent.match(re);
    if (!chars) continue;
    const st = getComputedStyle(el), lang = (el.closest('[lang]') || document.documentElement).lang;
    const key = JSON.stringify([st.fontFamily, st.fontWeight, st.fontStyle, st.fontStretch, lang]);
    const g = groups[key] || (groups[key] = {chars: {}, where: el.tagName.toLowerCase() + '.'
                                             + String(el.getAttribute('class') || '').split(' ')[0]});
    chars.forEach(c => { g.chars[c] = true; });
    runs += (t.textContent.match(new RegExp('(' + cjk + ')+', 'g')) || []).length;
    glyphs += chars.length;
  }
  return {runs, glyphs, groups: Object.entries(groups).map(([key, g]) =>
    ({key: JSON.parse(key), chars: Object.keys(g.chars).join(''), where: g.where}))};
}"""

ADD_PROBES = """async (probes) => {
  document.querySelectorAll('[data-cjk-probe]').forEach(e => e.remove());
  probes.forEach(([family, weight, style, stretch, lang, text], i) => {
    const div = document.createElement('div');
    div.setAttribute('data-cjk-probe', String(i));
    div.lang = lang;
    Object.assign(div.style, {position: 'absolute', left: '0', top: '0', whiteSpace: 'pre-wrap',
      fontFamily: family, fontWeight: weight, fontStyle: style, fontStretch: stretch,
      width: '40em'});
    div.textContent = text;
    document.body.appendChild(div);
  });
  document.body.getBoundingClientRect();
  await document.fonts.ready;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  await document.fonts.ready;
}"""


def _fonts_of_probes(page, cdp, probes):
    """For each probe (font-family, weight, style, stretch, lang, text): the web-font glyphs
    and the system fonts (family, glyphs) that drew its text."""
    page.evaluate(ADD_PROBES, probes)
    root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
    nodes = cdp.send("DOM.querySelectorAll",
                     {"nodeId": root, "selector": "[data-cjk-probe]"})["nodeIds"]
    assert len(nodes) == len(probes)
    out = []
    for node in nodes:
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
        out.append((sum(f["glyphCount"] for f in fonts if f["isCustomFont"]),
                    [(f["familyName"], f["glyphCount"]) for f in fonts if not f["isCustomFont"]]))
    return out


def test_every_chinese_glyph_of_the_chinese_site_is_drawn_with_the_shipped_font(site, base_url,
                                                                                browser):
    """Every Chinese character drawn on every page of the Chinese site comes from the shipped
    CJK web font, as the browser itself reports it (Chrome DevTools
    ``CSS.getPlatformFontsForNode``): body text, headings, tables, captions, code and its printed
    output, the figures' readouts and labels, formulas. This machine has system CJK fonts, so a
    glyph drawn by one (not a web font) is one that a reader without them sees as an empty box
    (and that the Chinese PDF draws only where the printing machine has one). Which font draws
    a character depends only on the character and on the computed font-family, weight, style,
    stretch and language, so each such style is checked once with all the characters used in
    it (on the first page that uses it, in that page's stylesheets); a bare ``monospace`` probe,
    which must come out drawn by a system font, shows that the check can fail."""
    pages = [rel for rel in _pages(site) if rel.startswith(ZH)]
    page = browser.context.new_page()
    cdp = browser.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    seen: Dict[str, Set[str]] = {}
    problems, runs, glyphs, styles, probes_checked = [], 0, 0, set(), 0
    for rel in pages:
        _open(page, base_url, rel, site)
        page.evaluate(WAIT_FOR_MATHJAX)
        page.wait_for_function("[...document.querySelectorAll('.d2lattn-viz')]"
                               ".every(r => r.dataset.ready === '1')", timeout=10000)
        found = page.evaluate(CJK_TEXT_BY_STYLE, CJK_CHAR)
        runs, glyphs = runs + found["runs"], glyphs + found["glyphs"]
        probes, wheres = [], []
        for group in found["groups"]:
            key = json.dumps(group["key"])
            styles.add(key)
            new = "".join(c for c in group["chars"] if c not in seen.setdefault(key, set()))
            if new:
                seen[key].update(new)
                probes.append(group["key"] + [new])
                wheres.append(f"{rel}: <{group['where']}> in {group['key'][0][:50]}")
        if rel == pages[0]:  # the control: no web font in the stack, so a system font draws it
            probes.append(["monospace", "400", "normal", "100%", "zh-CN", "注意力"])
            wheres.append("control")
        for probe, where, (shipped, system) in zip(probes, wheres,
                                                   _fonts_of_probes(page, cdp, probes)):
            probes_checked += 1
            if where == "control":
                assert shipped == 0 and system, ("the check cannot see a system font", system)
            elif system or shipped != len(probe[-1]):
                problems.append(f"{where}: {len(probe[-1])} characters, {shipped} drawn by a web "
                                f"font, system fonts {system}")
    page.close()
    print(f"\n{len(pages)} Chinese pages: {runs} runs of Chinese text, {glyphs} CJK glyphs, "
          f"{len(styles)} font styles, {sum(map(len, seen.values()))} (style, character) pairs "
          f"in {probes_checked} probes")
    assert problems == [], "\n".join(problems[:30])
    assert len(pages) >= 20 and glyphs > 20000, (len(pages), glyphs)


def test_chinese_figures_write_their_own_words_in_chinese(site, base_url, browser):
    """The script's own words follow the page: full-width colons after control labels, Chinese
    screen-reader text (no "points, from"); counts are integers ("65", not "65.000")."""
    import re

    page = browser.context.new_page()
    counted = 0
    for rel in _viz_pages(site):
        if not rel.startswith(ZH):
            continue
        _open(page, base_url, rel, site)
        page.wait_for_function("[...document.querySelectorAll('.d2lattn-viz')]"
                               ".every(r => r.dataset.ready === '1')", timeout=10000)
        got = page.evaluate("""() => ({
          labels: [...document.querySelectorAll('.d2lattn-viz-control > span:first-child')]
            .map(s => s.textContent),
          hidden: [...document.querySelectorAll('.d2lattn-viz-fallback')].map(f => f.textContent).join(' '),
          aria: [...document.querySelectorAll('.d2lattn-viz svg')].map(s => s.getAttribute('aria-label')),
          readouts: [...document.querySelectorAll('.d2lattn-viz')].flatMap(root => {
            const spec = JSON.parse(root.querySelector('script.d2lattn-viz-data').textContent);
            const frames = Object.values(spec.frames);
            const counts = new Set(spec.panels.filter(p => p.type === 'readout').flatMap(p =>
              Object.keys(frames[0][p.name]).filter(k => frames.every(f => Number.isInteger(f[p.name][k])))));
            return [...root.querySelectorAll('.d2lattn-viz-readout tr')]
              .map(r => [...r.children].map(c => c.textContent))
              .filter(([name]) => counts.has(name));
          })})""")
        assert all(label.endswith("：") for label in got["labels"]), (rel, got["labels"])
        assert "points, from" not in got["hidden"] and "its numbers" not in " ".join(got["aria"])
        for name, value in got["readouts"]:
            assert re.fullmatch(r"-?\d+", value), (rel, name, value)
            counted += 1
    page.close()
    assert counted >= 5, counted


def test_every_footer_shows_version_commit_and_build_date(site):
    import re

    init = (ROOT / "d2lattn" / "__init__.py").read_text(encoding="utf-8")
    version = re.search(r'__version__\s*=\s*"([^"]+)"', init).group(1)
    for rel in _pages(site):
        if rel.endswith("index.html") and rel.count("/") <= 1:
            continue  # the redirecting root page
        text = (site / rel).read_text(encoding="utf-8")
        match = re.search(r'<p class="d2lattn-build-info">(.*?)</p>', text)
        assert match, f"{rel}: no version and build date in the footer"
        assert version in match.group(1), rel
        assert re.search(r'datetime="\d{4}-\d{2}-\d{2}"', match.group(1)), rel


def test_source_links_follow_the_setting(site):
    """With no repository address (as committed) no page links to an invented one; with one,
    every page has the three links (tests/test_book_sources.py builds with an example)."""
    import yaml

    url = (yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
           .get("repository", {}).get("url") or "")
    for rel in _article_pages(site):
        text = (site / rel).read_text(encoding="utf-8")
        if url:
            for cls in ("d2lattn-issue-link", "d2lattn-edit-link", "d2lattn-repo-link"):
                assert cls in text, f"{rel}: no {cls}"
        else:
            assert "d2lattn-issue-link" not in text and "executablebooks" not in text, rel


def test_root_pages_have_a_language_and_a_title(site):
    for rel, lang in (("index.html", "en"), ("zh/index.html", "zh-CN")):
        text = (site / rel).read_text(encoding="utf-8")
        assert f'<html lang="{lang}">' in text and "<title>" in text, rel
    landing = (site / "book" / "preface.html").read_text(encoding="utf-8")
    assert "<title>How Attention Works</title>" in landing


def test_downloaded_notebooks_say_how_to_run_them(site):
    """The .ipynb button downloads (never opens the JSON), and the copy starts with a note on
    getting the repository; the rest of the notebook is the chapter as committed."""
    import re

    for rel in _article_pages(site):
        if not rel.split("/")[-1].startswith("ch"):
            continue
        text = (site / rel).read_text(encoding="utf-8")
        links = re.findall(r'<a href="([^"]+\.ipynb)"([^>]*)>', text)
        assert links and all(" download" in attrs for _, attrs in links), rel
        notebook = json.loads((site / _resolve(rel, links[0][0])).read_text(encoding="utf-8"))
        first = notebook["cells"][0]
        assert first["metadata"].get("d2lattn_download_note"), rel
        assert "requirements.txt" in "".join(first["source"]), rel
        if not rel.startswith(ZH):  # the Chinese download may carry translated prose
            original = json.loads((ROOT / "book" / Path(links[0][0]).name)
                                  .read_text(encoding="utf-8"))
            assert notebook["cells"][1:] == original["cells"], rel


PDF_NAME = "how-attention-works.pdf"


def _pdf_pages(data: bytes) -> int:
    import re

    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data))


@pytest.mark.parametrize("prefix", ["", ZH])
def test_the_pdf_of_the_whole_book_exists_and_opens(site, base_url, browser, prefix):
    """Each language's PDF is there, linked from every page, served as a PDF and whole (every
    chapter, so many pages)."""
    path = site / prefix / PDF_NAME
    assert path.is_file(), f"no {path.relative_to(site)}: run python tools/book.py build (or pdf)"
    data = path.read_bytes()
    assert data[:5] == b"%PDF-" and b"%%EOF" in data[-1024:], "not a complete PDF"
    assert _pdf_pages(data) >= 60, _pdf_pages(data)
    for rel in _article_pages(site):
        if rel.startswith(ZH) != bool(prefix):
            continue
        text = (site / rel).read_text(encoding="utf-8")
        import re

        href = re.search(r'<a class="d2lattn-pdf-link" href="([^"]+)"', text)
        assert href and _resolve(rel, href.group(1)) == f"{prefix}{PDF_NAME}", rel
    page = browser.context.new_page()
    response = page.request.get(base_url + prefix + PDF_NAME)
    assert response.status == 200 and response.body()[:5] == b"%PDF-"
    assert "pdf" in response.headers.get("content-type", ""), response.headers
    page.close()


def _pdf_links_and_outline(path: Path):
    """(link targets as 'file:...', 'https:...' or 'internal', [(title, depth)] of the outline)."""
    pypdf = pytest.importorskip("pypdf")
    reader = pypdf.PdfReader(str(path))
    links = []
    for page in reader.pages:
        for annotation in page.get("/Annots") or []:
            annotation = annotation.get_object()
            if annotation.get("/Subtype") != "/Link":
                continue
            action = annotation.get("/A")
            action = action.get_object() if action is not None else None
            if action is not None and "/URI" in action:
                links.append(str(action["/URI"]))
            elif action is not None and "/F" in action:  # a link to another file
                links.append("file:" + str(action["/F"]))
            else:
                links.append("internal")
    outline = []

    def walk(items, depth):
        for item in items:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                outline.append((str(item.title), depth))
    walk(reader.outline, 0)
    return links, outline


@pytest.mark.parametrize("prefix", ["", ZH])
def test_the_pdf_links_within_itself_and_has_bookmarks_by_part(site, prefix):
    """Every link of the PDF that points into the book is a link within the PDF (none to the
    builder's disk: the first PDFs had 570 file: links); the bookmarks hold the book's parts,
    each with its chapters, as _toc.yml orders them."""
    import re

    import yaml

    path = site / prefix / PDF_NAME
    links, outline = _pdf_links_and_outline(path)
    assert [u for u in links if u.startswith("file:") or "/_build/" in u] == []
    assert links.count("internal") >= 300, links.count("internal")
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    tool = book_tool()
    parts = [p["caption"] for p in toc["parts"]]
    if prefix:
        parts = [tool.ZH_CAPTIONS[p] for p in parts]
    top = [title for title, depth in outline if depth == 0]
    assert [t for t in top if t in parts] == parts, top
    chapters = [title for title, depth in outline if depth == 1]
    for n in range(1, len(_toc_chapters()) + 1):
        assert any(re.match(rf"{n}\. ", t) for t in chapters), (n, chapters)


@pytest.mark.parametrize("prefix", ["", ZH])
def test_the_pdf_bookmarks_land_in_their_own_chapter(site, prefix):
    """Every section bookmark lands on a page of its own chapter, and on a page that shows its
    title: section ids repeat across chapters on the one page that is printed ("summary",
    "exercises"), and before tools/book.py made them unique, 29 of 157 bookmarks and 72 heading
    links jumped to chapter 1's or chapter 7's page."""
    import re

    pypdf = pytest.importorskip("pypdf")
    reader = pypdf.PdfReader(str(site / prefix / PDF_NAME))
    squash = lambda t: re.sub(r"\s+", "", t)
    texts: dict = {}

    def text(i):
        if i not in texts:
            texts[i] = squash(reader.pages[i].extract_text() or "")
        return texts[i]

    chapters = []  # (title, page, [(section title, page)])

    def walk(items, depth):
        for item in items:
            if isinstance(item, list):
                walk(item, depth + 1)
            elif depth == 1:
                chapters.append((str(item.title), reader.get_destination_page_number(item), []))
            elif depth == 2 and chapters:
                chapters[-1][2].append((str(item.title), reader.get_destination_page_number(item)))
    walk(reader.outline, 0)
    numbered = [c for c in chapters if re.match(r"\d+\. ", c[0])]
    assert len(numbered) == len(_toc_chapters()), [c[0] for c in chapters]
    starts = sorted(page for _, page, _ in chapters)
    wrong, untitled, count = [], [], 0
    sampled = 0
    for title, page, sections in chapters:
        end = min([p for p in starts if p > page], default=len(reader.pages))
        for sub, at in sections:
            count += 1
            if not page <= at <= end:
                wrong.append((title, sub, at, (page, end)))
            elif count % 5 == 0:  # the title on the page (text extraction is slow: a sample)
                sampled += 1
                head = squash(sub)[:12]
                if head not in text(at) and not (at + 1 < len(reader.pages)
                                                 and head in text(at + 1)):
                    untitled.append((title, sub, at))
    assert count >= 100, count
    assert wrong == [], wrong[:10]
    # the live element of chapter 12 (its GPT) is said in print: what it is and where to run it
    import importlib.util

    spec = importlib.util.spec_from_file_location("d2lattn_lm", ROOT / "book" / "_ext" / "d2lattn_lm.py")
    lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm)
    alternative = squash(lm.PRINT_ALTERNATIVE["zh" if prefix else "en"])[:40]
    ch12 = [(page, end) for title, page, _ in chapters for end in
            [min([p for p in starts if p > page], default=len(reader.pages))]
            if re.match(r"12\. ", title)]
    assert ch12 and any(alternative in text(i) for i in range(ch12[0][0], ch12[0][1] + 1)), \
        alternative
    assert len(untitled) <= sampled // 10, untitled[:10]  # extraction may split a few titles


def _page_marks(page, reader):
    """One PDF page's filled areas, as (fill colour, (x0, y0, x1, y1)) cut to their clip (what
    shows), and where its text runs start, as (x, y, in a monospace font), in page units."""
    from pypdf.generic import ContentStream

    fonts = {}
    for name, font in (page["/Resources"].get_object().get("/Font") or {}).items():
        fonts[name] = str(font.get_object().get("/BaseFont", ""))
    fill_ops = {b"f", b"f*", b"F", b"B", b"B*", b"b", b"b*"}
    ctm, clip, color, font = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0), None, None, ""
    stack, points, clipping, fills, texts = [], [], False, [], []

    def at(x, y):
        return ctm[0] * x + ctm[2] * y + ctm[4], ctm[1] * x + ctm[3] * y + ctm[5]

    def cut(a, b):
        return b if a is None else (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))

    for operands, op in ContentStream(page.get_contents(), reader).operations:
        if op == b"q":
            stack.append((ctm, clip, color))
        elif op == b"Q":
            ctm, clip, color = stack.pop()
        elif op == b"cm":
            a, b, c, d, e, f = (float(v) for v in operands)
            m = ctm
            ctm = (a * m[0] + b * m[2], a * m[1] + b * m[3], c * m[0] + d * m[2],
                   c * m[1] + d * m[3], e * m[0] + f * m[2] + m[4], e * m[1] + f * m[3] + m[5])
        elif op == b"rg":
            color = tuple(round(float(v), 3) for v in operands)
        elif op == b"g":
            color = (round(float(operands[0]), 3),) * 3
        elif op in (b"m", b"l"):
            points.append(at(float(operands[0]), float(operands[1])))
        elif op == b"c":
            points.append(at(float(operands[4]), float(operands[5])))
        elif op == b"re":
            x, y, w, h = (float(v) for v in operands)
            points += [at(x, y), at(x + w, y + h)]
        elif op in (b"W", b"W*"):
            clipping = True
        elif op in fill_ops or op in (b"n", b"S", b"s"):
            if points:
                xs, ys = [q[0] for q in points], [q[1] for q in points]
                box = (min(xs), min(ys), max(xs), max(ys))
                if clipping:
                    clip = cut(clip, box)
                if op in fill_ops:
                    box = cut(clip, box)
                    if box[2] > box[0] and box[3] > box[1]:
                        fills.append((color, box))
            points, clipping = [], False
        elif op == b"Tf":
            font = fonts.get(operands[0], "")
        elif op == b"Tm":
            x, y = at(float(operands[4]), float(operands[5]))
            texts.append((x, y, "Mono" in font or "Courier" in font))
    return fills, texts


def empty_code_frames(path: Path, min_height: float = 6.0):
    """(code frames found, [(page, height in pt)] of those with no text in them) of a PDF that
    Chromium printed. A code frame is a light filled area at least 40% of the page wide; its
    colours are learnt from the PDF itself: those whose areas mostly hold monospace text
    (a cell's frame, a code block's background). A piece of such a frame at least
    ``min_height`` tall with no text in it is a frame left empty by a page break."""
    pypdf = pytest.importorskip("pypdf")
    reader = pypdf.PdfReader(str(path))
    marks = [_page_marks(page, reader) for page in reader.pages]
    width = float(reader.pages[0].mediabox.width)

    def holds(box, texts):
        x0, y0, x1, y1 = box
        return [mono for x, y, mono in texts if x0 - 1 <= x <= x1 + 1 and y0 - 1 <= y <= y1 + 1]

    counts: Dict[tuple, List[int]] = {}
    for fills, texts in marks:
        for color, box in fills:
            if color and min(color) >= 0.85 and color != (1.0, 1.0, 1.0) and box[2] - box[0] >= 0.4 * width:
                n = counts.setdefault(color, [0, 0])
                n[0] += 1
                n[1] += any(holds(box, texts))
    code = {c for c, (n, mono) in counts.items() if mono >= 20 and mono >= 0.5 * n}
    empty = [(number, round(box[3] - box[1], 1))
             for number, (fills, texts) in enumerate(marks, start=1) for color, box in fills
             if color in code and box[2] - box[0] >= 0.4 * width
             and box[3] - box[1] >= min_height and not holds(box, texts)]
    return sum(counts[c][0] for c in code), empty


@pytest.mark.parametrize("prefix", ["", ZH])
def test_the_pdf_has_no_empty_code_frame(site, prefix):
    """No code cell's frame sits empty at the foot of a page with its code on the next: every
    piece of a code frame in the PDF holds text. The first PDFs had such frames on 74 English
    pages; a print stylesheet that let code break across pages still left 18 (English) and 19
    (Chinese), where fewer than three lines fitted under the frame's top edge."""
    frames, empty = empty_code_frames(site / prefix / PDF_NAME)
    assert frames >= 1000, f"only {frames} code frames recognised: the detector is blind"
    assert empty == [], f"{len(empty)} empty code frames (page, height in pt): {empty[:12]}"


MEASURE_PHONE = """() => ({
  plots: [...document.querySelectorAll('.cell_output img')].filter(i => i.naturalWidth > 0)
    .map(i => [i.getAttribute('src'), i.getBoundingClientRect().width, i.naturalWidth]),
  charts: [...document.querySelectorAll('.d2lattn-viz svg')]
    .map(s => [s.getBoundingClientRect().width, s.width.baseVal.value]),
  fontPx: [...document.querySelectorAll('.d2lattn-viz svg text')].map(t => {
    const svg = t.ownerSVGElement, scale = svg.getBoundingClientRect().width / svg.width.baseVal.value;
    return parseFloat(t.getAttribute('font-size') || '10') * scale; }),
  wider: document.documentElement.scrollWidth > window.innerWidth + 1,
})"""


def test_figures_keep_a_legible_size_on_a_phone(site, base_url, browser):
    """At 390 px a plot keeps at least half its drawn size (10-point labels stay about 10 px)
    and an interactive figure its full size (text >= 9 px); they scroll sideways instead, and
    the page itself stays as wide as the screen."""
    page = browser.context.new_page()
    page.set_viewport_size(PHONE)
    checked = 0
    for rel in _article_pages(site):
        if not rel.split("/")[-1].startswith("ch"):
            continue
        _open(page, base_url, rel, site)
        if _viz_pages(site).count(rel):
            page.wait_for_function(
                "[...document.querySelectorAll('.d2lattn-viz')].every(r => r.dataset.ready === '1')",
                timeout=10000)
        got = page.evaluate(MEASURE_PHONE)
        assert not got["wider"], f"{rel}: wider than the phone's screen"
        for src, shown, natural in got["plots"]:
            checked += 1
            assert shown >= 0.49 * natural or shown >= PHONE["width"] - 40, f"{rel}: {src} at {shown / natural:.2f}"
        for shown, drawn in got["charts"]:
            assert shown >= drawn - 1, f"{rel}: an interactive figure shrunk to {shown / drawn:.2f}"
        assert all(px >= 8.9 for px in got["fontPx"]), f"{rel}: figure text {min(got['fontPx']):.1f} px"
    page.close()
    assert checked >= 40, checked


PHONE_TABLES = """() => ({
  tables: [...document.querySelectorAll('pre.d2lattn-table-output')].map(p => {
    const style = getComputedStyle(p), lines = p.textContent.replace(/\\n+$/, '').split('\\n');
    const line = parseFloat(style.lineHeight) || 16;
    return {whiteSpace: style.whiteSpace, overflowX: style.overflowX,
            rows: Math.round((p.scrollHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom)) / line),
            lines: lines.length, scrolls: p.scrollWidth > p.clientWidth,
            shadow: style.backgroundAttachment.includes('local')};
  }),
  backToTop: (() => { const b = document.getElementById('pst-back-to-top');
                      return b ? getComputedStyle(b).display : 'none'; })(),
  panels: [...document.querySelectorAll('.d2lattn-viz-panel')].filter(p => p.scrollWidth > p.clientWidth)
    .map(p => getComputedStyle(p).backgroundAttachment.includes('local')),
  wider: document.documentElement.scrollWidth > window.innerWidth + 1,
})"""


@pytest.mark.parametrize("prefix", ["", ZH])
def test_result_tables_keep_their_columns_on_a_phone(site, base_url, browser, prefix, tmp_path):
    """At 390 x 844, chapter 12's printed tables (its decoding table among them) keep one line
    per row and scroll in their own box, with a shadow that shows more lies to the side; a
    figure panel that scrolls shows it the same way; nothing floats over the page (the theme's
    "Back to top" covered chapter 16's figure). A screenshot of each page is written to the
    test's temporary folder for a reader of the test log."""
    page = browser.context.new_page()
    page.set_viewport_size(PHONE)
    tables = 0
    for rel in (prefix + "book/ch12_gpt.html", prefix + "book/ch16_beyond_sequences.html"):
        _open(page, base_url, rel, site)
        if _viz_pages(site).count(rel):
            page.wait_for_function(
                "[...document.querySelectorAll('.d2lattn-viz')].every(r => r.dataset.ready === '1')",
                timeout=10000)
        page.screenshot(path=str(tmp_path / (rel.replace("/", "_") + ".png")), full_page=False)
        got = page.evaluate(PHONE_TABLES)
        assert not got["wider"], rel
        assert got["backToTop"] == "none", rel
        assert all(got["panels"]), rel
        for t in got["tables"]:
            tables += 1
            assert t["whiteSpace"] == "pre" and t["overflowX"] == "auto" and t["shadow"], (rel, t)
            assert t["rows"] <= t["lines"] + 1, (rel, t)  # no row wrapped onto a second line
    page.close()
    assert tables >= 5, tables


def test_interactive_figures_are_accessible(site, base_url, browser):
    """Charts are named images, the figure a named figure; sliders announce their value
    ("label = value"); tokens are a radio group with one checked token; the data of the setting
    drawn is in a table hidden from sight only."""
    page = browser.context.new_page()
    for rel in _viz_pages(site):
        _open(page, base_url, rel, site)
        page.wait_for_function(
            "[...document.querySelectorAll('.d2lattn-viz')].every(r => r.dataset.ready === '1')",
            timeout=10000)
        got = page.evaluate("""() => [...document.querySelectorAll('.d2lattn-viz')].map(root => {
          const spec = JSON.parse(root.querySelector('script.d2lattn-viz-data').textContent);
          return {
            figure: [root.getAttribute('role'), root.getAttribute('aria-label')],
            charts: [...root.querySelectorAll('svg')].map(s => [s.getAttribute('role'), s.getAttribute('aria-label')]),
            sliders: [...root.querySelectorAll('input[type=range]')].map(r => [r.getAttribute('aria-label'), r.getAttribute('aria-valuetext'), Number(r.value)]),
            selects: [...root.querySelectorAll('select')].map(s => s.getAttribute('aria-label')),
            groups: [...root.querySelectorAll('[role=radiogroup]')].map(g => [g.getAttribute('aria-label'),
              [...g.querySelectorAll('[role=radio]')].map(r => r.getAttribute('aria-checked'))]),
            table: !!root.querySelector('.d2lattn-viz-fallback.d2lattn-visually-hidden table'),
            spec};
        })""")
        for fig in got:
            spec, where = fig["spec"], f"{rel} ({fig['spec']['title']})"
            assert fig["figure"] == ["figure", spec["title"]], where
            assert fig["charts"] and all(r == "img" and label and spec["title"] in label
                                         for r, label in fig["charts"]), where
            sliders = [c for c in spec["controls"] if c["type"] not in ("tokens", "select")]
            for c, (label, valuetext, value) in zip(sliders, fig["sliders"]):
                assert label == c["label"], where
                assert valuetext == f"{c['label']} = {_js_str(c['values'][value])}", where
            assert all(fig["selects"]), where
            tokens = [c for c in spec["controls"] if c["type"] == "tokens"]
            assert len(fig["groups"]) == len(tokens), where
            for c, (label, checked) in zip(tokens, fig["groups"]):
                assert label == c["label"] and checked.count("true") == 1, where
            assert fig["table"], where
    page.close()


def test_tokens_are_chosen_by_click_and_keys_never_by_hover(site, base_url, browser):
    """ch5's head view: moving the pointer over tokens, or tabbing past them to the menu,
    keeps the reader's choice; a click, or the arrow keys in the group, change it."""
    pages = [rel for rel in _viz_pages(site) if "d2lattn-viz" in (site / rel).read_text()
             and '"tokens"' in (site / rel).read_text(encoding="utf-8")]
    assert pages, "no figure with tokens"
    checked_pages = []
    page = browser.context.new_page()
    for rel in pages:
        _open(page, base_url, rel, site)
        page.wait_for_function(
            "[...document.querySelectorAll('.d2lattn-viz')].every(r => r.dataset.ready === '1')",
            timeout=10000)
        if page.locator("[role=radiogroup]").count() == 0:
            continue  # a figure whose data has tokens but no token chips (ch15's paged cache)
        checked_pages.append(rel)
        group = page.locator("[role=radiogroup]").first
        root = page.locator(".d2lattn-viz", has=group).first
        radios = group.locator("[role=radio]")
        assert radios.count() >= 3, rel
        checked = lambda: [radios.nth(i).get_attribute("aria-checked")
                           for i in range(radios.count())].index("true")
        frame = root.get_attribute("data-frame")
        first = checked()
        other = (first + 2) % radios.count()
        radios.nth(other).hover()
        for i in range(radios.count()):
            radios.nth(i).hover()
        assert checked() == first and root.get_attribute("data-frame") == frame, f"{rel}: hover chose"
        radios.nth(other).click()
        assert checked() == other and root.get_attribute("data-frame") != frame, f"{rel}: click"
        frame = root.get_attribute("data-frame")
        page.keyboard.press("ArrowRight")
        assert checked() == (other + 1) % radios.count(), f"{rel}: ArrowRight"
        assert page.evaluate("document.activeElement.getAttribute('role')") == "radio"
        page.keyboard.press("ArrowLeft")
        assert checked() == other and root.get_attribute("data-frame") == frame, f"{rel}: ArrowLeft"
        page.keyboard.press("Tab")  # on to the next control: the choice stays
        assert checked() == other and root.get_attribute("data-frame") == frame, f"{rel}: Tab"
    page.close()
    assert checked_pages, "no figure with token chips"


def test_every_reference_with_an_identifier_links_it(site):
    """Every entry of references.bib with a DOI, an arXiv id (an eprint field, or an arXiv
    number in its text) or a URL renders a link to it, in both languages."""
    import re

    bib = (ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    expected = {}
    for entry in re.split(r"\n(?=@)", bib):
        key = re.match(r"\s*@\w+\{([^,]+),", entry)
        if not key:
            continue
        doi = re.search(r"^\s*doi\s*=\s*\{([^}]+)\}", entry, re.M | re.I)
        arxiv = re.search(r"(?:eprint\s*=\s*\{|arXiv:)(\d{4}\.\d{4,5})", entry, re.I)
        if doi:
            expected[key.group(1)] = "https://doi.org/" + doi.group(1)
        elif arxiv:
            expected[key.group(1)] = "https://arxiv.org/abs/" + arxiv.group(1)
    assert len(expected) >= 60, len(expected)
    for prefix in ("", ZH):
        text = (site / prefix / "book" / "bibliography.html").read_text(encoding="utf-8")
        # an identifier belongs to one entry: its link on the page is that entry's
        links = {h.lower() for h in re.findall(r'<a class="reference external" href="([^"]+)"',
                                                text)}
        missing = [key for key, url in expected.items() if url.lower() not in links]
        assert missing == [], (prefix, missing)


def test_bibliography_renders_latex_and_links_its_sources(site):
    for prefix in ("", ZH):
        text = (site / prefix / "book" / "bibliography.html").read_text(encoding="utf-8")
        assert "$O(" not in text and "O(n²)" in text, prefix
        arxiv = text.count('href="https://arxiv.org/abs/')
        doi = text.count('href="https://doi.org/')
        assert arxiv >= 30 and doi >= 10, (prefix, arxiv, doi)


@pytest.mark.parametrize("prefix", ["", ZH])
def test_search_snippets_come_from_the_article(site, base_url, browser, prefix):
    page = browser.context.new_page()
    page.goto(f"{base_url}{prefix}search.html?q=softmax", wait_until="load")
    page.wait_for_function(
        "document.querySelectorAll('#search-results ul.search li p.context').length >= 3",
        timeout=20000)
    snippets = page.evaluate("""() => [...document.querySelectorAll(
        '#search-results ul.search li p.context')].map(p => p.textContent)""")
    page.close()
    assert not any(".ipynb" in s[:40] for s in snippets), snippets[:5]


def test_search_over_file_urls_logs_no_error_and_says_why(site, browser):
    page = browser.context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((site / "search.html").resolve().as_uri() + "?q=softmax", wait_until="load")
    hits = page.evaluate(SEARCH_RESULTS)
    page.wait_for_timeout(500)
    note = page.evaluate("document.querySelector('.d2lattn-search-note')?.textContent || ''")
    page.close()
    assert hits, "no results from file://"
    assert errors == [], errors[:3]
    assert "http.server" in note


# These two run last, so that they cover the pages opened by every test above. -------------

def test_no_request_leaves_the_machine(crawl, browser):
    """Runs last (pytest keeps file order): covers the requests of every test above."""
    recorder = browser.recorder
    assert recorder.requests, "no request was recorded at all"
    assert recorder.foreign_hosts() == set()


def test_no_missing_files_and_no_javascript_errors(crawl, browser):
    recorder = browser.recorder
    assert recorder.failures == []
    assert recorder.console_errors == []
