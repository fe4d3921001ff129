r"""Linear attention and the delta rule: attention written as a recurrence with a fixed state.

Replace softmax attention's similarity :math:`\exp(q^\top k)` by a product of features
:math:`\phi(q)^\top \phi(k)` and the causal pooled sum factorises (Katharopoulos et al. 2020,
eqs. 4-6 and 16-20)::

    o_t = phi(q_t)^T S_t / phi(q_t)^T z_t,   S_t = S_{t-1} + phi(k_t) v_t^T,   z_t = z_{t-1} + phi(k_t)

with a ``(d_k, d_v)`` state ``S_t`` and a ``(d_k,)`` normaliser ``z_t`` whose sizes do not grow
with ``t``. The same outputs come in three forms, equal up to rounding:

- :func:`linear_attention_quadratic`: the masked ``(T, T)`` matrix of chapter 3 (parallel,
  ``O(T^2 d)``);
- :func:`linear_attention_recurrent`: one step per token (:func:`linear_attention_step`),
  ``O(T d^2)`` time and ``O(d^2)`` state;
- :func:`linear_attention_chunked`: blocks of ``chunk_size`` positions, the quadratic form
  inside a block and the state between blocks (chapter 9's tiles).

The delta rule (Schlag et al. 2021, eq. 16-18; Yang et al. 2024, eq. 1) writes
``v_t`` at key ``k_t`` by first removing what the state returned for ``k_t``; its gated form
(Yang et al. 2025, eq. 10) also decays the state by ``alpha_t``. In this module's convention
the state is ``(d_k, d_v)`` (keys index the rows, as in the additive rule) and outputs are
``o_t = S_t^T q_t``; the papers write the transpose, ``S_t = alpha_t S_{t-1} (I - beta_t k_t
k_t^T) + beta_t v_t k_t^T``:

- :func:`delta_rule_recurrent` (:func:`delta_rule_step` per token) and
  :func:`delta_rule_chunked` (the WY-style triangular solve of Yang et al. 2024, section 3.2).

Every form takes float16 and bfloat16 inputs: it computes in float32 (the state is a sum over
all earlier tokens, and PyTorch's triangular solve has no half-precision kernel), returns the
outputs in the input dtype and the state in float32, and takes a float32 (or input-dtype)
``initial_state``: a state carried across steps is never rounded to half precision, as in
flash-linear-attention's kernels (whose ``output_final_state`` is float32). Rounding it at
every step of a decode loop would add up: 256 one-token steps of the bf16 delta rule strayed
about five times further from float64 than the whole sequence at once.

:class:`LinearMultiHeadAttention` is a causal self-attention layer built on them with the call
of :class:`~d2lattn.MultiHeadAttention`, so it can replace the attention of chapter 12's GPT
(``GPTConfig(attention="linear")``), and :class:`RecurrentState` is its cache for generation:
one fixed-size state per layer instead of a KV cache that grows.

Source: book chapter 14.
"""

from __future__ import annotations

from typing import Optional, Tuple, TypeVar, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (check_additive_args, check_chunk_size, check_delta_args, check_heads,
                      check_linear_call, check_linear_rule, values_trusted)
from .masking import causal_mask
from .multihead import merge_heads, split_heads

__all__ = ["LinearMultiHeadAttention", "RecurrentState", "delta_rule_chunked",
           "delta_rule_recurrent", "delta_rule_step", "elu_feature_map",
           "linear_attention_chunked", "linear_attention_quadratic",
           "linear_attention_recurrent", "linear_attention_step"]

_T = TypeVar("_T")

#: The additive rule's state: ``S`` ``(..., d_k, d_v)`` and ``z`` ``(..., d_k)``.
AdditiveState = Tuple[Tensor, Tensor]


def elu_feature_map(x: Tensor) -> Tensor:
    r"""The feature map :math:`\phi(x) = \mathrm{elu}(x) + 1`, elementwise and positive.

    :math:`\phi(x) = e^x` for :math:`x < 0` and :math:`x + 1` otherwise: positive in exact
    arithmetic; in float32 it rounds to 0 below about ``x = -17`` (the normaliser's ``eps``
    keeps the division finite).

    Args:
        x: any floating tensor. Returns: a new tensor of the same shape, entries ``>= 0``.

    Example:
        >>> elu_feature_map(torch.tensor([-3.0, 0.0, 2.0]))
        tensor([0.0498, 1.0000, 3.0000])

    Source: Katharopoulos et al. (2020), "Transformers are RNNs", eq. (7).
    """
    return F.elu(x) + 1


