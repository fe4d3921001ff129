"""Attention at serving time: what the KV cache costs, and four ways to pay less.

- **Bytes per token** of the cache: :func:`kv_cache_bytes` (multi-head, grouped-query,
  multi-query and sliding-window attention) and :func:`mla_cache_bytes` (multi-head latent
  attention).
- **Multi-head latent attention** (:class:`MultiHeadLatentAttention`, DeepSeek-V2): one shared
  low-rank latent and one small rotary key per token are cached; the up-projections can be
  absorbed into the query and output projections (``absorbed=True``), the same function.
- **A paged cache** (:class:`PagedKVCache`, vLLM): fixed-size blocks and a block table per
  sequence; :func:`contiguous_waste` and :func:`paged_waste` count the slots each layout wastes.
- **Long streams and long contexts** for a rotary :class:`~d2lattn.GPT`: :func:`gpt_logits`
  runs it with a full cache, a sliding window, or StreamingLLM's sinks plus a window, and with
  rotary frequencies scaled by :func:`rope_frequencies` (position interpolation, NTK-aware,
  YaRN) past the context it was trained on.

Sources: Kwon et al. (2023), "Efficient Memory Management for Large Language Model Serving
with PagedAttention"; DeepSeek-AI (2024), "DeepSeek-V2", section 2.1; Xiao et al. (2024),
"Efficient Streaming Language Models with Attention Sinks"; Chen et al. (2023), "Extending
Context Window of Large Language Models via Positional Interpolation"; Peng et al. (2023),
"YaRN: Efficient Context Window Extension of Large Language Models"; book chapter 15.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ._checks import (check_bool, check_hidden_states, check_lengths_list, check_paged_chunk,
                      check_positive_ints, check_rope_scaling, check_streaming, check_tokens)
from ._modes import evaluating
from .masking import causal_mask
from .heads import merge_heads, split_heads
from .kvcache import KVCache, kv_cache_bytes, mla_cache_bytes  # re-exported: the old path works
from .positional import rotary_embedding

__all__ = ["MultiHeadLatentAttention", "PagedKVCache", "contiguous_waste", "gpt_logits",
           "paged_waste", "rope_attention_scale",
           "rope_frequencies", "rotate_pairs"]


# --- bytes per token ----------------------------------------------------------------------------

# --- rotary frequencies, scaled -----------------------------------------------------------------

def rope_frequencies(head_size: int, *, base: float = 10000.0, method: str = "none",
                     factor: float = 1.0, original_context: Optional[int] = None,
                     alpha: float = 1.0, beta: float = 32.0) -> Tensor:
    r"""The rotary frequencies :math:`\omega_i`, ``i = 0 .. d/2 - 1``, optionally scaled to
    stretch a model trained on ``original_context`` positions by ``factor`` = s.

    - ``"none"``: :math:`\omega_i = \mathrm{base}^{-2i/d}` (as
      :func:`~d2lattn.positional.rotary_embedding`);
    - ``"interpolation"``: :math:`\omega_i / s`, i.e. position ``m`` is read as ``m / s``
      (Chen et al. 2023, eq. 4): every angle stays inside the trained range;
    - ``"ntk"``: the base raised to :math:`\mathrm{base}\, s^{d/(d-2)}` ("NTK-aware"): the
      highest frequency is kept, the lowest divided by ``s`` (Peng et al. 2023, section 3.1);
    - ``"yarn"``: "NTK-by-parts": with :math:`r_i = L / (2\pi/\omega_i)` the number of turns
      frequency ``i`` makes over the trained context ``L``,
      :math:`\gamma_i = \mathrm{clip}((r_i - \alpha)/(\beta - \alpha), 0, 1)` and
      :math:`\omega'_i = (1-\gamma_i)\,\omega_i / s + \gamma_i\, \omega_i`: fast frequencies
      kept, slow ones interpolated (Peng et al. 2023, eq. 18-19); pair it with
      :func:`rope_attention_scale`.

    Args:
        head_size: d, even. base, method, factor (``>= 1``), original_context (L, needed by
        ``"yarn"``), alpha, beta: keyword-only, as above.

    Returns:
        ``(d/2,)`` float64 frequencies in radians per position.

    Raises:
        ValueError: an odd or non-positive ``head_size``, an unknown ``method``, ``factor < 1``,
            ``"yarn"`` without ``original_context``, ``beta <= alpha``.

    Example:
        >>> rope_frequencies(4, base=100.0)
        tensor([1.0000, 0.1000], dtype=torch.float64)
        >>> rope_frequencies(4, base=100.0, method="interpolation", factor=2)
        tensor([0.5000, 0.0500], dtype=torch.float64)
    """
    check_positive_ints(head_size=head_size)
    if head_size % 2:
        raise ValueError(f"head_size must be even (feature pairs are rotated), got {head_size}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    check_rope_scaling(method, factor, original_context)
    if not beta > alpha:
        raise ValueError(f"beta must exceed alpha, got alpha={alpha!r}, beta={beta!r}")
    d = head_size
    exponent = torch.arange(0, d, 2, dtype=torch.float64) / d  # (d/2,)
    if method == "ntk":
        return (base * factor ** (d / (d - 2)) if d > 2 else base) ** -exponent
    omega = float(base) ** -exponent
    if method == "interpolation":
        return omega / factor
    if method == "yarn":
        turns = original_context * omega / (2 * math.pi)  # r_i
        gamma = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
        return (1 - gamma) * omega / factor + gamma * omega
    return omega


def rope_attention_scale(method: str, factor: float) -> float:
    r"""YaRN's temperature: queries and keys are both multiplied by
    :math:`\sqrt{1/t} = 0.1 \ln s + 1` (Peng et al. 2023, eq. 22), so the logits by its square;
    ``1.0`` for every other method.

    Example:
        >>> round(rope_attention_scale("yarn", 4), 4), rope_attention_scale("ntk", 4)
        (1.1386, 1.0)
    """
    check_rope_scaling(method, factor, 1)
    return 0.1 * math.log(factor) + 1.0 if method == "yarn" else 1.0


def rotate_pairs(X: Tensor, positions: Tensor, omega: Tensor) -> Tensor:
    r"""Rotate feature pair ``(2i, 2i+1)`` of the row at position ``m`` by ``m * omega[i]``:
    :func:`~d2lattn.positional.rotary_embedding` with the frequencies given (one
    implementation; this name is kept for chapter 15's readers).

    Args:
        X: ``(..., T, d)`` float, ``d`` even. positions: ``(T,)`` numbers.
        omega: ``(d/2,)`` frequencies (:func:`rope_frequencies`).

    Returns:
        a new tensor of the shape, dtype and device of ``X``.

    Raises:
        ValueError: mismatched shapes, ``X`` not floating point.
    """
    return rotary_embedding(X, positions, frequencies=omega)


# --- a rotary GPT with a cache policy and scaled positions ---------------------------------------

@torch.no_grad()
def gpt_logits(model: nn.Module, tokens: Tensor, *, window: Optional[int] = None,
               num_sinks: int = 0, method: str = "none", factor: float = 1.0) -> Tensor:
    r"""Run a rotary :class:`~d2lattn.GPT` on ``tokens`` of any length, as a server with a
    bounded cache would, all positions at once.

    - ``window=None``: the full cache (every earlier token; past ``block_size`` this is longer
      than the model was trained on);
    - ``window=W``: token ``t`` sees tokens ``t-W+1 .. t`` (a rolling cache of ``W`` entries);
    - ``window=W, num_sinks=S``: StreamingLLM's cache, the first ``S`` tokens plus the last
      ``W``. As in StreamingLLM, positions are those *in the cache*: once the cache is full,
      the query sits at cache position ``S + W - 1`` and sink ``j`` at ``j``, so a sink is
      ``S + W - 1 - j`` positions away, never farther than the cache is long; window keys keep
      their offset ``t - s``. Each token's keys and values are computed once, when it arrives,
      so this equals decoding token by token with the evicting cache.

    ``method`` and ``factor`` scale the rotary frequencies (:func:`rope_frequencies` with
    ``original_context=block_size``; YaRN also scales the logits by
    :func:`rope_attention_scale` squared).

    Args:
        model: a :class:`~d2lattn.GPT` with ``positions="rotary"`` and softmax attention in
            every layer.
        tokens: ``(B, T)`` int64, any ``T >= 1``.
        window, num_sinks, method, factor: keyword-only, as above.

    The model runs its own blocks (norms, residuals, feed-forward networks), each with its own
    projections; only the attention pattern and the rotary positions follow the policy. It runs
    in eval mode and is given back in the mode it was in; ``tokens`` go to its device.

    Returns:
        ``(B, T, V)`` float logits. With the defaults and ``T <= block_size``: ``model(tokens)``.

    Raises:
        ValueError: a model without rotary positions or with other attention than softmax
            (chapter 14's cores, latent attention), a bidirectional model
            (``config.causal=False``: a server's cache holds only the past), bad tokens, a bad
            window, sinks without a window, a bad scaling.

    Source: Xiao et al. (2024), section 3.2 (positions within the cache); book chapter 15.
    """
    c = getattr(model, "config", None)
    if (c is None or getattr(c, "positions", None) != "rotary"
            or not isinstance(getattr(model, "blocks", None), nn.ModuleList)):
        raise ValueError("model must be a GPT with positions='rotary'")
    if set(getattr(c, "layer_attention", ("softmax",))) != {"softmax"}:
        raise ValueError(f"gpt_logits runs softmax attention under a cache policy; this GPT's "
                         f"layers are {c.layer_attention}: call model(tokens) instead")
    if not c.causal:
        raise ValueError("gpt_logits runs a causal GPT as a server decodes it; this one is "
                         "bidirectional (config.causal=False): call model(tokens) instead")
    check_tokens(tokens, vocab_size=c.vocab_size)
    check_streaming(window, num_sinks)
    device = model.embedding.weight.device
    tokens = tokens.to(device)
    h = c.num_heads
    d_h = c.num_hiddens // h
    omega = rope_frequencies(d_h, method=method, factor=factor, original_context=c.block_size)
    logit_scale = rope_attention_scale(method, factor) ** 2 / math.sqrt(d_h)
    B, T = tokens.shape
    t = torch.arange(T, device=device)
    visible = causal_mask(T, T, device=device)  # (T, T): s <= t
    if window is not None:
        offset = t[:, None] - t[None, :]  # (T, T): t - s
        visible &= (offset < window) | (t[None, :] < num_sinks)
    # where the query sits when it looks at a sink: min(t, S + W - 1) (cache positions)
    sink_query_pos = t.clamp(max=num_sinks + window - 1) if num_sinks else t

    def policy_attention(mha: nn.Module) -> Callable[[Tensor], Tensor]:
        """The block's own projections, attending under the cache policy."""
        def attend(Z: Tensor) -> Tensor:  # (B, T, d) -> (B, T, d)
            q = split_heads(mha.W_q(Z), h)  # (B, h, T, d_h)
            k = split_heads(mha.W_k(Z), mha.num_kv_heads)  # (B, g, T, d_h)
            v = split_heads(mha.W_v(Z), mha.num_kv_heads)
            if mha.num_kv_heads != h:  # grouped-query heads: each serves h / g query heads
                r = h // mha.num_kv_heads
                k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
            k_rot = rotary_embedding(k, t, frequencies=omega)
            scores = rotary_embedding(q, t, frequencies=omega) @ k_rot.transpose(-1, -2)
            if num_sinks:  # (B, h, T, S): the query at its cache position
                S = min(num_sinks, T)
                q_sink = rotary_embedding(q, sink_query_pos, frequencies=omega)
                scores[..., :S] = q_sink @ k_rot[..., :S, :].transpose(-1, -2)
            scores = (scores * logit_scale).masked_fill(~visible, float("-inf"))  # (B, h, T, T)
            wide = torch.promote_types(scores.dtype, torch.float32)  # half: softmax in float32
            weights = scores.to(wide).softmax(dim=-1).to(v.dtype)  # (B, h, T, T)
            return mha.W_o(merge_heads(weights @ v))  # (B, T, d)
        return attend

    with evaluating(model):
        X = model.dropout(model.embedding(tokens))  # (B, T, d); rotary: no position table
        for block in model.blocks:  # each block's own norms, residuals and feed-forward net
            X = block(X, attention=policy_attention(block.self_attention))  # (B, T, d)
        return model.head(model.norm(X))  # (B, T, V)


# --- multi-head latent attention ----------------------------------------------------------------

class MultiHeadLatentAttention(nn.Module):
    r"""Multi-head latent attention (MLA): keys and values come from one cached latent.

    For the token at position ``t`` with hidden state :math:`x_t`, in head ``i``:

    .. math::
        c_t = W^{DKV} x_t \in \mathbb R^{d_c}, \quad
        k^C_{t,i} = W^{UK}_i c_t, \quad v_{t,i} = W^{UV}_i c_t, \quad
        k^R_t = \mathrm{RoPE}_t(W^{KR} x_t) \in \mathbb R^{d^R}

        q^C_{t,i} = W^Q_i x_t, \quad q^R_{t,i} = \mathrm{RoPE}_t(W^{QR}_i x_t), \quad
        a_{ts,i} = \mathrm{softmax}_s\Big(\frac{q^{C\top}_{t,i} k^C_{s,i}
                   + q^{R\top}_{t,i} k^R_s}{\sqrt{d_h + d^R}}\Big)

        o_t = W^O \big[\textstyle\sum_s a_{ts,1} v_{s,1}; \dots; \sum_s a_{ts,h} v_{s,h}\big]

    Only :math:`c_t` and :math:`k^R_t` are cached: :math:`d_c + d^R` numbers per token and
    layer, against :math:`2 h d_h` for multi-head attention. The rotary part is kept apart
    ("decoupled") because a rotation between :math:`W^Q_i` and :math:`W^{UK}_i` would depend on
    the position and could not be absorbed.

    **Absorbed form** (``absorbed=True``): since
    :math:`q^{C\top}_{t,i} W^{UK}_i c_s = (W^{UK\top}_i W^Q_i x_t)^\top c_s`, the queries are
    projected straight into the latent space by :math:`W^{UK\top}_i W^Q_i` (``(d_c, d)`` per
    head), attention pools the latents themselves, and :math:`W^O_i W^{UV}_i` (``(d, d_c)``
    per head) maps the pooled latent to the output: keys and values are never materialised.
    Same function, other order of products.

    Args:
        num_hiddens: d. num_heads: h. latent_size: d_c.
        head_size: keyword-only; d_h, the size of the content query/key/value heads
            (default ``d / h``). rope_head_size: keyword-only; d^R, even (default 8).
        base: keyword-only; the rotary base.

    Shapes (``forward``):
        X ``(B, T, d)`` float; keyword-only ``is_causal`` (default True), ``absorbed``
        (default False), ``cache`` (``None`` or a :class:`~d2lattn.KVCache` that stores the
        latents as its ``keys`` ``(B, 1, T, d_c)`` and the rotated keys as its ``values``
        ``(B, 1, T, d^R)``; then ``X`` are the positions after the cached ones). Returns
        ``(B, T, d)``.

    Raises:
        ValueError: bad sizes at construction; ``X`` of the wrong shape or dtype.

    Example:
        >>> mla = MultiHeadLatentAttention(16, 4, latent_size=6, rope_head_size=2)
        >>> X = torch.randn(2, 5, 16)
        >>> torch.allclose(mla(X), mla(X, absorbed=True), atol=1e-6)
        True
        >>> mla.cache_values_per_token()
        8

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1, equations (9)-(19) (without the
    query compression of equations (12)-(13)).
    """

    def __init__(self, num_hiddens: int, num_heads: int, latent_size: int, *,
                 head_size: Optional[int] = None, rope_head_size: int = 8,
                 base: float = 10000.0) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, num_heads=num_heads,
                            latent_size=latent_size, rope_head_size=rope_head_size)
        if head_size is None:
            if num_hiddens % num_heads:
                raise ValueError(f"num_hiddens = {num_hiddens} must be divisible by num_heads "
                                 f"= {num_heads}, or give head_size")
            head_size = num_hiddens // num_heads
        check_positive_ints(head_size=head_size)
        if rope_head_size % 2:
            raise ValueError(f"rope_head_size must be even, got {rope_head_size}")
        d, h = num_hiddens, num_heads
        self.num_hiddens, self.num_heads, self.head_size = d, h, head_size
        self.latent_size, self.rope_head_size = latent_size, rope_head_size
        rope_frequencies(rope_head_size, base=base)  # checks base; forward builds them anew
        self.base = base  # on the device of the input, in float64
        self.W_q = nn.Linear(d, h * head_size, bias=False)  # content queries
        self.W_qr = nn.Linear(d, h * rope_head_size, bias=False)  # rotary queries
        self.W_dkv = nn.Linear(d, latent_size, bias=False)  # down: the cached latent
        self.W_uk = nn.Linear(latent_size, h * head_size, bias=False)  # up: keys
        self.W_uv = nn.Linear(latent_size, h * head_size, bias=False)  # up: values
        self.W_kr = nn.Linear(d, rope_head_size, bias=False)  # the shared rotary key
        self.W_o = nn.Linear(h * head_size, d, bias=False)

    def cache_values_per_token(self) -> int:
        """Numbers cached per token (this layer): ``d_c + d^R``."""
        return self.latent_size + self.rope_head_size

    def absorbed_weights(self) -> tuple:
        """``(W_q_absorbed (h, d_c, d), W_o_absorbed (h, d, d_c))``: the query projection into
        the latent space and the output projection from it, per head."""
        h, d_h, d_c = self.num_heads, self.head_size, self.latent_size
        U_k = self.W_uk.weight.view(h, d_h, d_c)  # (h, d_h, d_c)
        U_v = self.W_uv.weight.view(h, d_h, d_c)
        W_q = self.W_q.weight.view(h, d_h, self.num_hiddens)  # (h, d_h, d)
        W_o = self.W_o.weight.view(self.num_hiddens, h, d_h)  # (d, h, d_h)
        return (torch.einsum("hkc,hkd->hcd", U_k, W_q),  # (h, d_c, d)
                torch.einsum("dhk,hkc->hdc", W_o, U_v))  # (h, d, d_c)

    def forward(self, X: Tensor, *, is_causal: bool = True, absorbed: bool = False,
                cache: Optional[KVCache] = None) -> Tensor:
        """Latent attention of the ``T`` new positions over the cached and new ones.

        Args:
            X: ``(B, T, d)`` float, the parameters' dtype.
            is_causal: keyword-only; the queries are the last ``T`` of the ``K`` positions
                and see keys ``<=`` their own (lower-right aligned).
            absorbed: keyword-only; the absorbed order of products (same function).
            cache: keyword-only; ``None`` or a :class:`~d2lattn.KVCache` of latents
                ``(B, 1, K, d_c)`` and rotated keys ``(B, 1, K, d^R)``, updated in place.

        Returns:
            ``(B, T, d)``.
        """
        check_hidden_states(X, self.num_hiddens, dtype=self.W_q.weight.dtype)
        check_bool(is_causal=is_causal, absorbed=absorbed)
        B, T, _ = X.shape
        h, d_h, d_r = self.num_heads, self.head_size, self.rope_head_size
        past = len(cache) if cache is not None else 0
        pos = torch.arange(past, past + T, device=X.device)
        # 1. what is cached: the latent and the rotated shared key of every new token
        latent = self.W_dkv(X)[:, None]  # (B, 1, T, d_c)
        k_rope = rotary_embedding(self.W_kr(X)[:, None], pos, base=self.base)  # (B, 1, T, d^R)
        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope)  # (B, 1, K, d_c), (B, 1, K, d^R)
        K = latent.shape[2]
        q_rope = rotary_embedding(split_heads(self.W_qr(X), h), pos,
                                  base=self.base)  # (B, h, T, d^R)
        rope_scores = q_rope @ k_rope.transpose(-1, -2)  # (B, h, T, K)
        if absorbed:  # 2a. queries into the latent space; attention pools latents
            W_q_abs, W_o_abs = self.absorbed_weights()
            q_latent = torch.einsum("btd,hcd->bhtc", X, W_q_abs)  # (B, h, T, d_c)
            scores = q_latent @ latent.transpose(-1, -2) + rope_scores  # (B, h, T, K)
        else:  # 2b. explicit: up-project keys and values for every head
            q = split_heads(self.W_q(X), h)  # (B, h, T, d_h)
            keys = split_heads(self.W_uk(latent[:, 0]), h)  # (B, h, K, d_h)
            values = split_heads(self.W_uv(latent[:, 0]), h)  # (B, h, K, d_h)
            scores = q @ keys.transpose(-1, -2) + rope_scores  # (B, h, T, K)
        scores = scores / math.sqrt(d_h + d_r)
        if is_causal:  # queries are the last T of the K positions
            allowed = causal_mask(T, K, device=X.device)  # (T, K), lower-right aligned
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, h, T, K)
        if absorbed:  # 3a. pool the latents, then one (d, d_c) map per head
            pooled = weights @ latent  # (B, h, T, d_c)
            return torch.einsum("bhtc,hdc->btd", pooled, W_o_abs)  # (B, T, d)
        return self.W_o(merge_heads(weights @ values))  # 3b. (B, T, d)


