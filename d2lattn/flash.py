"""Attention that fits in memory: online softmax, block-wise attention, local and grouped heads.

:class:`~d2lattn.DotProductAttention` materialises the ``(B, ..., Q, K)`` weights. The functions
here compute the same result block by block and never hold more than one tile of scores
(``(B*..., block_size, block_size)`` numbers) at a time:

- :func:`online_softmax_stats`: the running maximum and running sum of one pass over a row,
  the trick that makes the blocks possible (Milakov and Gimelshein, 2018);
- :func:`flash_attention`: exact scaled dot-product attention, forward and backward, in the
  style of FlashAttention-2 (Dao, 2023): the backward pass stores only the output and one
  log-sum-exp per query, and recomputes the tiles;
- :func:`local_attention` and :func:`sliding_window_mask`: each query sees only the keys within
  a window around its own position (Beltagy et al., 2020); blocks outside the window are skipped,
  so the cost grows linearly with the length;
- :class:`GroupedQueryAttention`: multi-head attention whose heads share ``num_kv_heads`` key and
  value heads (Ainslie et al., 2023; one shared head is multi-query attention, Shazeer, 2019).

Masking follows the rest of d2lattn: True = may attend; causal masks are lower-right aligned
(query ``i`` sees key ``j`` iff ``j <= i + (K - Q)``); a query with no visible key gets the zero
vector, never NaN.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .scoring import check_positive_ints, check_qkv

__all__ = [
    "online_softmax_stats",
    "flash_attention",
    "local_attention",
    "sliding_window_mask",
    "tile_schedule",
    "GroupedQueryAttention",
]

ValidLens = Union[Tensor, Sequence[int]]

#: Default tile size: a 256 x 256 float32 tile is 256 KiB per head, so the tiles of 8 heads
#: (2 MiB) stay in a 2 MiB-per-core L2 cache; see ``benchmarks/bench_flash.py`` and chapter 9.
DEFAULT_BLOCK_SIZE = 256
_LOG2_E = math.log2(math.e)  # scores times log2(e): exp(x) = 2 ** (x * log2(e))


def online_softmax_stats(scores: Tensor, block_size: int = 1) -> Tuple[Tensor, Tensor]:
    r"""The maximum and the sum of exponentials of each row, in one pass over blocks of keys.

    .. math:: m_t = \max(m_{t-1}, \max_{j \in \text{block } t} x_j), \qquad
              \ell_t = \ell_{t-1}\, e^{m_{t-1} - m_t} + \sum_{j \in \text{block } t} e^{x_j - m_t}

    After the last block, ``m`` is the row maximum and ``l = sum_j exp(x_j - m)``, so
    ``softmax(x) = exp(x - m) / l`` and ``logsumexp(x) = m + log(l)``. A row of ``-inf`` ends
    with ``m = -inf`` and ``l = 0``.

    Args:
        scores: float, shape ``(..., K)``.
        block_size: how many keys each step reads, a positive integer (1 = one key at a time).

    Returns:
        ``(m, l)``, each of shape ``(...,)``: the running maximum and running sum after all keys.

    Raises:
        ValueError: if ``scores`` is not a float tensor with at least one axis, or
            ``block_size`` is not a positive integer.

    Example:
        >>> x = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
        >>> m, l = online_softmax_stats(x, block_size=2)
        >>> m, l
        (tensor([3.]), tensor([1.5530]))
        >>> torch.allclose(torch.exp(x - m[:, None]) / l[:, None], torch.softmax(x, -1))
        True

    Source: Milakov and Gimelshein (2018), "Online normalizer calculation for softmax",
    algorithm 3; book chapter 9.
    """
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.dim() < 1:
        raise ValueError("scores must be a floating-point tensor of shape (..., K)")
    check_positive_ints(block_size=block_size)
    m = torch.full(scores.shape[:-1], -math.inf, dtype=scores.dtype, device=scores.device)
    l = torch.zeros_like(m)
    for start in range(0, scores.shape[-1], block_size):
        block = scores[..., start:start + block_size]  # (..., block)
        m_new = torch.maximum(m, block.amax(dim=-1))
        m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)  # a row of -inf so far: no NaN
        l = l * torch.exp(m - m_safe) + torch.exp(block - m_safe[..., None]).sum(dim=-1)
        m = m_new
    return m, l


# ---------------------------------------------------------------------------------------------
# Checking the arguments
# ---------------------------------------------------------------------------------------------

def _check_lens(valid_lens: ValidLens, B: int, Q: int, K: int) -> Tensor:
    """``valid_lens`` as an int64 tensor of shape ``(B,)`` or ``(B, Q)`` in ``[0, K]``."""
    if not isinstance(valid_lens, Tensor):
        try:
            valid_lens = torch.as_tensor(valid_lens)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"valid_lens must be integers of shape (B,) or (B, Q); "
                             f"got {valid_lens!r}") from err
    if valid_lens.dtype == torch.bool or valid_lens.is_floating_point() or valid_lens.is_complex():
        raise ValueError(f"valid_lens must have an integer dtype, got {valid_lens.dtype}")
    if valid_lens.shape not in ((B,), (B, Q)):
        raise ValueError(f"valid_lens must have shape (B,) = ({B},) or (B, Q) = ({B}, {Q}), "
                         f"got shape {tuple(valid_lens.shape)}")
    if valid_lens.numel() and (int(valid_lens.min()) < 0 or int(valid_lens.max()) > K):
        raise ValueError(f"valid_lens entries must lie in [0, {K}] (the number of keys); got "
                         f"values in [{int(valid_lens.min())}, {int(valid_lens.max())}]")
    return valid_lens.to(torch.int64)


def _check_options(window: Optional[int], scale: Optional[float], block_size: int) -> None:
    check_positive_ints(block_size=block_size)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 0):
        raise ValueError(f"window must be None or a non-negative integer, got {window!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not scale > 0 or not math.isfinite(scale)):
        raise ValueError(f"scale must be None or a positive finite number, got {scale!r}")


# ---------------------------------------------------------------------------------------------
# Which tiles to compute, and the mask of a tile
# ---------------------------------------------------------------------------------------------

class _Tiling:
    """Tile bookkeeping for ``N`` rows of ``Q`` queries against ``K`` keys.

    Query ``i`` may see key ``j`` iff ``j < valid_len`` (if given), ``j <= i + off`` (causal),
    and ``|j - (i + off)| <= window`` (if given), with ``off = K - Q`` (lower-right alignment).
    """

    def __init__(self, N: int, Q: int, K: int, lens: Optional[Tensor], is_causal: bool,
                 window: Optional[int], block_size: int, device: torch.device) -> None:
        self.Q, self.K, self.off, self.bs = Q, K, K - Q, block_size
        self.is_causal, self.window = is_causal, window
        self.lens = lens  # None, (N,) or (N, Q) int64
        self.device = device
        self._cache: dict = {}  # tile masks that do not depend on valid_lens

    def key_range(self, qs: int, qe: int) -> Tuple[int, int, int, int]:
        """Keys ``[lo, hi)`` some query in ``[qs, qe)`` sees; ``[full_lo, full_hi)``: all see."""
        lo, hi = 0, self.K
        full_lo, full_hi = 0, self.K
        if self.is_causal:
            hi = min(hi, qe - 1 + self.off + 1)
            full_hi = min(full_hi, qs + self.off + 1)
        if self.window is not None:
            lo = max(lo, qs + self.off - self.window)
            full_lo = max(full_lo, qe - 1 + self.off - self.window)
            if not self.is_causal:
                hi = min(hi, qe - 1 + self.off + self.window + 1)
                full_hi = min(full_hi, qs + self.off + self.window + 1)
        if self.lens is not None:
            rows = self.lens if self.lens.dim() == 1 else self.lens[:, qs:qe]
            hi = min(hi, int(rows.max()) if rows.numel() else 0)
            full_hi = min(full_hi, int(rows.min()) if rows.numel() else 0)
        return max(lo, 0), max(hi, 0), full_lo, full_hi

    def blocks(self, qs: int, qe: int):
        """Yield ``(ks, ke, needs_mask)`` for the key blocks that query rows ``[qs, qe)`` need."""
        lo, hi, full_lo, full_hi = self.key_range(qs, qe)
        if lo >= hi:
            return
        for ks in range((lo // self.bs) * self.bs, hi, self.bs):
            ke = min(ks + self.bs, self.K)
            yield ks, ke, not (full_lo <= ks and ke <= full_hi)

    def bias(self, qs: int, qe: int, ks: int, ke: int, dtype: torch.dtype) -> Tensor:
        """Additive tile mask: 0 where a query may attend, ``-inf`` elsewhere; ``(1|N, bq, bk)``.

        Adding it is cheaper than ``masked_fill``. Without ``valid_lens`` a tile's mask depends
        only on ``qs + off - ks`` and its size, so it is built once and reused (every diagonal
        tile of a causal mask is the same).
        """
        key = (qs + self.off - ks, qe - qs, ke - ks, dtype)
        if self.lens is None and key in self._cache:
            return self._cache[key]
        keep = self.mask(qs, qe, ks, ke)
        bias = torch.zeros(keep.shape, dtype=dtype, device=self.device).masked_fill_(~keep,
                                                                                      -math.inf)
        if self.lens is None:
            self._cache[key] = bias
        return bias

    def mask(self, qs: int, qe: int, ks: int, ke: int) -> Tensor:
        """Boolean tile mask, True = may attend, shape ``(1 or N, qe - qs, ke - ks)``."""
        i = torch.arange(qs, qe, device=self.device)[:, None] + self.off  # (bq, 1)
        j = torch.arange(ks, ke, device=self.device)[None, :]  # (1, bk)
        keep = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=self.device)[None]
        if self.is_causal:
            keep = keep & (j <= i)
        if self.window is not None:
            keep = keep & ((i - j).abs() <= self.window)
        if self.lens is not None:
            lens = self.lens[:, None, None] if self.lens.dim() == 1 else self.lens[:, qs:qe, None]
            keep = keep & (j < lens)  # (N, 1|bq, bk)
        return keep


# ---------------------------------------------------------------------------------------------
# Forward and backward, on flattened tensors (N, Q, d)
# ---------------------------------------------------------------------------------------------

def _forward(q: Tensor, k: Tensor, v: Tensor, c: float, tiling: _Tiling) -> Tuple[Tensor, Tensor]:
    """Output ``(N, Q, v)`` and base-2 log-sum-exp ``(N, Q, 1)`` (+inf for a query with no key).

    Each block of ``q`` is multiplied by ``c = scale * log2(e)``, so the scores are in base-2
    units and ``exp2`` replaces ``exp``: the same softmax, and on the CPU ``exp2`` stays fast
    where a score is ``-inf`` (masked) or far below the maximum, where ``exp`` is ten times
    slower.
    """
    N, Q, _ = q.shape
    bs = tiling.bs
    out = q.new_empty(N, Q, v.shape[-1])
    lse = q.new_full((N, Q, 1), math.inf)
    kt = k.transpose(-2, -1)  # (N, d, K)
    for qs in range(0, Q, bs):
        qe = min(qs + bs, Q)
        q_blk = q[:, qs:qe] * c  # (N, bq, d), scaled one block at a time
        m = q.new_full((N, qe - qs, 1), -math.inf)  # running maximum
        l = q.new_zeros(N, qe - qs, 1)  # running sum of exp(score - m)
        acc = q.new_zeros(N, qe - qs, v.shape[-1])  # (N, bq, v) running numerator
        for ks, ke, needs_mask in tiling.blocks(qs, qe):
            s = torch.bmm(q_blk, kt[:, :, ks:ke])  # (N, bq, bk) scores of one tile
            if needs_mask:
                s.add_(tiling.bias(qs, qe, ks, ke, s.dtype))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (N, bq, 1)
            m_safe = m_new.masked_fill(m_new == -math.inf, 0.0) if needs_mask else m_new
            alpha = torch.exp2(m - m_safe)  # rescales what was summed under the old maximum
            p = s.sub_(m_safe).exp2_()  # (N, bq, bk), 2^(s - m), in place of the scores
            l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
            acc.mul_(alpha).baddbmm_(p, v[:, ks:ke])  # acc = alpha * acc + p @ v
            m = m_new
        has_key = l > 0  # (N, bq, 1); False for a query that saw no key
        out[:, qs:qe] = acc.div_(torch.where(has_key, l, torch.ones_like(l)))  # 0 if no key
        lse[:, qs:qe] = torch.where(has_key, m + torch.log2(l), lse[:, qs:qe])
    return out, lse


def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, d_out: Tensor,
              c: float, tiling: _Tiling) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients with respect to the queries, keys and values, tile by tile (FlashAttention-2).

    ``q``, ``c`` and ``lse`` as in :func:`_forward`. With ``P = softmax(S)``, ``dV = P^T dO``,
    ``dP = dO V^T``, ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)``, and ``S = scale Q K^T``
    gives ``dQ = scale dS K`` and ``dK = scale dS^T Q``; the caller applies the ``scale``.
    """
    N, Q, _ = q.shape
    bs = tiling.bs
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (d_out * out).sum(dim=-1, keepdim=True)  # (N, Q, 1), D_i = dO_i . O_i
    for qs in range(0, Q, bs):
        qe = min(qs + bs, Q)
        q_blk, do_blk = q[:, qs:qe] * c, d_out[:, qs:qe]  # (N, bq, d), (N, bq, v)
        for ks, ke, needs_mask in tiling.blocks(qs, qe):
            s = torch.bmm(q_blk, k[:, ks:ke].transpose(-2, -1))  # (N, bq, bk), recomputed
            if needs_mask:
                s.add_(tiling.bias(qs, qe, ks, ke, s.dtype))
            p = s.sub_(lse[:, qs:qe]).exp2_()  # softmax weights of the tile; 0 where masked
            dv[:, ks:ke].baddbmm_(p.transpose(-2, -1), do_blk)  # dV += P^T dO
            dp = torch.bmm(do_blk, v[:, ks:ke].transpose(-2, -1))  # (N, bq, bk), dO V^T
            ds = dp.sub_(delta[:, qs:qe]).mul_(p)  # dS = P * (dP - D)
            dq[:, qs:qe].baddbmm_(ds, k[:, ks:ke])  # dQ += dS K
            dk[:, ks:ke].baddbmm_(ds.transpose(-2, -1), q_blk)  # dK += dS^T Q
    return dq, dk, dv


