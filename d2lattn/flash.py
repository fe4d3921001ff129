"""Attention that fits in memory: online softmax, block-wise attention, local and grouped heads.

:class:`~d2lattn.DotProductAttention` materialises the ``(B, ..., Q, K)`` weights. The functions
here compute the same result block by block and never hold more than one tile of scores
(``(B*..., block_size, block_size)`` numbers) at a time:

- :func:`online_softmax_stats`: the running maximum and running sum of one pass over a row,
  the trick that makes the blocks possible (Milakov and Gimelshein, 2018);
- :func:`flash_attention`: exact scaled dot-product attention, forward and backward, in the
  style of FlashAttention-2 (Dao, 2023): the backward pass stores only the output and one
  log-sum-exp per query, and recomputes the tiles. It takes the arguments of
  ``F.scaled_dot_product_attention`` (``attn_mask``, bool or float; ``dropout_p``, drawn as
  SDPA's math backend draws it; ``scale``; ``enable_gqa``) and d2lattn's own (``valid_lens``,
  a lower-right ``is_causal``, a ``window``);
- :func:`local_attention` and :func:`sliding_window_mask`: each query sees only the keys within
  a window around its own position (Beltagy et al., 2020); blocks outside the window are skipped,
  so the cost grows linearly with the length;
- ``enable_gqa``: query heads that share key/value heads (grouped-query attention, Ainslie et
  al., 2023) read them without a copy; :class:`d2lattn.multihead.GroupedQueryAttention` is the
  layer built on it.

Masking follows the rest of d2lattn: True = may attend; causal masks are lower-right aligned
(query ``i`` sees key ``j`` iff ``j <= i + (K - Q)``); a query with no visible key gets the zero
vector, never NaN.
"""

from __future__ import annotations

import bisect
import math
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

from ._checks import (
    ValidLens,
    Window,
    check_bool,
    check_broadcast,
    check_dropout,
    check_positive_ints,
    check_scale,
    check_sdpa_inputs,
    check_valid_lens,
    check_window,
    split_attn_mask,
)

__all__ = [
    "online_softmax_stats",
    "flash_attention",
    "local_attention",
    "sliding_window_mask",
    "tile_schedule",
]

#: Default tile size: a 256 x 256 float32 tile is 256 KiB per head (2 MiB for 8 heads), small
#: enough for a CPU's L2 or L3 cache; it was the fastest block size of the sweep in
#: ``benchmarks/bench_flash.py --sweep`` on the machines measured (chapter 9 shows the sweep).
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
# The dtype of the tiles
# ---------------------------------------------------------------------------------------------

def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the tiles are computed in: float32 for 16-bit inputs, as fused kernels do."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ---------------------------------------------------------------------------------------------
# Which tiles to compute, and the mask of a tile
# ---------------------------------------------------------------------------------------------

