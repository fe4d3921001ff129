"""Splitting a hidden vector into heads and merging them back: the one reshape every
multi-head layer shares (:mod:`d2lattn.multihead`, :mod:`d2lattn.linear`,
:mod:`d2lattn.serving`).

This module imports nothing from d2lattn, so every module may import it.
"""

from __future__ import annotations

import torch  # noqa: F401  (the examples use it)
from torch import Tensor

__all__ = ["merge_heads", "split_heads"]


def split_heads(X: Tensor, num_heads: int) -> Tensor:
    """``(B, T, num_heads * d_h)`` -> ``(B, num_heads, T, d_h)``: head ``i`` takes block ``i``.

    Contiguous: one copy here lets every later matrix product use the heads without copying,
    and gives BLAS ``keys^T`` as a plain transposed view.

    Example:
        >>> split_heads(torch.arange(12.0).view(1, 2, 6), num_heads=3)[0, 1]
        tensor([[2., 3.],
                [8., 9.]])

    Source: Vaswani et al. (2017), section 3.2.2 (h projections of size d_model / h).
    """
    B, T, hidden = X.shape
    d_h = hidden // num_heads  # named, not -1: B or T may be 0
    return X.view(B, T, num_heads, d_h).transpose(1, 2).contiguous()  # (B, h, T, d_h)


def merge_heads(X: Tensor) -> Tensor:
    """``(B, h, T, d_h)`` -> ``(B, T, h * d_h)``, the inverse of :func:`split_heads`.

    Example:
        >>> X = torch.randn(2, 5, 12)
        >>> torch.equal(merge_heads(split_heads(X, num_heads=3)), X)
        True
    """
    B, h, T, d_h = X.shape
    return X.transpose(1, 2).reshape(B, T, h * d_h)  # (B, T, h * d_h)