class _FlashAttentionFn(torch.autograd.Function):
    """Autograd wrapper: saves the inputs, the output and the log-sum-exp, nothing ``Q x K``."""

    @staticmethod
    def forward(ctx, q, k, v, scale, tiling):  # q, k, v: (N, Q|K, d|v)
        out, lse = _forward(q, k, v, scale * _LOG2_E, tiling)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.tiling = scale, tiling
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        scale = ctx.scale
        dq, dk, dv = _backward(q, k, v, out, lse, d_out.contiguous(), scale * _LOG2_E,
                               ctx.tiling)
        return dq.mul_(scale), dk.mul_(1.0 / _LOG2_E), dv, None, None


def flash_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    valid_lens: Optional[ValidLens] = None,
    is_causal: bool = False,
    window: Optional[int] = None,
    scale: Optional[float] = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Tensor:
    r"""Exact scaled dot-product attention, computed tile by tile with the online softmax.

    .. math:: \mathrm{softmax}\!\left(s\, Q K^\top + M\right) V, \qquad s = 1/\sqrt d,
              \quad M_{ij} \in \{0, -\infty\}

    Queries and keys are cut into blocks of ``block_size``; each query block keeps a running
    maximum, a running sum and a running output, rescaled as each key block arrives, so no more
    than one ``(B*..., block_size, block_size)`` tile of scores exists at a time (extra memory
    ``O(block_size**2 + Q*d)`` per head, never ``O(Q*K)``). Tiles that the mask hides entirely
    (causal, window, ``valid_lens``) are skipped. The backward pass (FlashAttention-2) keeps only
    the output and the log-sum-exp of each query's scores and recomputes the tiles.

    Args:
        queries: ``(B, ..., Q, d)`` float.
        keys: ``(B, ..., K, d)`` float, the same leading axes and dtype as ``queries``.
        values: ``(B, ..., K, v)`` float, the rows of ``keys``, the same dtype.
        valid_lens: keyword-only; ``None``, ``(B,)`` or ``(B, Q)`` integers in ``[0, K]``: each
            query sees only the first ``valid_lens`` keys (middle axes broadcast).
        is_causal: keyword-only; query ``i`` sees key ``j`` only if ``j <= i + (K - Q)``
            (lower-right aligned, as ``torch.nn.attention.bias.causal_lower_right``).
        window: keyword-only; ``None`` or an integer ``w >= 0``: query ``i`` sees key ``j``
            only if ``|j - (i + K - Q)| <= w`` (sliding-window attention, see
            :func:`local_attention`).
        scale: keyword-only factor of the scores; ``None`` means ``1 / sqrt(d)``.
        block_size: keyword-only tile size (queries and keys), a positive integer.

    Returns:
        ``(B, ..., Q, v)``, equal (up to rounding) to
        ``F.scaled_dot_product_attention`` with the same mask, and zero for a query that may
        see no key. Differentiable with respect to ``queries``, ``keys`` and ``values``
        (not twice). The inputs are never modified.

    Raises:
        ValueError: on non-float or mismatched inputs (shapes, dtypes, devices), bad
            ``valid_lens``, a negative or non-integer ``window``, a non-positive ``scale`` or
            ``block_size``.

    Example:
        >>> q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 3)
        >>> out = flash_attention(q, k, v, is_causal=True, block_size=2)
        >>> out.shape
        torch.Size([2, 4, 5, 3])
        >>> mask = torch.ones(5, 7, dtype=torch.bool).tril(diagonal=2)  # lower right
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        >>> torch.allclose(out, ref, atol=1e-6)
        True

    Source: Milakov and Gimelshein (2018) (online softmax); Dao et al. (2022), algorithm 1, and
    Dao (2023), algorithms 1 and 2 (FlashAttention, FlashAttention-2); book chapter 9.
    """
    check_qkv(queries, keys, values, same_size=True)
    if not queries.dtype == keys.dtype == values.dtype:
        raise ValueError(f"queries, keys and values must have the same dtype, got "
                         f"{queries.dtype}, {keys.dtype} and {values.dtype}")
    if not queries.device == keys.device == values.device:
        raise ValueError("queries, keys and values must be on the same device")
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool, got {is_causal!r}")
    _check_options(window, scale, block_size)
    *lead, Q, d = queries.shape
    K = keys.shape[-2]
    B, heads = lead[0], math.prod(lead[1:])  # heads: the product of the middle axes
    lens = None
    if valid_lens is not None:
        lens = _check_lens(valid_lens, B, Q, K).to(queries.device)
        lens = lens.repeat_interleave(heads, dim=0)  # (B*heads,) or (B*heads, Q)
    # 1. flatten the leading axes: (B, ..., n, size) -> (N, n, size)
    q = queries.reshape(-1, Q, d)  # (N, Q, d)
    k = keys.reshape(-1, K, d)  # (N, K, d)
    v = values.reshape(-1, K, values.shape[-1])  # (N, K, v)
    tiling = _Tiling(q.shape[0], Q, K, lens, is_causal, window, block_size, queries.device)
    # 2. attend, block by block (forward here, backward in _FlashAttentionFn)
    out = _FlashAttentionFn.apply(q, k, v, 1.0 / math.sqrt(d) if scale is None else scale, tiling)
    return out.reshape(*lead, Q, values.shape[-1])  # (B, ..., Q, v)


