"""Plotting helpers for the book. matplotlib is imported when a function is first called,
so ``import d2lattn`` stays light and chooses no backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Tuple, Union

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["show_heatmaps"]

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
        ValueError: if ``matrices`` is not 4-D or ``titles`` has the wrong length.

    Example:
        >>> fig = show_heatmaps(torch.eye(5).reshape(1, 1, 5, 5), "Keys", "Queries")
        >>> len(fig.axes)  # one panel and the colour bar
        2

    Source: the book's own helper (chapter 1, the first heatmap).
    """
    import matplotlib.pyplot as plt

    data = _to_numpy(matrices)
    if data.ndim != 4:
        raise ValueError(f"matrices must have shape (rows, cols, Q, K), got shape {data.shape}")
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
