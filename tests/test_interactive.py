"""Unit tests of d2lattn.interactive: the data behind the book's interactive figures."""

import json
import math
import re

import pytest
import torch

from d2lattn.interactive import InteractiveFigure, frame_key


def _figure(**overrides):
    spec = dict(
        controls=[{"name": "a", "label": "A", "values": [1, 2]},
                  {"name": "b", "label": "B", "type": "select", "values": ["x", "y", "z"],
                   "initial": 2}],
        panels=[{"name": "w", "type": "bars", "labels": ["k0", "k1"]},
                {"name": "r", "type": "readout"}],
        frames={frame_key(i, j): {"w": torch.tensor([0.25 * i, 1 / 3 + j]), "r": {"sum": i + j}}
                for i in range(2) for j in range(3)})
    spec.update(overrides)
    return InteractiveFigure("test", **spec)


def _payload(fig):
    html = fig._repr_html_()
    match = re.search(r'<script type="application/json" class="d2lattn-viz-data">(.*?)</script>', html)
    return html, json.loads(match.group(1))


def test_frame_key():
    assert frame_key(0) == "0" and frame_key(3, 1, 2) == "3,1,2"


def test_html_holds_rounded_data_and_a_fallback_of_the_initial_setting():
    fig = _figure()
    html, data = _payload(fig)
    assert html.startswith('<div class="d2lattn-viz">')
    assert data["frames"]["1,2"]["w"] == [0.25, 2.333]  # rounded to 3 digits
    assert set(data["frames"]) == {frame_key(i, j) for i in range(2) for j in range(3)}
    # the fallback table shows the initial setting: a = 1 (index 0), b = z (index 2)
    fallback = html.split('class="d2lattn-viz-fallback">', 1)[1]
    assert "A = 1, B = z" in fallback and "2.333" in fallback
    assert repr(fig) == "InteractiveFigure('test', 6 frames)"


def test_negative_zero_and_script_end_tags_are_made_safe():
    fig = _figure(frames={frame_key(i, j): {"w": [-0.0001, 0.0], "r": {"</script>": 1.0}}
                          for i in range(2) for j in range(3)})
    html, data = _payload(fig)
    assert data["frames"]["0,0"]["w"] == [0.0, 0.0]
    assert "-0.0" not in html.split("d2lattn-viz-data\">", 1)[1].split("</script>", 1)[0]
    assert html.count("</script>") == 1


def test_digits():
    fig = _figure(digits=1)
    assert _payload(fig)[1]["frames"]["0,0"]["w"] == [0.0, 0.3]
    with pytest.raises(ValueError, match="digits"):
        _figure(digits=-1)


@pytest.mark.parametrize("change, message", [
    ({"controls": [{"name": "a", "label": "A", "type": "knob", "values": [1]}]}, "control type"),
    ({"controls": [{"name": "a", "values": [1]}]}, "lacks the field 'label'"),
    ({"controls": [{"name": "a", "label": "A", "values": [1, 2], "initial": 2}]}, "initial"),
    ({"controls": []}, "at least one control"),
    ({"panels": [{"name": "w", "type": "pie"}]}, "panel type"),
    ({"panels": [{"name": "w", "type": "grid", "rows": [0]}]}, "lacks the field 'cols'"),
    ({"panels": [{"name": "w", "type": "readout"}, {"name": "w", "type": "readout"}]}, "distinct"),
])
def test_bad_specifications_raise(change, message):
    with pytest.raises(ValueError, match=message):
        _figure(**change)


def test_missing_frames_panels_and_non_finite_numbers_raise():
    frames = {frame_key(i, j): {"w": [0.0, 1.0], "r": {"s": 1}} for i in range(2) for j in range(3)}
    del frames["1,1"]
    with pytest.raises(ValueError, match="no entry for the control indices '1,1'"):
        _figure(frames=frames)
    frames["1,1"] = {"w": [0.0, 1.0]}
    with pytest.raises(ValueError, match="lacks the panels"):
        _figure(frames=frames)
    frames["1,1"] = {"w": [math.nan, 1.0], "r": {"s": 1}}
    with pytest.raises(ValueError, match="finite"):
        _figure(frames=frames)


def test_fallback_grid_has_a_header_per_drawn_column():
    """A grid that shrinks with a control (ch3's mask: K keys of at most 8) gets headers over
    the columns it has, not over all the columns it could have."""
    fig = InteractiveFigure(
        "mask", controls=[{"name": "k", "label": "K", "values": [2, 3]}],
        panels=[{"name": "m", "type": "grid", "rows": ["q0"], "cols": ["k0", "k1", "k2", "k3"],
                 "boolean": True}],
        frames={frame_key(0): {"m": [[1, 0]]}, frame_key(1): {"m": [[1, 1, 0]]}})
    html = fig._fallback()
    header = re.search(r"<tr><th></th>(.*?)</tr>", html).group(1)
    assert header.count("<th>") == 2 and "k2" not in header


