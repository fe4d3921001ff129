"""Scoring functions: the *score* step of attention, followed by masked softmax and pooling.

Every class here computes, for queries ``(B, Q, d)``, keys ``(B, K, d)`` and values
``(B, K, v)``::

    scores  = a(queries, keys)                       # (B, Q, K)   score
    weights = masked_softmax(scores, valid_lens)     # (B, Q, K)   normalize
    output  = dropout(weights) @ values              # (B, Q, v)   pool

and differs only in the scoring function ``a``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from .masking import ValidLens, masked_softmax

__all__ = ["DotProductAttention", "AdditiveAttention", "check_qkv"]


def check_qkv(queries: Tensor, keys: Tensor, values: Tensor, *, same_size: bool) -> None:
    """Check the shapes of an attention call, raising ``ValueError`` with the culprit's name.

    Args:
        queries: ``(B, ..., Q, d_q)`` float.
        keys: ``(B, ..., K, d_k)`` float, the same leading axes as ``queries``.
        values: ``(B, ..., K, v)`` float, as many rows as ``keys``.
        same_size: require ``d_q == d_k`` (dot-product scores need it).

    Raises:
        ValueError: on a non-float input, fewer than 3 axes, or mismatched sizes.
    """
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor")
        if t.dim() < 3:
            raise ValueError(f"{name} must have shape (B, ..., n, size), got shape {tuple(t.shape)}")
    if keys.shape[:-2] != queries.shape[:-2]:
        raise ValueError(
            f"keys must have the leading axes of queries {tuple(queries.shape[:-2])}, "
            f"got keys of shape {tuple(keys.shape)}"
        )
    if values.shape[:-1] != keys.shape[:-1]:
        raise ValueError(
            f"values must have shape (B, ..., K, v) with the K = {keys.shape[-2]} rows of keys, "
            f"got values of shape {tuple(values.shape)} and keys of shape {tuple(keys.shape)}"
        )
    if same_size and queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same feature size d for dot-product scores, "
            f"got {queries.shape[-1]} and {keys.shape[-1]}"
        )


class DotProductAttention(nn.Module):
    r"""Scaled dot-product attention.

    .. math:: \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d}}\right) V

    Args:
        dropout: probability of zeroing an attention weight during training (after the
            softmax, before pooling), in ``[0, 1)``.

    Shapes (``forward``):
        queries ``(B, ..., Q, d)``, keys ``(B, ..., K, d)``, values ``(B, ..., K, v)``, all
        float of one dtype; ``valid_lens`` ``None``, ``(B,)`` or ``(B, Q)`` integers in
        ``[0, K]``. Returns ``(B, ..., Q, v)``. Extra middle axes (heads) are allowed.

    Attributes:
        attention_weights: the weights of the last call, ``(B, ..., Q, K)``, detached, taken
            before dropout (what the model attends to, not the random mask of one step).

    Raises:
        ValueError: from ``forward`` on mismatched shapes or bad ``valid_lens`` (see
            :func:`d2lattn.masked_softmax`); from the constructor if ``dropout`` is outside
            ``[0, 1)``.

    Example:
        >>> attn = DotProductAttention()
        >>> attn(torch.ones(2, 1, 4), torch.ones(2, 10, 4), torch.ones(2, 10, 3)).shape
        torch.Size([2, 1, 3])

    Source: Vaswani et al. (2017), "Attention Is All You Need", equation (1).
    """

    attention_weights: Optional[Tensor]

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        self.dropout = nn.Dropout(dropout)
        self.attention_weights = None

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Optional[ValidLens] = None,
    ) -> Tensor:
        check_qkv(queries, keys, values, same_size=True)
        d = queries.shape[-1]
        # 1. score: scaling the queries (Q*d numbers) is cheaper than scaling the scores (Q*K).
        scores = (queries * (1.0 / math.sqrt(d))) @ keys.transpose(-2, -1)  # (B, ..., Q, K)
        # 2. normalize
        weights = masked_softmax(scores, valid_lens)  # (B, ..., Q, K)
        self.attention_weights = weights.detach()
        # 3. pool
        return self.dropout(weights) @ values  # (B, ..., Q, v)


class AdditiveAttention(nn.Module):
    r"""Additive (MLP) attention, for queries and keys of different sizes.

    .. math:: a(\mathbf q, \mathbf k) = \mathbf w_v^\top \tanh(\mathbf W_q \mathbf q +
              \mathbf W_k \mathbf k)

    Args:
        query_size: d_q, the feature size of the queries.
        key_size: d_k, the feature size of the keys.
        num_hiddens: h, the width of the hidden layer.
        dropout: probability of zeroing an attention weight during training, in ``[0, 1)``.

    Parameters:
        W_q: ``nn.Linear(query_size, num_hiddens, bias=False)``.
        W_k: ``nn.Linear(key_size, num_hiddens, bias=False)``.
        w_v: ``nn.Linear(num_hiddens, 1, bias=False)``.

    Shapes (``forward``):
        queries ``(B, ..., Q, d_q)``, keys ``(B, ..., K, d_k)``, values ``(B, ..., K, v)``;
        ``valid_lens`` as in :class:`DotProductAttention`. Returns ``(B, ..., Q, v)``.
        Memory: the hidden features take ``B*Q*K*num_hiddens`` numbers.

    Attributes:
        attention_weights: ``(B, ..., Q, K)`` weights of the last call, detached, before dropout.

    Raises:
        ValueError: bad sizes in the constructor; in ``forward``, mismatched shapes, feature
            sizes other than ``query_size``/``key_size``, or bad ``valid_lens``.

    Example:
        >>> attn = AdditiveAttention(query_size=20, key_size=2, num_hiddens=8)
        >>> attn(torch.ones(2, 1, 20), torch.ones(2, 10, 2), torch.ones(2, 10, 4)).shape
        torch.Size([2, 1, 4])

    Source: Bahdanau, Cho and Bengio (2015), appendix A.1.2; d2l.ai section 11.3.
    """

    attention_weights: Optional[Tensor]

    def __init__(self, query_size: int, key_size: int, num_hiddens: int, dropout: float = 0.0) -> None:
        super().__init__()
        for name, value in (("query_size", query_size), ("key_size", key_size),
                            ("num_hiddens", num_hiddens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.attention_weights = None

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Optional[ValidLens] = None,
    ) -> Tensor:
        check_qkv(queries, keys, values, same_size=False)
        if queries.shape[-1] != self.W_q.in_features:
            raise ValueError(f"queries must have feature size query_size = {self.W_q.in_features}, "
                             f"got {queries.shape[-1]}")
        if keys.shape[-1] != self.W_k.in_features:
            raise ValueError(f"keys must have feature size key_size = {self.W_k.in_features}, "
                             f"got {keys.shape[-1]}")
        # 1. score: broadcast every query against every key in the hidden space.
        q = self.W_q(queries).unsqueeze(-2)  # (B, ..., Q, 1, h)
        k = self.W_k(keys).unsqueeze(-3)  # (B, ..., 1, K, h)
        scores = self.w_v(torch.tanh(q + k)).squeeze(-1)  # (B, ..., Q, K)
        # 2. normalize
        weights = masked_softmax(scores, valid_lens)  # (B, ..., Q, K)
        self.attention_weights = weights.detach()
        # 3. pool
        return self.dropout(weights) @ values  # (B, ..., Q, v)