def _zero_state(keys: Tensor, values: Tensor) -> AdditiveState:
    lead, d_k, d_v = keys.shape[:-2], keys.shape[-1], values.shape[-1]
    return (keys.new_zeros(*lead, d_k, d_v), keys.new_zeros(*lead, d_k))


_HALF = (torch.float16, torch.bfloat16)


def _widen(x: _T) -> _T:
    """A half-precision tensor (or tuple of them, or ``None``) in float32; others unchanged.

    The forms below sum over every earlier token (the state) and the delta rule solves a
    triangular system (no half-precision kernel in PyTorch): for float16/bfloat16 inputs they
    accumulate in float32 and return the outputs in the input dtype and the state in float32,
    as flash-linear-attention's kernels do.
    """
    if isinstance(x, tuple):
        return tuple(_widen(t) for t in x)  # type: ignore[return-value]
    return x.float() if isinstance(x, Tensor) and x.dtype in _HALF else x  # type: ignore


def _narrow(x: _T, dtype: torch.dtype) -> _T:
    """Back to the input dtype (a no-op unless the input was half precision)."""
    if isinstance(x, tuple):
        return tuple(_narrow(t, dtype) for t in x)  # type: ignore[return-value]
    return x.to(dtype) if isinstance(x, Tensor) and dtype in _HALF else x  # type: ignore


def linear_attention_quadratic(queries: Tensor, keys: Tensor, values: Tensor, *,
                               normalize: bool = True, eps: float = 1e-6) -> Tensor:
    r"""Causal linear attention, quadratic form: the masked ``(T, T)`` score matrix.

    .. math::
        A = \mathrm{tril}(\Phi_Q \Phi_K^\top), \qquad
        O = \frac{A V}{A \mathbf{1} + \epsilon} \;\text{(row by row)}

    Args:
        queries: ``(..., T, d_k)`` float, features :math:`\phi(q)` (already mapped; positive
            when ``normalize=True``, e.g. by :func:`elu_feature_map`).
        keys: ``(..., T, d_k)``, features :math:`\phi(k)`. values: ``(..., T, d_v)``.
        normalize: keyword-only; divide by the summed weights (``False``: the plain sum).
        eps: keyword-only; a positive number added to every normaliser.

    Returns:
        ``(..., T, d_v)``, the same dtype as the inputs.

    Raises:
        ValueError: inputs that are not floating tensors of matching shapes, dtypes and
            devices; a non-positive ``eps``.

    Example:
        >>> q = k = elu_feature_map(torch.randn(2, 5, 4)); v = torch.randn(2, 5, 3)
        >>> linear_attention_quadratic(q, k, v).shape
        torch.Size([2, 5, 3])

    Source: Katharopoulos et al. (2020), eq. (6) with the causal mask of eq. (8).
    """
    check_additive_args(queries, keys, values, eps, None)
    dtype, (queries, keys, values) = queries.dtype, _widen((queries, keys, values))
    T = queries.shape[-2]
    A = queries @ keys.transpose(-2, -1)  # (..., T, T)
    A = A * causal_mask(T, T, device=A.device)  # j <= t only
    out = A @ values  # (..., T, d_v)
    return _narrow(out / (A.sum(dim=-1, keepdim=True) + eps) if normalize else out, dtype)


