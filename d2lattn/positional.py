"""Positional encoding: order information that attention scores cannot see by themselves."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from ._checks import (
    check_bool,
    check_dropout,
    check_even_size,
    check_non_negative_ints,
    check_offset,
    check_positions_input,
    check_positive_ints,
    check_rotary_args,
    check_slopes,
)

__all__ = [
    "sinusoidal_positional_encoding",
    "PositionalEncoding",
    "sinusoidal_shift_matrix",
    "LearnedPositionalEmbedding",
    "rotary_embedding",
    "alibi_bias",
    "alibi_slopes",
]


def sinusoidal_positional_encoding(
    max_len: int, num_hiddens: int, *, dtype: torch.dtype = torch.float32
) -> Tensor:
    r"""The sinusoidal position table of Vaswani et al. (2017).

    .. math::
        P_{\mathrm{pos},\,2i} = \sin\!\Big(\frac{\mathrm{pos}}{10000^{2i/d}}\Big), \qquad
        P_{\mathrm{pos},\,2i+1} = \cos\!\Big(\frac{\mathrm{pos}}{10000^{2i/d}}\Big)

    with positions ``pos = 0 .. max_len-1`` and ``d = num_hiddens``. An odd ``num_hiddens``
    is allowed: its last column is a sine.

    Args:
        max_len: number of positions (rows), a positive integer.
        num_hiddens: d, the encoding size (columns), a positive integer.
        dtype: floating dtype of the result (the angles are computed in float64).

    Returns:
        ``(max_len, num_hiddens)`` tensor of values in ``[-1, 1]``.

    Raises:
        ValueError: if ``max_len`` or ``num_hiddens`` is not a positive integer.

    Example:
        >>> sinusoidal_positional_encoding(3, 4)[1]
        tensor([0.8415, 0.5403, 0.0100, 0.9999])

    Source: Vaswani et al. (2017), section 3.5.
    """
    check_positive_ints(max_len=max_len, num_hiddens=num_hiddens)
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, num_hiddens, 2, dtype=torch.float64)  # (ceil(d/2),)
    angles = pos / torch.pow(10000.0, two_i / num_hiddens)  # (max_len, ceil(d/2))
    P = torch.empty(max_len, num_hiddens, dtype=torch.float64)
    P[:, 0::2] = torch.sin(angles)
    P[:, 1::2] = torch.cos(angles[:, : num_hiddens // 2])
    return P.to(dtype)


class PositionalEncoding(nn.Module):
    """Add the sinusoidal position table to a batch of embeddings, then apply dropout.

    Args:
        num_hiddens: d, the embedding size.
        dropout: dropout probability applied to the sum, in ``[0, 1)``.
        max_len: the longest sequence this module accepts.

    Buffers:
        P: ``(max_len, num_hiddens)`` float32, :func:`sinusoidal_positional_encoding`.
            Registered as a (non-persistent) buffer so that ``.to(device)`` and ``.double()``
            move it with the module; it is not saved in ``state_dict`` because it is a fixed
            function of ``max_len`` and ``num_hiddens``.

    Shapes (``forward``):
        X ``(B, T, num_hiddens)`` float with ``T <= max_len``; returns the same shape.

    Raises:
        ValueError: bad constructor arguments; in ``forward``, a last axis other than
            ``num_hiddens`` or a sequence longer than ``max_len``.

    Example:
        >>> pe = PositionalEncoding(num_hiddens=8, max_len=16)
        >>> pe(torch.zeros(2, 5, 8)).shape
        torch.Size([2, 5, 8])

    Source: Vaswani et al. (2017), section 3.5.
    """

    P: Tensor

    def __init__(self, num_hiddens: int, dropout: float = 0.0, max_len: int = 1000) -> None:
        super().__init__()
        check_dropout(dropout)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("P", sinusoidal_positional_encoding(max_len, num_hiddens),
                             persistent=False)

    @property
    def max_len(self) -> int:
        return self.P.shape[0]

    def forward(self, X: Tensor) -> Tensor:
        """``X`` ``(B, T, d)`` float, ``T <= max_len`` -> ``X + P[:T]`` (then dropout)."""
        check_positions_input(X, self.P.shape[1], self.max_len)
        T = X.shape[-2]
        return self.dropout(X + self.P[:T].to(X.dtype))  # (B, T, d)


def sinusoidal_shift_matrix(
    k: int, num_hiddens: int, *, dtype: torch.dtype = torch.float64
) -> Tensor:
    r"""The fixed linear map that moves a sinusoidal position code ``k`` steps along.

    For every position ``pos``, ``P[pos + k] = M_k @ P[pos]`` where ``P`` is
    :func:`sinusoidal_positional_encoding`. ``M_k`` is block diagonal: frequency
    :math:`\omega_i = 10000^{-2i/d}` owns columns ``(2i, 2i+1)`` and gets the 2x2 rotation

    .. math::
        \begin{pmatrix} \cos k\omega_i & \sin k\omega_i \\
                        -\sin k\omega_i & \cos k\omega_i \end{pmatrix},

    which does not depend on ``pos``. ``M_k`` is orthogonal, ``M_0 = I`` and
    ``M_a M_b = M_{a+b}``; a negative ``k`` moves backwards.

    Args:
        k: the offset, any integer (negative allowed).
        num_hiddens: d, the encoding size, a positive even integer (with an odd d the last
            sine column has no cosine partner, so no such matrix exists).
        dtype: floating dtype of the result (the angles are computed in float64).

    Returns:
        ``(num_hiddens, num_hiddens)`` tensor ``M_k``. For a table ``P`` of shape
        ``(T, num_hiddens)`` whose rows are row vectors, ``P[:-k] @ M_k.T`` equals ``P[k:]``.

    Raises:
        ValueError: if ``k`` is not an integer or ``num_hiddens`` is not a positive even
            integer.

    Example:
        >>> M = sinusoidal_shift_matrix(3, 8)
        >>> M.shape
        torch.Size([8, 8])
        >>> P = sinusoidal_positional_encoding(10, 8, dtype=torch.float64)
        >>> torch.allclose(P[:-3] @ M.T, P[3:])
        True

    Source: Vaswani et al. (2017), section 3.5 (``PE_{pos+k}`` is a linear function of
    ``PE_{pos}``); the book's chapter 6, "Relative position".
    """
    check_offset(k)
    check_even_size(num_hiddens)
    two_i = torch.arange(0, num_hiddens, 2, dtype=torch.float64)  # (d/2,)
    angles = k / torch.pow(10000.0, two_i / num_hiddens)  # (d/2,)
    cos, sin = torch.cos(angles), torch.sin(angles)  # (d/2,) each
    M = torch.zeros(num_hiddens, num_hiddens, dtype=torch.float64)
    M[0::2, 0::2] = torch.diag(cos)  # sin((pos+k)w) = cos(kw) sin(pos w) + sin(kw) cos(pos w)
    M[0::2, 1::2] = torch.diag(sin)
    M[1::2, 0::2] = torch.diag(-sin)  # cos((pos+k)w) = -sin(kw) sin(pos w) + cos(kw) cos(pos w)
    M[1::2, 1::2] = torch.diag(cos)
    return M.to(dtype)  # (d, d)


class LearnedPositionalEmbedding(nn.Module):
    """Add a learned position table (one trainable row per position) to a batch of embeddings.

    The same interface as :class:`PositionalEncoding`, but the table is an
    ``nn.Embedding(max_len, num_hiddens)`` trained with the rest of the model, as in BERT and
    GPT. It has no row for a position ``>= max_len``, so longer sequences are refused.

    Args:
        num_hiddens: d, the embedding size, a positive integer.
        dropout: dropout probability applied to the sum, in ``[0, 1)``.
        max_len: the number of positions with a row (the longest sequence accepted), a
            positive integer.

    Parameters:
        embedding: ``nn.Embedding(max_len, num_hiddens)``, initialised as
            ``nn.Embedding`` does (standard normal entries); ``max_len * num_hiddens``
            numbers.

    Shapes (``forward``):
        X ``(B, T, num_hiddens)`` float with ``T <= max_len``; returns the same shape, a new
        tensor (``X`` is not modified).

    Raises:
        ValueError: bad constructor arguments; in ``forward``, a non-float ``X``, a last axis
            other than ``num_hiddens`` or a sequence longer than ``max_len``.

    Example:
        >>> pe = LearnedPositionalEmbedding(num_hiddens=8, max_len=16)
        >>> pe(torch.zeros(2, 5, 8)).shape, pe.P.shape
        (torch.Size([2, 5, 8]), torch.Size([16, 8]))

    Source: Devlin et al. (2019), section 3 (BERT's position embeddings); Vaswani et al.
    (2017), section 3.5, compare learned and sinusoidal tables.
    """

    def __init__(self, num_hiddens: int, dropout: float = 0.0, max_len: int = 1000) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, max_len=max_len)
        check_dropout(dropout)
        self.dropout = nn.Dropout(dropout)
        self.embedding = nn.Embedding(max_len, num_hiddens)

    @property
    def max_len(self) -> int:
        return self.embedding.num_embeddings

    @property
    def P(self) -> Tensor:
        """The ``(max_len, num_hiddens)`` table (the embedding's weight, a parameter)."""
        return self.embedding.weight

    def forward(self, X: Tensor) -> Tensor:
        """``X`` ``(B, T, d)`` float, ``T <= max_len`` -> ``X`` plus the first ``T`` rows of the
        table (then dropout)."""
        check_positions_input(X, self.embedding.embedding_dim, self.max_len,
                              ": a learned table has no row for a later position")
        T = X.shape[-2]
        return self.dropout(X + self.embedding.weight[:T].to(X.dtype))  # (B, T, d)


def rotary_embedding(
    X: Tensor, positions: Optional[Tensor] = None, *, base: float = 10000.0,
    frequencies: Optional[Tensor] = None,
) -> Tensor:
    r"""Rotary position embedding (RoPE): rotate each feature pair by an angle set by the position.

    Feature pair ``(2i, 2i+1)`` of the vector at position ``m`` is rotated by the angle
    :math:`m\,\omega_i` with :math:`\omega_i = \mathrm{base}^{-2i/d}` (the frequencies of the
    sinusoidal table):

    .. math::
        \begin{pmatrix} x'_{2i} \\ x'_{2i+1} \end{pmatrix} =
        \begin{pmatrix} \cos m\omega_i & -\sin m\omega_i \\
                        \sin m\omega_i & \cos m\omega_i \end{pmatrix}
        \begin{pmatrix} x_{2i} \\ x_{2i+1} \end{pmatrix}.

    Applied to queries at positions ``m`` and keys at positions ``n``, the dot product of a
    rotated query and a rotated key is ``q^T R_{n-m} k``: it depends on the positions only
    through the offset ``n - m``, because rotations compose (``R_m^T R_n = R_{n-m}``). Nothing
    is added to the embeddings, and the norm of every vector is unchanged.

    Args:
        X: ``(..., T, d)`` float queries or keys (for example ``(B, h, T, d_h)``), ``d`` even.
        positions: ``None`` (positions ``0 .. T-1``) or a ``(T,)`` integer or float tensor of
            positions, one per row of ``X`` (for example ``offset + arange(T)`` after ``offset``
            cached tokens).
        base: keyword-only, the frequency base (10000 as in the paper), ``> 1``.
        frequencies: keyword-only; ``None`` (:math:`\omega_i = \mathrm{base}^{-2i/d}`) or the
            ``(d/2,)`` frequencies to use instead, for example scaled ones from
            :func:`~d2lattn.serving.rope_frequencies` (then ``base`` is not used).

    The angles are computed in float64 on the device of ``X`` (positions and frequencies are
    moved there), then the rotation is applied in the dtype of ``X``.

    Returns:
        a new tensor of the shape and dtype of ``X`` (``X`` is not modified).

    Raises:
        ValueError: ``X`` not floating point, with fewer than 2 axes or an odd last axis;
            ``positions`` not of shape ``(T,)``; ``base <= 1``; ``frequencies`` not a
            ``(d/2,)`` tensor.

    Example:
        >>> q = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # the same vector at positions 0 and 1
        >>> rotary_embedding(q)
        tensor([[1.0000, 0.0000],
                [0.5403, 0.8415]])

    Source: Su et al. (2021), "RoFormer: Enhanced Transformer with Rotary Position
    Embedding", equations (13)-(16) and (34); book chapter 8.
    """
    check_rotary_args(X, base, positions, frequencies)
    T, d = X.shape[-2], X.shape[-1]
    if positions is None:
        pos = torch.arange(T, dtype=torch.float64, device=X.device)  # (T,)
    else:
        pos = positions.to(device=X.device, dtype=torch.float64)
    if frequencies is None:
        omega = torch.pow(float(base), -torch.arange(0, d, 2, dtype=torch.float64,
                                                     device=X.device) / d)  # (d/2,)
    else:
        omega = frequencies.to(device=X.device, dtype=torch.float64)  # (d/2,)
    angles = pos[:, None] * omega  # (T, d/2), in float64 so that large positions stay exact
    cos, sin = torch.cos(angles).to(X.dtype), torch.sin(angles).to(X.dtype)  # (T, d/2)
    x_even, x_odd = X[..., 0::2], X[..., 1::2]  # (..., T, d/2) each
    out = torch.empty_like(X)
    out[..., 0::2] = x_even * cos - x_odd * sin
    out[..., 1::2] = x_even * sin + x_odd * cos
    return out  # (..., T, d)


def alibi_slopes(num_heads: int) -> Tensor:
    r"""The ALiBi paper's head slopes: a geometric sequence, with a recipe for any head count.

    For ``H`` a power of 2 the slopes are :math:`m_h = 2^{-8h/H}`, ``h = 1 .. H`` (ratio and
    first term :math:`2^{-8/H}`). For another ``H``, the paper takes the ``2^k`` slopes of the
    largest power of two ``2^k < H``, then the first ``H - 2^k`` of every other slope of
    ``2^{k+1}`` heads (the odd-numbered ones, which interleave with the first set).

    Args:
        num_heads: H, a positive integer.

    Returns:
        float64 ``(H,)``, each in ``(0, 1)``.

    Raises:
        ValueError: if ``num_heads`` is not a positive integer.

    Example:
        >>> alibi_slopes(4)
        tensor([0.2500, 0.0625, 0.0156, 0.0039], dtype=torch.float64)
        >>> alibi_slopes(6)  # 4 heads' slopes, then 2 of 8 heads' (2^-1, 2^-3)
        tensor([0.2500, 0.0625, 0.0156, 0.0039, 0.5000, 0.1250], dtype=torch.float64)

    Source: Press, Smith and Lewis (2022), section 3 and the reference code's ``get_slopes``.
    """
    check_positive_ints(num_heads=num_heads)

    def power_of_two(n: int) -> list:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    k = 2 ** int(math.floor(math.log2(num_heads)))  # the largest power of 2 <= H
    slopes = power_of_two(k) + power_of_two(2 * k)[0::2][: num_heads - k]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(num_heads: int, num_queries: int, num_keys: int, *,
               slopes: Optional[Tensor] = None, symmetric: bool = False) -> Tensor:
    r"""ALiBi: a per-head linear penalty on the distance between a query and a key.

    Head ``h`` adds :math:`-m_h\,(i + K - Q - j)` to the score of query ``i`` and key ``j``
    (the distance, with queries aligned to the last ``Q`` keys as in
    :func:`d2lattn.masking.causal_mask`), with the slopes :math:`m_h` of :func:`alibi_slopes`
    (or your own). This causal form is meant for causal attention: for keys after the query the
    distance is negative and the value is meaningless (mask them). ``symmetric=True`` gives
    the non-causal form :math:`-m_h\,|i + K - Q - j|`, for bidirectional attention (encoders).

    Args:
        num_heads: H, a positive integer.
        num_queries: Q, a non-negative integer.
        num_keys: K, a non-negative integer.
        slopes: keyword-only; ``None`` (the paper's, :func:`alibi_slopes`) or a float
            ``(H,)`` tensor of slopes (learned ones, for example; gradients flow through).
        symmetric: keyword-only; use the distance ``|i + K - Q - j|``.

    Returns:
        ``(H, Q, K)``, float32 (or the dtype of ``slopes``), to be added to the scores: a
        float ``attn_mask`` of ``F.scaled_dot_product_attention``, ``flash_attention``,
        :class:`~d2lattn.DotProductAttention` or (as ``bias[None]``, one mask per head)
        :class:`~d2lattn.MultiHeadAttention`, with a causal mask for the causal form.

    Raises:
        ValueError: a size that is not an integer in range, ``slopes`` not a float ``(H,)``
            tensor, or ``symmetric`` not a bool.

    Example:
        >>> alibi_bias(2, 3, 3)[0]
        tensor([[ 0.0000,  0.0625,  0.1250],
                [-0.0625,  0.0000,  0.0625],
                [-0.1250, -0.0625,  0.0000]])
        >>> alibi_bias(1, 2, 3, symmetric=True)[0]
        tensor([[-0.0039,  0.0000, -0.0039],
                [-0.0078, -0.0039,  0.0000]])

    Source: Press, Smith and Lewis (2022), "Train Short, Test Long: Attention with Linear
    Biases Enables Input Length Extrapolation", section 3.
    """
    check_positive_ints(num_heads=num_heads)
    check_non_negative_ints(num_queries=num_queries, num_keys=num_keys)
    check_bool(symmetric=symmetric)
    if slopes is None:
        slopes = alibi_slopes(num_heads).to(torch.float32)
    else:
        check_slopes(slopes, num_heads)
    i = torch.arange(num_queries, device=slopes.device)[:, None] + (num_keys - num_queries)
    j = torch.arange(num_keys, device=slopes.device)[None, :]  # (1, K)
    # integers first: j - i (or -|j - i|) is +0 on the diagonal, never -0.0
    minus_distance = (-(j - i).abs() if symmetric else (j - i)).to(slopes.dtype)  # (Q, K)
    return slopes[:, None, None] * minus_distance  # (H, Q, K)
