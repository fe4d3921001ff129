"""The key/value caches of decoding and the bytes they take, below every attention module.

:class:`KVCache` (one layer's cached keys and values), :class:`KVCacheLike` (what a multi-head
layer needs of a cache), and the byte counts :func:`kv_cache_bytes` and
:func:`mla_cache_bytes`. The attention modules (:mod:`d2lattn.multihead`,
:mod:`d2lattn.transformer`, :mod:`d2lattn.serving`, :mod:`d2lattn.gpt`) import them from
here; this module imports only :mod:`d2lattn._checks`, so no import circle runs through it.
The old paths (``d2lattn.transformer.KVCache``, ``d2lattn.serving.kv_cache_bytes``) still work.
"""

from __future__ import annotations

from typing import Optional, Protocol, Tuple

import torch
from torch import Tensor

from ._checks import check_cache_update, check_positive_ints

__all__ = ["KVCache", "KVCacheLike", "kv_cache_bytes", "mla_cache_bytes"]


class KVCacheLike(Protocol):
    """What multi-head attention needs of a cache (:class:`KVCache` is one)."""

    def __len__(self) -> int: ...

    def update(self, keys: Tensor, values: Tensor) -> Tuple[Tensor, Tensor]: ...


class KVCache:
    """The projected keys and values of the positions decoded so far, for one attention layer.

    Decoding one token at a time, a causal self-attention layer needs the keys and values of
    every earlier position. They do not change once computed (a position only attends to its
    past), so we keep them instead of recomputing them at every step.

    Attributes:
        keys: ``None`` before the first update, then ``(B, h, T, d_h)``.
        values: ``None`` before the first update, then ``(B, h, T, v_h)``.

    Example:
        >>> cache = KVCache()
        >>> k, v = cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
        >>> k, v = cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
        >>> len(cache), k.shape, cache.nbytes
        (4, torch.Size([1, 2, 4, 4]), 256)

    Source: the incremental decoding of autoregressive Transformers; Pope et al. (2023),
    "Efficiently Scaling Transformer Inference", section 2; book chapter 8.
    """

    def __init__(self) -> None:
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None

    def __len__(self) -> int:
        """T, the number of cached positions."""
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        if self.keys is None or self.values is None:
            return 0
        return (self.keys.numel() * self.keys.element_size()
                + self.values.numel() * self.values.element_size())

    def update(self, keys: Tensor, values: Tensor) -> Tuple[Tensor, Tensor]:
        """Append new keys and values and return everything cached.

        Args:
            keys: ``(B, h, T_new, d_h)`` float, the projected keys of the new positions.
            values: ``(B, h, T_new, v_h)`` float.

        Returns:
            ``(keys, values)`` of shapes ``(B, h, T + T_new, d_h)`` and ``(B, h, T + T_new, v_h)``.

        Raises:
            ValueError: if the shapes do not match each other or the cache, or the dtypes or
                devices differ from each other or from the cache's (no silent promotion).
        """
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a tensor of shape (B, h, T_new, size)")
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must "
                             "share (B, h, T_new)")
        if keys.dtype != values.dtype or keys.device != values.device:
            raise ValueError(f"keys ({keys.dtype} on {keys.device}) and values ({values.dtype} "
                             f"on {values.device}) must share one dtype and device")
        check_cache_update(self.keys, keys, "keys")
        check_cache_update(self.values, values, "values")
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
        else:
            if keys.shape[:2] != self.keys.shape[:2] or keys.shape[3] != self.keys.shape[3] \
                    or values.shape[3] != self.values.shape[3]:
                raise ValueError(f"new keys {tuple(keys.shape)} do not fit the cached keys "
                                 f"{tuple(self.keys.shape)} (B, h and sizes must agree)")
            self.keys = torch.cat([self.keys, keys], dim=-2)  # (B, h, T + T_new, d_h)
            self.values = torch.cat([self.values, values], dim=-2)  # (B, h, T + T_new, v_h)
        return self.keys, self.values

    def __repr__(self) -> str:
        return f"KVCache(length={len(self)}, nbytes={self.nbytes})"


# --- bytes per token ---------------------------------------------------------------------------

def kv_cache_bytes(*, num_layers: int, num_kv_heads: int, head_size: int, seq_len: int,
                   batch_size: int = 1, bytes_per_value: int = 2,
                   window: Optional[int] = None) -> int:
    r"""Bytes of the keys and values a decoder caches.

    .. math:: \text{bytes} = 2 \cdot B \cdot L \cdot g \cdot d_h \cdot \min(T, W) \cdot b

    (a key and a value per token, layer and key/value head). Multi-head attention has
    ``g = h`` key/value heads, grouped-query attention ``1 < g < h``, multi-query attention
    ``g = 1``; a sliding window of ``W`` tokens keeps only the last ``W`` (``window=None``:
    all ``T``).

    Args (keyword-only, positive integers):
        num_layers: L. num_kv_heads: g. head_size: d_h. seq_len: T, tokens per sequence.
        batch_size: B. bytes_per_value: b (2 for float16/bfloat16, 4 for float32).
        window: ``None`` or W.

    Returns:
        an ``int``, bytes.

    Raises:
        ValueError: an argument that is not a positive integer.

    Example:
        >>> kv_cache_bytes(num_layers=4, num_kv_heads=4, head_size=32, seq_len=1)
        2048

    Source: Shazeer (2019), "Fast Transformer Decoding: One Write-Head is All You Need" (MQA);
    Ainslie et al. (2023), "GQA"; Beltagy et al. (2020), "Longformer" (sliding window).
    """
    check_positive_ints(num_layers=num_layers, num_kv_heads=num_kv_heads, head_size=head_size,
                        seq_len=seq_len, batch_size=batch_size, bytes_per_value=bytes_per_value)
    if window is not None:
        check_positive_ints(window=window)
    kept = seq_len if window is None else min(seq_len, window)
    return 2 * batch_size * num_layers * num_kv_heads * head_size * kept * bytes_per_value


def mla_cache_bytes(*, num_layers: int, latent_size: int, rope_head_size: int, seq_len: int,
                    batch_size: int = 1, bytes_per_value: int = 2) -> int:
    r"""Bytes of the cache of multi-head latent attention.

    .. math:: \text{bytes} = B \cdot L \cdot (d_c + d_h^R) \cdot T \cdot b

    One latent :math:`c^{KV}_t \in \mathbb R^{d_c}` and one rotary key
    :math:`k^R_t \in \mathbb R^{d_h^R}` per token and layer, shared by all heads.

    Args (keyword-only, positive integers):
        num_layers: L. latent_size: d_c. rope_head_size: d_h^R. seq_len: T. batch_size: B.
        bytes_per_value: b.

    Returns and raises as :func:`kv_cache_bytes`: an ``int`` of bytes; ``ValueError`` for an
    argument that is not a positive integer.

    Example:
        >>> mla_cache_bytes(num_layers=60, latent_size=512, rope_head_size=64, seq_len=1)
        69120

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1.4 and table 1.
    """
    check_positive_ints(num_layers=num_layers, latent_size=latent_size,
                        rope_head_size=rope_head_size, seq_len=seq_len, batch_size=batch_size,
                        bytes_per_value=bytes_per_value)
    return batch_size * num_layers * (latent_size + rope_head_size) * seq_len * bytes_per_value