def linear_attention_step(query: Tensor, key: Tensor, value: Tensor, state: AdditiveState, *,
                          normalize: bool = True, eps: float = 1e-6
                          ) -> Tuple[Tensor, AdditiveState]:
    r"""One token of causal linear attention: update the state, then read it.

    .. math::
        S_t = S_{t-1} + \phi(k_t) v_t^\top, \quad z_t = z_{t-1} + \phi(k_t), \quad
        o_t = \frac{S_t^\top \phi(q_t)}{z_t^\top \phi(q_t) + \epsilon}

    Args:
        query, key: ``(..., d_k)`` features. value: ``(..., d_v)``.
        state: ``(S, z)``, ``(..., d_k, d_v)`` and ``(..., d_k)`` (zeros before the first
            token). normalize, eps: as in :func:`linear_attention_quadratic`.

    Returns:
        ``(o_t, (S_t, z_t))``: ``(..., d_v)`` and the new state (the old one is not modified).

    Source: Katharopoulos et al. (2020), eqs. (18)-(20).
    """
    S, z = state
    S = S + key[..., :, None] * value[..., None, :]  # (..., d_k, d_v)
    z = z + key  # (..., d_k)
    out = (query[..., None, :] @ S).squeeze(-2)  # (..., d_v)
    if normalize:
        out = out / ((query * z).sum(dim=-1, keepdim=True) + eps)
    return out, (S, z)


def linear_attention_recurrent(queries: Tensor, keys: Tensor, values: Tensor, *,
                               normalize: bool = True, eps: float = 1e-6,
                               initial_state: Optional[AdditiveState] = None,
                               return_state: bool = False
                               ) -> Union[Tensor, Tuple[Tensor, AdditiveState]]:
    """Causal linear attention, recurrent form: :func:`linear_attention_step` per token.

    Arguments as in :func:`linear_attention_quadratic`, and keyword-only ``initial_state``
    (``None``: zeros; or ``(S, z)``, ``(..., d_k, d_v)`` and ``(..., d_k)``, the state after
    earlier tokens) and ``return_state`` (also return the final ``(S, z)``).

    Returns:
        ``(..., T, d_v)``, or ``(outputs, (S, z))``. The state has the same size for every
        ``T``.

    Example:
        >>> q = k = elu_feature_map(torch.randn(5, 4)); v = torch.randn(5, 3)
        >>> out, (S, z) = linear_attention_recurrent(q, k, v, return_state=True)
        >>> out.shape, S.shape, z.shape
        (torch.Size([5, 3]), torch.Size([4, 3]), torch.Size([4]))

    Source: Katharopoulos et al. (2020), section 3.4.
    """
    check_additive_args(queries, keys, values, eps, initial_state)
    dtype = queries.dtype
    queries, keys, values, initial_state = _widen((queries, keys, values, initial_state))
    state = initial_state if initial_state is not None else _zero_state(keys, values)
    outs = []
    for t in range(queries.shape[-2]):
        out, state = linear_attention_step(queries[..., t, :], keys[..., t, :],
                                           values[..., t, :], state, normalize=normalize,
                                           eps=eps)
        outs.append(out)
    out = (torch.stack(outs, dim=-2) if outs
           else values.new_zeros(values.shape))  # (..., T, d_v)
    out = _narrow(out, dtype)  # the state stays float32 (see _widen)
    return (out, state) if return_state else out


def linear_attention_chunked(queries: Tensor, keys: Tensor, values: Tensor, chunk_size: int,
                             *, normalize: bool = True, eps: float = 1e-6,
                             initial_state: Optional[AdditiveState] = None,
                             return_state: bool = False
                             ) -> Union[Tensor, Tuple[Tensor, AdditiveState]]:
    r"""Causal linear attention, chunked form: blocks of ``chunk_size`` positions.

    Inside block :math:`b` (rows :math:`Q_b, K_b, V_b`) the quadratic form, plus what the state
    carries from the blocks before; then the state takes the whole block at once:

    .. math::
        O_b = Q_b S + \mathrm{tril}(Q_b K_b^\top) V_b, \qquad S \leftarrow S + K_b^\top V_b

    (and the same for the normaliser). ``chunk_size`` need not divide ``T``: the last block is
    shorter.

    Args:
        chunk_size: a positive integer. Other arguments and returns as in
            :func:`linear_attention_recurrent`.

    Raises:
        ValueError: as :func:`linear_attention_quadratic`, and a bad ``chunk_size`` or
            ``initial_state``.

    Example:
        >>> q = k = elu_feature_map(torch.randn(7, 4)); v = torch.randn(7, 3)
        >>> torch.allclose(linear_attention_chunked(q, k, v, 3),
        ...                linear_attention_quadratic(q, k, v), atol=1e-6)
        True

    Source: the chunkwise form of Yang et al. (2024), "Gated Linear Attention Transformers
    with Hardware-Efficient Training", section 3.2 (without the gate); book chapters 9 and 14.
    """
    check_additive_args(queries, keys, values, eps, initial_state)
    check_chunk_size(chunk_size)
    dtype = queries.dtype
    queries, keys, values, initial_state = _widen((queries, keys, values, initial_state))
    S, z = initial_state if initial_state is not None else _zero_state(keys, values)
    outs = []
    for start in range(0, queries.shape[-2], chunk_size):
        q = queries[..., start:start + chunk_size, :]  # (..., c, d_k)
        k = keys[..., start:start + chunk_size, :]  # (..., c, d_k)
        v = values[..., start:start + chunk_size, :]  # (..., c, d_v)
        c = q.shape[-2]
        A = (q @ k.transpose(-2, -1)) * causal_mask(c, c, device=q.device)  # (..., c, c)
        out = q @ S + A @ v  # (..., c, d_v): earlier blocks + this block
        if normalize:
            out = out / ((q @ z[..., :, None]) + A.sum(dim=-1, keepdim=True) + eps)
        outs.append(out)
        S = S + k.transpose(-2, -1) @ v  # (..., d_k, d_v)
        z = z + k.sum(dim=-2)  # (..., d_k)
    out = torch.cat(outs, dim=-2) if outs else values.new_zeros(values.shape)
    out = _narrow(out, dtype)  # the state stays float32 (see _widen)
    return (out, (S, z)) if return_state else out