def local_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    window: int,
    *,
    valid_lens: Optional[ValidLens] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Tensor:
    r"""Sliding-window (local) attention: each query sees the keys within ``window`` positions.

    .. math:: \mathrm{softmax}_j\big(s\, \mathbf q_i^\top \mathbf k_j\big) \text{ over }
              |j - (i + K - Q)| \le w \quad (\text{and } j \le i + K - Q \text{ if causal})

    Equal to :func:`flash_attention` with ``window=window``: a query sees at most ``2w + 1``
    keys (``w + 1`` if causal), and key blocks outside every window of a query block are never
    computed, so time and memory grow linearly with the sequence length instead of
    quadratically. This is the study notes' *local attention* with the window centred on the
    query's own position.

    Args:
        queries: ``(B, ..., Q, d)`` float.
        keys: ``(B, ..., K, d)`` float.
        values: ``(B, ..., K, v)`` float.
        window: ``w``, a non-negative integer (0 = each query sees only its own position).
        valid_lens, is_causal, scale, block_size: as in :func:`flash_attention`.

    Returns:
        ``(B, ..., Q, v)``.

    Raises:
        ValueError: as :func:`flash_attention`.

    Example:
        >>> x = torch.randn(1, 6, 4)
        >>> out = local_attention(x, x, x, window=1, block_size=2)
        >>> mask = sliding_window_mask(6, 6, window=1)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)
        >>> out.shape, torch.allclose(out, ref, atol=1e-6)
        (torch.Size([1, 6, 4]), True)

    Source: Beltagy, Peters and Cohan (2020), "Longformer", section 3.1 (sliding window);
    Luong, Pham and Manning (2015), section 3.2 (local attention); book chapter 9.
    """
    if window is None:
        raise ValueError("window must be a non-negative integer, got None")
    return flash_attention(queries, keys, values, valid_lens=valid_lens, is_causal=is_causal,
                           window=window, scale=scale, block_size=block_size)