class _Tiling:
    """Tile bookkeeping for ``N`` rows of ``r`` query heads of ``Q`` queries against ``K`` keys.

    Query ``i`` may see key ``j`` iff ``j < valid_len`` (if given), ``j <= i + off + right`` and
    ``j >= i + off - left`` (a window; causal is ``right = 0``), with ``off = K - Q``
    (lower-right alignment), and where the optional ``attn`` mask (bool or additive) and
    dropout ``keep`` mask allow it. Rows sorted by decreasing valid length let a tile be
    computed for the leading ``n`` rows only: the rows whose keys all lie before the tile skip it.
    """

    def __init__(self, N: int, Q: int, K: int, lens: Optional[Tensor], is_causal: bool,
                 window: Optional[Window], block_size: int,
                 device: torch.device, *, r: int = 1, kv_lead: Tuple[int, ...] = (),
                 attn: Optional[Tensor] = None, keep: Optional[Tensor] = None,
                 dropout_p: float = 0.0) -> None:
        self.N, self.r, self.Q, self.K, self.off, self.bs = N, r, Q, K, K - Q, block_size
        self.left, self.right = check_window(window) or (None, None)
        if is_causal:  # causal = no key to the right of the (aligned) diagonal
            self.right = 0 if self.right is None else min(self.right, 0)
        self.lens = lens  # None, (N,) or (N, Q) int64
        self.kv_lead = kv_lead or (N,)  # the leading axes of the keys, product N
        self.attn, self.keep, self.dropout_p = attn, keep, dropout_p
        self.attn_overflows = False  # a finite float mask entry that log2(e) sends to -inf
        if attn is not None and attn.is_floating_point():
            low = torch.finfo(torch.float32).min / _LOG2_E  # float64 tiles: a superset
            self.attn_overflows = bool(((attn < low) & attn.isfinite()).any())
        self.device = device
        self._cache: dict = {}  # tile masks that do not depend on valid_lens
        self.row_hi: list = []  # per row: keys [0, row_hi) may be seen (valid_lens)
        self._neg_hi: list = []
        self.prefix = False  # rows sorted by decreasing row_hi: tiles for the first n rows
        if lens is not None:
            if lens.dim() == 1:
                self.row_hi = lens.tolist()
            else:
                self.row_hi = lens.amax(dim=1).tolist() if Q > 0 else [0] * N
            self.prefix = (attn is None and keep is None
                           and all(a >= b for a, b in zip(self.row_hi, self.row_hi[1:])))
            self._neg_hi = [-h for h in self.row_hi]  # ascending when prefix

    def key_range(self, qs: int, qe: int) -> Tuple[int, int, int, int]:
        """Keys ``[lo, hi)`` some query in ``[qs, qe)`` sees; ``[full_lo, full_hi)``: all see."""
        lo, hi = 0, self.K
        full_lo, full_hi = 0, self.K
        if self.right is not None:
            hi = min(hi, qe - 1 + self.off + self.right + 1)
            full_hi = min(full_hi, qs + self.off + self.right + 1)
        if self.left is not None:
            lo = max(lo, qs + self.off - self.left)
            full_lo = max(full_lo, qe - 1 + self.off - self.left)
        if self.lens is not None:
            if self.lens.dim() == 1:
                hi = min(hi, max(self.row_hi, default=0))
                if not self.prefix:
                    full_hi = min(full_hi, min(self.row_hi, default=0))
            else:
                rows = self.lens[:, qs:qe]
                hi = min(hi, int(rows.max()) if rows.numel() else 0)
                full_hi = min(full_hi, int(rows.min()) if rows.numel() else 0)
        return max(lo, 0), max(hi, 0), full_lo, full_hi

    def rows(self, ks: int) -> int:
        """How many leading rows need the key block starting at ``ks``."""
        if not self.prefix:
            return self.N
        return bisect.bisect_left(self._neg_hi, -ks)  # rows with row_hi > ks

    def blocks(self, qs: int, qe: int) -> Iterator[Tuple[int, int, bool, int]]:
        """Yield ``(ks, ke, needs_mask, n)`` for the key blocks that query rows ``[qs, qe)``
        need; only the first ``n`` of the ``N`` rows need that block."""
        lo, hi, full_lo, full_hi = self.key_range(qs, qe)
        if lo >= hi:
            return
        for ks in range((lo // self.bs) * self.bs, hi, self.bs):
            ke = min(ks + self.bs, self.K)
            n = self.rows(ks)
            if n == 0:
                return  # the rows are sorted: no row sees a later key either
            full = full_lo <= ks and ke <= full_hi and self.attn is None
            if full and self.prefix and self.lens is not None and self.lens.dim() == 1:
                full = ke <= self.row_hi[n - 1]  # the shortest of the n rows covers the tile
            yield ks, ke, not full, n

    def add_mask(self, s: Tensor, qs: int, qe: int, ks: int, ke: int, n: int) -> None:
        """Add the tile's mask to the base-2 scores ``s`` of shape ``(n, r * bq, bk)``.

        The rule-based part (causal, window, ``valid_lens``) is 0 or ``-inf``; adding it is
        cheaper than ``masked_fill``. Without ``valid_lens`` it depends only on
        ``qs + off - ks`` and the tile's size, so it is built once and reused (every diagonal
        tile of a causal mask is the same). A user's ``attn_mask`` is added as it is (times
        ``log2 e``: the scores are in base-2 units).
        """
        bq, bk = qe - qs, ke - ks
        s4 = s.view(n, self.r, bq, bk)  # the r heads that share keys, side by side
        if self.right is not None or self.left is not None or self.lens is not None:
            s4.add_(self.bias(qs, qe, ks, ke, s.dtype, n)[:, None])  # (1|n, 1, bq, bk)
        if self.attn is not None:
            tile = self._tile(self.attn, qs, qe, ks, ke)
            if tile.dtype == torch.bool:
                tile = torch.zeros((), dtype=s.dtype, device=s.device).masked_fill(~tile,
                                                                                   -math.inf)
                s.view(*self.kv_lead, self.r, bq, bk).add_(tile)
            else:
                s.view(*self.kv_lead, self.r, bq, bk).add_(self._base2(tile, s.dtype))

    def _base2(self, bias: Tensor, dtype: torch.dtype) -> Tensor:
        """A float mask tile in the scores' base-2 units (times ``log2 e``), finite where it was.

        A bias below ``finfo.min / log2(e)`` (Hugging Face pads with ``finfo(dtype).min``)
        would overflow to ``-inf`` and turn SDPA's uniform weights over such keys into the
        zero row of a fully masked query; it is clamped to ``finfo.min`` instead, so only a
        true ``-inf`` forbids a key.
        """
        scaled = bias.to(dtype) * _LOG2_E
        if self.attn_overflows:
            scaled.clamp_(min=torch.finfo(dtype).min).masked_fill_(bias.isneginf(), -math.inf)
        return scaled

    def drop(self, p: Tensor, qs: int, qe: int, ks: int, ke: int) -> Tensor:
        """Dropout of a tile ``(N, r * bq, bk)``: the kept entries divided by ``1 - p``."""
        bq, bk = qe - qs, ke - ks
        tile = self._tile(self.keep, qs, qe, ks, ke)  # (*kv_lead, r, bq, bk) bool
        kept = p.view(*self.kv_lead, self.r, bq, bk) * tile
        return kept.mul_(1.0 / (1.0 - self.dropout_p)).view(p.shape)

    @staticmethod
    def _tile(mask: Tensor, qs: int, qe: int, ks: int, ke: int) -> Tensor:
        """``mask[..., qs:qe, ks:ke]``, where an axis of size 1 (broadcast) stays whole."""
        rows = slice(qs, qe) if mask.shape[-2] > 1 else slice(None)
        cols = slice(ks, ke) if mask.shape[-1] > 1 else slice(None)
        return mask[..., rows, cols]

    def bias(self, qs: int, qe: int, ks: int, ke: int, dtype: torch.dtype,
             n: Optional[int] = None) -> Tensor:
        """Additive tile mask: 0 where a query may attend, ``-inf`` elsewhere; ``(1|n, bq, bk)``."""
        key = (qs + self.off - ks, qe - qs, ke - ks, dtype)
        if self.lens is None and key in self._cache:
            return self._cache[key]
        keep = self.mask(qs, qe, ks, ke, n)
        bias = torch.zeros(keep.shape, dtype=dtype, device=self.device).masked_fill_(~keep,
                                                                                      -math.inf)
        if self.lens is None:
            self._cache[key] = bias
        return bias

    def mask(self, qs: int, qe: int, ks: int, ke: int, n: Optional[int] = None) -> Tensor:
        """Boolean tile mask, True = may attend, shape ``(1 or n, qe - qs, ke - ks)``
        (causal, window and ``valid_lens``; not the user's ``attn_mask``)."""
        i = torch.arange(qs, qe, device=self.device)[:, None] + self.off  # (bq, 1)
        j = torch.arange(ks, ke, device=self.device)[None, :]  # (1, bk)
        keep = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=self.device)[None]
        if self.right is not None:
            keep = keep & (j <= i + self.right)
        if self.left is not None:
            keep = keep & (j >= i - self.left)
        if self.lens is not None:
            lens = self.lens[:n]
            lens = lens[:, None, None] if lens.dim() == 1 else lens[:, qs:qe, None]
            keep = keep & (j < lens)  # (n, 1|bq, bk)
        return keep


# ---------------------------------------------------------------------------------------------
# Forward and backward, on flattened tensors: q (N, r, Q, d), k (N, K, d), v (N, K, v)
# ---------------------------------------------------------------------------------------------

def _forward(q: Tensor, k: Tensor, v: Tensor, c: float,
             tiling: _Tiling) -> Tuple[Tensor, Tensor, Tensor]:
    """Output ``(N, r, Q, v)``, each query's maximum base-2 score ``m`` and ``1 / l``, where
    ``l = sum_j 2^(s_j - m)`` (each ``(N, r, Q, 1)``; ``m = +inf`` and ``1/l = 0`` for a query
    that saw no key).

    ``m`` and ``1/l`` are kept apart, not folded into one log-sum-exp ``m + log2(l)``: when
    every score of a row is huge and negative (a float mask of ``finfo.min`` on every key)
    ``m + log2(l)`` rounds back to ``m``, and the backward pass would take weights of 1
    instead of ``1/K``.

    The ``r`` query heads that share a key/value head (grouped-query attention; ``r = 1``
    otherwise) are stacked into one block of ``r * bq`` rows, so they read each key tile once
    and no copy of the keys is made. Each block of ``q`` is multiplied by
    ``c = scale * log2(e)``, so the scores are in base-2 units and ``exp2`` replaces ``exp``:
    the same softmax, and on the CPU ``exp2`` stays fast where a score is ``-inf`` (masked) or
    far below the maximum, where ``exp`` is ten times slower. Only the first ``n`` rows of
    ``N`` compute a tile that the shorter rows' ``valid_lens`` hide.
    """
    N, r, Q, d = q.shape
    bs, dv = tiling.bs, v.shape[-1]
    out = q.new_empty(N, r, Q, dv)
    row_max = q.new_full((N, r, Q, 1), math.inf)
    inv_sum = q.new_zeros(N, r, Q, 1)
    kt = k.transpose(-2, -1)  # (N, d, K)
    for qs in range(0, Q, bs):
        qe = min(qs + bs, Q)
        rows = r * (qe - qs)
        q_blk = (q[:, :, qs:qe] * c).reshape(N, rows, d)  # (N, r*bq, d), scaled block by block
        m = q.new_full((N, rows, 1), -math.inf)  # running maximum
        l = q.new_zeros(N, rows, 1)  # running sum of exp(score - m)
        acc = q.new_zeros(N, rows, dv)  # (N, r*bq, v) running numerator
        for ks, ke, needs_mask, n in tiling.blocks(qs, qe):
            s = torch.bmm(q_blk[:n], kt[:n, :, ks:ke])  # (n, r*bq, bk) scores of one tile
            if needs_mask:
                tiling.add_mask(s, qs, qe, ks, ke, n)
            m_new = torch.maximum(m[:n], s.amax(dim=-1, keepdim=True))  # (n, r*bq, 1)
            m_safe = m_new.masked_fill(m_new == -math.inf, 0.0) if needs_mask else m_new
            alpha = torch.exp2(m[:n] - m_safe)  # rescales what was summed under the old max
            p = s.sub_(m_safe).exp2_()  # (n, r*bq, bk), 2^(s - m), in place of the scores
            l[:n].mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
            if tiling.keep is not None:  # dropout on the weights, after the softmax's sum
                p = tiling.drop(p, qs, qe, ks, ke)
            acc[:n].mul_(alpha).baddbmm_(p, v[:n, ks:ke])  # acc = alpha * acc + p @ v
            m[:n] = m_new
        has_key = l > 0  # (N, r*bq, 1); False for a query that saw no key
        o = acc.div_(torch.where(has_key, l, torch.ones_like(l)))  # 0 if no key
        out[:, :, qs:qe] = o.view(N, r, qe - qs, dv)
        row_max[:, :, qs:qe] = torch.where(has_key, m, math.inf).view(N, r, qe - qs, 1)
        inv_sum[:, :, qs:qe] = torch.where(has_key, 1.0 / l, 0.0).view(N, r, qe - qs, 1)
    return out, row_max, inv_sum


def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, row_max: Tensor, inv_sum: Tensor,
              d_out: Tensor, c: float, tiling: _Tiling) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients with respect to the queries, keys and values, tile by tile (FlashAttention-2).

    ``q``, ``c``, ``row_max`` and ``inv_sum`` as in :func:`_forward`. With ``P = softmax(S)``,
    ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)``, and
    ``S = scale Q K^T`` gives ``dQ = scale dS K`` and ``dK = scale dS^T Q``; the caller applies
    the ``scale``. A tile recomputes ``E = 2^(S - m)``, so ``P = E / l``; the ``1 / l`` of each
    row is folded into ``dO`` and ``D`` (``dV = E^T (dO / l)``, ``dS = E * (dP / l - D / l)``),
    which costs nothing per tile. With dropout mask ``Z``, ``P`` becomes ``P * Z / (1 - p)`` in
    ``dV`` and ``dP`` is multiplied by ``Z / (1 - p)``. The ``r`` stacked heads add their
    ``dK``, ``dV`` into the shared key/value head.
    """
    N, r, Q, d = q.shape
    bs, d_v = tiling.bs, v.shape[-1]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (d_out * out).sum(dim=-1, keepdim=True)  # (N, r, Q, 1), D_i = dO_i . O_i
    d_out, delta = d_out * inv_sum, delta * inv_sum  # dO / l and D / l (0 if no key)
    for qs in range(0, Q, bs):
        qe = min(qs + bs, Q)
        rows = r * (qe - qs)
        q_blk = (q[:, :, qs:qe] * c).reshape(N, rows, d)  # (N, r*bq, d)
        do_blk = d_out[:, :, qs:qe].reshape(N, rows, d_v)  # (N, r*bq, v)
        max_blk = row_max[:, :, qs:qe].reshape(N, rows, 1)
        delta_blk = delta[:, :, qs:qe].reshape(N, rows, 1)
        dq_blk = torch.zeros_like(q_blk)  # (N, r*bq, d)
        for ks, ke, needs_mask, n in tiling.blocks(qs, qe):
            s = torch.bmm(q_blk[:n], k[:n, ks:ke].transpose(-2, -1))  # (n, r*bq, bk), again
            if needs_mask:
                tiling.add_mask(s, qs, qe, ks, ke, n)
            p = s.sub_(max_blk[:n]).exp2_()  # l times the tile's weights; 0 where masked
            p_drop = p if tiling.keep is None else tiling.drop(p, qs, qe, ks, ke)
            dv[:n, ks:ke].baddbmm_(p_drop.transpose(-2, -1), do_blk[:n])  # dV += P^T dO
            dp = torch.bmm(do_blk[:n], v[:n, ks:ke].transpose(-2, -1))  # (n, r*bq, bk), dO V^T
            if tiling.keep is not None:
                dp = tiling.drop(dp, qs, qe, ks, ke)
            ds = dp.sub_(delta_blk[:n]).mul_(p)  # dS = P * (dP - D), P = p / l
            dq_blk[:n].baddbmm_(ds, k[:n, ks:ke])  # dQ += dS K
            dk[:n, ks:ke].baddbmm_(ds.transpose(-2, -1), q_blk[:n])  # dK += dS^T Q
        dq[:, :, qs:qe] = dq_blk.view(N, r, qe - qs, d)
    return dq, dk, dv


class _FlashAttentionFn(torch.autograd.Function):
    """Autograd wrapper: saves the inputs, the output and two numbers per query (the row's
    maximum score and the inverse of its sum), nothing ``Q x K``.

    16-bit inputs are computed in float32 (the running maximum, sum and output too) and the
    output is rounded once at the end, as fused kernels do.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, tiling):  # q (N, r, Q, d), k, v (N, K, d|v)
        acc = _acc_dtype(q.dtype)
        out, row_max, inv_sum = _forward(q.to(acc), k.to(acc), v.to(acc), scale * _LOG2_E,
                                         tiling)
        ctx.save_for_backward(q, k, v, out, row_max, inv_sum)
        ctx.scale, ctx.tiling = scale, tiling
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, row_max, inv_sum = ctx.saved_tensors
        # a Function of its own, so that differentiating the gradients raises (not silently
        # dropping the second-order term, as a constant gradient would)
        dq, dk, dv = _FlashAttentionBackwardFn.apply(q, k, v, out, row_max, inv_sum, d_out,
                                                     ctx.scale, ctx.tiling)
        return dq, dk, dv, None, None


