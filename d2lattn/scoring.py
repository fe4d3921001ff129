"""Scoring functions: the *score* step of attention, followed by masked softmax and pooling.

Every class here computes, for queries ``(B, Q, d)``, keys ``(B, K, d)`` and values
``(B, K, v)``::

    scores  = a(queries, keys)                       # (B, Q, K)   score
    weights = masked_softmax(scores, valid_lens)     # (B, Q, K)   normalize
    output  = dropout(weights) @ values              # (B, Q, v)   pool

and differs only in the scoring function ``a``: :class:`Attention` does the three steps, and
each layer defines only its :meth:`~Attention.score`.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ._checks import (
    ValidLens,
    check_bool,
    check_broadcast,
    check_dropout as _check_dropout,
    check_positive as _check_positive,
    check_positive_ints,
    check_qkv,
    check_scale,
    check_scores_shape,
    check_scores_args as _check_scores_args,
    split_attn_mask,
)
from .masking import causal_mask, masked_softmax

__all__ = [
    "DotProductAttention",
    "AdditiveAttention",
    "ScoreFn",
    "dot_product_scores",
    "cosine_scores",
    "gaussian_scores",
    "Attention",
    "BilinearAttention",
]


def combine_masks(
    attn_mask: Optional[Tensor],
    is_causal: bool,
    num_queries: int,
    num_keys: int,
    *,
    device: Optional[torch.device] = None,
) -> Optional[Tensor]:
    """AND an optional boolean ``attn_mask`` with the causal mask; ``None`` if neither is set.

    Args:
        attn_mask: ``None`` or a bool tensor (True = may attend) whose last two axes
            broadcast to ``(Q, K)``.
        is_causal: whether to AND in :func:`d2lattn.masking.causal_mask` ``(Q, K)``.
        num_queries: Q.
        num_keys: K.
        device: keyword-only; where the causal mask is built.

    Returns:
        ``None`` or a bool tensor broadcastable to ``(..., Q, K)``; the caller's
        ``attn_mask`` is never modified.

    Raises:
        ValueError: ``attn_mask`` not a bool tensor with at least two axes that broadcast to
            ``(Q, K)``; ``is_causal`` not a bool.

    Example:
        >>> combine_masks(torch.tensor([[True, False, True]]), True, 2, 3).int()
        tensor([[1, 0, 0],
                [1, 0, 1]], dtype=torch.int32)

    Source: the AND rule of ``F.scaled_dot_product_attention`` masks; book chapter 8.
    """
    check_bool(is_causal=is_causal)
    bool_mask, float_mask = split_attn_mask(attn_mask, num_queries, num_keys)
    if float_mask is not None:
        raise ValueError("attn_mask must be a bool tensor (True = may attend) here, got "
                         f"dtype {float_mask.dtype}")
    if not is_causal:
        return attn_mask
    causal = causal_mask(num_queries, num_keys, device=device)  # (Q, K)
    return causal if attn_mask is None else attn_mask.to(causal.device) & causal


def _bias_and_keep(bias: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    """Split a float mask into finite biases and a bool mask of its ``-inf`` entries.

    The bool part goes through :func:`masked_softmax`, which gives a query with no allowed key
    zero weights instead of the NaN that a softmax of a row of ``-inf`` gives.
    """
    forbidden = torch.isneginf(bias)
    if not bool(forbidden.any()):
        return bias, None
    return bias.masked_fill(forbidden, 0.0), ~forbidden


def _add_bias(scores: Tensor, bias: Tensor, *, inplace: bool) -> Tensor:
    """``scores + bias`` (in place if allowed); ``ValueError`` if ``bias`` would enlarge the
    scores."""
    check_broadcast(bias, scores.shape, "attn_mask", "the scores' shape")
    bias = bias.to(scores.device)
    return scores.add_(bias) if inplace else scores + bias


def _masks(attn_mask: Optional[Tensor], is_causal: bool,
           scores: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``attn_mask`` and ``is_causal`` as one bool mask and a finite float bias (each or both
    ``None``); a bias's ``-inf`` entries join the bool mask, so a query left with no key gets
    zero weights, not NaN."""
    Q, K = scores.shape[-2], scores.shape[-1]
    bool_mask, bias = split_attn_mask(attn_mask, Q, K)  # at most one is not None
    if bias is not None:
        bias, bool_mask = _bias_and_keep(bias.to(scores.dtype))
    mask = combine_masks(bool_mask, is_causal, Q, K, device=scores.device)
    return mask, bias


