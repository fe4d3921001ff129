"""Positional encoding: order information that attention scores cannot see by themselves."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["sinusoidal_positional_encoding", "PositionalEncoding"]


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
    for name, value in (("max_len", max_len), ("num_hiddens", num_hiddens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
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
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("P", sinusoidal_positional_encoding(max_len, num_hiddens),
                             persistent=False)

    @property
    def max_len(self) -> int:
        return self.P.shape[0]

    def forward(self, X: Tensor) -> Tensor:
        if not isinstance(X, Tensor) or not X.is_floating_point() or X.dim() < 2:
            raise ValueError("X must be a floating-point tensor of shape (B, T, num_hiddens)")
        T, d = X.shape[-2], X.shape[-1]
        if d != self.P.shape[1]:
            raise ValueError(f"X must have last axis num_hiddens = {self.P.shape[1]}, got {d}")
        if T > self.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len = {self.max_len}")
        return self.dropout(X + self.P[:T].to(X.dtype))  # (B, T, d)
