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