ScoreFn = Callable[[Tensor, Tensor], Tensor]


def dot_product_scores(queries: Tensor, keys: Tensor, *, scale: Optional[float] = None) -> Tensor:
    r"""Dot-product scores, scaled by ``1/sqrt(d)`` unless another ``scale`` is given.

    .. math:: a(\mathbf q, \mathbf k) = s\, \mathbf q^\top \mathbf k, \qquad
              s = 1/\sqrt d \text{ by default}

    Args:
        queries: ``(B, ..., Q, d)`` float.
        keys: ``(B, ..., K, d)`` float, the same leading axes and dtype as ``queries``.
        scale: keyword-only factor ``s`` multiplying the dot products; ``None`` (default)
            means ``1 / sqrt(d)``, as in ``F.scaled_dot_product_attention``; ``1.0`` gives
            plain (unscaled) dot products.

    Returns:
        scores of shape ``(B, ..., Q, K)``.

    Raises:
        ValueError: if an input is not a float tensor with at least 3 axes, the leading axes,
            feature sizes or dtypes differ, or ``scale`` is not a positive finite number.

    Example:
        >>> dot_product_scores(torch.ones(2, 3, 4), torch.ones(2, 5, 4)).shape
        torch.Size([2, 3, 5])
        >>> dot_product_scores(torch.ones(1, 1, 4), torch.ones(1, 1, 4))  # 4 / sqrt(4)
        tensor([[[2.]]])

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.1, equation (1);
    book chapter 4.
    """
    _check_scores_args(queries, keys)
    if scale is None:
        scale = 1.0 / math.sqrt(queries.shape[-1])
    _check_positive("scale", scale)
    return (queries * scale) @ keys.transpose(-2, -1)  # (B, ..., Q, K)


def cosine_scores(queries: Tensor, keys: Tensor, *, temperature: float = 1.0,
                  eps: float = 1e-8) -> Tensor:
    r"""Cosine-similarity scores, divided by a temperature.

    .. math:: a(\mathbf q, \mathbf k) = \frac{1}{\tau}\,
              \frac{\mathbf q^\top \mathbf k}{\max(\lVert\mathbf q\rVert, \epsilon)\,
              \max(\lVert\mathbf k\rVert, \epsilon)}

    A cosine lies in ``[-1, 1]``, so with ``temperature = 1`` the softmax of cosine scores
    can never be sharp (over ``K`` keys, no weight exceeds ``e / (e + (K-1)/e)``); a small
    temperature sharpens it. A zero vector has cosine 0 with everything.

    Args:
        queries: ``(B, ..., Q, d)`` float.
        keys: ``(B, ..., K, d)`` float, the same leading axes and dtype as ``queries``.
        temperature: keyword-only ``tau > 0``; the cosines are divided by it.
        eps: keyword-only floor on the vector lengths, ``> 0`` (guards against zero vectors).

    Returns:
        scores of shape ``(B, ..., Q, K)``, each in ``[-1/tau, 1/tau]``.

    Raises:
        ValueError: bad shapes or dtypes (as :func:`dot_product_scores`), or a non-positive
            ``temperature`` or ``eps``.

    Example:
        >>> q = torch.tensor([[[1.0, 0.0]]])
        >>> k = torch.tensor([[[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0]]])
        >>> cosine_scores(q, k)
        tensor([[[ 1.,  0., -1.]]])
        >>> cosine_scores(q, k).shape
        torch.Size([1, 1, 3])

    Source: the cosine similarity of the study notes' list of scores (book chapter 4);
    content-based addressing with a key strength beta in Graves, Wayne and Danihelka (2014),
    "Neural Turing Machines", section 3.3.1.
    """
    _check_scores_args(queries, keys)
    _check_positive("temperature", temperature)
    _check_positive("eps", eps)
    q_len = torch.linalg.vector_norm(queries, dim=-1, keepdim=True)  # (B, ..., Q, 1)
    k_len = torch.linalg.vector_norm(keys, dim=-1, keepdim=True)  # (B, ..., K, 1)
    q = queries / q_len.clamp_min(eps)  # (B, ..., Q, d), unit length (or zero)
    k = keys / k_len.clamp_min(eps)  # (B, ..., K, d)
    return (q @ k.transpose(-2, -1)) / temperature  # (B, ..., Q, K)


