"""Multi-head attention: h scaled dot-product attentions side by side, in learned subspaces."""

from __future__ import annotations

from typing import Optional, Protocol, Tuple

import torch
from torch import Tensor, nn

from ._checks import (
    ValidLens,
    check_bool,
    check_input_dtype,
    check_kv_cache_chunk,
    check_positive_ints,
    check_qkv,
)
from .positional import rotary_embedding
from .scoring import DotProductAttention


class _KVCacheLike(Protocol):
    """What ``MultiHeadAttention.forward`` needs of a cache (see ``d2lattn.KVCache``)."""

    def __len__(self) -> int: ...

    def update(self, keys: Tensor, values: Tensor) -> Tuple[Tensor, Tensor]: ...

__all__ = ["MultiHeadAttention"]


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
            values of this call, ``(B, h, K_new, d_h)``, are appended to it, and attention
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
    ) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, num_heads=num_heads)
        if num_hiddens % num_heads != 0:
            raise ValueError(
                f"num_hiddens ({num_hiddens}) must be divisible by num_heads ({num_heads})"
            )
        sizes = {"query_size": query_size, "key_size": key_size, "value_size": value_size}
        check_positive_ints(**{name: size for name, size in sizes.items() if size is not None})
        if not isinstance(rotary, bool):
            raise ValueError(f"rotary must be a bool, got {rotary!r}")
        if rotary and (num_hiddens // num_heads) % 2 != 0:
            raise ValueError("rotary=True needs an even head size num_hiddens // num_heads, "
                             f"got {num_hiddens // num_heads}")
        self.num_hiddens = num_hiddens
        self.num_heads = num_heads
        self.rotary = rotary
        self.W_q = nn.Linear(query_size or num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size or num_hiddens, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size or num_hiddens, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.attention = DotProductAttention(dropout)

    @property
    def attention_weights(self) -> Optional[Tensor]:
        """``(B, num_heads, Q, K)`` weights of the last call (``None`` before the first)."""
        return self.attention.attention_weights

    def split_heads(self, X: Tensor) -> Tensor:
        """``(B, T, num_hiddens)`` -> ``(B, num_heads, T, num_hiddens // num_heads)``."""
        B, T, _ = X.shape
        # contiguous: one copy here lets every later matmul use the heads without copying,
        # and gives BLAS keys^T as a plain transposed view.
        d_h = self.num_hiddens // self.num_heads  # named, not -1: B or T may be 0
        return X.view(B, T, self.num_heads, d_h).transpose(1, 2).contiguous()  # (B, h, T, d_h)

    def merge_heads(self, X: Tensor) -> Tensor:
        """``(B, num_heads, T, d_h)`` -> ``(B, T, num_heads * d_h)``; inverse of ``split_heads``."""
        B, h, T, d_h = X.shape
        return X.transpose(1, 2).reshape(B, T, h * d_h)  # (B, T, num_hiddens)

    def _project_packed(self, X: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``W_q(X), W_k(X), W_v(X)``, each ``(B, T, num_hiddens)``, from one matrix product."""
        weight = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])  # (3 nh, size)
        bias = (None if self.W_q.bias is None
                else torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))  # (3 nh,)
        q, k, v = nn.functional.linear(X, weight, bias).chunk(3, dim=-1)
        return q, k, v

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Optional[ValidLens] = None,
        *,
        attn_mask: Optional[Tensor] = None,
        is_causal: bool = False,
        kv_cache: Optional[_KVCacheLike] = None,
        scale: Optional[float] = None,
    ) -> Tensor:
        check_qkv(queries, keys, values, same_size=False, query_size=self.W_q.in_features,
                  key_size=self.W_k.in_features, value_size=self.W_v.in_features)
        if queries.dim() != 3:
            raise ValueError(f"queries must have shape (B, Q, query_size), got {tuple(queries.shape)}")
        for name, t in (("queries", queries), ("keys", keys), ("values", values)):
            check_input_dtype(name, t, self.W_q.weight.dtype)
        check_bool(is_causal=is_causal)
        check_kv_cache_chunk(kv_cache, is_causal, attn_mask, queries.shape[1])
        if attn_mask is not None and isinstance(attn_mask, Tensor) and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)  # (B, 1, Q, K): the same mask for every head
        # 1. project, then split the hidden axis into h contiguous blocks
        if queries is keys is values and not torch.is_grad_enabled():
            # self-attention at inference: the three projections as one matrix product, as
            # nn.MultiheadAttention's fast path does (about 5% faster here). Same weights and
            # products; training keeps the three calls, the form the chapters explain.
            q, k, v = self._project_packed(queries)
        else:
            q, k, v = self.W_q(queries), self.W_k(keys), self.W_v(values)
        q = self.split_heads(q)  # (B, h, Q, d_h)
        k = self.split_heads(k)  # (B, h, K_new, d_h)
        v = self.split_heads(v)  # (B, h, K_new, d_h)
        if self.rotary:  # positions: keys after the cached ones, queries the last Q of all
            past = len(kv_cache) if kv_cache is not None else 0
            total = past + k.shape[-2]
            k = rotary_embedding(k, torch.arange(past, total, device=k.device))
            q = rotary_embedding(q, torch.arange(total - q.shape[-2], total, device=q.device))
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, h, K, d_h): the cache plus the new keys
        # 2. attend in every head at once; masks broadcast over the head axis
        heads = self.attention(q, k, v, valid_lens, attn_mask=attn_mask,
                               is_causal=is_causal, scale=scale)  # (B, h, Q, d_h)
        # 3. concatenate the heads and mix them
        return self.W_o(self.merge_heads(heads))  # (B, Q, num_hiddens)
