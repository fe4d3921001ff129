"""Multi-head attention: h scaled dot-product attentions side by side, in learned subspaces.

One core, :class:`MultiHeadAttention`: ``h`` query heads that share ``g`` key/value heads
(``g = h`` unless ``num_kv_heads`` says otherwise), with the weights materialised (they are kept
in ``attention_weights``). :class:`GroupedQueryAttention` is the same layer whose attention step
is the tiled kernel :func:`~d2lattn.flash.flash_attention` (no weights held). Both use
:func:`~d2lattn.heads.split_heads`, :func:`~d2lattn.heads.merge_heads` and one cache protocol
(:class:`~d2lattn.kvcache.KVCacheLike`, which :class:`d2lattn.KVCache` follows); all three live
in modules below this one and are re-exported here.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ._checks import (
    ValidLens,
    check_bool,
    check_heads,
    check_input_dtype,
    check_kv_cache_chunk,
    check_positive_ints,
    check_qkv,
)
from .flash import DEFAULT_BLOCK_SIZE, flash_attention
from .heads import merge_heads, split_heads  # re-exported: the old path works
from .kvcache import KVCacheLike, kv_cache_bytes  # re-exported: the old path works
from .positional import rotary_embedding
from .scoring import DotProductAttention

__all__ = ["GroupedQueryAttention", "MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention with ``num_heads`` heads of size ``num_hiddens // num_heads``.

    .. math::
        \mathrm{MultiHead}(Q, K, V) = [\mathrm{head}_1; \dots; \mathrm{head}_h] W_o^\top,
        \quad \mathrm{head}_i = \mathrm{softmax}\!\Big(\frac{Q W_{q,i}^\top (K W_{k,i}^\top)^\top}
        {\sqrt{d_h}}\Big) V W_{v,i}^\top

    Head ``i`` uses rows ``i*d_h : (i+1)*d_h`` of ``W_q``, ``W_k`` and ``W_v`` (contiguous
    blocks, as in :class:`torch.nn.MultiheadAttention`), so a model with the same weights
    gives the same outputs as PyTorch's.

    Args:
        num_hiddens: total projected size, split evenly across the heads.
        num_heads: h, the number of heads; must divide ``num_hiddens``.
        dropout: dropout probability on the attention weights, in ``[0, 1)``.
        bias: whether the four projections have a bias (``nn.MultiheadAttention``'s ``bias``).
        query_size: feature size of the queries (default ``num_hiddens``).
        key_size: feature size of the keys (default ``num_hiddens``).
        value_size: feature size of the values (default ``num_hiddens``).
        num_kv_heads: keyword-only; g, the number of key/value heads, a divisor of
            ``num_heads`` (default ``num_heads``). With ``g < h`` the query heads share key/value
            heads as in :class:`GroupedQueryAttention` (``W_k`` and ``W_v`` then produce
            ``g * d_h`` features), computed here with the weights materialised.
        rotary: keyword-only; if True, queries and keys are rotated by
            :func:`d2lattn.positional.rotary_embedding` in every head after the projections
            (RoPE), so that the scores see relative positions. Keys get positions
            ``len(kv_cache) .. len(kv_cache) + K - 1`` (``0 .. K-1`` without a cache), and
            queries the last ``Q`` of all the positions, the alignment of ``is_causal``. Meant
            for self-attention. Needs an even head size.

    Parameters:
        W_q, W_k, W_v: ``nn.Linear(query_size|key_size|value_size, num_hiddens, bias)``.
        W_o: ``nn.Linear(num_hiddens, num_hiddens, bias)``.

    Shapes (``forward``):
        queries ``(B, Q, query_size)``, keys ``(B, K, key_size)``, values
        ``(B, K, value_size)``; ``valid_lens`` ``None``, ``(B,)`` or ``(B, Q)`` integers in
        ``[0, K]``, shared by all heads. Returns ``(B, Q, num_hiddens)``.

    Keyword-only options (``forward``):
        attn_mask: ``None``; a bool mask, **True = may attend**; or a float mask added to
            the scores (``nn.MultiheadAttention``'s float ``attn_mask``, e.g. an ALiBi bias
            ``alibi_bias(h, Q, K)[None]``): ``(Q, K)`` for every sequence and head,
            ``(B, Q, K)`` per sequence (shared by the heads), or ``(B, h, Q, K)`` (any of these
            axes may be 1). ``K`` counts the cached keys too. (``nn.MultiheadAttention``'s
            3-D mask is ``(B*h, Q, K)``: reshape it to ``(B, h, Q, K)``.)
        is_causal: query ``i`` sees key ``j`` only if ``j <= i + (K - Q)`` (lower-right
            aligned, so new queries after a cache see the whole cache).
        kv_cache: ``None`` or a cache such as :class:`d2lattn.KVCache`. The projected keys and
            values of this call, ``(B, g, K_new, d_h)`` (``g = h`` by default), are appended to it, and attention
            runs over everything it holds. Then ``valid_lens`` and ``attn_mask`` refer to all
            ``K`` keys. A chunk of several queries needs ``is_causal=True`` or an
            ``attn_mask`` (otherwise the new positions would see each other's future).
        scale: factor of the dot products; ``None`` means ``1 / sqrt(d_h)``.

        ``valid_lens``, ``attn_mask`` and ``is_causal`` combine with AND.

    Attributes:
        attention_weights: ``(B, num_heads, Q, K)`` weights of the last call, per head,
            detached, before dropout.

    Raises:
        ValueError: at construction if ``num_hiddens % num_heads != 0``, a size is not a
            positive integer, or ``rotary`` is set with an odd head size; in ``forward`` on
            mismatched shapes, inputs of another dtype than the parameters, bad
            ``valid_lens``, a bad ``attn_mask``, or a ``kv_cache`` with ``is_causal=False``
            and several queries without ``attn_mask``.

    Example:
        >>> mha = MultiHeadAttention(num_hiddens=16, num_heads=4)
        >>> X = torch.ones(2, 5, 16)
        >>> mha(X, X, X).shape, mha.attention_weights.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 4, 5, 5]))
        >>> _ = mha(X, X, X, is_causal=True)
        >>> mha.attention_weights[0, 0, 1]  # query 1 sees keys 0 and 1 only
        tensor([0.5000, 0.5000, 0.0000, 0.0000, 0.0000])

    Source: Vaswani et al. (2017), section 3.2.2.
    """

    def __init__(
        self,
        num_hiddens: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = False,
        *,
        query_size: Optional[int] = None,
        key_size: Optional[int] = None,
        value_size: Optional[int] = None,
        rotary: bool = False,
        num_kv_heads: Optional[int] = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_heads(num_hiddens, num_heads, num_kv_heads, rotary=rotary,
                    query_size=query_size, key_size=key_size, value_size=value_size)
        self.num_hiddens, self.num_heads, self.num_kv_heads = num_hiddens, num_heads, num_kv_heads
        self.head_size = num_hiddens // num_heads
        self.rotary = rotary
        kv_hiddens = num_kv_heads * self.head_size
        self.W_q = nn.Linear(query_size or num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size or num_hiddens, kv_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size or num_hiddens, kv_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.attention = DotProductAttention(dropout)

    @property
    def attention_weights(self) -> Optional[Tensor]:
        """``(B, num_heads, Q, K)`` weights of the last call (``None`` before the first)."""
        return self.attention.attention_weights

    def split_heads(self, X: Tensor, num_heads: Optional[int] = None) -> Tensor:
        """``(B, T, num_heads * d_h)`` -> ``(B, num_heads, T, d_h)`` (default: the query heads)."""
        return split_heads(X, self.num_heads if num_heads is None else num_heads)

    def merge_heads(self, X: Tensor) -> Tensor:
        """``(B, num_heads, T, d_h)`` -> ``(B, T, num_heads * d_h)``; inverse of ``split_heads``."""
        return merge_heads(X)

    def kv_cache_bytes(self, batch_size: int, seq_len: int,
                       dtype: torch.dtype = torch.float32) -> int:
        """Bytes of the keys and values a decoder caches for ``seq_len`` tokens (one layer).

        ``2 * batch_size * seq_len * num_kv_heads * d_h * itemsize``: ``num_heads /
        num_kv_heads`` times less than multi-head attention's cache. The count is
        :func:`d2lattn.kvcache.kv_cache_bytes` for this layer's sizes.
        """
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype, got {dtype!r}")
        return kv_cache_bytes(num_layers=1, num_kv_heads=self.num_kv_heads,
                              head_size=self.head_size, seq_len=seq_len, batch_size=batch_size,
                              bytes_per_value=dtype.itemsize)

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor,
                valid_lens: Optional[ValidLens] = None, *, attn_mask: Optional[Tensor] = None,
                is_causal: bool = False, kv_cache: Optional[KVCacheLike] = None,
                scale: Optional[float] = None) -> Tensor:
        """Attend from ``queries`` ``(B, Q, query_size)`` over ``keys`` ``(B, K, key_size)``
        and ``values`` ``(B, K, value_size)`` in every head; returns ``(B, Q, num_hiddens)``.

        ``valid_lens`` (``None``, ``(B,)`` or ``(B, Q)``), ``attn_mask``, ``is_causal``,
        ``kv_cache`` and ``scale`` are described in the class docstring; the weights of the
        call are kept in :attr:`attention_weights` ``(B, h, Q, K)``.
        """
        attn_mask = self._check(queries, keys, values, attn_mask, is_causal, kv_cache)
        # 1. project, then split the hidden axis into heads (h for queries, g for keys)
        q, k, v = self._project(queries, keys, values)
        q = split_heads(q, self.num_heads)  # (B, h, Q, d_h)
        k = split_heads(k, self.num_kv_heads)  # (B, g, K_new, d_h)
        v = split_heads(v, self.num_kv_heads)  # (B, g, K_new, d_h)
        if self.rotary:
            q, k = self._rotate(q, k, kv_cache)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, g, K, d_h): the cache plus the new keys
        # 2. attend in every head at once; masks broadcast over the head axis
        heads = self._attend(q, k, v, valid_lens, attn_mask, is_causal, scale)  # (B, h, Q, d_h)
        # 3. concatenate the heads and mix them
        return self.W_o(merge_heads(heads))  # (B, Q, num_hiddens)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, valid_lens: Optional[ValidLens],
                attn_mask: Optional[Tensor], is_causal: bool, scale: Optional[float]) -> Tensor:
        """Scaled dot-product attention of ``(B, h, Q, d_h)`` queries over ``g`` key heads."""
        r = self.num_heads // self.num_kv_heads
        if r > 1:  # materialised weights need one key/value head per query head
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)  # (B, h, K, d_h)
        return self.attention(q, k, v, valid_lens, attn_mask=attn_mask, is_causal=is_causal,
                              scale=scale)  # (B, h, Q, d_h)

    def _check(self, queries: Tensor, keys: Tensor, values: Tensor, attn_mask: Optional[Tensor],
               is_causal: bool, kv_cache: Optional[KVCacheLike]) -> Optional[Tensor]:
        """Check the inputs; return ``attn_mask`` with a head axis (``(B, Q, K)`` ->
        ``(B, 1, Q, K)``: the same mask for every head)."""
        check_qkv(queries, keys, values, same_size=False, query_size=self.W_q.in_features,
                  key_size=self.W_k.in_features, value_size=self.W_v.in_features)
        if queries.dim() != 3:
            raise ValueError(f"queries must have shape (B, Q, query_size), "
                             f"got {tuple(queries.shape)}")
        for name, t in (("queries", queries), ("keys", keys), ("values", values)):
            check_input_dtype(name, t, self.W_q.weight.dtype)
        check_bool(is_causal=is_causal)
        check_kv_cache_chunk(kv_cache, is_causal, attn_mask, queries.shape[1])
        if isinstance(attn_mask, Tensor) and attn_mask.dim() == 3:
            return attn_mask.unsqueeze(1)  # (B, 1, Q, K)
        return attn_mask

    def _project(self, queries: Tensor, keys: Tensor,
                 values: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``W_q(queries), W_k(keys), W_v(values)``, each ``(B, T, size)``.

        Self-attention at inference takes the three projections as one matrix product, as
        ``nn.MultiheadAttention``'s fast path does (about 5% faster here): the same weights
        and products; training keeps the three calls, the form the chapters explain.
        """
        if not (queries is keys is values) or torch.is_grad_enabled():
            return self.W_q(queries), self.W_k(keys), self.W_v(values)
        weight = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])  # (nh+2gd, size)
        bias = (None if self.W_q.bias is None
                else torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))
        sizes = [self.W_q.out_features, self.W_k.out_features, self.W_v.out_features]
        q, k, v = nn.functional.linear(queries, weight, bias).split(sizes, dim=-1)
        return q, k, v

    def _rotate(self, q: Tensor, k: Tensor,
                kv_cache: Optional[KVCacheLike]) -> Tuple[Tensor, Tensor]:
        """RoPE: keys after the cached positions, queries the last ``Q`` of all positions."""
        past = len(kv_cache) if kv_cache is not None else 0
        total = past + k.shape[-2]
        k = rotary_embedding(k, torch.arange(past, total, device=k.device))
        q = rotary_embedding(q, torch.arange(total - q.shape[-2], total, device=q.device))
        return q, k


class GroupedQueryAttention(MultiHeadAttention):
    r"""Multi-head attention whose ``num_heads`` query heads share ``num_kv_heads`` key/value heads.

    .. math:: \mathrm{head}_i = \mathrm{softmax}\!\Big(\frac{Q W_{q,i}^\top
              (K W_{k,g(i)}^\top)^\top}{\sqrt{d_h}}\Big) V W_{v,g(i)}^\top, \qquad
              g(i) = \lfloor i / r \rfloor,\ r = \texttt{num\_heads} / \texttt{num\_kv\_heads}

    Query heads ``i*r ... (i+1)*r - 1`` use key/value head ``i`` (the grouping of
    ``F.scaled_dot_product_attention(..., enable_gqa=True)``). ``num_kv_heads == num_heads`` is
    ordinary multi-head attention; ``num_kv_heads == 1`` is multi-query attention. It is
    :class:`MultiHeadAttention` with ``num_kv_heads`` (the same projections, checks, cache and
    ``forward``) whose attention step is the tiled kernel instead of the materialised weights.
    The keys and values a decoder caches shrink by the factor ``r`` (see :meth:`kv_cache_bytes`
    and the ``kv_cache`` option), and so do the keys and values saved for the backward pass:
    the attention is :func:`~d2lattn.flash.flash_attention` with ``enable_gqa=True``, whose
    ``r`` query heads read their shared key/value head in one matrix product, never a copy of
    it per query head (no dropout, no stored weights).

    Args:
        num_hiddens: total size of the query heads, ``num_heads * d_h``.
        num_heads: h, the number of query heads; must divide ``num_hiddens``.
        num_kv_heads: g, the number of key/value heads; must divide ``num_heads``.
        bias: whether the four projections have a bias.
        query_size, key_size, value_size: keyword-only input sizes (default ``num_hiddens``).
        block_size: keyword-only tile size passed to :func:`~d2lattn.flash.flash_attention`.
        rotary: keyword-only; rotary position embedding, as in :class:`MultiHeadAttention`.

    Parameters:
        W_q: ``nn.Linear(query_size, num_hiddens)``; W_k, W_v: ``nn.Linear(key_size|value_size,
        num_kv_heads * d_h)``; W_o: ``nn.Linear(num_hiddens, num_hiddens)``.

    Shapes (``forward``):
        queries ``(B, Q, query_size)``, keys ``(B, K, key_size)``, values ``(B, K, value_size)``
        of the parameters' dtype; ``valid_lens`` ``None``, ``(B,)`` or ``(B, Q)``.
        Keyword-only: ``attn_mask`` (bool or float, over the ``h`` query heads, as in
        :class:`MultiHeadAttention`: ``(Q, K)``, ``(B, Q, K)``, ``(B, 1|h, Q, K)``),
        ``is_causal``, ``scale`` and ``kv_cache`` (a :class:`~d2lattn.KVCache`: the new keys
        and values ``(B, g, K_new, d_h)`` are appended to it and attention runs over all it
        holds; a chunk of several queries needs ``is_causal=True`` or an ``attn_mask``).
        Returns ``(B, Q, num_hiddens)``.

    Raises:
        ValueError: at construction if a size is not a positive integer or does not divide as
            required; in ``forward`` on mismatched shapes or dtypes, bad ``valid_lens`` or
            masks, or a ``kv_cache`` with ``is_causal=False`` and several new queries.

    Example:
        >>> gqa = GroupedQueryAttention(num_hiddens=16, num_heads=4, num_kv_heads=2)
        >>> X = torch.ones(2, 5, 16)
        >>> gqa(X, X, X, is_causal=True).shape
        torch.Size([2, 5, 16])
        >>> gqa.W_k.weight.shape, gqa.kv_cache_bytes(batch_size=1, seq_len=100)
        (torch.Size([8, 16]), 6400)

    Source: Ainslie et al. (2023), "GQA", section 2.2; Shazeer (2019), "Fast transformer
    decoding: one write-head is all you need" (multi-query attention); book chapter 9.
    """

    def __init__(
        self,
        num_hiddens: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        *,
        query_size: Optional[int] = None,
        key_size: Optional[int] = None,
        value_size: Optional[int] = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        rotary: bool = False,
    ) -> None:
        check_positive_ints(num_kv_heads=num_kv_heads, block_size=block_size)
        super().__init__(num_hiddens, num_heads, 0.0, bias, query_size=query_size,
                         key_size=key_size, value_size=value_size, rotary=rotary,
                         num_kv_heads=num_kv_heads)
        self.block_size = block_size

    @property
    def attention_weights(self) -> Optional[Tensor]:
        """Always ``None``: the tiled kernel never holds the weights."""
        return None

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, valid_lens: Optional[ValidLens],
                attn_mask: Optional[Tensor], is_causal: bool, scale: Optional[float]) -> Tensor:
        """Every group of ``h / g`` query heads reads its key/value head (no copies)."""
        return flash_attention(q, k, v, valid_lens=valid_lens, attn_mask=attn_mask,
                               is_causal=is_causal, scale=scale, enable_gqa=True,
                               block_size=self.block_size)  # (B, h, Q, d_h)