class _FlashAttentionBackwardFn(torch.autograd.Function):
    """The gradients of :class:`_FlashAttentionFn`; differentiating them again raises."""

    @staticmethod
    def forward(ctx, q, k, v, out, row_max, inv_sum, d_out, scale, tiling):
        acc = _acc_dtype(q.dtype)
        dq, dk, dv = _backward(q.to(acc), k.to(acc), v.to(acc), out, row_max, inv_sum,
                               d_out.to(acc).contiguous(), scale * _LOG2_E, tiling)
        return (dq.mul_(scale).to(q.dtype), dk.mul_(1.0 / _LOG2_E).to(k.dtype),
                dv.to(v.dtype))

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "flash_attention is differentiable once: its gradients have no gradient of their "
            "own (double backward, e.g. a gradient penalty with create_graph=True). Use "
            "DotProductAttention, or F.scaled_dot_product_attention's math backend, there.")


def _shape_mask(mask: Tensor, q_lead: Tuple[int, ...], kv_lead: Tuple[int, ...], r: int,
                enable_gqa: bool, Q: int, K: int, name: str) -> Tensor:
    """A mask broadcastable to ``(*q_lead, Q, K)`` as a view broadcastable to
    ``(*kv_lead, r, Q, K)`` (the query heads split into key/value heads and their ``r``
    query heads), without copying it."""
    full = torch.Size((*q_lead, Q, K))
    check_broadcast(mask, full, name, "(B, ..., Q, K) =")
    mask = mask.view((1,) * (len(full) - mask.dim()) + tuple(mask.shape))
    if not enable_gqa:
        return mask.unsqueeze(-3)  # (*lead, 1, Q|1, K|1)
    heads = mask.shape[-3]
    split = (kv_lead[-1], r) if heads > 1 else (1, 1)
    return mask.view(*mask.shape[:-3], *split, *mask.shape[-2:])  # (*kv_lead, r, Q|1, K|1)


