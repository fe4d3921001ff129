"""The scatter panel of the interactive figures: a picture of points (chapter 16's point cloud).

Chapter 16's figure draws the cloud, the chosen query point and its neighbours filled by the
weight of the chosen channel, not a grid of numbers chosen by bare indices. These tests check
the data (``d2lattn.interactive``) without a browser, and the drawing
(``book/assets/static/d2lattn-viz.js``) in headless Chromium on a page of its own: every drawn
neighbour carries the weight computed for the setting, the cross sits on the chosen point, the
keyboard moves both controls, and the hidden table for screen readers follows. Chromium and
playwright as in tests/test_site.py (skipped where missing, failed in CI).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from d2lattn.interactive import InteractiveFigure

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "book" / "assets" / "static" / "d2lattn-viz.js"
CHAPTER = ROOT / "book" / "ch16_beyond_sequences.ipynb"
_DATA = re.compile(r'<script type="application/json" class="d2lattn-viz-data">(.*?)</script>',
                   re.S)


def _small(**entry):
    frame = {"focus": 0, "points": [0, 2], "values": [0.25, 0.75], **entry}
    return InteractiveFigure(
        "t", controls=[{"name": "c", "label": "c", "values": ["a"]}],
        panels=[{"name": "s", "type": "scatter", "x": [0.0, 1.0, 2.0], "y": [0.0, 1.0, 0.5]}],
        frames={"0": {"s": frame}})


def test_a_scatter_panel_keeps_its_points_and_lists_them_in_the_static_table():
    html = _small()._repr_html_()
    spec = json.loads(_DATA.search(html).group(1))
    assert spec["panels"][0]["x"] == [0.0, 1.0, 2.0]
    assert spec["frames"]["0"]["s"] == {"focus": 0, "points": [0, 2], "values": [0.25, 0.75]}
    fallback = html.split('class="d2lattn-viz-fallback">')[1]
    assert "<tr><td>×</td><td>0</td></tr><tr><td>0</td><td>0.250</td></tr>" in fallback
    assert "<tr><td>2</td><td>0.750</td></tr>" in fallback


@pytest.mark.parametrize("entry, message", [
    ({"focus": 3}, "indices of the panel's 3 points"),
    ({"points": [0, 5]}, "indices of the panel's 3 points"),
    ({"points": [0, 0]}, "distinct"),
    ({"values": [0.5]}, "one value each"),
    ({"focus": True}, "indices"),
])
def test_a_scatter_entry_that_names_no_point_of_the_panel_raises(entry, message):
    with pytest.raises(ValueError, match=message):
        _small(**entry)


def test_a_scatter_panel_needs_one_y_per_x():
    with pytest.raises(ValueError, match="same non-zero length"):
        InteractiveFigure("t", controls=[{"name": "c", "label": "c", "values": ["a"]}],
                          panels=[{"name": "s", "type": "scatter", "x": [0, 1], "y": [0]}],
                          frames={"0": {"s": {"focus": 0, "points": [], "values": []}}})


def _chapter_figure() -> tuple[str, dict]:
    notebook = json.loads(CHAPTER.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            html = "".join(output.get("data", {}).get("text/html", []))
            if 'class="d2lattn-viz"' in html:
                return html, json.loads(_DATA.search(html).group(1).replace("<\\/", "</"))
    raise AssertionError("chapter 16 has no interactive figure")


def test_chapter_16s_figure_shows_the_cloud_and_the_chosen_point():
    """The figure draws the point cloud: every point's position, the query point and its
    neighbours per setting, a query point and a channel to choose."""
    _, spec = _chapter_figure()
    scatter = [p for p in spec["panels"] if p["type"] == "scatter"]
    assert len(scatter) == 1, "chapter 16's figure has no picture of the cloud"
    cloud = scatter[0]
    n = len(cloud["x"])
    assert n == len(cloud["y"]) >= 32
    assert [c["name"] for c in spec["controls"]] == ["query", "channel"]
    queries = {spec["frames"][f"{a},0"][cloud["name"]]["focus"]
               for a in range(len(spec["controls"][0]["values"]))}
    assert len(queries) == len(spec["controls"][0]["values"])  # six different points
    for key, frame in spec["frames"].items():
        entry = frame[cloud["name"]]
        assert entry["points"][0] == entry["focus"]  # its own nearest neighbour
        assert len(entry["points"]) == 12
        assert abs(sum(entry["values"]) - 1) < 0.01, key  # one channel's weights
        assert entry["values"] == frame["weights"], key  # the bars show the same weights


@pytest.fixture(scope="module")
def page():
    from test_site import CHROMIUM_ARGS, _chromium, _missing

    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the `playwright` Python package is not installed")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True,
                                     args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: errors.append("request " + r.url)
                if not r.url.startswith(("about:", "data:")) else None)
        html, _ = _chapter_figure()
        page.set_content(f'<!doctype html><html lang="en"><body>{html}'
                         f'<script>{SCRIPT.read_text(encoding="utf-8")}</script></body></html>')
        page.wait_for_selector(".d2lattn-viz[data-ready='1']")
        yield page
        assert not errors, errors
        browser.close()


READ = """() => {
  const root = document.querySelector('.d2lattn-viz');
  const box = root.querySelector('.d2lattn-viz-panel[data-panel="cloud"]');
  return {
    frame: root.dataset.frame,
    dots: [...box.querySelectorAll('circle.d2lattn-viz-dot')].map(
      c => [Number(c.dataset.index), Number(c.dataset.value)]),
    grey: box.querySelectorAll('circle.d2lattn-viz-point').length,
    focus: Number(box.querySelector('.d2lattn-viz-focus').dataset.index),
    focusAt: (() => { const l = box.querySelector('.d2lattn-viz-focus line');
                      return [(+l.getAttribute('x1') + +l.getAttribute('x2')) / 2,
                              (+l.getAttribute('y1') + +l.getAttribute('y2')) / 2]; })(),
    dotAt: Object.fromEntries([...box.querySelectorAll('circle.d2lattn-viz-dot')].map(
      c => [c.dataset.index, [+c.getAttribute('cx'), +c.getAttribute('cy')]])),
    label: box.querySelector('svg').getAttribute('aria-label'),
    hidden: root.querySelector('.d2lattn-viz-fallback').textContent,
  };
}"""


def _check(page, spec):
    got = page.evaluate(READ)
    entry = spec["frames"][got["frame"]]["cloud"]
    assert got["dots"] == [list(p) for p in zip(entry["points"], entry["values"])]
    assert got["focus"] == entry["focus"]
    assert got["dotAt"][str(entry["focus"])] == pytest.approx(got["focusAt"], abs=0.01)
    assert got["grey"] == len(spec["panels"][0]["x"]) - len(entry["points"])
    assert "×" + str(entry["focus"]) in got["hidden"].replace(" ", "")
    return got


def test_the_figure_draws_the_chosen_point_and_its_neighbours(page):
    _, spec = _chapter_figure()
    got = _check(page, spec)
    initial = ",".join(str(c["initial"]) for c in spec["controls"])
    assert got["frame"] == initial
    assert "query point" in got["label"]


def test_the_keyboard_moves_the_query_point_and_the_channel(page):
    _, spec = _chapter_figure()
    start = page.evaluate(READ)
    page.focus(".d2lattn-viz-control[data-control='query'] select")
    page.keyboard.press("ArrowDown")
    moved = _check(page, spec)
    assert moved["frame"].split(",")[0] == "1" and moved["focus"] != start["focus"]
    page.focus(".d2lattn-viz-control[data-control='channel'] input[type=range]")
    page.keyboard.press("ArrowRight")
    turned = _check(page, spec)
    q, c = map(int, turned["frame"].split(","))
    assert (q, c) == (1, int(moved["frame"].split(",")[1]) + 1)
    assert turned["focus"] == moved["focus"] and turned["dots"] != moved["dots"]
