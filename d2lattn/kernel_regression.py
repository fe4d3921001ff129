r"""Nadaraya–Watson kernel regression: attention pooling before deep learning.

.. math:: \hat f(x) = \sum_{i=1}^n \frac{K\big((x - x_i)/\sigma\big)}
          {\sum_{j=1}^n K\big((x - x_j)/\sigma\big)}\; y_i

The query is ``x``, the keys are the training inputs ``x_i``, the values are the training
targets ``y_i``, and the normalized kernel values are the attention weights.

Source: Nadaraya (1964); Watson (1964); the example data and the parametric model follow the
Chinese edition of *Dive into Deep Learning* (动手学深度学习, 2nd ed., 2023), section 10.2.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ._checks import (
    check_nw_inputs,
)

from .masking import masked_softmax

__all__ = ["KERNELS", "nadaraya_watson", "NadarayaWatsonRegression"]


def _gaussian(u: Tensor) -> Tensor:
    return torch.exp(-0.5 * u**2)


def _boxcar(u: Tensor) -> Tensor:
    return (u.abs() <= 1).to(u.dtype)


def _constant(u: Tensor) -> Tensor:
    return torch.ones_like(u)


def _epanechnikov(u: Tensor) -> Tensor:
    return torch.clamp(1 - u**2, min=0)


#: The kernels of :func:`nadaraya_watson`, each a function of ``u = (x - x_i) / bandwidth``,
#: up to a constant factor that cancels in the normalization.
KERNELS: Dict[str, Callable[[Tensor], Tensor]] = {
    "gaussian": _gaussian,  # exp(-u^2 / 2)
    "boxcar": _boxcar,  # 1 if |u| <= 1 else 0 (uniform / rectangular)
    "constant": _constant,  # 1: every query gets the plain average of y_train
    "epanechnikov": _epanechnikov,  # max(0, 1 - u^2), a parabola; not the triangle 1 - |u|
}


def nadaraya_watson(
    *args: Tensor,
    x_query: Optional[Tensor] = None,
    x_train: Optional[Tensor] = None,
    y_train: Optional[Tensor] = None,
    kernel: str = "gaussian",
    bandwidth: float = 1.0,
) -> Tuple[Tensor, Tensor]:
    r"""Nonparametric Nadaraya–Watson regression with a fixed kernel and bandwidth.

    Every argument is passed by name, so no call can mix up the queries and the keys. (Earlier
    releases took ``(x_train, y_train, x_query, kernel, bandwidth)`` by position, the
    opposite of :class:`NadarayaWatsonRegression`'s ``(x_query, x_train, y_train)``. That
    form still works in this release, with a ``DeprecationWarning``; the next release takes
    positional tensors in the layer's order, queries first.)

    Args:
        x_query: keyword; ``(m,)`` float, the queries (where to predict).
        x_train: keyword; ``(n,)`` float, the keys (training inputs).
        y_train: keyword; ``(n,)`` float, the values (training targets).
        kernel: keyword; one of ``"gaussian"``, ``"boxcar"``, ``"constant"``,
            ``"epanechnikov"`` (see :data:`KERNELS`), evaluated at
            ``u = (x_query - x_train) / bandwidth``.
        bandwidth: keyword; sigma, a positive finite number in the units of ``x``.

    Returns:
        ``(y_hat, weights)``: predictions ``(m,)`` and attention weights ``(m, n)`` whose rows
        sum to 1. A query with zero total kernel weight (possible for ``"boxcar"`` and
        ``"epanechnikov"`` when no training input lies within one bandwidth) gets a row of
        zero weights and ``y_hat = 0``, the same rule as :func:`d2lattn.masked_softmax` for a
        query with no valid key. The Gaussian weights are computed as a softmax of
        ``-u**2 / 2``, so they never underflow to an all-zero row.

    Raises:
        ValueError: if an input is missing or not a 1-D float tensor, the three inputs differ
            in dtype, ``x_train`` and ``y_train`` differ in length, ``n == 0``, the kernel is
            unknown, or ``bandwidth`` is not a positive finite number.
        TypeError: more than five positional arguments, or one given both by position and
            by name (the deprecated positional form).

    Example:
        >>> x = torch.tensor([0.0, 1.0, 2.0]); y = torch.tensor([0.0, 1.0, 4.0])
        >>> y_hat, w = nadaraya_watson(x_query=torch.tensor([1.0]), x_train=x, y_train=y,
        ...                            kernel="boxcar")
        >>> y_hat, w
        (tensor([1.6667]), tensor([[0.3333, 0.3333, 0.3333]]))

    Source: Nadaraya (1964); Watson (1964); the data and setting follow Zhang et al.,
    *Dive into Deep Learning*, Chinese edition (动手学深度学习, 2nd ed., Posts & Telecom
    Press, 2023), section 10.2 (注意力汇聚：Nadaraya-Watson 核回归).
    """
    if args:  # the positional form of earlier releases (deprecated)
        x_query, x_train, y_train, kernel, bandwidth = _old_positional_order(
            args, x_query, x_train, y_train, kernel, bandwidth)
    check_nw_inputs(x_query, x_train, y_train)
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    try:
        sigma = float(bandwidth)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"bandwidth must be a positive finite number, got {bandwidth!r}") from err
    if isinstance(bandwidth, bool) or not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"bandwidth must be a positive finite number, got {bandwidth!r}")
    u = (x_query[:, None] - x_train[None, :]) / sigma  # (m, n)
    if kernel == "gaussian":
        weights = torch.softmax(-0.5 * u**2, dim=-1)  # (m, n), exp(-u^2/2) normalized
    else:
        k = KERNELS[kernel](u)  # (m, n), non-negative
        total = k.sum(dim=-1, keepdim=True)  # (m, 1)
        weights = torch.where(total > 0, k / torch.where(total > 0, total, 1.0), 0.0)
    return weights @ y_train, weights  # (m,), (m, n)


def _old_positional_order(args: Tuple[Any, ...], x_query: Any, x_train: Any, y_train: Any,
                          kernel: Any, bandwidth: Any) -> Tuple[Any, Any, Any, Any, Any]:
    """:func:`nadaraya_watson`'s arguments from a call in the positional order of earlier
    releases, ``(x_train, y_train, x_query, kernel, bandwidth)``, with a DeprecationWarning."""
    names = ("x_train", "y_train", "x_query", "kernel", "bandwidth")
    if len(args) > len(names):
        raise TypeError(f"nadaraya_watson takes at most {len(names)} positional arguments "
                        f"(deprecated), got {len(args)}")
    given = {"x_query": x_query, "x_train": x_train, "y_train": y_train,
             "kernel": kernel, "bandwidth": bandwidth}
    defaults = nadaraya_watson.__kwdefaults__  # an argument left out is its default object
    for name, value in zip(names, args):
        if given[name] is not defaults[name]:
            raise TypeError(f"nadaraya_watson got {name} both by position and by name")
        given[name] = value
    warnings.warn("nadaraya_watson's positional arguments (x_train, y_train, x_query, kernel, "
                  "bandwidth) are deprecated: pass them by name, as nadaraya_watson("
                  "x_query=..., x_train=..., y_train=..., kernel=..., bandwidth=...); the next "
                  "release takes positional tensors in NadarayaWatsonRegression's order "
                  "(x_query, x_train, y_train)", DeprecationWarning, stacklevel=3)
    return (given["x_query"], given["x_train"], given["y_train"], given["kernel"],
            given["bandwidth"])


class NadarayaWatsonRegression(nn.Module):
    r"""Parametric Nadaraya–Watson regression: a Gaussian kernel with a learnable width.

    .. math:: \hat f(x) = \sum_i \mathrm{softmax}_i\!\Big(-\tfrac12 \big((x - x_i)\, w\big)^2\Big)\, y_i

    ``w`` is the inverse of the bandwidth (``w = 1 / sigma``), not the standard deviation: a
    larger ``w`` gives a narrower kernel and spikier weights. With ``w = 1 / sigma`` the
    weights equal those of ``nadaraya_watson(x_query=..., x_train=..., y_train=...,
    kernel="gaussian", bandwidth=sigma)``.

    Args:
        w: initial value of the learnable scale, a finite float.

    Parameters:
        w: ``()`` float32, the learnable inverse bandwidth.

    Shapes (``forward``):
        x_query ``(m,)``, x_train ``(n,)``, y_train ``(n,)`` float of one dtype, ``n >= 1``;
        optional ``mask`` ``(m, n)`` bool (True = may attend), for example
        ``~torch.eye(n, dtype=torch.bool)`` to leave each training point out of its own
        prediction. Returns ``(m,)``. A query whose keys are all masked gets zero weights and
        the prediction 0 (the rule of :func:`d2lattn.masked_softmax`).

    Attributes:
        attention_weights: ``(m, n)`` weights of the last call, detached.

    Raises:
        ValueError: from the constructor if ``w`` is not a finite number; from ``forward`` on
            inputs that are not 1-D float tensors of one dtype, mismatched lengths, ``n == 0``,
            or a mask that is not bool or does not broadcast to ``(m, n)``.

    Example:
        >>> model = NadarayaWatsonRegression(w=2.0)
        >>> x = torch.tensor([0.0, 1.0, 2.0]); y = torch.tensor([0.0, 1.0, 4.0])
        >>> model(x, x, y, mask=~torch.eye(3, dtype=torch.bool)).shape
        torch.Size([3])
        >>> model.attention_weights[0]  # query 0 may not attend to key 0
        tensor([0.0000, 0.9975, 0.0025])

    Source: Zhang et al., *Dive into Deep Learning*, Chinese edition (动手学深度学习, 2nd ed.,
    Posts & Telecom Press, 2023), section 10.2.4 (带参数注意力汇聚, parametric attention
    pooling); Nadaraya (1964); Watson (1964).
    """

    attention_weights: Optional[Tensor]

    def __init__(self, w: float = 1.0) -> None:
        super().__init__()
        try:
            w0 = float(w)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"w must be a finite number, got {w!r}") from err
        if not math.isfinite(w0):
            raise ValueError(f"w must be a finite number, got {w!r}")
        self.w = nn.Parameter(torch.tensor(w0))
        self.attention_weights = None

    def forward(
        self, x_query: Tensor, x_train: Tensor, y_train: Tensor, mask: Optional[Tensor] = None
    ) -> Tensor:
        """Predict at ``x_query`` from the pairs ``(x_train, y_train)``; see the class docstring."""
        check_nw_inputs(x_query, x_train, y_train)
        # 1. score: minus half the squared distance, measured in units of 1 / w
        u = (x_query[:, None] - x_train[None, :]) * self.w  # (m, n)
        # 2. normalize (masked keys get exactly zero weight)
        weights = masked_softmax(-0.5 * u**2, mask=mask)  # (m, n)
        self.attention_weights = weights.detach()
        # 3. pool the values
        return weights @ y_train  # (m,)
