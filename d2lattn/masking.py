"""Masked softmax: the *normalize* step of attention, made aware of padding.

Shape legend used throughout d2lattn (see the book's notation page):

====  ==========================================
B     batch size
Q     number of queries
K     number of keys (= number of values)
d     query/key feature size
v     value feature size
h     number of heads
====  ==========================================

Mask convention: a boolean ``mask`` is **True where a query may attend to a key**, the
convention of :func:`torch.nn.functional.scaled_dot_product_attention`. (The opposite
convention, True = ignore, is used by :class:`torch.nn.MultiheadAttention`; chapter 3 of the
book shows how to translate between them.)

Empty rows: a query that has no key it may attend to gets an all-zero row of weights, so the
pooled output for it is the zero vector. Never NaN, in the forward or the backward pass.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from ._checks import (
    ValidLens,
    check_bool_mask,
    check_non_negative_ints,
    check_scores,
    check_valid_lens,
)

__all__ = ["causal_mask", "masked_softmax", "valid_lens_to_mask"]

def valid_lens_to_mask(valid_lens: ValidLens, num_queries: int, num_keys: int) -> Tensor:
    """Turn valid lengths into a boolean mask (True = may attend).

    Args:
        valid_lens: ``(B,)`` integers, one valid length per sequence, or ``(B, Q)``, one per
            query; each in ``[0, num_keys]``.
        num_queries: Q, the number of queries (rows of the score matrix).
        num_keys: K, the number of keys (columns of the score matrix).

    Returns:
        bool tensor of shape ``(B, 1, K)`` for 1-D ``valid_lens`` (the same keys for every
        query) or ``(B, Q, K)`` for 2-D ``valid_lens``; entry ``[b, i, j]`` is ``j <
        valid_lens[b(, i)]``.

    Raises:
        ValueError: if ``valid_lens`` is not an integer tensor of shape ``(B,)`` or ``(B, Q)``
            with ``Q == num_queries``, or has an entry outside ``[0, num_keys]``.

    Example:
        >>> valid_lens_to_mask(torch.tensor([1, 3]), num_queries=2, num_keys=4).shape
        torch.Size([2, 1, 4])

    Source: the ``valid_lens`` convention of d2l.ai, section 11.3 (masked softmax).
    """
    valid_lens = check_valid_lens(valid_lens, None, num_queries, num_keys)
    if valid_lens.dim() == 2:
        lens = valid_lens[:, :, None]  # (B, Q, 1)
    else:
        lens = valid_lens[:, None, None]  # (B, 1, 1)
    positions = torch.arange(num_keys, device=valid_lens.device)  # (K,)
    return positions < lens  # (B, 1 or Q, K)


def causal_mask(
    num_queries: int,
    num_keys: int,
    *,
    device: Optional[Union[torch.device, str]] = None,
    alignment: str = "lower_right",
) -> Tensor:
    """The causal (look-ahead) mask, lower-right aligned: True where a query may attend.

    Query ``i`` may attend to key ``j`` iff ``j <= i + (K - Q)``. For ``Q == K`` this is the
    familiar lower triangle ``j <= i`` (``F.scaled_dot_product_attention(is_causal=True)``).
    For ``Q < K`` the queries are the *last* ``Q`` positions of a sequence whose first
    ``K - Q`` positions are already known (a KV cache), so every query sees the whole cache.
    For ``Q > K`` the first ``Q - K`` queries see no key at all (their rows are all False;
    :func:`masked_softmax` gives them zero weights). This is
    ``torch.nn.attention.bias.causal_lower_right``, the rule of every ``is_causal`` in d2lattn.

    ``alignment="upper_left"`` gives instead ``j <= i`` whatever ``K - Q`` is: the mask of
    ``F.scaled_dot_product_attention(is_causal=True)`` and
    ``torch.nn.attention.bias.causal_upper_left``. The two agree when ``Q == K``; to get
    SDPA's behaviour for ``Q != K`` from a d2lattn layer, pass this mask as ``attn_mask``
    (with ``is_causal=False``).

    Args:
        num_queries: Q, the number of queries (rows), a non-negative integer.
        num_keys: K, the number of keys (columns), a non-negative integer.
        device: keyword-only; where to build the mask (default: the CPU).
        alignment: keyword-only; ``"lower_right"`` (default) or ``"upper_left"``.

    Returns:
        bool tensor of shape ``(Q, K)``; entry ``[i, j]`` is ``j <= i + (K - Q)``
        (``j <= i`` for ``"upper_left"``). It broadcasts against scores ``(B, ..., Q, K)``.

    Raises:
        ValueError: if ``num_queries`` or ``num_keys`` is not a non-negative integer, or
            ``alignment`` is not one of the two names.

    Example:
        >>> causal_mask(3, 3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
        >>> causal_mask(2, 4).int()  # two new queries after two cached positions
        tensor([[1, 1, 1, 0],
                [1, 1, 1, 1]], dtype=torch.int32)
        >>> causal_mask(2, 4, alignment="upper_left").int()  # SDPA's is_causal=True
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0]], dtype=torch.int32)

    Source: Vaswani et al. (2017), section 3.2.3 (masking out illegal connections in the
    decoder); the lower-right alignment of ``torch.nn.attention.bias.causal_lower_right``.
    """
    check_non_negative_ints(num_queries=num_queries, num_keys=num_keys)
    if alignment not in ("lower_right", "upper_left"):
        raise ValueError(f"alignment must be 'lower_right' or 'upper_left', got {alignment!r}")
    offset = num_keys - num_queries if alignment == "lower_right" else 0
    rows = torch.arange(num_queries, device=device)[:, None]  # (Q, 1)
    cols = torch.arange(num_keys, device=device)  # (K,)
    return cols <= rows + offset  # (Q, K)


def _softmax_into(X: Tensor) -> Tensor:
    """Softmax over the last axis, written over ``X`` unless autograd is recording ``X``.

    Reusing the storage saves a fresh ``(B, ..., Q, K)`` allocation, which on the CPU can cost
    more than the softmax itself; ``out=`` does not support autograd, so training allocates.
    """
    if torch.is_grad_enabled() and X.requires_grad:
        return torch.softmax(X, dim=-1)
    return torch.softmax(X, dim=-1, out=X)


def masked_softmax(
    X: Tensor,
    valid_lens: Optional[ValidLens] = None,
    mask: Optional[Tensor] = None,
    *,
    inplace: bool = False,
) -> Tensor:
    r"""Softmax over the last axis of ``X`` in which masked keys get exactly zero weight.

    .. math:: \alpha_{ij} = \frac{m_{ij}\,\exp(x_{ij})}{\sum_{k} m_{ik}\,\exp(x_{ik})},
              \qquad m_{ij} \in \{0, 1\},

    and :math:`\alpha_{i\cdot} = 0` when :math:`m_{i\cdot} = 0` (a query with no valid key).

    Args:
        X: attention scores, float, shape ``(B, ..., Q, K)``; any number of middle axes
            (for example heads). Without ``valid_lens`` any shape with ``dim >= 1`` works.
        valid_lens: ``None``; ``(B,)`` integers, the number of leading keys each sequence may
            attend to; or ``(B, Q)``, one number per query. Entries lie in ``[0, K]``. Middle
            axes of ``X`` are broadcast over.
        mask: ``None`` or a bool tensor broadcastable to ``X.shape``; **True = may attend**
            (as in ``F.scaled_dot_product_attention``). If both ``valid_lens`` and ``mask``
            are given, a key must be allowed by both.
        inplace: keyword-only; if True, ``X`` may be overwritten (its storage is reused for
            the masking and, when autograd is not recording ``X``, for the result), which saves
            one ``(B, ..., Q, K)`` allocation per call. :class:`~d2lattn.DotProductAttention`
            passes True for the scores it has just computed; keep the default for scores you
            still need. A leaf tensor that requires grad cannot be written to; for it,
            ``inplace`` is ignored.

    Returns:
        Tensor of the shape and dtype of ``X``: non-negative weights, each row summing to 1,
        or to 0 for a row in which every key is masked. ``X`` itself is never modified unless
        ``inplace=True``.

    Raises:
        ValueError: ``X`` not floating point; ``valid_lens`` not integer, not of shape ``(B,)``
            or ``(B, Q)`` matching ``X``, or out of ``[0, K]``; ``mask`` not bool or not
            broadcastable to ``X``.

    Example:
        >>> X = torch.zeros(2, 2, 4)
        >>> masked_softmax(X, torch.tensor([2, 3]))[0]
        tensor([[0.5000, 0.5000, 0.0000, 0.0000],
                [0.5000, 0.5000, 0.0000, 0.0000]])

    Source: Vaswani et al. (2017), section 3.2.3 (masking by setting scores to
    :math:`-\infty`); the empty-row rule (zeros) is this book's, see chapter 3.
    """
    keep = _allowed_keys(X, valid_lens, mask)  # None or bool, broadcastable to X
    if inplace and X.is_leaf and X.requires_grad:
        inplace = False  # autograd forbids writing into such a tensor

    if keep is None:
        return _softmax_into(X) if inplace else torch.softmax(X, dim=-1)

    # masked_fill returns a new tensor, so the caller's X is left untouched (masked_fill_
    # writes into X, which only inplace=True allows). Either way `scores` is ours to overwrite.
    fill = X.masked_fill_ if inplace else X.masked_fill
    scores = fill(~keep, float("-inf"))
    has_key = keep.any(dim=-1, keepdim=True)  # (..., Q, 1) or broadcastable
    # On the CPU, look whether a row is empty (cheap); on an accelerator that look would be a
    # host synchronisation (and under torch.compile a graph break), so take the path below,
    # which gives the same weights for any row.
    if X.device.type == "cpu" and not torch.compiler.is_compiling() and bool(has_key.all()):
        # Every row keeps at least one key: exp(-inf) = 0 gives masked keys exactly zero weight.
        return _softmax_into(scores)
    # Some row is empty: softmax of a row of -inf is NaN. Give such rows finite scores first,
    # then zero them; torch.where passes no gradient to the branch it did not pick.
    scores = torch.where(has_key, scores, torch.zeros((), dtype=X.dtype, device=X.device))
    return torch.softmax(scores, dim=-1).masked_fill(~keep, 0.0)


def _allowed_keys(X: Tensor, valid_lens: Optional[ValidLens],
                  mask: Optional[Tensor]) -> Optional[Tensor]:
    """Check :func:`masked_softmax`'s arguments; return the keys each query may attend to.

    Returns ``None`` (every key) or a bool tensor broadcastable to ``X``, True = may attend:
    ``valid_lens`` as ``(B, 1.., 1|Q, K)`` (the middle axes of ``X`` broadcast), AND ``mask``.
    """
    check_scores(X, with_valid_lens=valid_lens is not None)
    keep: Optional[Tensor] = None
    if valid_lens is not None:
        lens = check_valid_lens(valid_lens, X.shape[0], X.shape[-2], X.shape[-1])
        keep = valid_lens_to_mask(lens.to(X.device), X.shape[-2], X.shape[-1])  # (B, 1|Q, K)
        keep = keep.view(keep.shape[0], *([1] * (X.dim() - 3)), *keep.shape[1:])
    if mask is not None:
        check_bool_mask(mask, X.shape, "mask", "X's shape")
        mask = mask.to(X.device)
        keep = mask if keep is None else keep & mask
    return keep