def gaussian_scores(queries: Tensor, keys: Tensor, *, bandwidth: float = 1.0) -> Tensor:
    r"""Gaussian-kernel scores: minus half the squared distance, in units of the bandwidth.

    .. math:: a(\mathbf q, \mathbf k) = -\frac{\lVert \mathbf q - \mathbf k\rVert^2}{2\sigma^2}

    The softmax of these scores is the Nadaraya–Watson weighting with a Gaussian kernel of
    chapter 2, ``exp(a) / sum exp(a)``, for vectors instead of numbers. Expanding the square,
    ``a = (q.k - |q|^2/2 - |k|^2/2) / sigma^2``: the ``|q|^2`` term is the same for every key
    and cancels in the softmax.

    Args:
        queries: ``(B, ..., Q, d)`` float.
        keys: ``(B, ..., K, d)`` float, the same leading axes and dtype as ``queries``.
        bandwidth: keyword-only kernel width ``sigma > 0``.

    Returns:
        scores of shape ``(B, ..., Q, K)``, all ``<= 0`` (0 where a query equals a key).
        The differences take ``B*Q*K*d`` numbers of memory, like additive attention's hidden
        layer: computing them directly keeps the scores exact where ``q`` is close to ``k``.

    Raises:
        ValueError: bad shapes or dtypes (as :func:`dot_product_scores`), or a non-positive
            ``bandwidth``.

    Example:
        >>> q = torch.zeros(1, 1, 2); k = torch.tensor([[[0.0, 0.0], [3.0, 4.0]]])
        >>> gaussian_scores(q, k)
        tensor([[[  0.0000, -12.5000]]])
        >>> gaussian_scores(q, k).shape
        torch.Size([1, 1, 2])

    Source: Nadaraya (1964) and Watson (1964) with a Gaussian kernel; book chapter 2 (kernel
    regression) and chapter 4.
    """
    _check_scores_args(queries, keys)
    _check_positive("bandwidth", bandwidth)
    diff = queries.unsqueeze(-2) - keys.unsqueeze(-3)  # (B, ..., Q, K, d)
    sq_dist = (diff / bandwidth).square().sum(dim=-1)  # (B, ..., Q, K)
    return 0.0 - 0.5 * sq_dist  # (B, ..., Q, K); "0.0 -" gives +0.0, not -0.0, where q == k