def delta_rule_step(query: Tensor, key: Tensor, value: Tensor, beta: Tensor, state: Tensor, *,
                    alpha: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""One token of the (gated) delta rule: decay, correct the value stored at ``key``, read.

    .. math::
        S' = \alpha_t S_{t-1}, \qquad
        S_t = S' + \beta_t\, k_t \,(v_t - S'^\top k_t)^\top, \qquad o_t = S_t^\top q_t

    that is :math:`S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top`.

    Args:
        query, key: ``(..., d_k)`` (unit-norm keys keep the update stable for
            ``beta <= 2``). value: ``(..., d_v)``. beta: ``(...)`` in ``[0, 2]``.
        state: ``(..., d_k, d_v)``. alpha: keyword-only; ``None`` (no decay) or ``(...)``
            in ``(0, 1]``.

    Returns:
        ``(o_t, S_t)``: ``(..., d_v)`` and the new ``(..., d_k, d_v)`` state.

    Source: Schlag et al. (2021), eq. (17); Yang et al. (2025), "Gated Delta Networks",
    eq. (10) (written there as the transpose of this state).
    """
    if alpha is not None:
        state = alpha[..., None, None] * state
    stored = (key[..., None, :] @ state).squeeze(-2)  # (..., d_v): what key reads now
    state = state + beta[..., None, None] * key[..., :, None] * (value - stored)[..., None, :]
    return (query[..., None, :] @ state).squeeze(-2), state  # (..., d_v), (..., d_k, d_v)


def delta_rule_recurrent(queries: Tensor, keys: Tensor, values: Tensor, beta: Tensor, *,
                         alpha: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                         return_state: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The (gated) delta rule over a sequence, :func:`delta_rule_step` per token.

    Args:
        queries, keys: ``(..., T, d_k)`` float. values: ``(..., T, d_v)``.
        beta: ``(..., T)`` in ``[0, 2]``, the writing strength of each token.
        alpha: keyword-only; ``None`` or ``(..., T)`` in ``(0, 1]``, the decay of each token.
        initial_state: keyword-only; ``None`` (zeros) or ``(..., d_k, d_v)``.
        return_state: keyword-only; also return the final state.

    Returns:
        ``(..., T, d_v)``, or ``(outputs, state)``.

    Raises:
        ValueError: mismatched shapes, dtypes or devices; ``beta`` or ``alpha`` out of range.

    Example:
        >>> k = F.normalize(torch.randn(6, 4), dim=-1)
        >>> out, S = delta_rule_recurrent(k, k, torch.randn(6, 2), torch.ones(6),
        ...                               return_state=True)
        >>> out.shape, S.shape
        (torch.Size([6, 2]), torch.Size([4, 2]))

    Source: Schlag et al. (2021), eqs. (16)-(18); Yang et al. (2024), "Parallelizing Linear
    Transformers with the Delta Rule over Sequence Length", eq. (1); Yang et al. (2025).
    """
    check_delta_args(queries, keys, values, beta, alpha, initial_state)
    dtype = queries.dtype
    queries, keys, values, beta, alpha, initial_state = _widen(
        (queries, keys, values, beta, alpha, initial_state))
    state = initial_state if initial_state is not None else _zero_state(keys, values)[0]
    outs = []
    for t in range(queries.shape[-2]):
        out, state = delta_rule_step(queries[..., t, :], keys[..., t, :], values[..., t, :],
                                     beta[..., t], state,
                                     alpha=None if alpha is None else alpha[..., t])
        outs.append(out)
    out = torch.stack(outs, dim=-2) if outs else values.new_zeros(values.shape)
    out = _narrow(out, dtype)  # the state stays float32 (see _widen)
    return (out, state) if return_state else out


