"""A decoder-only Transformer language model (GPT) from d2lattn's blocks, and how it samples.

The model is a stack of pre-norm :class:`~d2lattn.transformer.TransformerEncoderBlock` s run
with ``is_causal=True`` (a block without cross-attention *is* a GPT block once the mask is
causal), between a token embedding and a linear read-out that shares its weight (weight
tying)::

    X = E[tokens] (+ P[positions])                      (B, T, d)
    X = block_l(X, is_causal=True)    l = 1 .. L        (B, T, d)
    logits = LN(X) @ E^T                                (B, T, V)

Positions are either rotary (RoPE, inside every attention) or a learned table added to the
embeddings. :meth:`GPT.generate` decodes greedily or samples with a temperature, top-k and
top-p (nucleus) filters, with or without a KV cache.

Sources: Radford et al. (2018, 2019), "Improving Language Understanding by Generative
Pre-Training" and "Language Models are Unsupervised Multitask Learners" (decoder-only, pre-norm
in GPT-2); Press & Wolf (2017), "Using the Output Embedding to Improve Language Models" (tying);
Fan et al. (2018) (top-k); Holtzman et al. (2020), "The Curious Case of Neural Text
Degeneration" (top-p); book chapter 12.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_bool,
    check_choice,
    check_dropout,
    check_logits,
    check_mask_rate,
    check_non_negative_ints,
    check_positive_ints,
    check_stream_scorer,
    check_temperature,
    check_tokens,
    check_top_k,
    check_top_p,
    values_trusted,
)
from ._modes import evaluating
from .linear import LinearMultiHeadAttention, RecurrentState
from .serving import MultiHeadLatentAttention
from .text import random_windows
from .training import Callback, fit
from .transformer import KVCache, TransformerEncoderBlock

__all__ = ["GPT", "GPTConfig", "fill_in_losses", "held_out_losses", "lr_schedule",
           "mask_tokens", "next_token_probs", "sliding_window_losses", "top_k_filter",
           "top_p_filter", "train_lm"]

ATTENTION_KINDS = ("softmax", "linear", "delta", "gated_delta", "mla")
RECURRENT_KINDS = ("linear", "delta", "gated_delta")  # chapter 14: a state, not a cache


@dataclass
class GPTConfig:
    """Sizes of a :class:`GPT`; the defaults are the chapter's Shakespeare model.

    Raises:
        ValueError: a size that is not a positive integer, a dropout outside ``[0, 1)``, an
            unknown ``positions`` or ``attention`` kind, a tuple of kinds whose length is not
            ``num_layers``, a recurrent core with ``positions="rotary"`` or ``causal=False``,
            an odd ``rope_head_size``.

    Example:
        >>> hybrid = GPTConfig(positions="learned", attention=("gated_delta",) * 3 + ("softmax",))
        >>> hybrid.layer_attention[-2:]
        ('gated_delta', 'softmax')
    """

    vocab_size: int = 65  # V: 65 characters in tiny Shakespeare
    block_size: int = 128  # T_max: the context the model is trained on
    num_hiddens: int = 128  # d
    num_heads: int = 4  # h (head size d / h = 32)
    num_layers: int = 4  # L
    ffn_num_hiddens: int = 512  # 4 d, as in GPT-2
    dropout: float = 0.0  # small models trained for minutes do not overfit
    positions: str = "rotary"  # "rotary" (RoPE in every attention) or "learned" (a table)
    tie_weights: bool = True  # the read-out reuses the embedding matrix
    # the attention of every layer (one name), or of each layer (a tuple of num_layers names):
    # "softmax" (chapter 12), chapter 14's recurrent cores "linear", "delta", "gated_delta",
    # or chapter 15's multi-head latent attention "mla"
    attention: Union[str, Tuple[str, ...]] = "softmax"
    causal: bool = True  # False: every position sees every other (a BERT-style masked LM)
    latent_size: Optional[int] = None  # "mla": d_c, the cached latent (default 4 d / h)
    rope_head_size: Optional[int] = None  # "mla": d^R, its rotary key (default d_h / 2, even)

    def __post_init__(self) -> None:
        check_positive_ints(vocab_size=self.vocab_size, block_size=self.block_size,
                            num_hiddens=self.num_hiddens, num_heads=self.num_heads,
                            num_layers=self.num_layers, ffn_num_hiddens=self.ffn_num_hiddens)
        check_dropout(self.dropout)
        check_bool(tie_weights=self.tie_weights, causal=self.causal)
        check_choice("positions", self.positions, ("rotary", "learned"))
        if isinstance(self.attention, list):  # a config read back from JSON
            self.attention = tuple(self.attention)
        if isinstance(self.attention, tuple):
            if len(self.attention) != self.num_layers:
                raise ValueError(f"attention must name one kind, or one per layer "
                                 f"(num_layers = {self.num_layers}), got "
                                 f"{len(self.attention)} names")
            for kind in self.attention:
                check_choice("attention", kind, ATTENTION_KINDS)
        else:
            check_choice("attention", self.attention, ATTENTION_KINDS)
        recurrent = sorted({k for k in self.layer_attention if k in RECURRENT_KINDS})
        if recurrent and self.positions == "rotary":
            raise ValueError(f"attention={recurrent[0]!r} has no rotary positions: use "
                             f"positions='learned'")
        if recurrent and not self.causal:
            raise ValueError(f"attention={recurrent[0]!r} is causal by construction (a "
                             f"recurrence over the past): use causal=True")
        for name in ("latent_size", "rope_head_size"):
            if getattr(self, name) is not None:
                check_positive_ints(**{name: getattr(self, name)})
        if self.rope_head_size is not None and self.rope_head_size % 2:
            raise ValueError(f"rope_head_size must be even, got {self.rope_head_size}")

    @property
    def layer_attention(self) -> Tuple[str, ...]:
        """The attention of each layer: ``num_layers`` names."""
        if isinstance(self.attention, tuple):
            return self.attention
        return (self.attention,) * self.num_layers


class _LatentSelfAttention(nn.Module):
    """Chapter 15's :class:`~d2lattn.MultiHeadLatentAttention` behind the call a Transformer
    block makes of its self-attention, so that a :class:`GPT` layer can hold it.

    Shapes (``forward``): ``queries``, ``keys``, ``values`` the same ``(B, T, d)`` tensor;
    keyword-only ``is_causal`` and ``kv_cache`` (a :class:`~d2lattn.KVCache` of latents and
    rotated keys, see :class:`~d2lattn.MultiHeadLatentAttention`). Returns ``(B, T, d)``.

    Raises:
        ValueError: keys or values other than the queries, ``valid_lens`` or ``attn_mask``
            (latent attention here is self-attention without masks beyond ``is_causal``).
    """

    def __init__(self, num_hiddens: int, num_heads: int, latent_size: int,
                 rope_head_size: int) -> None:
        super().__init__()
        self.mla = MultiHeadLatentAttention(num_hiddens, num_heads, latent_size,
                                            rope_head_size=rope_head_size)

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor,
                valid_lens: Optional[Tensor] = None, *, attn_mask: Optional[Tensor] = None,
                is_causal: bool = False, kv_cache: Optional[KVCache] = None) -> Tensor:
        """Latent self-attention of ``queries`` ``(B, T, d)``; returns ``(B, T, d)``."""
        if keys is not queries or values is not queries:
            raise ValueError("latent attention in a GPT block is self-attention: keys and "
                             "values must be the queries")
        if valid_lens is not None or attn_mask is not None:
            raise ValueError("latent attention in a GPT block takes no valid_lens or "
                             "attn_mask (only is_causal)")
        return self.mla(queries, is_causal=is_causal, cache=kv_cache)


def _attention_layer(config: GPTConfig, kind: str) -> Optional[nn.Module]:
    """The attention factory: the self-attention of a layer of kind ``kind``, or ``None`` for
    the block's own multi-head (softmax) attention."""
    c, d_h = config, config.num_hiddens // config.num_heads
    if kind in RECURRENT_KINDS:
        rule = "additive" if kind == "linear" else kind
        return LinearMultiHeadAttention(c.num_hiddens, c.num_heads, rule=rule)
    if kind == "mla":
        return _LatentSelfAttention(
            c.num_hiddens, c.num_heads,
            c.latent_size if c.latent_size is not None else 4 * d_h,
            c.rope_head_size if c.rope_head_size is not None else max(2, d_h // 4 * 2))
    return None


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row, set the others to ``-inf``.

    Ties at the k-th value are broken by position (``torch.topk``), so exactly ``k`` stay.

    Args:
        logits: ``(..., V)`` float. k: an integer in ``[1, V]``.

    Returns:
        a new ``(..., V)`` tensor (``logits`` is not modified).

    Example:
        >>> top_k_filter(torch.tensor([1.0, 3.0, 2.0, 0.0]), 2)
        tensor([-inf, 3., 2., -inf])

    Source: Fan et al. (2018), "Hierarchical Neural Story Generation", section 5.4.
    """
    check_logits(logits)
    check_top_k(k, logits.shape[-1])
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep.scatter_(-1, logits.topk(k, dim=-1).indices, True)
    return logits.masked_fill(~keep, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    r"""Keep the smallest set of most likely tokens whose probabilities sum to at least ``p``.

    Sort the probabilities in decreasing order, :math:`\pi_{(1)} \ge \pi_{(2)} \ge \dots`; keep
    the first :math:`m` with :math:`m = \min\{m : \sum_{i \le m} \pi_{(i)} \ge p\}`. Token
    ``(i)`` is kept when the mass *before* it is still below ``p``. The most likely token is
    always kept; ``p = 1`` keeps every token (the logits are returned unchanged, whatever the
    rounding of a sum over a large vocabulary). The mass is summed in float64.

    Args:
        logits: ``(..., V)`` float. p: a number in ``(0, 1]``.

    Returns:
        a new ``(..., V)`` tensor, the removed logits set to ``-inf``.

    Raises:
        ValueError: ``logits`` not a float tensor with ``V >= 1``, ``p`` outside ``(0, 1]``.

    Example:
        >>> logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
        >>> top_p_filter(logits, 0.8).exp()  # 0.5 + 0.3 reaches 0.8
        tensor([0.5000, 0.3000, 0.0000, 0.0000])

    Source: Holtzman et al. (2020), "The Curious Case of Neural Text Degeneration", eq. (2).
    """
    check_logits(logits)
    check_top_p(p)
    if logits.shape[-1] == 0:  # as top_k_filter: no token to keep
        raise ValueError("logits must have a vocabulary of at least one token (V >= 1), got "
                         f"shape {tuple(logits.shape)}")
    if p >= 1:  # every token: no rounded sum may decide that the mass is already complete
        return logits.clone()
    probs, order = logits.float().softmax(dim=-1).sort(dim=-1, descending=True)
    # the mass before each token, summed in float64 (a float32 sum over 50k tokens drifts by
    # more than the smallest probabilities; exact probabilities such as 1/2 + 1/4 stay exact)
    wide = probs.to(torch.float32 if probs.device.type == "mps" else torch.float64)
    mass_before = wide.cumsum(dim=-1) - wide  # (..., V)
    keep_sorted = mass_before < p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def next_token_probs(logits: Tensor, *, temperature: float = 1.0, top_k: Optional[int] = None,
                     top_p: Optional[float] = None) -> Tensor:
    """The sampling distribution: logits divided by the temperature, then top-k, then top-p.

    Computed in float32 at least (float64 stays float64), so float16 logits divided by a
    small temperature do not overflow; a row that would still overflow (a temperature near
    zero) is shifted by its largest logit first, so the other tokens get ``-inf``, never
    ``inf - inf`` (NaN). Temperature ``0`` is the limit of ever smaller temperatures, taken
    by ``argmax``: all the mass on the most likely token (the first one, on ties), which is
    what ``greedy`` decoding picks.

    Args:
        logits: ``(..., V)`` float, unnormalized scores of the next token.
        temperature: keyword-only; a finite number ``>= 0`` (``< 1`` sharpens, ``> 1``
            flattens). ``0`` is the limit of a vanishing temperature, greedy decoding: all the
            mass on the most likely token (ties: the lowest index, as ``argmax``), which every
            top-k and top-p filter keeps.
        top_k: keyword-only; ``None`` or an integer in ``[1, V]``.
        top_p: keyword-only; ``None`` or a number in ``(0, 1]``.

    Returns:
        ``(..., V)`` probabilities that sum to one, zero outside the kept tokens: float32 for
        float16, bfloat16 and float32 logits (half-precision probabilities below 6e-8 would
        round to zero), float64 for float64 logits.

    Raises:
        ValueError: a temperature that is negative or not finite, a bad ``top_k`` or ``top_p``
            (``top_p = 0`` too: it would keep no token).

    Example:
        >>> next_token_probs(torch.tensor([2.0, 1.0, 0.0]), temperature=0.5, top_k=2)
        tensor([0.8808, 0.1192, 0.0000])
        >>> next_token_probs(torch.tensor([2.0, 1.0, 0.0], dtype=torch.float16), temperature=1e-3)
        tensor([1., 0., 0.])
        >>> next_token_probs(torch.tensor([2.0, 1.0, 2.0]), temperature=0)  # ties: the first
        tensor([1., 0., 0.])
    """
    check_logits(logits)
    check_temperature(temperature, allow_zero=True)
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (..., V)
    if temperature == 0:
        if wide.shape[-1] == 0:
            raise ValueError("logits must have a vocabulary of at least one token (V >= 1)")
        if top_k is not None:  # the filters keep the argmax, but their arguments are checked
            check_top_k(top_k, wide.shape[-1])
        if top_p is not None:
            check_top_p(top_p)
        return torch.zeros_like(wide).scatter_(-1, wide.argmax(dim=-1, keepdim=True), 1.0)
    scaled = wide / temperature  # (..., V)
    if wide.shape[-1]:  # a row whose largest scaled logit overflowed: shift it first (the
        # largest becomes 0, the others finite or -inf: never inf - inf); no host sync
        top = wide.amax(dim=-1, keepdim=True)  # (..., 1)
        overflow = ~torch.isfinite(scaled.amax(dim=-1, keepdim=True)) & torch.isfinite(top)
        scaled = torch.where(overflow, (wide - top) / temperature, scaled)
    wide = scaled
    if top_k is not None:
        wide = top_k_filter(wide, top_k)
    if top_p is not None:
        wide = top_p_filter(wide, top_p)
    return wide.softmax(dim=-1)


class GPT(nn.Module):
    r"""A decoder-only Transformer language model.

    .. math::
        X^{(0)} = E[x] \;(+\, P), \qquad X^{(l)} = \mathrm{Block}_l(X^{(l-1)}), \qquad
        \mathrm{logits} = \mathrm{LN}(X^{(L)})\, E^\top

    Each block is ``TransformerEncoderBlock(d, h, ffn, dropout, norm_first=True,
    activation="gelu", rotary=..., self_attention=...)`` called with ``is_causal=True``. Its
    self-attention is the kind ``config.attention`` names for that layer, built in place:
    multi-head softmax attention (``"softmax"``, the block's own), a
    :class:`~d2lattn.LinearMultiHeadAttention` (``"linear"``, ``"delta"``, ``"gated_delta"``,
    chapter 14) or a :class:`~d2lattn.MultiHeadLatentAttention` (``"mla"``, chapter 15, behind
    the block's call); a tuple of kinds, one per layer, builds a hybrid.

    Args:
        config: a :class:`GPTConfig`.

    Shapes (``forward``):
        tokens ``(B, T)`` integers (int64, or int8 .. int32, uint8: converted to int64) in
        ``[0, V)``; ``T <= block_size`` counting the cached positions. Keyword-only
        ``kv_caches``: ``None`` or a list of ``num_layers``
        :class:`~d2lattn.KVCache` or :class:`~d2lattn.RecurrentState` (see
        :meth:`new_caches`); then ``tokens`` are the positions that follow the cached ones.
        Returns logits ``(B, T, V)`` float.

    Attributes:
        The attention weights of the last call of a softmax layer are
        ``blocks[l].self_attention.attention_weights``, ``(B, h, T, K)``.

    Raises:
        ValueError: a config that is not a :class:`GPTConfig`; tokens not an integer
            ``(B, T)`` tensor in ``[0, V)`` (the range is not read on the ``meta`` device),
            more positions than ``block_size``, a wrong number of caches, caches holding
            different numbers of positions.

    Example:
        >>> model = GPT(GPTConfig(vocab_size=10, block_size=8, num_hiddens=16, num_heads=2,
        ...                       num_layers=2, ffn_num_hiddens=32))
        >>> model(torch.zeros(3, 5, dtype=torch.long)).shape
        torch.Size([3, 5, 10])
        >>> model.generate(torch.zeros(1, 2, dtype=torch.long), 4, greedy=True).shape
        torch.Size([1, 6])

    Source: Radford et al. (2019); book chapters 12, 14 (recurrent cores) and 15 (MLA).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = c = config
        self.embedding = nn.Embedding(c.vocab_size, c.num_hiddens)
        self.positions = (nn.Embedding(c.block_size, c.num_hiddens)
                          if c.positions == "learned" else None)
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerEncoderBlock(c.num_hiddens, c.num_heads, c.ffn_num_hiddens, c.dropout,
                                    norm_first=True, activation="gelu",
                                    rotary=c.positions == "rotary",
                                    self_attention=_attention_layer(c, kind))
            for kind in c.layer_attention)
        self.norm = nn.LayerNorm(c.num_hiddens)
        self.head = nn.Linear(c.num_hiddens, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_weights:
            self.head.weight = self.embedding.weight  # one (V, d) matrix reads and writes

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation: normal(0, 0.02) weights, zero biases
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self, *, non_embedding: bool = False) -> int:
        """Trainable parameters (``requires_grad``), the tied matrix counted once.

        Args:
            non_embedding: keyword-only; leave out the token embedding (and the read-out
                tied to it) and the learned position table. This is the ``N`` of the
                ``6 N D`` of :func:`~d2lattn.training_flops`, counted as Kaplan et al. (2020,
                section 2.1) count it, without the embeddings. (nanoGPT's
                ``get_num_params(non_embedding=True)`` leaves out only the position table
                and keeps the tied matrix.) A read-out that is not tied is counted.

        Example:
            >>> model = GPT(GPTConfig(vocab_size=10, block_size=8, num_hiddens=16,
            ...                       num_heads=2, num_layers=1, ffn_num_hiddens=32,
            ...                       positions="learned"))
            >>> model.num_parameters() - model.num_parameters(non_embedding=True)
            288
        """
        check_bool(non_embedding=non_embedding)
        skip = set()
        if non_embedding:
            skip.add(id(self.embedding.weight))
            if self.positions is not None:
                skip.add(id(self.positions.weight))
        return sum(p.numel() for p in self.parameters()
                   if p.requires_grad and id(p) not in skip)

    def new_caches(self) -> List[Union[KVCache, RecurrentState]]:
        """One empty cache per layer: a :class:`~d2lattn.KVCache`, or a
        :class:`~d2lattn.RecurrentState` for the recurrent cores of chapter 14."""
        return [RecurrentState() if kind in RECURRENT_KINDS else KVCache()
                for kind in self.config.layer_attention]

    def forward(self, tokens: Tensor, *,
                kv_caches: Optional[List[Union[KVCache, RecurrentState]]] = None) -> Tensor:
        """Logits of the next token at every position.

        Args:
            tokens: ``(B, T)`` integer ids in ``[0, V)`` (int8 .. int64 or uint8, used as
                int64); with ``kv_caches``, the ``T``
                positions after the cached ones (``past + T <= block_size``).
            kv_caches: keyword-only; ``None`` or one cache per layer (:meth:`new_caches`),
                updated in place.

        Returns:
            ``(B, T, V)`` logits, the dtype of the parameters.

        Raises:
            ValueError: see the class docstring.
        """
        c = self.config
        check_tokens(tokens, "tokens", c.vocab_size, any_int=True)
        if tokens.dtype != torch.long:  # int8 .. int32, uint8: nn.Embedding takes int64
            tokens = tokens.long()
        B, T = tokens.shape
        if kv_caches is not None and not c.causal:
            raise ValueError("kv_caches need a causal model (config.causal=True)")
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"kv_caches must hold one cache per layer ({len(self.blocks)}), "
                             f"got {len(kv_caches)}")
        past = len(kv_caches[0]) if kv_caches is not None else 0
        if kv_caches is not None and any(len(cache) != past for cache in kv_caches):
            raise ValueError(f"kv_caches must all hold the same number of positions, got "
                             f"{[len(cache) for cache in kv_caches]} (one per layer)")
        if past + T > c.block_size:
            raise ValueError(f"{past} cached + {T} new positions exceed block_size = "
                             f"{c.block_size}")
        X = self.embedding(tokens)  # (B, T, d)
        if self.positions is not None:
            X = X + self.positions(torch.arange(past, past + T, device=tokens.device))
        X = self.dropout(X)
        for l, block in enumerate(self.blocks):
            X = block(X, is_causal=c.causal,
                      kv_cache=None if kv_caches is None else kv_caches[l])  # (B, T, d)
        return self.head(self.norm(X))  # (B, T, V)

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, *, greedy: bool = False,
                 temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, use_cache: Optional[bool] = None,
                 generator: Optional[torch.Generator] = None) -> Tensor:
        """Continue ``prompt`` by ``max_new_tokens`` tokens, one at a time.

        Each step turns the last position's logits into a distribution with
        :func:`next_token_probs` and takes its most likely token (``greedy=True``) or a
        sample from it.

        Args:
            prompt: ``(B, T0)`` int64 tokens, ``T0 >= 1``.
            max_new_tokens: a non-negative integer.
            greedy: keyword-only; the argmax instead of a sample (then ``temperature``,
                ``top_k`` and ``top_p`` must keep their defaults).
            temperature, top_k, top_p: keyword-only; see :func:`next_token_probs`
                (``temperature=0`` decodes greedily; the probabilities are float32).
            use_cache: keyword-only; ``True`` keeps every layer's keys and values in a
                :class:`~d2lattn.KVCache` and feeds one new token per step (needs
                ``T0 + max_new_tokens <= block_size``); ``False`` recomputes the whole
                context at every step, cropped to the last ``block_size`` tokens; ``None``
                (default) caches when the text fits the context.
            generator: keyword-only; the random generator of the samples.

        Returns:
            ``(B, T0 + max_new_tokens)`` int64, the prompt followed by the new tokens.

        Raises:
            ValueError: bad arguments (a prompt that is not ``(B, T0)`` integers, a negative
                length, a bad temperature, top-k or top-p, sampling options with
                ``greedy=True``, ``use_cache=True`` for a text longer than ``block_size``).
        """
        c = self.config
        if not c.causal:
            raise ValueError("generate() needs a causal model (config.causal=True); a masked "
                             "language model does not write left to right")
        check_tokens(prompt, "prompt", c.vocab_size, any_int=True)
        if prompt.shape[1] < 1:
            raise ValueError("prompt must be an integer tensor of shape (B, T0) with T0 >= 1")
        check_non_negative_ints(max_new_tokens=max_new_tokens)
        check_bool(greedy=greedy)
        check_temperature(temperature, allow_zero=True)
        if greedy and (temperature != 1.0 or top_k is not None or top_p is not None):
            raise ValueError("greedy=True takes the argmax: leave temperature, top_k and top_p "
                             "at their defaults")
        check_top_k(top_k, c.vocab_size, optional=True)
        check_top_p(top_p, optional=True)
        total = prompt.shape[1] + max_new_tokens
        if use_cache is None:
            use_cache = total <= c.block_size
        check_bool(use_cache=use_cache)
        if use_cache and total > c.block_size:
            raise ValueError(f"use_cache=True needs T0 + max_new_tokens = {total} <= "
                             f"block_size = {c.block_size}")
        tokens = prompt
        caches = self.new_caches() if use_cache else None
        feed = prompt  # with a cache: the positions not yet seen by the model
        # the prompt's ids were checked above and the later ones are the model's own, so the
        # loop skips the range checks: it never reads a value back to the host
        with evaluating(self), values_trusted():
            for _ in range(max_new_tokens):
                if caches is not None:
                    logits = self(feed, kv_caches=caches)[:, -1]  # (B, V)
                else:
                    logits = self(tokens[:, -c.block_size:])[:, -1]  # (B, V)
                if greedy or temperature == 0:  # temperature 0: the greedy limit
                    nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
                else:
                    probs = next_token_probs(logits, temperature=temperature, top_k=top_k,
                                             top_p=top_p)
                    nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
                tokens = torch.cat([tokens, nxt], dim=1)
                feed = nxt
        return tokens


def mask_tokens(tokens: Tensor, mask_id: int, *, rate: float = 0.15,
                generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
    """BERT's corruption for masked language modelling.

    Each position is chosen with probability ``rate``. A chosen position becomes ``mask_id``
    with probability 0.8, a random token of ``[0, mask_id)`` with 0.1, and stays itself with
    0.1; the model must predict the original token at every chosen position, whatever it sees.

    Args:
        tokens: ``(B, T)`` int64 in ``[0, mask_id)`` (the ``mask_id`` token is the last one of
            the model's vocabulary). mask_id: a positive integer.
        rate: keyword-only; the share of positions chosen, in ``(0, 1)``.
        generator: keyword-only; the random generator of the choices.

    Returns:
        ``(inputs, targets)``, both ``(B, T)`` int64 and new tensors: ``inputs`` the corrupted
        tokens, ``targets`` the original token at chosen positions and ``-100`` elsewhere (the
        ``ignore_index`` of ``F.cross_entropy``).

    Raises:
        ValueError: tokens not ``(B, T)`` integers in ``[0, mask_id)``, a bad ``mask_id`` or
            ``rate``.

    Example:
        >>> x = torch.zeros(2, 1000, dtype=torch.long)
        >>> inputs, targets = mask_tokens(x, 5, generator=torch.Generator().manual_seed(0))
        >>> round((targets != -100).float().mean().item(), 2), int(inputs.max())
        (0.15, 5)

    Source: Devlin et al. (2019), "BERT: Pre-training of Deep Bidirectional Transformers for
    Language Understanding", section 3.1 (task 1); book chapter 12.
    """
    check_positive_ints(mask_id=mask_id)
    check_mask_rate(rate)
    check_tokens(tokens, "tokens", vocab_size=mask_id)
    B, T = tokens.shape
    # drawn on the generator's device (the CPU by default), then moved to the tokens'
    where = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(3, B, T, generator=generator, device=where).to(tokens.device)  # (3, B, T)
    # u[0]: chosen? u[1]: masked or not? u[2]: a random token or itself?
    chosen = u[0] < rate
    targets = tokens.masked_fill(~chosen, -100)
    masked = chosen & (u[1] < 0.8)
    swapped = chosen & (u[1] >= 0.8) & (u[2] < 0.5)
    random = torch.randint(0, mask_id, (B, T), generator=generator,
                           device=where).to(tokens.device)
    inputs = torch.where(masked, torch.full_like(tokens, mask_id), tokens)
    inputs = torch.where(swapped, random, inputs)
    return inputs, targets


def lr_schedule(step: int, steps: int, lr: float, *, warmup: int = 0,
                min_ratio: float = 0.1) -> float:
    """The learning rate of step ``step`` (0-based) out of ``steps``: a linear warm-up over
    ``warmup`` steps from ``lr / warmup`` to ``lr``, then a cosine decay to ``min_ratio * lr``.

    Example:
        >>> [round(lr_schedule(s, 10, 1.0, warmup=2), 3) for s in (0, 1, 2, 9)]
        [0.5, 1.0, 1.0, 0.1]

    Source: Loshchilov & Hutter (2017), SGDR (cosine decay); the warm-up of Vaswani et al.
    (2017), section 5.3, and Goyal et al. (2017).
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train_lm(model: GPT, data: Tensor, *, steps: int, batch_size: int = 32, lr: float = 2e-3,
             seed: int = 0, stop_after: Optional[int] = None, clip: Optional[float] = 1.0,
             callback: Optional[Callback] = None, warmup: int = 50, min_ratio: float = 0.1,
             weight_decay: float = 0.1, mask_id: Optional[int] = None,
             mask_rate: float = 0.15) -> List[float]:
    """Train ``model`` as a next-token predictor on random windows of a token stream.

    AdamW (betas 0.9, 0.95; weight decay on matrices only), the learning rate of
    :func:`lr_schedule`, gradient-norm clipping at ``clip``. The windows come from a generator
    seeded with ``seed``, so two runs with the same seed and the same initial weights see the
    same batches. The loop and its arguments follow the library's training convention
    (:mod:`d2lattn.training`).

    Args:
        model: the :class:`GPT` to train (in place).
        data: ``(N,)`` int64, the training token stream.
        steps: optimizer steps (keyword-only, as all below).
        batch_size: windows per step. lr: the peak learning rate.
        seed: the seed of the window generator.
        stop_after: run only the first ``stop_after`` steps of the ``steps``-step schedule.
        clip: the largest global gradient norm (``None``: no clipping).
        callback: ``callback(step, model, loss)`` after each step, ``step`` from 1.
        warmup, min_ratio: the schedule's warm-up steps and final fraction of ``lr``.
        weight_decay: AdamW's, on the weight matrices.
        mask_id: ``None`` trains a causal model to predict the next token. An integer trains a
            non-causal model (``config.causal=False``) as a masked language model: each window
            is corrupted by :func:`mask_tokens` with this ``mask_id`` (the last token of the
            model's vocabulary) and ``mask_rate``, and the loss is taken at the chosen
            positions only.

    Returns:
        the training loss of every step (nats per token, on that step's batch, before the
        update). A non-finite loss stops training (the list ends with it). The model is left
        in eval mode.

    Raises:
        ValueError: sizes that are not positive integers, a ``mask_id`` that does not fit the
            model (see above).

    Source: book chapter 12; the schedule of :func:`lr_schedule`; AdamW, Loshchilov & Hutter
    (2019).
    """
    check_positive_ints(steps=steps, batch_size=batch_size)
    if mask_id is not None and model.config.causal:
        raise ValueError("mask_id trains a masked language model: the model must have "
                         "config.causal=False")
    if mask_id is None and not model.config.causal:
        raise ValueError("a non-causal model sees the next token: train it with mask_id")
    if mask_id is not None and mask_id != model.config.vocab_size - 1:
        raise ValueError(f"mask_id must be the last token of the vocabulary, "
                         f"{model.config.vocab_size - 1}, got {mask_id!r}")
    T = model.config.block_size
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(seed)

    def batch_loss() -> Tensor:
        X, Y = random_windows(data, batch_size, T, generator=generator)
        if mask_id is not None:
            X, Y = mask_tokens(X, mask_id, rate=mask_rate, generator=generator)
        X, Y = X.to(model.embedding.weight.device), Y.to(model.embedding.weight.device)
        return F.cross_entropy(model(X).flatten(0, 1), Y.flatten())

    return fit(model, opt, batch_loss, steps=steps, stop_after=stop_after, clip=clip,
               lr_at=lambda step: lr_schedule(step, steps, lr, warmup=warmup,
                                              min_ratio=min_ratio),
               callback=callback)


@torch.no_grad()
def held_out_losses(model: GPT, data: Tensor, *, batch_size: int = 64,
                    max_windows: Optional[int] = None) -> Tensor:
    """The loss of every prediction on a token stream cut into consecutive windows.

    The stream is cut into windows of ``block_size + 1`` tokens that overlap by one: window
    ``w`` predicts tokens ``w T + 1 .. w T + T`` from the tokens before them in the window, so
    every token but the first is predicted once, and the prediction at window position ``t``
    sees ``t + 1`` tokens of context.

    Args:
        model: a causal :class:`GPT`. data: ``(N,)`` int64 tokens, ``N >= block_size + 1``.
        batch_size: windows per forward pass. max_windows: use only the first windows.

    Returns:
        ``(W, T)`` float32 (float64 for a float64 model) on the CPU: the cross-entropy in
        **bits** of each prediction, window by window, computed from logits widened to
        float32 (a bfloat16 model's losses are not rounded to its steps of 1/64 bit); the
        mean is the held-out bits per character, the mean over axis 0 the loss by position.
        The model runs in eval mode and is given back in the mode it was in.

    Raises:
        ValueError: a model that is not a causal :class:`GPT`, ``data`` not 1-D tokens of its
            vocabulary or too short, sizes that are not positive integers.
    """
    check_stream_scorer(model, data, 0)
    T = model.config.block_size
    check_positive_ints(batch_size=batch_size)
    if max_windows is not None:
        check_positive_ints(max_windows=max_windows)
    W = (data.numel() - 1) // T
    if max_windows is not None:
        W = min(W, max_windows)
    device = model.embedding.weight.device
    index = torch.arange(W)[:, None] * T + torch.arange(T + 1)  # (W, T + 1)
    out = []
    with evaluating(model):
        for chunk in index.split(batch_size):
            windows = data[chunk].to(device)  # (b, T + 1)
            logits = model(windows[:, :-1])  # (b, T, V)
            wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
            nats = F.cross_entropy(wide.transpose(1, 2), windows[:, 1:], reduction="none")
            out.append((nats / math.log(2)).cpu())  # (b, T) bits
    return torch.cat(out)  # (W, T)


@torch.no_grad()
def sliding_window_losses(model: GPT, data: Tensor, *, stride: Optional[int] = None,
                          batch_size: int = 64) -> Tensor:
    """The loss of every prediction on a token stream, each made with a long context.

    :func:`held_out_losses` cuts the stream into windows that do not overlap, so a window's
    first predictions see almost no context. Here windows of ``block_size + 1`` tokens start
    every ``stride`` tokens; the first window scores all its predictions, every later one only
    its last ``stride``, which see at least ``block_size - stride + 1`` tokens. Every token
    from the second to the last one a window reaches is predicted exactly once (the fewer than
    ``stride`` tokens after the last window are left out). With the default
    ``stride = block_size // 2`` every prediction after the first window's sees at least half
    a context, at twice the cost of :func:`held_out_losses`.

    Args:
        model: a :class:`GPT` (causal). data: ``(N,)`` int64 tokens, ``N > block_size + 1``.
        stride: tokens between window starts, ``1 .. block_size`` (``block_size`` scores as
            :func:`held_out_losses` does).
        batch_size: windows per forward pass.

    Returns:
        ``(P,)`` float on the CPU: the cross-entropy in **bits** of each scored prediction, in
        the order of the stream; the mean is the held-out bits per character. The model runs
        in eval mode and is given back in the mode it was in.

    Raises:
        ValueError: a bidirectional model, ``data`` too short or not 1-D integer tokens, a
            ``stride`` outside ``1 .. block_size``.

    Source: the sliding-window inference that Press et al. (2021), "Shortformer", set against
    non-overlapping windows (whose first tokens suffer the "early token curse"), with a
    stride of half a window; book chapter 12.
    """
    check_stream_scorer(model, data, 1)
    T = model.config.block_size
    stride = T // 2 if stride is None else stride
    check_positive_ints(stride=stride, batch_size=batch_size)
    if stride > T:
        raise ValueError(f"stride must be at most block_size = {T}, got {stride}")
    device = model.embedding.weight.device
    starts = torch.arange(0, data.numel() - T, stride)  # windows of T + 1 tokens that fit
    index = starts[:, None] + torch.arange(T + 1)  # (W, T + 1)
    out = []
    with evaluating(model):
        for k, chunk in enumerate(index.split(batch_size)):
            windows = data[chunk].to(device)  # (b, T + 1)
            logits = model(windows[:, :-1])  # (b, T, V)
            wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
            nats = F.cross_entropy(wide.transpose(1, 2), windows[:, 1:],
                                   reduction="none")  # (b, T)
            bits = (nats / math.log(2)).cpu()
            if k == 0:  # the stream's first window: all its predictions
                out.append(bits[0])
                bits = bits[1:]
            out.append(bits[:, T - stride:].reshape(-1))
    return torch.cat(out)  # (P,)


@torch.no_grad()
def fill_in_losses(model: GPT, data: Tensor, *, mask_id: Optional[int] = None,
                   rate: float = 0.15, seed: int = 0, max_windows: Optional[int] = None,
                   batch_size: int = 64) -> Tensor:
    """The loss of filling in blanks of a token stream, for a masked or a causal model.

    The stream is cut into consecutive windows of ``block_size`` tokens; positions ``1 ..
    T - 1`` of each are blanked with probability ``rate`` (a generator seeded with ``seed``,
    so two models are scored on the same blanks). A masked model (``config.causal=False``)
    sees every blank replaced by ``mask_id`` and the rest of the window on both sides; a
    causal model predicts each blank from the tokens to its left only (its logits at the
    position before), which is all it can use.

    Args:
        model: a :class:`GPT`. data: ``(N,)`` int64 tokens.
        mask_id: keyword-only; required for a masked model, ignored for a causal one.
        rate, seed, max_windows, batch_size: keyword-only; as above.

    Returns:
        ``(n,)`` float on the CPU: the cross-entropy in **bits** of every blank, window by
        window. The windows go to the model's device; the model runs in eval mode and is
        given back in the mode it was in.

    Raises:
        ValueError: a masked model without ``mask_id``, a bad ``rate``, too little data.

    Source: the masked-LM evaluation of Devlin et al. (2019); book chapter 12.
    """
    check_mask_rate(rate)
    if not model.config.causal and mask_id is None:
        raise ValueError("a masked model needs mask_id")
    T = model.config.block_size
    W = data.numel() // T
    if max_windows is not None:
        W = min(W, max_windows)
    if W < 1:
        raise ValueError(f"data must hold at least block_size = {T} tokens")
    device = model.embedding.weight.device
    windows = data[: W * T].view(W, T)  # (W, T)
    blanks = torch.rand(W, T, generator=torch.Generator().manual_seed(seed)) < rate
    blanks[:, 0] = False  # a causal model needs one token to its left
    out = []
    with evaluating(model):
        for x, b in zip(windows.split(batch_size), blanks.split(batch_size)):
            x, b = x.to(device), b.to(device)  # (b, T) each
            if model.config.causal:
                logits = model(x)[:, :-1]  # (b, T - 1, V): predicts positions 1 .. T - 1
                nats = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
                out.append(nats[b[:, 1:]].cpu())
            else:
                logits = model(x.masked_fill(b, mask_id))  # (b, T, V)
                nats = F.cross_entropy(logits.transpose(1, 2), x, reduction="none")
                out.append(nats[b].cpu())
    return torch.cat(out) / math.log(2)