def test_a_chinese_notebook_draws_its_figures_in_chinese(tmp_path):
    """set_language("zh_CN") (the first cell of a Chinese notebook downloaded from the site)
    makes the figures drawn afterwards Chinese, strings and the script's language alike; None
    gives back exactly the English output; an unknown language is refused by name."""
    from d2lattn import interactive

    catalogue = tmp_path / "interactive.po"
    catalogue.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                         'msgid "A"\nmsgstr "甲"\n\nmsgid "sum"\nmsgstr "和"\n', encoding="utf-8")
    fig = _figure()
    english = fig._repr_html_()
    try:
        interactive.set_language("zh_CN", catalogue=catalogue)
        html, data = _payload(fig)
        assert data["lang"] == "zh_CN"
        assert data["controls"][0]["label"] == "甲" and data["controls"][1]["label"] == "B"
        assert all("和" in frame["r"] for frame in data["frames"].values())
        assert "甲 = 1" in html  # the static table too
    finally:
        interactive.set_language(None)
    assert fig._repr_html_() == english
    with pytest.raises(ValueError, match="language 'xx'"):
        interactive.set_language("xx")
    # the book's own catalogue is where a re-run Chinese notebook finds it
    interactive.set_language("zh_CN")
    interactive.set_language(None)


def _pool(**panel_overrides):
    """A grid whose cells carry an owner (group) and a label: chapter 15's memory pool."""
    panel = {"name": "pool", "type": "grid", "rows": ["0-1"], "cols": ["0", "1"], "vmax": 1,
             "groups": ["a", "b"], "ungrouped": "free"}
    panel.update(panel_overrides)
    frames = {frame_key(0): {"pool": {"values": [[0.5, 0.0]], "groups": [[1, None]],
                                      "labels": [["b0", ""]]}},
              frame_key(1): {"pool": {"values": [[1.0, 0.25]], "groups": [[1, 0]],
                                      "labels": [["b0", "a0"]]}}}
    return panel, frames


def test_grid_cells_carry_their_owner_and_label():
    """A grid cell can name what it belongs to: the data keeps each cell's group and label per
    frame, and the static table shows the label (else the group's name, or the legend's name
    for no group) beside each number."""
    panel, frames = _pool()
    fig = InteractiveFigure("pool", controls=[{"name": "s", "label": "step", "values": [0, 1]}],
                            panels=[panel], frames=frames, digits=2)
    _, data = _payload(fig)
    assert data["panels"][0]["groups"] == ["a", "b"] and data["panels"][0]["ungrouped"] == "free"
    assert data["frames"]["1"]["pool"] == {"values": [[1.0, 0.25]], "groups": [[1, 0]],
                                           "labels": [["b0", "a0"]]}
    cells = re.findall(r"<td>(.*?)</td>", fig._fallback())
    assert cells == ["b0 (0.50)", "free (0.00)"]
    # without labels the group names the cell, and a cell of no group is named by "ungrouped"
    frames = {k: {"pool": {"values": v["pool"]["values"], "groups": v["pool"]["groups"]}}
              for k, v in frames.items()}
    fig = InteractiveFigure("pool", controls=[{"name": "s", "label": "step", "values": [0, 1]}],
                            panels=[panel], frames=frames, digits=2)
    assert re.findall(r"<td>(.*?)</td>", fig._fallback()) == ["b (0.50)", "free (0.00)"]


@pytest.mark.parametrize("change, message", [
    (lambda f: f["0"]["pool"].update(labels=[["b0"]]), "labels must have the shape"),
    (lambda f: f["0"]["pool"].update(groups=[[2, None]]), "index into the panel's 2 groups"),
    (lambda f: f["0"]["pool"].update(groups=[[True, None]]), "index into"),
    (lambda f: f["0"]["pool"].update(labels=[["b0", 3]]), "labels must be strings"),
    (lambda f: f["0"]["pool"].update(colour=[["red", ""]]), "may have 'labels' and 'groups'"),
    (lambda f: f["0"]["pool"].pop("values"), "needs 'values'"),
])
def test_grid_labels_and_groups_are_checked(change, message):
    panel, frames = _pool()
    change(frames)
    with pytest.raises(ValueError, match=message):
        InteractiveFigure("pool", controls=[{"name": "s", "label": "step", "values": [0, 1]}],
                          panels=[panel], frames=frames)
    panel, frames = _pool(groups=[])
    with pytest.raises(ValueError, match="groups must be a non-empty list"):
        InteractiveFigure("pool", controls=[{"name": "s", "label": "step", "values": [0, 1]}],
                          panels=[panel], frames=frames)