def delta_rule_chunked(queries: Tensor, keys: Tensor, values: Tensor, beta: Tensor,
                       chunk_size: int, *, alpha: Optional[Tensor] = None,
                       initial_state: Optional[Tensor] = None, return_state: bool = False
                       ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    r"""The (gated) delta rule in blocks of ``chunk_size`` positions, equal to
    :func:`delta_rule_recurrent`.

    Within a block starting from state :math:`S_0`, with :math:`\gamma_t = \prod_{i \le t}
    \alpha_i` and :math:`\Gamma_{tj} = \gamma_t / \gamma_j`, every token writes a corrected
    value :math:`u_t` so that :math:`S_t = \gamma_t S_0 + \sum_{j \le t} \Gamma_{tj} k_j
    u_j^\top`. The corrections solve one unit lower-triangular system,

    .. math::
        \big(I + \mathrm{diag}(\beta)\,\mathrm{tril}(K K^\top \odot \Gamma, -1)\big)\, U
        = \mathrm{diag}(\beta)\,\big(V - \mathrm{diag}(\gamma) K S_0\big),

    then :math:`O = \mathrm{diag}(\gamma) Q S_0 + \mathrm{tril}(Q K^\top \odot \Gamma) U` and
    :math:`S \leftarrow \gamma_c S_0 + K^\top \mathrm{diag}(\gamma_c / \gamma) U`.

    Args:
        chunk_size: a positive integer (need not divide ``T``). Other arguments and returns as
            in :func:`delta_rule_recurrent`.

    Example:
        >>> k = F.normalize(torch.randn(7, 4, dtype=torch.float64), dim=-1)
        >>> v, beta = torch.randn(7, 2, dtype=torch.float64), torch.rand(7, dtype=torch.float64)
        >>> torch.allclose(delta_rule_chunked(k, k, v, beta, 3),
        ...                delta_rule_recurrent(k, k, v, beta))
        True

    Source: Yang et al. (2024), "Parallelizing Linear Transformers with the Delta Rule over
    Sequence Length", section 3 (the WY representation, eqs. 5-9), with the gate of Yang et
    al. (2025), section 3.3.
    """
    check_delta_args(queries, keys, values, beta, alpha, initial_state)
    check_chunk_size(chunk_size)
    dtype = queries.dtype  # float16/bfloat16: float32 inside (see _widen)
    queries, keys, values, beta, alpha, initial_state = _widen(
        (queries, keys, values, beta, alpha, initial_state))
    S = initial_state if initial_state is not None else _zero_state(keys, values)[0]
    log_alpha = None if alpha is None else alpha.log()  # (..., T)
    outs = []
    for start in range(0, queries.shape[-2], chunk_size):
        q = queries[..., start:start + chunk_size, :]  # (..., c, d_k)
        k = keys[..., start:start + chunk_size, :]  # (..., c, d_k)
        v = values[..., start:start + chunk_size, :]  # (..., c, d_v)
        b = beta[..., start:start + chunk_size]  # (..., c)
        c = q.shape[-2]
        causal = causal_mask(c, c, device=q.device)  # (c, c)
        if log_alpha is None:
            g = b.new_zeros(b.shape)  # (..., c): log gamma
        else:
            g = log_alpha[..., start:start + chunk_size].cumsum(dim=-1)
        diff = (g[..., :, None] - g[..., None, :]).masked_fill(~causal, float("-inf"))
        Gamma = diff.exp()  # (..., c, c): gamma_t / gamma_j for j <= t, else 0
        gamma = g.exp()[..., None]  # (..., c, 1)
        strict = (k @ k.transpose(-2, -1) * Gamma).tril(-1)  # (..., c, c)
        system = torch.eye(c, dtype=q.dtype, device=q.device) + b[..., :, None] * strict
        rhs = b[..., :, None] * (v - gamma * (k @ S))  # (..., c, d_v)
        U = torch.linalg.solve_triangular(system, rhs, upper=False,
                                          unitriangular=True)  # (..., c, d_v)
        outs.append(gamma * (q @ S) + (q @ k.transpose(-2, -1) * Gamma) @ U)
        last = g[..., -1:]  # (..., 1): log gamma_c
        S = (last.exp()[..., None] * S
             + (k * (last - g).exp()[..., None]).transpose(-2, -1) @ U)  # (..., d_k, d_v)
    out = torch.cat(outs, dim=-2) if outs else values.new_zeros(values.shape)
    out = _narrow(out, dtype)  # the state stays float32 (see _widen)
    return (out, S) if return_state else out


class RecurrentState:
    """The generation cache of a :class:`LinearMultiHeadAttention`: one fixed-size state.

    Where a :class:`~d2lattn.KVCache` keeps every past key and value (its size grows with the
    number of tokens), this keeps the layer's state after them: ``(S, z)`` for the additive
    rule, ``S`` for the delta rules, ``(B, h, d_h, d_h)`` (and ``(B, h, d_h)``).

    Attributes:
        state: ``None`` before the first token, then the state tensor(s).
        length: how many tokens the state has seen (``len(cache)``).

    Example:
        >>> layer = LinearMultiHeadAttention(8, 2)
        >>> cache = RecurrentState()
        >>> X = torch.randn(1, 5, 8)
        >>> _ = layer(X, X, X, is_causal=True, kv_cache=cache)
        >>> len(cache), cache.nbytes  # S (1, 2, 4, 4) + z (1, 2, 4), float32
        (5, 160)
    """

    def __init__(self) -> None:
        self.state: Optional[Union[Tensor, AdditiveState]] = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        """The bytes the state holds (0 before the first token)."""
        if self.state is None:
            return 0
        tensors = self.state if isinstance(self.state, tuple) else (self.state,)
        return sum(t.numel() * t.element_size() for t in tensors)


class LinearMultiHeadAttention(nn.Module):
    r"""Causal multi-head self-attention with a linear (recurrent) core.

    .. math::
        \mathrm{head}_i = \mathrm{LinearAttention}(X W_q^{(i)}, X W_k^{(i)}, X W_v^{(i)}),
        \qquad \mathrm{out} = [\mathrm{head}_1; \dots; \mathrm{head}_h] W_o^\top

    ``rule="additive"``: features :func:`elu_feature_map` of queries and keys, normalised
    output (Katharopoulos et al. 2020). ``rule="delta"``: unit-norm queries and keys,
    ``beta_t = sigmoid(x_t w_beta)`` per head (DeltaNet; Yang et al. 2024). ``"gated_delta"``:
    also ``alpha_t = sigmoid(x_t w_alpha)`` per head (Gated DeltaNet's decay; the paper
    parametrises it as ``exp(-softplus(.))``-style, the idea is the same).

    The call is :class:`~d2lattn.MultiHeadAttention`'s, so the layer can replace the attention
    of a :class:`~d2lattn.TransformerEncoderBlock` run with ``is_causal=True``:
    ``layer(X, X, X, is_causal=True, kv_cache=None)``. With a :class:`RecurrentState` as
    ``kv_cache`` it starts from the cached state and leaves the new one there (generation).

    Args:
        num_hiddens: d. num_heads: h (divides d). rule: keyword-only, as above.
        chunk_size: keyword-only; the block length of the chunked form used for training.
        bias: keyword-only; biases in the four projections.

    Shapes:
        X ``(B, T, d)`` float -> ``(B, T, d)``.

    Raises:
        ValueError: bad sizes or rule; a call that is not causal self-attention (different
            tensors for queries, keys and values, ``is_causal=False``, a mask, valid_lens or
            a scale); a wrong input size.

    Example:
        >>> layer = LinearMultiHeadAttention(16, 4, rule="delta")
        >>> layer(torch.ones(2, 5, 16), torch.ones(2, 5, 16), torch.ones(2, 5, 16),
        ...       is_causal=True)
        Traceback (most recent call last):
            ...
        ValueError: a linear-attention layer is self-attention: pass the same tensor as queries, keys and values
        >>> X = torch.ones(2, 5, 16)
        >>> layer(X, X, X, is_causal=True).shape
        torch.Size([2, 5, 16])

    Source: Katharopoulos et al. (2020); Schlag et al. (2021); Yang et al. (2024, 2025);
    book chapter 14.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, rule: str = "additive",
                 chunk_size: int = 64, bias: bool = False) -> None:
        super().__init__()
        check_heads(num_hiddens, num_heads, num_heads)
        check_linear_rule(rule)
        check_chunk_size(chunk_size)
        self.num_hiddens, self.num_heads = num_hiddens, num_heads
        self.rule, self.chunk_size = rule, chunk_size
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_beta = nn.Linear(num_hiddens, num_heads) if rule != "additive" else None
        self.W_alpha = nn.Linear(num_hiddens, num_heads) if rule == "gated_delta" else None
        self.attention_weights: Optional[Tensor] = None  # no weights are formed

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor,
                valid_lens: Optional[Tensor] = None, *, attn_mask: Optional[Tensor] = None,
                is_causal: bool = False, kv_cache: Optional[RecurrentState] = None,
                scale: Optional[float] = None) -> Tensor:
        """Causal self-attention with the recurrent core (chunked form).

        Args:
            queries, keys, values: the same ``(B, T, d)`` float tensor ``X``.
            valid_lens, attn_mask, scale: must be ``None`` (the recurrence has no mask).
            is_causal: keyword-only; must be True.
            kv_cache: keyword-only; ``None`` or a :class:`RecurrentState`: the state after
                the earlier tokens, replaced by the state after these ``T``.

        Returns:
            ``(B, T, d)``, the dtype of ``X`` (half precision is accumulated in float32).
        """
        check_linear_call(queries, keys, values, valid_lens, attn_mask, is_causal, scale)
        X = queries
        if X.dim() != 3 or X.shape[-1] != self.num_hiddens:
            raise ValueError(f"X must have shape (B, T, {self.num_hiddens}), got "
                             f"{tuple(X.shape)}")
        if kv_cache is not None and not isinstance(kv_cache, RecurrentState):
            raise ValueError("kv_cache must be None or a RecurrentState")
        h = self.num_heads
        # 1. project, split the hidden axis into heads
        q = split_heads(self.W_q(X), h)  # (B, h, T, d_h)
        k = split_heads(self.W_k(X), h)  # (B, h, T, d_h)
        v = split_heads(self.W_v(X), h)  # (B, h, T, d_h)
        start = None if kv_cache is None else kv_cache.state
        # 2. the causal recurrence in every head, in blocks
        if self.rule == "additive":
            q, k = elu_feature_map(q), elu_feature_map(k)
            out, state = linear_attention_chunked(q, k, v, self.chunk_size,
                                                  initial_state=start,  # type: ignore[arg-type]
                                                  return_state=True)
        else:
            assert self.W_beta is not None
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            beta = torch.sigmoid(self.W_beta(X)).transpose(1, 2)  # (B, h, T)
            alpha = None
            if self.W_alpha is not None:  # kept above 0, so that its log is finite
                alpha = torch.sigmoid(self.W_alpha(X)).transpose(1, 2).clamp_min(1e-6)
            with values_trusted():  # sigmoid gates are in range: not read back to the host
                out, state = delta_rule_chunked(q, k, v, beta, self.chunk_size, alpha=alpha,
                                                initial_state=start,  # type: ignore[arg-type]
                                                return_state=True)
        if kv_cache is not None:
            kv_cache.state = tuple(s.detach() for s in state) if isinstance(state, tuple) \
                else state.detach()  # type: ignore[assignment]
            kv_cache.length += X.shape[1]
        # 3. concatenate the heads and mix them
        return self.W_o(merge_heads(out))  # (B, T, d)