class Attention(nn.Module):
    r"""Attention with any score function: score, masked softmax, dropout, weighted sum.

    The base of every attention layer here: a subclass defines :meth:`score` (dot product,
    additive, bilinear) and inherits the rest, the masks and options included.

    .. math:: \mathrm{softmax}\big(a(Q, K)\big)\, V

    Args:
        score_fn: ``None`` in a subclass that defines :meth:`score`; otherwise a function
            ``(queries, keys) -> scores`` mapping ``(B, ..., Q, d)`` and
            ``(B, ..., K, d)`` to ``(B, ..., Q, K)``, such as :func:`dot_product_scores`,
            :func:`cosine_scores` or :func:`gaussian_scores`; use ``functools.partial`` to fix
            keyword options (``partial(cosine_scores, temperature=0.1)``). It may hold
            parameters if it is an ``nn.Module`` (they are registered as ``score_fn``'s).
        dropout: probability of zeroing an attention weight during training, in ``[0, 1)``.

    Shapes (``forward``):
        queries ``(B, ..., Q, d_q)``, keys ``(B, ..., K, d_k)``, values ``(B, ..., K, v)``
        (``score_fn`` decides whether ``d_q`` must equal ``d_k``); ``valid_lens`` ``None``,
        ``(B,)`` or ``(B, Q)`` integers in ``[0, K]``. Returns ``(B, ..., Q, v)``.

    Options (``forward``, keyword-only; the same for every layer built on :class:`Attention`):
        attn_mask: ``None``; a bool tensor broadcastable to the scores ``(B, ..., Q, K)``,
            **True = may attend** (as in ``F.scaled_dot_product_attention``), for example
            ``(Q, K)``, ``(B, 1, K)`` or ``(B, h, Q, K)``; or a float tensor of such a shape
            *added* to the scaled scores (SDPA's float ``attn_mask``: a bias such as
            :func:`d2lattn.positional.alibi_bias`; ``-inf`` forbids a key).
        is_causal: if True, query ``i`` may attend to key ``j`` only if ``j <= i + (K - Q)``
            (:func:`d2lattn.masking.causal_mask`, lower-right aligned: with ``Q < K`` the
            queries are the last ``Q`` positions and see every earlier key, as when decoding
            with a KV cache).
        scale: a factor of the scores; ``None`` means the layer's own (``1 / sqrt(d)`` for
            dot products, 1 for the other scores).

        ``valid_lens``, ``attn_mask`` and ``is_causal`` combine with AND: a key gets weight
        only if every one of them allows it. A query left with no key (``-inf`` biases
        included) gets all-zero weights, never NaN.

    Attributes:
        attention_weights: ``(B, ..., Q, K)`` weights of the last call, detached, before dropout.

    Raises:
        ValueError: from the constructor if ``score_fn`` is not callable (or ``None`` without
            a :meth:`score` of a subclass) or ``dropout`` is outside ``[0, 1)``; from
            ``forward`` on mismatched shapes, bad ``valid_lens`` or masks, a non-bool
            ``is_causal``, a non-positive ``scale``, or scores of a shape other than
            ``(B, ..., Q, K)``.

    Example:
        >>> attn = Attention(dot_product_scores)
        >>> attn(torch.ones(2, 1, 4), torch.ones(2, 10, 4), torch.ones(2, 10, 3)).shape
        torch.Size([2, 1, 3])

    Source: the score / normalize / pool decomposition of book chapter 4; Bahdanau, Cho and
    Bengio (2015), section 3.1; Luong, Pham and Manning (2015), section 3.1.
    """

    attention_weights: Optional[Tensor]

    def __init__(self, score_fn: Optional[ScoreFn] = None, dropout: float = 0.0) -> None:
        super().__init__()
        own_score = type(self).score is not Attention.score
        if not (callable(score_fn) or (score_fn is None and own_score)):
            raise ValueError(f"score_fn must be callable, got {type(score_fn).__name__}")
        _check_dropout(dropout)
        if score_fn is not None:
            self.score_fn = score_fn
        self._scores_are_new = own_score  # a subclass's score() returns a fresh tensor
        self.dropout = nn.Dropout(dropout)
        self.attention_weights = None

    def score(self, queries: Tensor, keys: Tensor, scale: Optional[float] = None) -> Tensor:
        """Scores ``(B, ..., Q, K)`` of queries ``(B, ..., Q, d_q)`` against keys
        ``(B, ..., K, d_k)``, times ``scale`` if given."""
        scores = self.score_fn(queries, keys)
        return scores if scale is None else scores * scale

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor,
                valid_lens: Optional[ValidLens] = None, *, attn_mask: Optional[Tensor] = None,
                is_causal: bool = False, scale: Optional[float] = None) -> Tensor:
        """Score, normalize, pool: queries ``(B, ..., Q, d_q)``, keys ``(B, ..., K, d_k)``,
        values ``(B, ..., K, d_v)`` give ``(B, ..., Q, d_v)``.

        ``valid_lens``, ``attn_mask``, ``is_causal`` and ``scale`` are described in the class
        docstring; the weights ``(B, ..., Q, K)`` are kept in :attr:`attention_weights`.
        """
        check_qkv(queries, keys, values, **self._input_sizes())
        check_scale(scale)
        self.attention_weights = None  # let the last call's (B, ..., Q, K) weights go first
        # 1. score
        scores = self.score(queries, keys, scale)  # (B, ..., Q, K)
        check_scores_shape(scores, queries, keys)
        # 2. normalize: masks (and a float bias) first
        mask, bias = _masks(attn_mask, is_causal, scores)
        if bias is not None:  # a float attn_mask is added to the scaled scores, as in SDPA
            scores = _add_bias(scores, bias, inplace=self._scores_are_new)
        weights = masked_softmax(scores, valid_lens, mask,
                                 inplace=self._scores_are_new)  # (B, ..., Q, K)
        self.attention_weights = weights.detach()
        # 3. pool
        return self.dropout(weights) @ values  # (B, ..., Q, v)

    def _input_sizes(self) -> Dict[str, object]:
        """What :meth:`score` needs of the inputs' sizes (``check_qkv``'s options)."""
        return {"same_size": False}

    def extra_repr(self) -> str:
        if not hasattr(self, "score_fn") or isinstance(self.score_fn, nn.Module):
            return ""  # a subclass's score, or a submodule printed as such
        return f"score_fn={_describe(self.score_fn)}"