def sliding_window_mask(num_queries: int, num_keys: int, window: Optional[int] = None, *,
                        is_causal: bool = False) -> Tensor:
    """The boolean mask of :func:`flash_attention`'s ``window`` and ``is_causal`` options.

    Args:
        num_queries: Q, a positive integer.
        num_keys: K, a positive integer.
        window: ``None`` (no window) or ``w >= 0``: query ``i`` may see key ``j`` only if
            ``|j - (i + K - Q)| <= w``.
        is_causal: keyword-only; also require ``j <= i + K - Q`` (lower-right aligned).

    Returns:
        bool ``(Q, K)``, True = may attend (``F.scaled_dot_product_attention``'s convention).

    Raises:
        ValueError: if a size is not a positive integer or ``window`` is negative.

    Example:
        >>> sliding_window_mask(3, 5, window=1, is_causal=True).int()
        tensor([[0, 1, 1, 0, 0],
                [0, 0, 1, 1, 0],
                [0, 0, 0, 1, 1]], dtype=torch.int32)

    Source: Beltagy, Peters and Cohan (2020), "Longformer", figure 2(b); book chapter 9.
    """
    check_positive_ints(num_queries=num_queries, num_keys=num_keys)
    _check_options(window, None, 1)
    tiling = _Tiling(1, num_queries, num_keys, None, is_causal, window, 1, torch.device("cpu"))
    return tiling.mask(0, num_queries, 0, num_keys)[0]  # (Q, K)