def flash_attention(queries: Tensor, keys: Tensor, values: Tensor,
                    valid_lens: Optional[ValidLens] = None, *,
                    attn_mask: Optional[Tensor] = None, is_causal: bool = False,
                    window: Optional[Window] = None, scale: Optional[float] = None,
                    dropout_p: float = 0.0, enable_gqa: bool = False,
                    block_size: int = DEFAULT_BLOCK_SIZE) -> Tensor:
    r"""Exact scaled dot-product attention, computed tile by tile with the online softmax.

    .. math:: \mathrm{softmax}\!\left(s\, Q K^\top + M\right) V, \qquad s = 1/\sqrt d,
              \quad M_{ij} \in \{0, -\infty\} \text{ (or a float bias)}

    Queries and keys are cut into blocks of ``block_size``; each query block keeps a running
    maximum, a running sum and a running output, rescaled as each key block arrives, so no more
    than one ``(B*..., block_size, block_size)`` tile of scores exists at a time (extra memory
    ``O(block_size**2 + Q*d)`` per head, never ``O(Q*K)``, except for dropout's mask). Tiles that
    the rule-based masks hide entirely (causal, window) are skipped; with ``valid_lens`` the
    rows are sorted by length (a copy of the inputs, unless they already come longest first)
    and a tile is computed only for the rows whose valid keys reach it, so a short sequence
    batched with a long one skips the long one's tiles (see :func:`tile_schedule`). The backward pass (FlashAttention-2) keeps only the output and
    the log-sum-exp of each query's scores and recomputes the tiles. 16-bit inputs are
    computed in float32 and rounded once, at the end.

    Args:
        queries: ``(B, ..., Q, d)`` float.
        keys: ``(B, ..., K, d)`` float, the same leading axes and dtype as ``queries`` (with
            ``enable_gqa``, ``g`` heads on axis -3 where the queries have ``h``).
        values: ``(B, ..., K, v)`` float, the rows of ``keys``, the same dtype.
        valid_lens: ``None``, ``(B,)`` or ``(B, Q)`` integers in ``[0, K]``: each query sees
            only the first ``valid_lens`` keys (middle axes broadcast). The fourth argument,
            positional or by name, as in every d2lattn attention layer.
        attn_mask: keyword-only; ``None``, a bool mask (True = may attend) or a float mask
            added to the scaled scores (SDPA's ``attn_mask``, e.g. an ALiBi bias), broadcastable
            to ``(B, ..., Q, K)``. Every tile is then computed (no skipping from it); a float
            mask gets no gradient.
        is_causal: keyword-only; query ``i`` sees key ``j`` only if ``j <= i + (K - Q)``
            (lower-right aligned, as ``torch.nn.attention.bias.causal_lower_right``). For SDPA's
            upper-left ``is_causal`` with ``Q != K``, pass
            ``attn_mask=causal_mask(Q, K, alignment="upper_left")`` instead.
        window: keyword-only; ``None``, an integer ``w >= 0`` or a pair ``(left, right)``:
            query ``i`` sees key ``j`` only if ``i' - left <= j <= i' + right`` with
            ``i' = i + K - Q`` (``w`` means ``(w, w)``; ``None`` or ``-1`` for an unbounded
            side, as FlashAttention's ``window_size``). See :func:`local_attention`.
        scale: keyword-only factor of the scores; ``None`` means ``1 / sqrt(d)``.
        dropout_p: keyword-only probability of zeroing a weight (after the softmax), in
            ``[0, 1)``, applied whenever it is positive (as SDPA). The keep mask is drawn as
            SDPA's math backend draws it, one Bernoulli per ``(B, ..., Q, K)`` entry from the
            default generator, so the same seed gives the same result; it is stored, one byte
            per entry, until the backward pass.
        enable_gqa: keyword-only; grouped-query attention as in SDPA: ``h`` query heads
            (axis -3) share ``g`` key/value heads, ``h`` a multiple of ``g``; query head ``i``
            reads key/value head ``i // (h / g)``. No copy of the keys or values is made.
        block_size: keyword-only tile size (queries and keys), a positive integer.

    Returns:
        ``(B, ..., Q, v)``, equal (up to rounding) to ``F.scaled_dot_product_attention`` with
        the same mask, and zero for a query that may see no key. An empty result for ``Q = 0``
        and zeros for ``K = 0``, as SDPA. Differentiable with respect to ``queries``,
        ``keys`` and ``values`` once: differentiating the gradients again raises a
        ``RuntimeError``. The inputs are never modified.

    Raises:
        ValueError: on non-float or mismatched inputs (shapes, dtypes, devices), bad
            ``valid_lens``, an ``attn_mask`` that is neither bool nor float or does not
            broadcast, a bad ``window``, a non-positive ``scale`` or ``block_size``, a
            ``dropout_p`` outside ``[0, 1)``, or head counts that do not divide.

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
    r = check_sdpa_inputs(queries, keys, values, enable_gqa=enable_gqa)
    check_bool(is_causal=is_causal)
    window = check_window(window)
    check_scale(scale)
    check_positive_ints(block_size=block_size)
    check_dropout(dropout_p, "dropout_p")
    *q_lead, Q, d = queries.shape
    *kv_lead, K, _ = keys.shape
    dv = values.shape[-1]
    B, N = q_lead[0], math.prod(kv_lead)
    bool_mask, float_mask = split_attn_mask(attn_mask, Q, K)
    attn = bool_mask if bool_mask is not None else float_mask
    if attn is not None:
        if attn.requires_grad:
            raise ValueError("flash_attention gives no gradient to attn_mask; use "
                             "DotProductAttention for a learned bias")
        attn = _shape_mask(attn.to(queries.device), tuple(q_lead), tuple(kv_lead), r,
                           enable_gqa, Q, K, "attn_mask")
    keep = None
    if dropout_p > 0:  # SDPA's math backend: one Bernoulli draw over the (..., Q, K) weights
        keep = torch.empty((*q_lead, Q, K), dtype=torch.bool, device=queries.device)
        keep = keep.bernoulli_(1.0 - dropout_p).view(*kv_lead, r, Q, K)
    # 1. flatten the leading axes: (B, ..., n, size) -> (N, [r,] n, size)
    q = queries.reshape(N, r, Q, d)  # (N, r, Q, d): the r query heads of each key/value head
    k = keys.reshape(N, K, d)  # (N, K, d)
    v = values.reshape(N, K, dv)  # (N, K, v)
    lens, order = None, None
    if valid_lens is not None:
        lens = check_valid_lens(valid_lens, B, Q, K).to(queries.device)
        lens = lens.repeat_interleave(N // B if B else 0, dim=0)  # (N,) or (N, Q)
        if attn is None and keep is None:  # sort the rows by length: tiles for the long ones
            row_hi = lens if lens.dim() == 1 else lens.amax(dim=1) if Q else lens.sum(dim=1)
            order = torch.argsort(row_hi, descending=True, stable=True)
            if bool((order == torch.arange(N, device=order.device)).all()):
                order = None  # already sorted: no copy
            else:
                q, k, v, lens = q[order], k[order], v[order], lens[order]
    tiling = _Tiling(N, Q, K, lens, is_causal, window, block_size, queries.device, r=r,
                     kv_lead=tuple(kv_lead), attn=attn, keep=keep, dropout_p=dropout_p)
    # 2. attend, block by block (forward here, backward in _FlashAttentionFn)
    out = _FlashAttentionFn.apply(q, k, v, 1.0 / math.sqrt(d) if scale is None else scale,
                                  tiling)  # (N, r, Q, v)
    if order is not None:
        out = out[torch.argsort(order)]  # back to the callers' row order
    return out.reshape(*q_lead, Q, dv)  # (B, ..., Q, v)


def local_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    window: Window,
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
        window: ``w``, a non-negative integer (0 = each query sees only its own position), or
            ``(left, right)`` for a window that is not centred (see :func:`flash_attention`).
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
        raise ValueError("window must be a non-negative integer or a pair (left, right), "
                         "got None")
    return flash_attention(queries, keys, values, valid_lens=valid_lens, is_causal=is_causal,
                           window=window, scale=scale, block_size=block_size)


def sliding_window_mask(num_queries: int, num_keys: int, window: Optional[Window] = None, *,
                        is_causal: bool = False) -> Tensor:
    """The boolean mask of :func:`flash_attention`'s ``window`` and ``is_causal`` options.

    Args:
        num_queries: Q, a positive integer.
        num_keys: K, a positive integer.
        window: ``None`` (no window), ``w >= 0``: query ``i`` may see key ``j`` only if
            ``|j - (i + K - Q)| <= w``, or ``(left, right)``: only if
            ``-left <= j - (i + K - Q) <= right`` (``None`` or ``-1``: that side unbounded).
        is_causal: keyword-only; also require ``j <= i + K - Q`` (lower-right aligned).

    Returns:
        bool ``(Q, K)``, True = may attend (``F.scaled_dot_product_attention``'s convention).

    Raises:
        ValueError: if a size is not a positive integer or ``window`` is not a window.

    Example:
        >>> sliding_window_mask(3, 5, window=1, is_causal=True).int()
        tensor([[0, 1, 1, 0, 0],
                [0, 0, 1, 1, 0],
                [0, 0, 0, 1, 1]], dtype=torch.int32)
        >>> sliding_window_mask(3, 5, window=(0, 1)).int()  # the diagonal and one key after
        tensor([[0, 0, 1, 1, 0],
                [0, 0, 0, 1, 1],
                [0, 0, 0, 0, 1]], dtype=torch.int32)

    Source: Beltagy, Peters and Cohan (2020), "Longformer", figure 2(b); the ``window_size``
    of Dao's FlashAttention package; book chapter 9.
    """
    check_positive_ints(num_queries=num_queries, num_keys=num_keys)
    check_bool(is_causal=is_causal)
    tiling = _Tiling(1, num_queries, num_keys, None, is_causal, check_window(window), 1,
                     torch.device("cpu"))
    return tiling.mask(0, num_queries, 0, num_keys)[0]  # (Q, K)


def tile_schedule(num_queries: int, num_keys: int, *, block_size: int = DEFAULT_BLOCK_SIZE,
                  is_causal: bool = False, window: Optional[Window] = None,
                  valid_lens: Optional[ValidLens] = None) -> Tensor:
    """Which tiles :func:`flash_attention` computes for a mask, one entry per tile.

    Args:
        num_queries: Q, a positive integer.
        num_keys: K, a positive integer.
        block_size: keyword-only; the tile side ``b`` (queries and keys), a positive integer.
        is_causal: keyword-only; lower-right aligned causal mask, as in :func:`flash_attention`.
        window: keyword-only; ``None``, ``w >= 0`` or ``(left, right)``, the sliding window of
            :func:`flash_attention`.
        valid_lens: keyword-only; ``None``, or ``(B,)`` or ``(B, Q)`` integers in ``[0, K]``:
            then one map per sequence (each sequence skips the tiles beyond its own keys).

    Returns:
        int64 ``(ceil(Q / b), ceil(K / b))``, or ``(B, ceil(Q / b), ceil(K / b))`` with
        ``valid_lens``: 0 = skipped (every entry masked), 1 = computed with a mask,
        2 = computed in full (no entry masked).

    Raises:
        ValueError: if a size is not a positive integer, ``window`` is not a window or
            ``valid_lens`` is bad.

    Example:
        >>> tile_schedule(4, 4, block_size=2, is_causal=True)
        tensor([[1, 0],
                [2, 1]])
        >>> tile_schedule(4, 4, block_size=2, valid_lens=torch.tensor([4, 1]))
        tensor([[[2, 2],
                 [2, 2]],
        <BLANKLINE>
                [[1, 0],
                 [1, 0]]])

    Source: Dao (2023), FlashAttention-2, section 3.1 (skipping masked blocks); book chapter 9.
    """
    check_positive_ints(num_queries=num_queries, num_keys=num_keys, block_size=block_size)
    check_bool(is_causal=is_causal)
    window = check_window(window)
    if valid_lens is None:
        return _tile_grid(num_queries, num_keys, block_size, is_causal, window, None)
    lens = check_valid_lens(valid_lens, None, num_queries, num_keys)
    return torch.stack([_tile_grid(num_queries, num_keys, block_size, is_causal, window,
                                   row[None]) for row in lens])  # (B, nQ, nK)


def _tile_grid(Q: int, K: int, block_size: int, is_causal: bool,
               window: Optional[Tuple[Optional[int], Optional[int]]],
               lens: Optional[Tensor]) -> Tensor:
    """The tile map of one row (``lens`` ``None``, ``(1,)`` or ``(1, Q)``)."""
    tiling = _Tiling(1, Q, K, lens, is_causal, window, block_size, torch.device("cpu"))
    grid = torch.zeros(-(-Q // block_size), -(-K // block_size), dtype=torch.long)
    for qi, qs in enumerate(range(0, Q, block_size)):
        for ks, _, needs_mask, _ in tiling.blocks(qs, min(qs + block_size, Q)):
            grid[qi, ks // block_size] = 1 if needs_mask else 2
    return grid
