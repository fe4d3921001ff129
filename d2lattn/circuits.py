"""Circuits: an attention-only Transformer whose heads can be read, scored and ablated.

The tools of chapter 11 (induction heads), after Elhage et al. (2021), "A Mathematical
Framework for Transformer Circuits", and Olsson et al. (2022), "In-context Learning and
Induction Heads":

- :func:`repeated_sequences` — a block of distinct random tokens repeated to fill a sequence,
  with a random period, and :func:`determined_positions`, where the next token is fixed;
- :class:`AttentionOnlyBlock` and :class:`AttentionOnlyTransformer` — causal multi-head
  self-attention added to a residual stream, no MLP, no LayerNorm; every head's write into the
  residual stream is returned separately, so that it can be replaced (ablated);
- :func:`previous_token_score` and :func:`prefix_matching_score` — how much of a head's
  attention falls on the previous token, and on the token after an earlier occurrence of the
  current token (the signature of an induction head);
- :func:`induction_loss`, :func:`induction_accuracy`, :func:`head_means` and
  :func:`train_induction` — training and ablation on the determined positions;
- :func:`ov_circuit` and :func:`k_composition_circuit` — the same heads read off the weights:
  the token-to-logit map of a head's values, and the token-to-token score that a layer-2 key
  gets from what a layer-1 head wrote into it.

Shape legend: B batch, T sequence length, V vocabulary size, d ``num_hiddens``, h heads,
L layers, d_h = d / h.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_layer_and_head,
    check_positive_ints,
    check_square_weights,
    check_tokens,
)

from .masking import causal_mask, masked_softmax
from .multihead import MultiHeadAttention
from .positional import LearnedPositionalEmbedding
from .training import Callback, fit

__all__ = [
    "AttentionOnlyBlock",
    "AttentionOnlyTransformer",
    "determined_positions",
    "head_means",
    "induction_accuracy",
    "induction_loss",
    "k_composition_circuit",
    "ov_circuit",
    "prefix_matching_score",
    "previous_token_score",
    "repeated_sequences",
    "train_induction",
]

Ablation = Mapping[Tuple[int, int], Union[float, Tensor]]


def repeated_sequences(
    batch_size: int,
    seq_len: int,
    vocab: Union[int, Sequence[int], Tensor],
    periods: Tuple[int, int] = (6, 16),
    *,
    distractors: int = 0,
    generator: Optional[torch.Generator] = None,
) -> Tuple[Tensor, Tensor]:
    """Sequences made of a block of distinct random tokens repeated to fill ``seq_len``.

    Row ``b`` draws a period ``p_b`` uniformly from ``periods`` (both ends included), then
    ``p_b`` distinct tokens from ``vocab``, and repeats them: ``tokens[b, t] =
    block_b[t % p_b]``. Because the period varies, no fixed positional offset predicts the next
    token; looking up the earlier occurrence of the current token does (an induction head).
    With ``distractors = m > 0`` the first ``m`` positions hold distinct tokens that are not in
    the block and never recur, and the block repeats from position ``m`` on.

    Args:
        batch_size: B, a positive integer.
        seq_len: T, a positive integer.
        vocab: the tokens to draw from: an int ``V`` (tokens ``0 .. V-1``) or a 1-D sequence
            or integer tensor of distinct token ids.
        periods: ``(min_period, max_period)``, integers with ``1 <= min_period <= max_period
            <= len(vocab)`` (a block has distinct tokens).
        distractors: keyword-only; m, the number of leading non-recurring tokens, with
            ``0 <= m < seq_len`` and ``m + max_period <= len(vocab)``.
        generator: keyword-only; the random generator (default: torch's global one).

    Returns:
        ``(tokens, period)``: ``tokens`` ``(B, T)`` int64 and ``period`` ``(B,)`` int64.

    Raises:
        ValueError: if a size is not a positive integer, ``vocab`` has repeated entries or is
            not 1-D, or ``periods`` is not an increasing pair within ``[1, len(vocab)]``.

    Example:
        >>> tokens, period = repeated_sequences(2, 10, 32, (3, 4),
        ...                                     generator=torch.Generator().manual_seed(0))
        >>> tokens.shape, period.tolist()
        (torch.Size([2, 10]), [3, 4])
        >>> bool((tokens[1, 4:] == tokens[1, :6]).all())  # period 4: t and t - 4 agree
        True

    Source: the repeated random tokens on which Olsson et al. (2022) define induction heads
    (here with a random period and more than two repeats).
    """
    check_positive_ints(batch_size=batch_size, seq_len=seq_len)
    if isinstance(vocab, int) and not isinstance(vocab, bool):
        check_positive_ints(vocab=vocab)
        vocab_ids = torch.arange(vocab)
    else:
        vocab_ids = torch.as_tensor(vocab)
        if vocab_ids.dim() != 1 or vocab_ids.numel() == 0 or vocab_ids.is_floating_point() \
                or vocab_ids.dtype == torch.bool:
            raise ValueError(f"vocab must be an int or a non-empty 1-D sequence of token ids, "
                             f"got {vocab!r}")
        if vocab_ids.unique().numel() != vocab_ids.numel():
            raise ValueError("vocab must not repeat a token id")
        vocab_ids = vocab_ids.long()
    V = vocab_ids.numel()
    if (not isinstance(periods, (tuple, list)) or len(periods) != 2
            or any(isinstance(p, bool) or not isinstance(p, int) for p in periods)
            or not 1 <= periods[0] <= periods[1] <= V):
        raise ValueError(f"periods must be (min_period, max_period) with 1 <= min_period <= "
                         f"max_period <= len(vocab) = {V}, got {periods!r}")
    if (isinstance(distractors, bool) or not isinstance(distractors, int)
            or not 0 <= distractors < seq_len or distractors + periods[1] > V):
        raise ValueError(f"distractors must be an integer in [0, seq_len) with distractors + "
                         f"max_period <= len(vocab) = {V}, got {distractors!r}")
    period = torch.randint(periods[0], periods[1] + 1, (batch_size,), generator=generator)
    perm = torch.rand(batch_size, V, generator=generator).argsort(dim=1)  # (B, V) distinct
    t = torch.arange(seq_len - distractors)[None, :]  # positions of the repeats
    index = torch.cat([torch.arange(V - distractors, V).expand(batch_size, -1),  # (B, m)
                       t % period[:, None]], dim=1)  # (B, T): the block's t mod p_b
    return vocab_ids[perm.gather(1, index)], period  # (B, T), (B,)


def determined_positions(tokens: Tensor) -> Tensor:
    """True where ``tokens[b, i]`` occurred earlier in row ``b``.

    In a sequence of :func:`repeated_sequences` these are exactly the positions whose *next*
    token is fixed by the context (it is the token after the earlier occurrence), the positions
    ``i >= p_b``; before them the next token is a fresh random draw. Training and accuracy count
    these positions only.

    Args:
        tokens: ``(B, T)`` integer tensor.

    Returns:
        ``(B, T)`` bool.

    Raises:
        ValueError: if ``tokens`` is not an integer tensor of shape ``(B, T)``.

    Example:
        >>> determined_positions(torch.tensor([[5, 7, 9, 5, 7, 9, 5]])).int()
        tensor([[0, 0, 0, 1, 1, 1, 1]], dtype=torch.int32)

    Source: book chapter 11.
    """
    tokens = check_tokens(tokens)
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T): token i equals token j
    earlier = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool,
                         device=tokens.device).tril(-1)  # j < i
    return (same & earlier).any(dim=-1)  # (B, T)


def previous_token_score(attention_weights: Tensor) -> Tensor:
    r"""The mean attention weight that query ``i`` puts on key ``i - 1``.

    .. math:: s_\text{prev} = \frac{1}{B (T - 1)} \sum_b \sum_{i=1}^{T-1} \alpha_{b,i,i-1}

    1 for a head that always attends to the previous token; about ``1 / (i + 1)`` at query
    ``i`` for a head that spreads its weight evenly over a causal prefix.

    Args:
        attention_weights: ``(B, ..., T, T)`` float, queries by keys (for example ``(B, h, T,
            T)`` from :attr:`AttentionOnlyBlock.attention_weights`); ``T >= 2``.

    Returns:
        ``(...)``: one score per head (the middle axes), averaged over the batch and queries
        ``1 .. T-1``.

    Raises:
        ValueError: if ``attention_weights`` is not a float tensor ``(B, ..., T, T)`` with
            ``T >= 2``.

    Example:
        >>> weights = torch.eye(4).roll(-1, dims=1).tril()  # row i puts 1 on key i - 1
        >>> weights[0, 0] = 1.0  # query 0 can only attend to itself
        >>> previous_token_score(weights[None, None])  # (B=1, h=1, 4, 4)
        tensor([1.])

    Source: the previous-token heads of Elhage et al. (2021) and Olsson et al. (2022); the
    score is this book's average.
    """
    attention_weights = check_square_weights(attention_weights)
    if attention_weights.shape[-1] < 2:
        raise ValueError("attention_weights needs T >= 2 to have a previous token")
    on_previous = attention_weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, ..., T - 1)
    return on_previous.mean(dim=-1).mean(dim=0)  # (...)


def prefix_matching_score(attention_weights: Tensor, tokens: Tensor) -> Tensor:
    r"""The mean attention weight on the tokens that *followed* earlier copies of the query's token.

    For query ``i`` the targets are the keys ``j <= i`` with ``tokens[j - 1] == tokens[i]``
    and ``j - 1 < i``: the positions right after an earlier occurrence of the current token,
    where an induction head looks. The score is the total weight on the targets, averaged over
    the queries that have at least one (for :func:`repeated_sequences`, ``i >= p_b``):

    .. math:: s_\text{prefix} = \operatorname{mean}_{(b, i):\,|J_{b,i}| > 0}
              \sum_{j \in J_{b,i}} \alpha_{b,i,j}, \qquad
              J_{b,i} = \{\, j \le i : x_{b,j-1} = x_{b,i} \,\}

    Args:
        attention_weights: ``(B, ..., T, T)`` float, queries by keys.
        tokens: ``(B, T)`` integer, the sequence the weights were computed on.

    Returns:
        ``(...)``: one score per head (the middle axes), in ``[0, 1]`` for weights that sum to
        at most one; NaN-free (0 if no query has a target).

    Raises:
        ValueError: if the shapes do not match or ``tokens`` is not an integer ``(B, T)``.

    Example:
        >>> tokens = torch.tensor([[4, 8, 4, 8]])  # period 2
        >>> weights = torch.zeros(1, 1, 4, 4)
        >>> weights[0, 0, 2, 1] = 1.0  # query 2 (a 4) looks at key 1, after the earlier 4
        >>> weights[0, 0, 3, 3] = 0.5  # query 3 (an 8): targets {2}; half on itself
        >>> weights[0, 0, 3, 2] = 0.5
        >>> prefix_matching_score(weights, tokens)
        tensor([0.7500])

    Source: the prefix-matching score of Olsson et al. (2022) (defined there on a random
    sequence repeated once); here every earlier occurrence counts.
    """
    attention_weights = check_square_weights(attention_weights)
    tokens = check_tokens(tokens)
    B, T = tokens.shape
    if attention_weights.shape[0] != B or attention_weights.shape[-1] != T:
        raise ValueError(f"attention_weights (B, ..., T, T) = {tuple(attention_weights.shape)} "
                         f"does not match tokens (B, T) = {tuple(tokens.shape)}")
    before = torch.cat([torch.full((B, 1), -1, dtype=tokens.dtype, device=tokens.device),
                        tokens[:, :-1]], 1)
    # target[b, i, j]: key j follows an earlier copy of token i (j - 1 < i, i.e. j <= i)
    target = ((before[:, None, :] == tokens[:, :, None])
              & causal_mask(T, T, device=tokens.device))  # (B, T, T)
    target[:, :, 0] = False  # key 0 follows nothing
    has_target = target.any(dim=-1)  # (B, T)
    shape = (B,) + (1,) * (attention_weights.dim() - 3) + (T, T)
    on_target = (attention_weights * target.view(shape)).sum(dim=-1)  # (B, ..., T)
    rows = has_target.view(shape[:-1]).to(attention_weights.dtype)  # (B, 1.., T)
    count = rows.sum(dim=(0, -1)).clamp(min=1.0)
    return (on_target * rows).sum(dim=(0, -1)) / count  # (...)


class AttentionOnlyBlock(nn.Module):
    r"""Causal multi-head self-attention added to the residual stream, head by head.

    .. math:: \mathbf X' = \mathbf X + \sum_{k=1}^{h} \mathbf A^{(k)} \mathbf X
              \mathbf W_V^{(k)\top} \mathbf W_O^{(k)\top},
              \qquad \mathbf A^{(k)} = \operatorname{softmax}_\text{causal}\Big(
              \frac{\mathbf X \mathbf W_Q^{(k)\top} (\mathbf X \mathbf W_K^{(k)\top})^\top}
              {\sqrt{d_h}}\Big)

    The weights live in a :class:`d2lattn.MultiHeadAttention` (``self.attention``, no bias);
    ``forward`` computes what ``self.attention(X, X, X, is_causal=True)`` computes, but keeps
    the ``h`` terms of the sum separate: head ``k``'s output is its pooled values times its own
    ``d_h`` columns of ``W_o`` (Elhage et al. 2021: the heads of a layer act independently and
    add their results into the residual stream). That makes ablation a replacement of one term.

    Args:
        num_hiddens: d, the width of the residual stream, a positive integer.
        num_heads: h, a positive integer dividing ``num_hiddens``.

    Shapes (``forward``):
        X ``(B, T, d)`` float. Returns ``(X', heads)``: ``X'`` ``(B, T, d)`` and ``heads``
        ``(B, h, T, d)``, every head's write into the residual stream (after any ablation).

    Keyword-only options (``forward``):
        ablate: ``None`` or a mapping ``{head: replacement}``: head ``k``'s output is replaced
            by ``replacement``, a float (0.0 = zero ablation) or a tensor broadcastable to
            ``(B, T, d)`` (for example the head's mean output, mean ablation).

    Attributes:
        attention_weights: ``(B, h, T, T)`` weights of the last call, detached.

    Raises:
        ValueError: bad sizes; in ``forward``, an ``X`` that is not float ``(B, T, d)`` or an
            ``ablate`` key that is not a head index.

    Example:
        >>> block = AttentionOnlyBlock(num_hiddens=8, num_heads=2)
        >>> Y, heads = block(torch.randn(3, 5, 8))
        >>> Y.shape, heads.shape, block.attention_weights.shape
        (torch.Size([3, 5, 8]), torch.Size([3, 2, 5, 8]), torch.Size([3, 2, 5, 5]))

    Source: Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits" (the
    attention-only Transformer and the per-head decomposition of multi-head attention).
    """

    attention_weights: Optional[Tensor]

    def __init__(self, num_hiddens: int, num_heads: int) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(num_hiddens, num_heads, bias=False)
        self.num_hiddens, self.num_heads = num_hiddens, num_heads
        self.attention_weights = None

    def forward(self, X: Tensor, *, ablate: Optional[Mapping[int, Union[float, Tensor]]] = None
                ) -> Tuple[Tensor, Tensor]:
        """``X`` ``(B, T, d)`` float -> ``(X', heads)``, ``(B, T, d)`` and ``(B, h, T, d)``;
        ``ablate`` as in the class docstring."""
        if not isinstance(X, Tensor) or not X.is_floating_point() or X.dim() != 3 \
                or X.shape[-1] != self.num_hiddens:
            raise ValueError(f"X must be a float tensor of shape (B, T, {self.num_hiddens}), got "
                             + (f"shape {tuple(X.shape)}" if isinstance(X, Tensor)
                                else type(X).__name__))
        B, T, d = X.shape
        h, mha = self.num_heads, self.attention
        # 1. per-head queries, keys, values: (B, h, T, d_h)
        q, k, v = (mha.split_heads(W(X)) for W in (mha.W_q, mha.W_k, mha.W_v))
        # 2. causal scaled dot-product attention in every head
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T, T)
        weights = masked_softmax(scores, mask=causal_mask(T, T, device=X.device))
        self.attention_weights = weights.detach()
        # 3. each head through its own d_h columns of W_o: (B, h, T, d)
        W_o = mha.W_o.weight.view(d, h, -1)  # (d, h, d_h)
        heads = torch.einsum("bhtc,dhc->bhtd", weights @ v, W_o)  # (B, h, T, d)
        if ablate:
            replaced = list(heads.unbind(dim=1))
            for head, value in ablate.items():
                if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < h:
                    raise ValueError(f"ablate keys must be head indices in [0, {h}), got {head!r}")
                try:
                    replaced[head] = torch.zeros_like(replaced[head]) + value  # (B, T, d)
                except (RuntimeError, TypeError) as err:
                    raise ValueError(f"ablate[{head}] must be a float or a tensor that "
                                     f"broadcasts to (B, T, d) = {(B, T, d)}") from err
            heads = torch.stack(replaced, dim=1)
        return X + heads.sum(dim=1), heads


class AttentionOnlyTransformer(nn.Module):
    """Token embedding + learned positions + attention-only blocks + a linear unembedding.

    No MLP and no LayerNorm, so the logits are a sum of paths through the heads (Elhage et
    al. 2021): the direct path (embedding to unembedding), one-head paths, and, with two
    layers, paths through a head of layer 1 feeding a head of layer 2 (composition).

    Args:
        vocab_size: V, a positive integer.
        num_hiddens: d, the width of the residual stream.
        num_heads: h, heads per layer (must divide ``num_hiddens``).
        num_layers: L, the number of attention-only blocks.
        max_len: rows of the learned position table (the longest sequence accepted).

    Shapes (``forward``):
        tokens ``(B, T)`` integers in ``[0, V)``, ``T <= max_len``. Returns logits ``(B, T,
        V)`` for the next token at every position (causal: logit ``i`` depends on tokens
        ``0 .. i`` only), and with ``return_heads=True`` also the heads' outputs ``(L, B, h,
        T, d)``.

    Keyword-only options (``forward``):
        ablate: ``None`` or ``{(layer, head): replacement}`` with a float or a tensor
            broadcastable to ``(B, T, d)``; see :class:`AttentionOnlyBlock`.
        return_heads: also return every head's write into the residual stream.

    Raises:
        ValueError: bad sizes; in ``forward``, tokens that are not integers ``(B, T)`` in
            ``[0, V)``, a sequence longer than ``max_len`` or a bad ``ablate`` key.

    Example:
        >>> model = AttentionOnlyTransformer(vocab_size=10, num_hiddens=8, num_heads=2)
        >>> tokens = torch.tensor([[1, 2, 3, 1, 2, 3]])
        >>> model(tokens).shape
        torch.Size([1, 6, 10])
        >>> logits, heads = model(tokens, ablate={(0, 1): 0.0}, return_heads=True)
        >>> heads.shape, bool(heads[0, :, 1].eq(0).all())
        (torch.Size([2, 1, 2, 6, 8]), True)

    Source: Elhage et al. (2021), the attention-only models of "A Mathematical Framework for
    Transformer Circuits"; Olsson et al. (2022), their small attention-only models.
    """

    def __init__(self, vocab_size: int, num_hiddens: int = 64, num_heads: int = 2,
                 num_layers: int = 2, max_len: int = 64) -> None:
        super().__init__()
        check_positive_ints(vocab_size=vocab_size, num_hiddens=num_hiddens,
                            num_heads=num_heads, num_layers=num_layers, max_len=max_len)
        if num_hiddens % num_heads != 0:
            raise ValueError(
                f"num_hiddens ({num_hiddens}) must be divisible by num_heads ({num_heads})")
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.positions = LearnedPositionalEmbedding(num_hiddens, max_len=max_len)
        self.blocks = nn.ModuleList(AttentionOnlyBlock(num_hiddens, num_heads)
                                    for _ in range(num_layers))
        self.unembed = nn.Linear(num_hiddens, vocab_size, bias=False)

    def forward(self, tokens: Tensor, *, ablate: Optional[Ablation] = None,
                return_heads: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """``tokens`` ``(B, T)`` integers in ``[0, V)`` -> logits ``(B, T, V)`` (and, with
        ``return_heads=True``, the heads' outputs ``(L, B, h, T, d)``); ``ablate`` as in the
        class docstring."""
        tokens = check_tokens(tokens, vocab_size=self.vocab_size, any_int=True)
        per_layer: Dict[int, Dict[int, Union[float, Tensor]]] = {}
        for key, value in (ablate or {}).items():
            if (not isinstance(key, tuple) or len(key) != 2
                    or not isinstance(key[0], int) or not 0 <= key[0] < len(self.blocks)):
                raise ValueError(f"ablate keys must be (layer, head) with layer in "
                                 f"[0, {len(self.blocks)}), got {key!r}")
            per_layer.setdefault(key[0], {})[key[1]] = value
        X = self.positions(self.embedding(tokens))  # (B, T, d): the residual stream
        heads: List[Tensor] = []
        for layer, block in enumerate(self.blocks):
            X, layer_heads = block(X, ablate=per_layer.get(layer))  # (B, T, d), (B, h, T, d)
            heads.append(layer_heads)
        logits = self.unembed(X)  # (B, T, V)
        return (logits, torch.stack(heads)) if return_heads else logits


def induction_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Cross-entropy of the next-token prediction, on the determined positions only.

    Args:
        logits: ``(B, T, V)`` float, the model's output on ``tokens``.
        tokens: ``(B, T)`` integer; position ``i < T - 1`` is scored against ``tokens[:, i +
            1]`` if :func:`determined_positions` marks it.

    Returns:
        a scalar tensor (0 if no position is determined).

    Raises:
        ValueError: on mismatched shapes.

    Example:
        >>> tokens = torch.tensor([[0, 1, 0, 1]])
        >>> logits = F.one_hot(tokens.roll(-1, dims=1), 2).float() * 100  # always right
        >>> induction_loss(logits, tokens).item()
        0.0

    Source: book chapter 11 (the loss of Olsson et al. 2022 counts every position).
    """
    tokens = check_tokens(tokens)
    if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[:2] != tokens.shape:
        raise ValueError(f"logits must have shape (B, T, V) with (B, T) = {tuple(tokens.shape)}")
    mask = determined_positions(tokens)[:, :-1]  # (B, T - 1)
    if not bool(mask.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[:, :-1][mask], tokens[:, 1:][mask])


@torch.no_grad()
def induction_accuracy(model: nn.Module, tokens: Tensor, *,
                       ablate: Optional[Ablation] = None) -> float:
    """Share of determined positions where the model's most likely next token is right.

    Args:
        model: maps ``(B, T)`` tokens to ``(B, T, V)`` logits (an
            :class:`AttentionOnlyTransformer`, which also accepts ``ablate``).
        tokens: ``(B, T)`` integer, for example from :func:`repeated_sequences`.
        ablate: keyword-only; passed to the model if given.

    Returns:
        a float in ``[0, 1]``.

    Raises:
        ValueError: if ``tokens`` has no determined position.

    Example:
        >>> tokens = torch.tensor([[0, 1, 0, 1, 0]])
        >>> induction_accuracy(lambda t: F.one_hot(t.roll(-1, dims=1), 2).float(), tokens)
        1.0

    Source: book chapter 11.
    """
    tokens = check_tokens(tokens)
    mask = determined_positions(tokens)[:, :-1]  # (B, T - 1)
    if not bool(mask.any()):
        raise ValueError("tokens has no determined position (no token repeats)")
    logits = model(tokens) if ablate is None else model(tokens, ablate=ablate)
    right = logits[:, :-1].argmax(dim=-1) == tokens[:, 1:]  # (B, T - 1)
    return right[mask].float().mean().item()


@torch.no_grad()
def head_means(model: AttentionOnlyTransformer, tokens: Tensor) -> Tensor:
    """Every head's output averaged over a batch, per position: the values of mean ablation.

    Args:
        model: an :class:`AttentionOnlyTransformer`.
        tokens: ``(B, T)`` integer, a reference batch.

    Returns:
        ``(L, h, T, d)`` float: ``means[l, k]`` replaces head ``(l, k)`` in ``ablate``.

    Example:
        >>> model = AttentionOnlyTransformer(vocab_size=10, num_hiddens=8, num_heads=2)
        >>> head_means(model, torch.randint(0, 10, (4, 6))).shape
        torch.Size([2, 2, 6, 8])

    Source: book chapter 11 (mean ablation: a head's output replaced by its average; Olsson et
    al. (2022) ablate heads in their small models too).
    """
    _, heads = model(tokens, return_heads=True)  # (L, B, h, T, d)
    return heads.mean(dim=1)  # (L, h, T, d)


def train_induction(
    model: nn.Module,
    *,
    steps: int,
    vocab: Union[int, Sequence[int], Tensor],
    seq_len: int = 32,
    periods: Tuple[int, int] = (6, 16),
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    stop_after: Optional[int] = None,
    clip: Optional[float] = None,
    callback: Optional[Callback] = None,
) -> List[float]:
    """Train ``model`` with Adam on fresh :func:`repeated_sequences` batches; return the losses.

    Each step draws a new batch (from a generator seeded with ``seed``) and minimises
    :func:`induction_loss`. The loop and its arguments follow the library's training
    convention (:mod:`d2lattn.training`): ``callback(step, model, loss)`` after each step, with
    ``step`` the number of steps done; call it yourself with ``step = 0`` to measure the
    untrained model.

    Args:
        model: maps ``(B, T)`` tokens to ``(B, T, V)`` logits.
        steps: number of Adam steps, a positive integer (keyword-only, as all below).
        vocab: tokens to draw from (see :func:`repeated_sequences`).
        seq_len, periods, batch_size: the data (see :func:`repeated_sequences`).
        lr: Adam's learning rate.
        seed: seeds the data generator (initialise the model yourself).
        stop_after: run only the first ``stop_after`` steps.
        clip: the largest global gradient norm (``None``: no clipping).
        callback: called as ``callback(step, model, loss)``, for evaluation or snapshots.

    Returns:
        the training loss of every step, a list of ``steps`` floats (fewer if a loss is not
        finite). The model is left in eval mode.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionOnlyTransformer(vocab_size=8, num_hiddens=8, num_heads=2)
        >>> losses = train_induction(model, steps=3, vocab=8, seq_len=12, periods=(2, 4))
        >>> len(losses)
        3

    Source: book chapter 11.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def batch_loss() -> Tensor:
        tokens, _ = repeated_sequences(batch_size, seq_len, vocab, periods, generator=generator)
        return induction_loss(model(tokens), tokens)

    return fit(model, optimizer, batch_loss, steps=steps, stop_after=stop_after, clip=clip,
               callback=callback)


def _head_rows(linear: nn.Linear, head: int, num_heads: int) -> Tensor:
    """Head ``head``'s ``d_h`` output rows of a ``(d, d)`` projection: ``(d_h, d)``."""
    d_h = linear.weight.shape[0] // num_heads
    return linear.weight[head * d_h:(head + 1) * d_h]


def _layer_and_head(model: object, layer: int, head: int) -> None:
    """Raise ``ValueError`` unless ``model`` is an attention-only Transformer with that head."""
    if not isinstance(model, AttentionOnlyTransformer):
        raise ValueError(f"model must be an AttentionOnlyTransformer, got {type(model).__name__}")
    check_layer_and_head(layer, head, len(model.blocks), model.blocks[0].num_heads)


def _ov(model: AttentionOnlyTransformer, layer: int, head: int) -> Tensor:
    """``W_OV = W_O^{(l,k)} W_V^{(l,k)}``, ``(d, d)``, acting on column vectors."""
    mha, h = model.blocks[layer].attention, model.blocks[layer].num_heads
    d_h = mha.W_o.weight.shape[1] // h
    W_O = mha.W_o.weight[:, head * d_h:(head + 1) * d_h]  # (d, d_h)
    return W_O @ _head_rows(mha.W_v, head, h)  # (d, d)


@torch.no_grad()
def ov_circuit(model: AttentionOnlyTransformer, layer: int, head: int) -> Tensor:
    r"""The OV circuit of one head on the direct path: what attending to a token adds to the logits.

    .. math:: \mathbf M = \mathbf W_U \mathbf W_O^{(l,k)} \mathbf W_V^{(l,k)} \mathbf W_E

    with column vectors: :math:`\mathbf W_E` ``(d, V)`` holds the token embeddings as columns,
    :math:`\mathbf W_U` ``(V, d)`` is the unembedding. Column ``j`` of ``M`` is the change of the
    ``V`` logits when the head puts weight 1 on a position holding token ``j`` (the residual
    stream there taken to be the token's embedding alone: positions and earlier heads left out).
    A copying head ranks token ``j`` first in column ``j``.

    Args:
        model: an :class:`AttentionOnlyTransformer`.
        layer, head: which head, 0-based.

    Returns:
        ``(V, V)`` float, ``M[i, j]`` = logit of token ``i`` per unit of attention on token ``j``.

    Raises:
        ValueError: a model of another kind, or a layer or head out of range.

    Example:
        >>> model = AttentionOnlyTransformer(vocab_size=10, num_hiddens=8, num_heads=2)
        >>> ov_circuit(model, 1, 0).shape
        torch.Size([10, 10])

    Source: Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits" (the OV
    circuit and its copying behaviour); book chapter 11.
    """
    _layer_and_head(model, layer, head)
    W_E = model.embedding.weight.T  # (d, V)
    return model.unembed.weight @ _ov(model, layer, head) @ W_E  # (V, V)


@torch.no_grad()
def k_composition_circuit(model: AttentionOnlyTransformer, head: int, *, layer: int = 1,
                          source_heads: Optional[Sequence[int]] = None) -> Tensor:
    r"""The QK circuit of a head through K-composition with the heads of the layer before.

    .. math:: \mathbf S = \mathbf W_E^\top \mathbf W_Q^{(l,k)\top} \mathbf W_K^{(l,k)}
              \Big(\sum_{m} \mathbf W_O^{(l-1,m)} \mathbf W_V^{(l-1,m)}\Big) \mathbf W_E

    ``S[i, j]`` is the part of the score (before the :math:`1/\sqrt{d_h}` scaling) between a
    query holding token ``i`` and a key into which the earlier heads ``m`` wrote token ``j``
    with weight 1: for a previous-token head, a key whose *previous* token is ``j``. An
    induction head ranks ``j = i`` first in row ``i``. Positions and the direct path are left
    out.

    Args:
        model: an :class:`AttentionOnlyTransformer` with at least ``layer + 1`` layers.
        head: the head of layer ``layer`` whose keys read the earlier heads.
        layer: its layer, at least 1 (default 1, the second layer).
        source_heads: heads of layer ``layer - 1`` to compose with (default: all of them).

    Returns:
        ``(V, V)`` float, rows = query tokens, columns = the token written into the key.

    Raises:
        ValueError: a model of another kind, ``layer < 1``, or a layer or head out of range.

    Example:
        >>> model = AttentionOnlyTransformer(vocab_size=10, num_hiddens=8, num_heads=2)
        >>> k_composition_circuit(model, 0, source_heads=[1]).shape
        torch.Size([10, 10])

    Source: Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits"
    (K-composition and the QK circuit of induction heads); book chapter 11.
    """
    _layer_and_head(model, layer, head)
    if layer < 1:
        raise ValueError(f"layer must be at least 1 (a layer before it to compose with), "
                         f"got {layer}")
    h = model.blocks[layer].num_heads
    sources = list(range(model.blocks[layer - 1].num_heads)) if source_heads is None \
        else list(source_heads)
    for m in sources:
        _layer_and_head(model, layer - 1, m)
    mha = model.blocks[layer].attention
    W_E = model.embedding.weight.T  # (d, V)
    W_QK = _head_rows(mha.W_q, head, h).T @ _head_rows(mha.W_k, head, h)  # (d, d)
    W_OV = sum(_ov(model, layer - 1, m) for m in sources)  # (d, d)
    return W_E.T @ W_QK @ W_OV @ W_E  # (V, V)