class DotProductAttention(Attention):
    r"""Scaled dot-product attention.

    .. math:: \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d}}\right) V

    Args:
        dropout: probability of zeroing an attention weight during training (after the
            softmax, before pooling), in ``[0, 1)``.

    Shapes (``forward``):
        queries ``(B, ..., Q, d)``, keys ``(B, ..., K, d)``, values ``(B, ..., K, v)``, all
        float of one dtype; ``valid_lens`` ``None``, ``(B,)`` or ``(B, Q)`` integers in
        ``[0, K]``. Returns ``(B, ..., Q, v)``. Extra middle axes (heads) are allowed.

    Options (``forward``): ``attn_mask``, ``is_causal`` and ``scale`` (default ``1 / sqrt(d)``),
    as in :class:`Attention`.

    Attributes:
        attention_weights: the weights of the last call, ``(B, ..., Q, K)``, detached, taken
            before dropout (what the model attends to, not the random mask of one step).

    Raises:
        ValueError: from ``forward`` on mismatched shapes, bad ``valid_lens`` (see
            :func:`d2lattn.masked_softmax`), an ``attn_mask`` that is neither bool nor float
            or does not broadcast to ``(B, ..., Q, K)``, a non-bool ``is_causal`` or a
            non-positive ``scale``; from the constructor if ``dropout`` is outside ``[0, 1)``.

    Example:
        >>> attn = DotProductAttention()
        >>> attn(torch.ones(2, 1, 4), torch.ones(2, 10, 4), torch.ones(2, 10, 3)).shape
        torch.Size([2, 1, 3])
        >>> X = torch.ones(1, 3, 4)
        >>> _ = attn(X, X, X, is_causal=True)
        >>> attn.attention_weights[0]
        tensor([[1.0000, 0.0000, 0.0000],
                [0.5000, 0.5000, 0.0000],
                [0.3333, 0.3333, 0.3333]])

    Source: Vaswani et al. (2017), "Attention Is All You Need", equation (1).
    """

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__(dropout=dropout)

    def score(self, queries: Tensor, keys: Tensor, scale: Optional[float] = None) -> Tensor:
        """``scale * queries @ keys^T``, ``scale = 1 / sqrt(d)`` by default; ``(B, ..., Q, K)``.

        Scaling the queries (``Q*d`` numbers) instead of the scores (``Q*K``) gives the same
        result with fewer multiplications whenever ``d < K``.
        """
        if scale is None:
            scale = 1.0 / math.sqrt(queries.shape[-1])
        return (queries * scale) @ keys.transpose(-2, -1)  # (B, ..., Q, K)

    def _input_sizes(self) -> Dict[str, object]:
        return {"same_size": True}


