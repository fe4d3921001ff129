"""Plotting helpers for the book. matplotlib is imported when a function is first called,
so ``import d2lattn`` stays light and chooses no backend."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["show_heatmaps", "show_fits"]

ArrayLike = Union[torch.Tensor, np.ndarray]


def _to_numpy(x: ArrayLike) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=float)


def show_heatmaps(
    matrices: ArrayLike,
    xlabel: str,
    ylabel: str,
    titles: Optional[Sequence[str]] = None,
    figsize: Tuple[float, float] = (2.5, 2.5),
    cmap: str = "Reds",
    *,
    vmin: Optional[float] = None,
    vmax: Optional[float] = None,
) -> "Figure":
    """Draw a grid of heatmaps (usually attention weights) with one shared colour bar.

    Args:
        matrices: ``(rows, cols, Q, K)`` tensor or array: ``rows x cols`` panels, each a
            ``Q x K`` matrix (queries down, keys across).
        xlabel: label under the bottom row of panels (usually ``"Keys"``).
        ylabel: label left of the first column of panels (usually ``"Queries"``).
        titles: ``None`` or ``cols`` strings, one title per column.
        figsize: size of one panel in inches ``(width, height)``; the figure is
            ``cols * width`` by ``rows * height``.
        cmap: a matplotlib colour map name.
        vmin, vmax: colour scale limits shared by all panels (default: the data's range).

    Returns:
        the matplotlib ``Figure`` (created with pyplot, so a notebook shows it).

    Raises:
        ValueError: if ``matrices`` is not 4-D, has an empty axis, or ``titles`` has the wrong
            length.

    Example:
        >>> fig = show_heatmaps(torch.eye(5).reshape(1, 1, 5, 5), "Keys", "Queries")
        >>> len(fig.axes)  # one panel and the colour bar
        2

    Source: the book's own helper (chapter 1, the first heatmap).
    """
    import matplotlib.pyplot as plt

    data = _to_numpy(matrices)
    if data.ndim != 4 or 0 in data.shape:
        raise ValueError(f"matrices must have shape (rows, cols, Q, K) with no empty axis, "
                         f"got shape {data.shape}")
    rows, cols = data.shape[:2]
    if titles is not None and len(titles) != cols:
        raise ValueError(f"titles must hold one title per column ({cols}), got {len(titles)}")
    lo = float(data.min()) if vmin is None else vmin
    hi = float(data.max()) if vmax is None else vmax
    fig, axes = plt.subplots(rows, cols, figsize=(figsize[0] * cols, figsize[1] * rows),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    image = None
    for i in range(rows):
        for j in range(cols):
            ax = axes[i, j]
            image = ax.imshow(data[i, j], cmap=cmap, vmin=lo, vmax=hi, aspect="auto",
                              interpolation="nearest")
            if i == rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles is not None and i == 0:
                ax.set_title(titles[j])
    fig.colorbar(image, ax=axes, shrink=0.6)
    return fig


def _to_vector(name: str, x: ArrayLike) -> np.ndarray:
    """Turn a tensor or array into a 1-D float64 array, or raise ``ValueError``."""
    data = _to_numpy(x)
    if data.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {data.shape}")
    return data


def show_fits(
    x_train: ArrayLike,
    y_train: ArrayLike,
    x_query: ArrayLike,
    predictions: Mapping[str, ArrayLike],
    y_truth: Optional[ArrayLike] = None,
    *,
    ncols: Optional[int] = None,
    figsize: Tuple[float, float] = (3.0, 2.4),
) -> "Figure":
    """Draw one panel per regression fit: training pairs, the true function and the prediction.

    Args:
        x_train: ``(n,)`` training inputs (the keys), drawn as dots with ``y_train``.
        y_train: ``(n,)`` training targets (the values).
        x_query: ``(m,)`` query points, the x-coordinates of every curve.
        predictions: panel title -> ``(m,)`` predictions at ``x_query``; one panel each, in
            the mapping's order.
        y_truth: ``None`` or ``(m,)`` values of the true function at ``x_query`` (dashed).
        ncols: panels per row (default: all panels in one row).
        figsize: size of one panel in inches ``(width, height)``.

    Returns:
        the matplotlib ``Figure`` (created with pyplot, so a notebook shows it); its first
        ``len(predictions)`` axes are the panels, in order.

    Raises:
        ValueError: if an input is not 1-D, lengths disagree (``x_train`` with ``y_train``;
            ``x_query`` with ``y_truth`` and every prediction), ``predictions`` is empty, or
            ``ncols < 1``.

    Example:
        >>> x = torch.linspace(0, 1, 5)
        >>> from d2lattn.plotting import show_fits
        >>> fig = show_fits(x, x, x, {"identity": x, "zero": 0 * x}, y_truth=x)
        >>> len(fig.axes)
        2

    Source: the book's own helper (chapter 2, kernel regression).
    """
    import matplotlib.pyplot as plt

    xt, yt, xq = (_to_vector(n, a) for n, a in
                  (("x_train", x_train), ("y_train", y_train), ("x_query", x_query)))
    if xt.shape != yt.shape:
        raise ValueError(f"x_train and y_train must have the same length, got "
                         f"{xt.shape[0]} and {yt.shape[0]}")
    curves = {title: _to_vector(f"predictions[{title!r}]", y) for title, y in predictions.items()}
    truth = None if y_truth is None else _to_vector("y_truth", y_truth)
    for name, y in [("y_truth", truth)] + [(f"predictions[{t!r}]", y) for t, y in curves.items()]:
        if y is not None and y.shape != xq.shape:
            raise ValueError(f"{name} must have the length of x_query ({xq.shape[0]}), "
                             f"got {y.shape[0]}")
    if not curves:
        raise ValueError("predictions must hold at least one curve")
    ncols = len(curves) if ncols is None else ncols
    if ncols < 1:
        raise ValueError(f"ncols must be at least 1, got {ncols}")
    nrows = math.ceil(len(curves) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(figsize[0] * ncols, figsize[1] * nrows),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    flat = axes.ravel()
    for ax, (title, y) in zip(flat, curves.items()):
        ax.plot(xt, yt, "o", color="0.6", markersize=3, alpha=0.7, label="training pairs")
        if truth is not None:
            ax.plot(xq, truth, "--", color="k", linewidth=1, label="truth")
        ax.plot(xq, y, color="C0", linewidth=1.6, label="prediction")
        ax.set_title(title)
        ax.set_xlabel("x")
    for ax in flat[len(curves):]:
        fig.delaxes(ax)
    for row in axes:
        row[0].set_ylabel("y")
    axes[0, 0].legend(fontsize="small")
    return fig