def tile_schedule(num_queries: int, num_keys: int, *, block_size: int = DEFAULT_BLOCK_SIZE,
                  is_causal: bool = False, window: Optional[int] = None) -> Tensor:
    """Which tiles :func:`flash_attention` computes for a mask, one entry per tile.

    Args:
        num_queries: Q, a positive integer.
        num_keys: K, a positive integer.
        block_size: keyword-only; the tile side ``b`` (queries and keys), a positive integer.
        is_causal: keyword-only; lower-right aligned causal mask, as in :func:`flash_attention`.
        window: keyword-only; ``None`` or ``w >= 0``, the sliding window of :func:`flash_attention`.

    Returns:
        int64 ``(ceil(Q / b), ceil(K / b))``: 0 = skipped (every entry masked), 1 = computed with
        a mask, 2 = computed in full (no entry masked).

    Raises:
        ValueError: if a size is not a positive integer or ``window`` is negative.

    Example:
        >>> tile_schedule(4, 4, block_size=2, is_causal=True)
        tensor([[1, 0],
                [2, 1]])

    Source: Dao (2023), FlashAttention-2, section 3.1 (skipping masked blocks); book chapter 9.
    """
    check_positive_ints(num_queries=num_queries, num_keys=num_keys)
    _check_options(window, None, block_size)
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool, got {is_causal!r}")
    tiling = _Tiling(1, num_queries, num_keys, None, is_causal, window, block_size,
                     torch.device("cpu"))
    grid = torch.zeros(-(-num_queries // block_size), -(-num_keys // block_size), dtype=torch.long)
    for qi, qs in enumerate(range(0, num_queries, block_size)):
        for ks, _, needs_mask in tiling.blocks(qs, min(qs + block_size, num_queries)):
            grid[qi, ks // block_size] = 1 if needs_mask else 2
    return grid


class GroupedQueryAttention(nn.Module):
    r"""Multi-head attention whose ``num_heads`` query heads share ``num_kv_heads`` key/value heads.

    .. math:: \mathrm{head}_i = \mathrm{softmax}\!\Big(\frac{Q W_{q,i}^\top
              (K W_{k,g(i)}^\top)^\top}{\sqrt{d_h}}\Big) V W_{v,g(i)}^\top, \qquad
              g(i) = \lfloor i / r \rfloor,\ r = \texttt{num\_heads} / \texttt{num\_kv\_heads}

    Query heads ``i*r ... (i+1)*r - 1`` use key/value head ``i`` (the grouping of
    ``F.scaled_dot_product_attention(..., enable_gqa=True)``). ``num_kv_heads == num_heads`` is
    ordinary multi-head attention (:class:`~d2lattn.MultiHeadAttention` with the same weights
    gives the same output); ``num_kv_heads == 1`` is multi-query attention. The keys and values a
    decoder caches shrink by the factor ``r``: see :meth:`kv_cache_bytes`. The attention itself
    is :func:`flash_attention` (no dropout, no stored weights).

    Args:
        num_hiddens: total size of the query heads, ``num_heads * d_h``.
        num_heads: h, the number of query heads; must divide ``num_hiddens``.
        num_kv_heads: g, the number of key/value heads; must divide ``num_heads``.
        bias: whether the four projections have a bias.
        query_size, key_size, value_size: keyword-only input sizes (default ``num_hiddens``).
        block_size: keyword-only tile size passed to :func:`flash_attention`.

    Parameters:
        W_q: ``nn.Linear(query_size, num_hiddens)``; W_k, W_v: ``nn.Linear(key_size|value_size,
        num_kv_heads * d_h)``; W_o: ``nn.Linear(num_hiddens, num_hiddens)``.

    Shapes (``forward``):
        queries ``(B, Q, query_size)``, keys ``(B, K, key_size)``, values ``(B, K, value_size)``;
        ``valid_lens`` ``None``, ``(B,)`` or ``(B, Q)``; keyword-only ``is_causal``.
        Returns ``(B, Q, num_hiddens)``.

    Raises:
        ValueError: at construction if a size is not a positive integer or does not divide as
            required; in ``forward`` on mismatched shapes or bad ``valid_lens``.

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
    ) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, num_heads=num_heads,
                            num_kv_heads=num_kv_heads, block_size=block_size)
        if num_hiddens % num_heads != 0:
            raise ValueError(f"num_hiddens ({num_hiddens}) must be divisible by num_heads "
                             f"({num_heads})")
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads "
                             f"({num_kv_heads})")
        sizes = {"query_size": query_size, "key_size": key_size, "value_size": value_size}
        check_positive_ints(**{name: size for name, size in sizes.items() if size is not None})
        self.num_hiddens, self.num_heads, self.num_kv_heads = num_hiddens, num_heads, num_kv_heads
        self.head_size = num_hiddens // num_heads
        self.block_size = block_size
        kv_hiddens = num_kv_heads * self.head_size
        self.W_q = nn.Linear(query_size or num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size or num_hiddens, kv_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size or num_hiddens, kv_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def kv_cache_bytes(self, batch_size: int, seq_len: int,
                       dtype: torch.dtype = torch.float32) -> int:
        """Bytes of the keys and values a decoder caches for ``seq_len`` tokens (one layer).

        ``2 * batch_size * seq_len * num_kv_heads * d_h * itemsize``: ``num_heads /
        num_kv_heads`` times less than multi-head attention's cache.
        """
        check_positive_ints(batch_size=batch_size, seq_len=seq_len)
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * batch_size * seq_len * self.num_kv_heads * self.head_size * itemsize

    def _split(self, X: Tensor, heads: int) -> Tensor:
        B, T, _ = X.shape
        return X.view(B, T, heads, self.head_size).transpose(1, 2)  # (B, heads, T, d_h)

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Optional[ValidLens] = None,
        *,
        is_causal: bool = False,
    ) -> Tensor:
        check_qkv(queries, keys, values, same_size=False, query_size=self.W_q.in_features,
                  key_size=self.W_k.in_features, value_size=self.W_v.in_features)
        if queries.dim() != 3:
            raise ValueError(f"queries must have shape (B, Q, query_size), "
                             f"got {tuple(queries.shape)}")
        r = self.num_heads // self.num_kv_heads
        # 1. project: h query heads, g key/value heads
        q = self._split(self.W_q(queries), self.num_heads)  # (B, h, Q, d_h)
        k = self._split(self.W_k(keys), self.num_kv_heads)  # (B, g, K, d_h)
        v = self._split(self.W_v(values), self.num_kv_heads)  # (B, g, K, d_h)
        # 2. every group of r query heads reads the same key/value head
        k = k.repeat_interleave(r, dim=1)  # (B, h, K, d_h)
        v = v.repeat_interleave(r, dim=1)  # (B, h, K, d_h)
        heads = flash_attention(q, k, v, valid_lens=valid_lens, is_causal=is_causal,
                                block_size=self.block_size)  # (B, h, Q, d_h)
        # 3. concatenate the heads and mix them
        B, _, Q, _ = heads.shape
        return self.W_o(heads.transpose(1, 2).reshape(B, Q, self.num_hiddens))  # (B, Q, h*d_h)