class AdditiveAttention(Attention):
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
        ``valid_lens``, ``attn_mask``, ``is_causal`` and ``scale`` (default 1) as in
        :class:`Attention`. Returns ``(B, ..., Q, v)``. Memory: the hidden features take ``B*Q*K*num_hiddens`` numbers.

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

    def __init__(self, query_size: int, key_size: int, num_hiddens: int,
                 dropout: float = 0.0) -> None:
        check_positive_ints(query_size=query_size, key_size=key_size, num_hiddens=num_hiddens)
        super().__init__(dropout=dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def score(self, queries: Tensor, keys: Tensor, scale: Optional[float] = None) -> Tensor:
        """``w_v^T tanh(W_q q + W_k k)`` for every query and key: broadcast in the hidden space."""
        q = self.W_q(queries).unsqueeze(-2)  # (B, ..., Q, 1, h)
        k = self.W_k(keys).unsqueeze(-3)  # (B, ..., 1, K, h)
        scores = self.w_v(torch.tanh(q + k)).squeeze(-1)  # (B, ..., Q, K)
        return scores if scale is None else scores * scale

    def _input_sizes(self) -> Dict[str, object]:
        return {"same_size": False, "query_size": self.W_q.in_features,
                "key_size": self.W_k.in_features}


class BilinearAttention(Attention):
    r"""Bilinear ("general") attention: the score is ``q^T W k`` for a learned matrix ``W``.

    .. math:: a(\mathbf q, \mathbf k) = \mathbf q^\top \mathbf W_b\, \mathbf k, \qquad
              \mathbf W_b \in \mathbb R^{d_q \times d_k}

    With ``W_b`` the identity (``d_q = d_k = d``) this is unscaled dot-product attention;
    with ``W_b = I / sqrt(d)`` it is scaled dot-product attention. A low-rank
    ``W_b = W_q^T W_k`` is what projecting queries and keys before a dot product amounts to.

    Args:
        query_size: d_q, the feature size of the queries.
        key_size: d_k, the feature size of the keys.
        dropout: probability of zeroing an attention weight during training, in ``[0, 1)``.

    Parameters:
        W_b: ``nn.Linear(key_size, query_size, bias=False)``; its ``weight``, of shape
            ``(query_size, key_size)``, is the matrix ``W_b`` of the formula, so
            ``W_b(keys)`` maps each key into query space.

    Shapes (``forward``):
        queries ``(B, ..., Q, d_q)``, keys ``(B, ..., K, d_k)``, values ``(B, ..., K, v)``;
        ``valid_lens``, ``attn_mask``, ``is_causal`` and ``scale`` (default 1) as in
        :class:`Attention`. Returns ``(B, ..., Q, v)``.

    Attributes:
        attention_weights: ``(B, ..., Q, K)`` weights of the last call, detached, before dropout.

    Raises:
        ValueError: bad sizes or dropout in the constructor; in ``forward``, mismatched shapes,
            feature sizes other than ``query_size``/``key_size``, or bad ``valid_lens``.

    Example:
        >>> attn = BilinearAttention(query_size=20, key_size=2)
        >>> attn.W_b.weight.shape
        torch.Size([20, 2])
        >>> attn(torch.ones(2, 1, 20), torch.ones(2, 10, 2), torch.ones(2, 10, 4)).shape
        torch.Size([2, 1, 4])

    Source: Luong, Pham and Manning (2015), section 3.1, the "general" score.
    """

    def __init__(self, query_size: int, key_size: int, dropout: float = 0.0) -> None:
        check_positive_ints(query_size=query_size, key_size=key_size)
        super().__init__(dropout=dropout)
        self.W_b = nn.Linear(key_size, query_size, bias=False)

    def score(self, queries: Tensor, keys: Tensor, scale: Optional[float] = None) -> Tensor:
        """``q^T W_b k``: map every key into query space, then take dot products."""
        keys_in_query_space = self.W_b(keys)  # (B, ..., K, d_q)
        scores = queries @ keys_in_query_space.transpose(-2, -1)  # (B, ..., Q, K)
        return scores if scale is None else scores * scale

    def _input_sizes(self) -> Dict[str, object]:
        return {"same_size": False, "query_size": self.W_b.out_features,
                "key_size": self.W_b.in_features}


def _describe(fn: Callable[..., Tensor]) -> str:
    """A short, address-free name for a score function (``partial`` objects included)."""
    if isinstance(fn, functools.partial):
        options = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"partial({_describe(fn.func)}{', ' if options else ''}{options})"
    return getattr(fn, "__qualname__", type(fn).__name__)
