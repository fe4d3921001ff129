"""show_heatmaps and show_fits: figure layout, shared colour scale, bad shapes."""

import matplotlib

matplotlib.use("Agg")  # no display in the test run

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from d2lattn import show_heatmaps  # noqa: E402
from d2lattn.plotting import show_fits  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_heatmaps_one_axis_per_panel_plus_colour_bar(rows, cols):
    fig = show_heatmaps(torch.rand(rows, cols, 4, 6), "Keys", "Queries")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == rows * cols + 1
    panels = fig.axes[: rows * cols]
    for ax in panels:
        assert ax.images[0].get_array().shape == (4, 6)


def test_heatmaps_labels_and_titles():
    fig = show_heatmaps(torch.rand(2, 3, 4, 5), "Keys", "Queries", titles=["a", "b", "c"])
    panels = np.array(fig.axes[:6]).reshape(2, 3)
    assert [ax.get_title() for ax in panels[0]] == ["a", "b", "c"]
    assert [ax.get_title() for ax in panels[1]] == ["", "", ""]
    assert [ax.get_xlabel() for ax in panels[1]] == ["Keys"] * 3
    assert [ax.get_ylabel() for ax in panels[:, 0]] == ["Queries"] * 2
    assert panels[0, 1].get_ylabel() == "" and panels[0, 0].get_xlabel() == ""


def test_heatmaps_show_the_data_and_share_one_colour_scale():
    data = torch.stack([torch.eye(3), 2 * torch.eye(3)]).reshape(1, 2, 3, 3)
    fig = show_heatmaps(data, "Keys", "Queries")
    left, right = fig.axes[0].images[0], fig.axes[1].images[0]
    np.testing.assert_array_equal(left.get_array(), np.eye(3))
    np.testing.assert_array_equal(right.get_array(), 2 * np.eye(3))
    assert left.get_clim() == right.get_clim() == (0.0, 2.0)
    fig2 = show_heatmaps(data, "Keys", "Queries", vmin=-1.0, vmax=5.0)
    assert fig2.axes[0].images[0].get_clim() == (-1.0, 5.0)


def test_heatmaps_accept_numpy_and_leave_the_input_unmodified():
    data = np.random.default_rng(0).random((1, 2, 3, 4))
    before = data.copy()
    t = torch.from_numpy(data.copy()).requires_grad_()
    show_heatmaps(data, "k", "q")
    show_heatmaps(t, "k", "q")  # a tensor that requires grad is detached, not an error
    np.testing.assert_array_equal(data, before)


@pytest.mark.parametrize("shape", [(4, 4), (1, 4, 4), (1, 1, 1, 4, 4), (0, 1, 3, 3), (1, 1, 0, 3)])
def test_heatmaps_bad_shapes_raise(shape):
    with pytest.raises(ValueError, match="matrices"):
        show_heatmaps(torch.zeros(shape), "Keys", "Queries")


def test_heatmaps_wrong_number_of_titles_raises():
    with pytest.raises(ValueError, match="titles"):
        show_heatmaps(torch.zeros(1, 2, 3, 3), "Keys", "Queries", titles=["only one"])


# --- show_fits -------------------------------------------------------------------------------

def _data():
    x_train = torch.linspace(0, 5, 10)
    x_query = torch.linspace(0, 5, 20)
    return x_train, torch.sin(x_train), x_query


def test_fits_one_panel_per_prediction_with_the_curves():
    x_train, y_train, x_query = _data()
    preds = {"a": torch.zeros(20), "b": torch.ones(20), "c": x_query}
    fig = show_fits(x_train, y_train, x_query, preds, y_truth=torch.sin(x_query))
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert [ax.get_title() for ax in fig.axes] == ["a", "b", "c"]
    lines = fig.axes[2].get_lines()
    assert len(lines) == 3  # training pairs, truth, prediction
    np.testing.assert_allclose(lines[0].get_xdata(), x_train.numpy())
    np.testing.assert_allclose(lines[2].get_ydata(), x_query.numpy())


def test_fits_grid_layout_removes_unused_panels():
    x_train, y_train, x_query = _data()
    preds = {str(i): torch.zeros(20) for i in range(5)}
    fig = show_fits(x_train, y_train, x_query, preds, ncols=3)
    assert len(fig.axes) == 5
    assert len(fig.axes[0].get_lines()) == 2  # no truth given


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(y_train=torch.zeros(9)), "same length"),
        (dict(x_train=torch.zeros(10, 1)), "x_train"),
        (dict(predictions={"a": torch.zeros(19)}), "predictions"),
        (dict(predictions={}), "at least one"),
        (dict(y_truth=torch.zeros(21)), "y_truth"),
        (dict(ncols=0), "ncols"),
    ],
)
def test_fits_bad_inputs_raise(kwargs, match):
    x_train, y_train, x_query = _data()
    args = dict(x_train=x_train, y_train=y_train, x_query=x_query,
                predictions={"a": torch.zeros(20)})
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        show_fits(**args)