# --- a paged KV cache ----------------------------------------------------------------------------

class PagedKVCache:
    r"""A KV cache in fixed-size blocks, shared by many sequences through block tables.

    A pool of ``num_blocks`` blocks of ``block_size`` token slots each (keys and values of
    ``num_heads`` heads). A sequence owns a *block table*, the list of its blocks in order:
    token ``n`` of the sequence lives in block ``table[n // block_size]``, slot
    ``n % block_size``. Blocks are taken from the free list only when a sequence crosses into
    a new block, and returned when it finishes, so a sequence wastes at most
    ``block_size - 1`` slots (its last block's tail), whatever its final length.

    :meth:`attend` reads the blocks through the table, one block at a time, with an online
    softmax (running maximum and sum, as in chapter 9), and equals softmax attention over the
    same keys stored contiguously.

    Args:
        num_blocks, block_size, num_heads, head_size: positive integers.
        dtype: keyword-only; the dtype of the stored keys and values.
        device: keyword-only; where the blocks live (default: the CPU).

    Attributes:
        key_blocks, value_blocks: ``(num_blocks, num_heads, block_size, head_size)``.
        block_tables: ``{seq_id: [block, ...]}``. lengths: ``{seq_id: tokens stored}``.

    Raises:
        ValueError: bad sizes; keys or values of the wrong shape or dtype; an unknown sequence.
        RuntimeError: no free block left (the server must wait or preempt a sequence).

    Example:
        >>> cache = PagedKVCache(num_blocks=4, block_size=2, num_heads=1, head_size=3)
        >>> cache.append("a", torch.zeros(1, 3, 3), torch.zeros(1, 3, 3))
        >>> cache.block_tables["a"], cache.num_free_blocks, cache.wasted_slots()
        ([0, 1], 2, 1)

    Source: Kwon et al. (2023), "Efficient Memory Management for Large Language Model Serving
    with PagedAttention", sections 4.1-4.3.
    """

    def __init__(self, num_blocks: int, block_size: int, num_heads: int, head_size: int, *,
                 dtype: torch.dtype = torch.float32,
                 device: Optional[Union[torch.device, str]] = None) -> None:
        check_positive_ints(num_blocks=num_blocks, block_size=block_size, num_heads=num_heads,
                            head_size=head_size)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.block_size, self.num_heads, self.head_size, self.dtype = (
            block_size, num_heads, head_size, dtype)
        shape = (num_blocks, num_heads, block_size, head_size)
        self.key_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self.value_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self.device = self.key_blocks.device
        self._free: List[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0, 1, ...
        self.block_tables: Dict[object, List[int]] = {}
        self.lengths: Dict[object, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks not owned by any sequence."""
        return len(self._free)

    def wasted_slots(self) -> int:
        """Slots allocated but not (yet) holding a token, over all sequences."""
        return sum(len(t) * self.block_size - self.lengths[s]
                   for s, t in self.block_tables.items())

    def append(self, seq_id: object, keys: Tensor, values: Tensor) -> None:
        """Store the keys and values ``(num_heads, T_new, head_size)`` of ``T_new`` new tokens
        of sequence ``seq_id`` (a new id starts a sequence), taking blocks as needed."""
        check_paged_chunk(keys, values, self.num_heads, self.head_size, self.dtype)
        table = self.block_tables.get(seq_id, [])
        n = self.lengths.get(seq_id, 0)
        T_new = keys.shape[1]
        needed = -(-(n + T_new) // self.block_size) - len(table)
        if needed > len(self._free):  # checked before anything changes
            raise RuntimeError(f"out of blocks: sequence {seq_id!r} needs {needed} more, "
                               f"{len(self._free)} free")
        self.block_tables[seq_id] = table
        table.extend(self._free.pop() for _ in range(needed))
        for i in range(T_new):  # token n + i -> (block, slot)
            block, slot = divmod(n + i, self.block_size)
            self.key_blocks[table[block], :, slot] = keys[:, i]
            self.value_blocks[table[block], :, slot] = values[:, i]
        self.lengths[seq_id] = n + T_new

    def free(self, seq_id: object) -> None:
        """The sequence is finished: its blocks go back to the free list."""
        self._table(seq_id)
        self._free.extend(reversed(self.block_tables.pop(seq_id)))
        del self.lengths[seq_id]

    def gather(self, seq_id: object) -> tuple:
        """The keys and values of ``seq_id`` as contiguous ``(num_heads, T, head_size)``."""
        table, n = self._table(seq_id), self.lengths[seq_id]
        idx = torch.tensor(table, dtype=torch.long, device=self.device)
        keys = self.key_blocks[idx].transpose(0, 1).flatten(1, 2)[:, :n]  # (h, T, d_h)
        values = self.value_blocks[idx].transpose(0, 1).flatten(1, 2)[:, :n]
        return keys, values

    def attend(self, seq_id: object, queries: Tensor, *, is_causal: bool = True) -> Tensor:
        r"""Scaled dot-product attention of ``queries`` over the sequence's cached tokens,
        block by block through its block table.

        Args:
            seq_id: a sequence the cache holds (it may hold 0 tokens).
            queries: ``(H, Q, head_size)``, the cache's dtype and device; ``H`` a multiple of
                ``num_heads`` (grouped-query heads: query head ``i`` reads key/value head
                ``i // (H / num_heads)``).
            is_causal: keyword-only; the queries are the sequence's last ``Q`` tokens (query
                ``q`` sees tokens ``0 .. T - Q + q``; needs ``Q <= T``).

        Returns:
            ``(H, Q, head_size)`` in the cache's dtype. Scores, running maximum, sum and
            weighted values are accumulated in float32 (float64 for a float64 cache), as
            vLLM's reference kernel does. A query that sees no key (a sequence of 0 tokens with
            ``is_causal=False``) gets zeros, as ``F.scaled_dot_product_attention`` gives.

        Raises:
            ValueError: an unknown sequence; queries of the wrong shape, dtype or device.
        """
        table, n = self._table(seq_id), self.lengths[seq_id]
        check_bool(is_causal=is_causal)
        if (not isinstance(queries, Tensor) or queries.dim() != 3
                or queries.shape[0] % self.num_heads or queries.shape[0] == 0
                or queries.shape[2] != self.head_size or queries.dtype != self.dtype
                or queries.device != self.device or (is_causal and queries.shape[1] > n)):
            raise ValueError(f"queries must be {self.dtype} on {self.device} of shape (H, "
                             f"Q <= {n}, head_size = {self.head_size}) with H a multiple of "
                             f"num_heads = {self.num_heads}")
        H, Q = queries.shape[:2]
        r = H // self.num_heads  # query heads per key/value head
        wide = torch.promote_types(self.dtype, torch.float32)  # the accumulation dtype
        q = queries.to(wide).view(self.num_heads, r * Q, self.head_size) / math.sqrt(
            self.head_size)  # (g, r Q, d_h): the r query heads of a group, one after another
        m = torch.full((self.num_heads, r * Q, 1), float("-inf"), dtype=wide,
                       device=self.device)  # running max
        s = torch.zeros(self.num_heads, r * Q, 1, dtype=wide, device=self.device)  # running sum
        acc = torch.zeros(self.num_heads, r * Q, self.head_size, dtype=wide,
                          device=self.device)  # running weighted sum of values
        for j, block in enumerate(table):
            width = min(self.block_size, n - j * self.block_size)
            if width <= 0:
                break
            k = self.key_blocks[block, :, :width].to(wide)  # (g, width, d_h)
            v = self.value_blocks[block, :, :width].to(wide)
            scores = q @ k.transpose(-1, -2)  # (g, r Q, width)
            if is_causal:  # the queries are the last Q of n positions: lower-right aligned
                seen = causal_mask(Q, n, device=self.device)[
                    :, j * self.block_size:j * self.block_size + width]  # (Q, width)
                scores = scores.masked_fill(~seen.repeat(r, 1), float("-inf"))
            m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = (scores - safe).exp()
            correction = (m - safe).exp()
            s = s * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + p @ v
            m = m_new
        out = torch.where(s > 0, acc / s, torch.zeros_like(acc))  # no key: zeros, not 0 / 0
        return out.view(H, Q, self.head_size).to(self.dtype)  # (H, Q, d_h)

    def _table(self, seq_id: object) -> List[int]:
        if seq_id not in self.block_tables:
            raise ValueError(f"unknown sequence {seq_id!r}; known: {list(self.block_tables)}")
        return self.block_tables[seq_id]


def contiguous_waste(lengths: Sequence[int], max_len: int) -> int:
    """Slots wasted when every request reserves ``max_len`` contiguous slots up front (its
    final length is unknown when it starts): ``sum(max_len - n)``.

    Raises:
        ValueError: empty ``lengths``, a length outside ``[0, max_len]``.

    Example:
        >>> contiguous_waste([3, 10, 7], max_len=16)
        28
    """
    lens = check_lengths_list(lengths)
    check_positive_ints(max_len=max_len)
    if max(lens) > max_len:
        raise ValueError(f"lengths must be <= max_len = {max_len}, got {max(lens)}")
    return sum(max_len - n for n in lens)


def paged_waste(lengths: Sequence[int], block_size: int) -> int:
    """Slots wasted by a paged cache: the empty tail of each request's last block,
    ``sum(ceil(n / block_size) * block_size - n)``, less than ``block_size`` per request.

    Example:
        >>> paged_waste([3, 10, 7], block_size=4)
        4
    """
    lens = check_lengths_list(lengths)
    check_positive_ints(block_size=block_size)
    return sum(-(-n // block_size) * block_size - n for n in lens)