def test_translation_names_groups_and_free_cells_but_keeps_cell_labels():
    from d2lattn.interactive import translate_data

    panel, frames = _pool()
    fig = InteractiveFigure("pool", controls=[{"name": "s", "label": "step", "values": [0, 1]}],
                            panels=[panel], frames=frames)
    data = translate_data(fig.data(), {"free": "空闲", "a": "甲", "b0": "乙0"})
    assert data["panels"][0]["ungrouped"] == "空闲" and data["panels"][0]["groups"] == ["甲", "b"]
    assert data["frames"]["1"]["pool"]["labels"] == [["b0", "a0"]]  # data, not words


def test_counts_are_written_as_integers_in_the_static_table():
    """A number that is whole in every frame (a readout's name, or a whole bars or grid panel)
    is a count and is written without decimals: "5", not "5.00" (chapter 15's requests running,
    tokens stored); a name or panel with one fractional value keeps the figure's decimals."""
    from d2lattn.interactive import integer_parts

    frames = {frame_key(i): {"r": {"running": 5 + i, "stored": 89.0, "mean": 1.0 + 0.5 * i},
                             "b": [24, 0.0], "g": [[1.0, 0.25 * i]]} for i in range(2)}
    panels = [{"name": "r", "type": "readout"}, {"name": "b", "type": "bars", "labels": ["a", "b"]},
              {"name": "g", "type": "grid", "rows": ["r"], "cols": ["x", "y"]}]
    fig = InteractiveFigure("counts", controls=[{"name": "s", "label": "step", "values": [0, 1]}],
                            panels=panels, frames=frames, digits=2)
    cells = re.findall(r"<td>(.*?)</td>", fig._fallback())
    assert cells == ["running", "5", "stored", "89", "mean", "1.00", "a", "24", "b", "0",
                     "1.00", "0.00"]
    assert integer_parts(fig.panels, fig.frames) == {
        "r": {"running": True, "stored": True, "mean": False}, "b": True, "g": False}
    # a boolean grid's cells are 0 and 1
    mask = InteractiveFigure("m", controls=[{"name": "s", "label": "s", "values": [0]}],
                             panels=[{"name": "m", "type": "grid", "rows": ["q"],
                                      "cols": ["k0", "k1"], "boolean": True}],
                             frames={"0": {"m": [[True, False]]}})
    assert re.findall(r"<td>(.*?)</td>", mask._fallback()) == ["1", "0"]


@pytest.mark.parametrize("groups", [[0], [0, "b"], [0, -1], [True, 0], "ab", 3])
def test_bar_groups_must_give_each_bar_a_group_index(groups):
    with pytest.raises(ValueError, match="groups must give each of its 2 bars a group index"):
        InteractiveFigure("g", controls=[{"name": "s", "label": "s", "values": [0]}],
                          panels=[{"name": "b", "type": "bars", "labels": ["a", "b"],
                                   "groups": groups}],
                          frames={"0": {"b": [1, 2]}})


def test_bars_keep_their_groups_in_the_data():
    fig = InteractiveFigure("g", controls=[{"name": "s", "label": "s", "values": [0]}],
                            panels=[{"name": "b", "type": "bars", "labels": ["a", "b"],
                                     "groups": (1, None)}],
                            frames={"0": {"b": [1, 2]}})
    assert _payload(fig)[1]["panels"][0]["groups"] == [1, None]


# --- the live widget (anywidget) in a notebook --------------------------------------------------

#: sha256 of _figure()'s HTML as the static-only version wrote it (before the widget existed),
#: with its integer readout ("sum") written as "2" since counts are integers (it was "2.000"):
#: the website and nbval read this HTML, so the widget must leave it byte for byte as it is.
HTML_BEFORE_THE_WIDGET = "410b53ad9e4744790be40e347b9dcd4f6471594e4e74de3e06a580a2a8c54c62"


@pytest.fixture
def widgets():
    """Widgets forced on (no kernel runs here), and back to the frontend's choice afterwards."""
    pytest.importorskip("anywidget")
    from d2lattn import interactive

    interactive.use_widgets(True)
    try:
        yield interactive
    finally:
        interactive.use_widgets(None)


def test_outside_a_widget_frontend_the_figure_is_the_static_html(monkeypatch):
    """No kernel with a widget manager (nbval, nbconvert, a plain interpreter): no mime bundle,
    so IPython shows _repr_html_ alone, exactly as before."""
    import hashlib

    from d2lattn import interactive

    monkeypatch.delenv("D2LATTN_WIDGETS", raising=False)
    fig = _figure()
    assert hashlib.sha256(fig._repr_html_().encode()).hexdigest() == HTML_BEFORE_THE_WIDGET
    assert not interactive.widgets_enabled() and fig._repr_mimebundle_() is None
    monkeypatch.setenv("D2LATTN_WIDGETS", "1")
    assert interactive.widgets_enabled() == interactive._anywidget_available()
    interactive.use_widgets(False)
    try:
        assert fig._repr_mimebundle_() is None  # the call beats the environment
    finally:
        interactive.use_widgets(None)
    with pytest.raises(ValueError, match="enabled"):
        interactive.use_widgets("yes")


def test_mimebundle_holds_the_widget_and_the_unchanged_html(widgets):
    import hashlib

    fig = _figure()
    bundle, metadata = fig._repr_mimebundle_()
    assert set(bundle) == {widgets.WIDGET_MIME, "text/html"}
    view = bundle[widgets.WIDGET_MIME]
    assert view["version_major"] == 2 and view["model_id"] == fig._widget.model_id
    assert hashlib.sha256(bundle["text/html"].encode()).hexdigest() == HTML_BEFORE_THE_WIDGET
    # the widget draws what the website draws: the same data, and the same script
    assert fig._widget.spec == _payload(fig)[1] and fig._widget.input == {}
    assert widgets.SCRIPT.read_text(encoding="utf-8") in fig._widget._esm
    assert ".d2lattn-viz-title" in fig._widget._css and "--pst-" not in fig._widget._css


def test_the_widget_speaks_the_language_set(widgets, tmp_path):
    catalogue = tmp_path / "interactive.po"
    catalogue.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                         'msgid "A"\nmsgstr "甲"\n', encoding="utf-8")
    widgets.set_language("zh_CN", catalogue=catalogue)
    try:
        fig = _figure()
        fig._repr_mimebundle_()
        assert fig._widget.spec["lang"] == "zh_CN"
        assert fig._widget.spec["controls"][0]["label"] == "甲"
    finally:
        widgets.set_language(None)


def _counting_figure(text):
    """A figure of the letters of ``text``; a ValueError names what is wrong with it."""
    if not text:
        raise ValueError("type at least one letter")
    if not text.isalpha():
        raise ValueError(f"only letters, not {sorted(set(c for c in text if not c.isalpha()))}")
    letters = sorted(set(text))
    return InteractiveFigure("letters", controls=[{"name": "c", "label": "c", "values": [0]}],
                             panels=[{"name": "n", "type": "bars", "labels": letters}],
                             frames={"0": {"n": [text.count(c) for c in letters]}})


def test_a_figure_recomputes_for_the_readers_text_and_explains_bad_input(widgets):
    fig = _counting_figure("abba").with_input(_counting_figure, value="abba")
    fig._repr_mimebundle_()
    widget = fig._widget
    assert widget.input == {"value": "abba"}
    widget.query = "banana"  # what the script sends when the reader presses the button
    assert widget.spec["panels"][0]["labels"] == ["a", "b", "n"]
    assert widget.spec["frames"]["0"]["n"] == [3, 1, 2]
    assert widget.message == "" and widget.revision == 1
    before = widget.spec
    for text, message in [("", "type at least one letter"), ("a1", "only letters, not ['1']")]:
        widget.query = text
        assert widget.message == message and widget.spec == before
    assert widget.revision == 3
    # a recompute that fails otherwise: its type and message, no traceback
    fig.with_input(lambda text: 1 / 0)
    widget.query = "x"
    assert widget.message == "ZeroDivisionError: division by zero"
    fig.with_input(lambda text: "not a figure")
    widget.query = "y"
    assert widget.message.startswith("TypeError: recompute returned str")
    with pytest.raises(ValueError, match="recompute must be callable"):
        fig.with_input("abc")
    # a figure without an input: no text box, and no recompute
    plain = _figure()
    plain._repr_mimebundle_()
    plain._widget.query = "x"
    assert plain._widget.message == "this figure does not recompute"


def test_no_chapter_is_saved_with_a_live_widget():
    """A chapter saved from JupyterLab would hold its figures' widgets (a model id that no
    saved state backs) and, with its widget state, the whole script again: the website would
    draw the widget (an empty box: myst-nb prefers the widget mime to the HTML) instead of the
    figure. Chapters are saved from a fresh run under nbconvert, where figures are the HTML."""
    import json
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    found = []
    for path in sorted(book.glob("*.ipynb")):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        if "widgets" in notebook.get("metadata", {}):
            found.append(f"{path.name}: widget state in its metadata")
        for cell in notebook["cells"]:
            for output in cell.get("outputs", []):
                if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
                    found.append(f"{path.name}: a widget in the output of cell {cell.get('id')}")
    assert found == [], ("re-execute with `jupyter nbconvert --to notebook --execute --inplace`"
                         " (README), not from JupyterLab:\n" + "\n".join(found))
