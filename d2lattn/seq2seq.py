"""Sequence to sequence with attention: the encoder-decoder models of chapter 7.

The task (chapter 7, data in :mod:`d2lattn.data`): a date as the Unicode CLDR writes it in some
locale and format, read character by character, is turned into the ISO form ``YYYY-MM-DD``::

    "fr dimanche 22 novembre 2026"  ->  "2026-11-22"
    "ja 2026/11/22"                 ->  "2026-11-22"

This module holds the models: a GRU encoder, a decoder that sees only the encoder's last
state, two decoders that attend over all encoder states with any attention layer of
:mod:`d2lattn` (the query after the GRU step, as Luong et al.; or the previous state as the
query and the context fed into the GRU, as Bahdanau et al.), greedy decoding and the
teacher-forced loss.

Shape legend: B batch, T source length, U target length, V vocabulary size, H hidden size.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_decoder_args,
    check_lengths,
    check_positive,
    check_positive_ints,
    check_tokens,
)
from .data import CharVocab, length_batches
from .training import Callback, fit

__all__ = [
    "AttentionDecoder",
    "BahdanauDecoder",
    "EncoderDecoder",
    "Seq2SeqDecoder",
    "Seq2SeqEncoder",
    "greedy_decode",
    "seq2seq_loss",
    "train_seq2seq",
]

# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------

DecoderState = Tuple[Tensor, Tensor, Tensor]
"""``(enc_outputs (B, T, H), enc_valid_lens (B,), hidden (1, B, H))``."""


class Seq2SeqEncoder(nn.Module):
    r"""A GRU encoder: embeds the source characters and returns every hidden state.

    .. math:: \mathbf h_t = \mathrm{GRU}(\mathbf e(x_t), \mathbf h_{t-1}), \quad t = 1..T

    The GRU runs left to right over the padded batch (no packing: it is several times
    slower on a CPU); since a state depends only on the characters before it, the state at
    position ``valid_lens - 1`` is exactly the state after the last real character, and it
    is returned as the final state. States at padded positions are returned too: attention
    masks them with ``valid_lens``.

    Args:
        vocab_size: V, the number of source tokens.
        embed_size: the size of the character embeddings.
        num_hiddens: H, the GRU's hidden size.

    Shapes (``forward``):
        X ``(B, T)`` long token indices; ``valid_lens`` ``(B,)`` integers in ``[1, T]``.
        Returns ``(outputs, state)``: ``outputs`` ``(B, T, H)`` the states at every position
        (the keys and values of attention), ``state`` ``(1, B, H)`` the final states.

    Raises:
        ValueError: bad sizes; ``X`` not a ``(B, T)`` LongTensor of indices below ``V``;
            ``valid_lens`` not ``(B,)`` integers in ``[1, T]``.

    Example:
        >>> enc = Seq2SeqEncoder(vocab_size=10, embed_size=8, num_hiddens=16)
        >>> outputs, state = enc(torch.tensor([[4, 5, 6], [7, 0, 0]]), torch.tensor([3, 1]))
        >>> outputs.shape, state.shape, torch.equal(state[0, 1], outputs[1, 0])
        (torch.Size([2, 3, 16]), torch.Size([1, 2, 16]), True)

    Source: Cho et al. (2014), section 2.3 (the GRU); the encoder of Bahdanau et al. (2015)
    without the backward direction.
    """

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int) -> None:
        super().__init__()
        check_positive_ints(vocab_size=vocab_size, embed_size=embed_size,
                            num_hiddens=num_hiddens)
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, batch_first=True)

    def forward(self, X: Tensor, valid_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Encode ``X`` ``(B, T)`` with valid lengths ``(B,)``.

        Returns outputs ``(B, T, H)`` and the final state ``(1, B, H)``.
        """
        check_tokens(X, "X", vocab_size=self.vocab_size)
        B, T = X.shape
        check_lengths("valid_lens", valid_lens, B, T)
        emb = self.embedding(X)  # (B, T, E)
        outputs, _ = self.rnn(emb)  # (B, T, H)
        # the state after each sequence's last real character (causal: padding comes later)
        state = outputs[torch.arange(B), valid_lens - 1].unsqueeze(0)  # (1, B, H)
        return outputs, state


class _Decoder(nn.Module):
    """What the three decoders share: the target vocabulary's size, the target embedding, the
    state they pass on and the check of the target tokens."""

    attention_weights: Optional[Tensor] = None

    def __init__(self, vocab_size: int, embed_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_size)

    def init_state(self, enc_outputs: Tensor, enc_state: Tensor,
                   enc_valid_lens: Tensor) -> DecoderState:
        """The decoder's initial state: ``(enc_outputs, enc_valid_lens, enc_state)``."""
        return enc_outputs, enc_valid_lens, enc_state

    def _embed(self, Y: Tensor) -> Tensor:
        """The embedded targets ``(B, U, E)`` of ``Y`` ``(B, U)``, checked first."""
        check_tokens(Y, "Y", vocab_size=self.vocab_size)
        return self.embedding(Y)


class Seq2SeqDecoder(_Decoder):
    r"""A GRU decoder *without* attention: the whole source reaches it through the encoder's
    final state (the bottleneck).

    The decoder starts from the encoder's final state and, at every step, also reads the
    fixed context :math:`\mathbf c = \mathbf h_T` (the top layer's final state):

    .. math:: \mathbf s_t = \mathrm{GRU}([\mathbf e(y_{t-1}); \mathbf c], \mathbf s_{t-1}),
              \quad p(y_t) = \mathrm{softmax}(W_o [\mathbf s_t; \mathbf c])

    Args:
        vocab_size: V, the number of target tokens.
        embed_size: the size of the target embeddings.
        num_hiddens: H, the GRU's hidden size (the encoder's).

    Shapes:
        ``init_state(enc_outputs (B, T, H), enc_state (1, B, H), enc_valid_lens (B,))``
        returns the state; ``forward(Y (B, U) long, state)`` returns ``(logits (B, U, V),
        state)``: feed the whole shifted target for teacher forcing, or one column at a time
        for decoding.

    Attributes:
        attention_weights: always ``None`` (no attention), so both decoders can be inspected
            the same way.

    Raises:
        ValueError: bad sizes; ``Y`` not a ``(B, U)`` LongTensor of indices below ``V``.

    Example:
        >>> enc, dec = Seq2SeqEncoder(10, 8, 16), Seq2SeqDecoder(12, 8, 16)
        >>> X, X_lens = torch.tensor([[4, 5, 6], [7, 0, 0]]), torch.tensor([3, 1])
        >>> state = dec.init_state(*enc(X, X_lens), X_lens)
        >>> logits, state = dec(torch.tensor([[1, 5], [1, 6]]), state)
        >>> logits.shape
        torch.Size([2, 2, 12])

    Source: Cho et al. (2014), section 2.2 (the context feeds every step); Sutskever et al.
    (2014) (the final state starts the decoder).
    """

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int) -> None:
        check_positive_ints(vocab_size=vocab_size, embed_size=embed_size,
                            num_hiddens=num_hiddens)
        super().__init__(vocab_size, embed_size)  # self.embedding
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, batch_first=True)
        self.dense = nn.Linear(2 * num_hiddens, vocab_size)

    def forward(self, Y: Tensor, state: DecoderState) -> Tuple[Tensor, DecoderState]:
        """One call over ``Y`` ``(B, U)``: logits ``(B, U, V)`` and the updated state.

        ``state`` is ``(enc_outputs (B, T, H), enc_valid_lens (B,), hidden)``, as returned by
        :meth:`init_state` or the previous call.
        """
        emb = self._embed(Y)  # (B, U, E)
        enc_outputs, enc_valid_lens, hidden = state
        B, U = Y.shape
        # the fixed context: the encoder's final state (top layer), the same at every step
        # (the encoder's state after the last real character)
        context = enc_outputs[torch.arange(B), enc_valid_lens - 1]  # (B, H)
        context = context.unsqueeze(1).expand(B, U, -1)  # (B, U, H)
        outputs, hidden = self.rnn(torch.cat([emb, context], dim=-1), hidden)  # (B, U, H)
        logits = self.dense(torch.cat([outputs, context], dim=-1))  # (B, U, V)
        return logits, (enc_outputs, enc_valid_lens, hidden)


class AttentionDecoder(_Decoder):
    r"""A GRU decoder that attends over all encoder states with a given attention layer.

    At step ``t`` the decoder's state is the query; the encoder's states are the keys and the
    values; the context vector is the attention pooling of the encoder states:

    .. math:: \mathbf s_t = \mathrm{GRU}(\mathbf e(y_{t-1}), \mathbf s_{t-1}), \quad
              \mathbf c_t = \sum_{j=1}^{T} \alpha(\mathbf s_t, \mathbf h_j)\, \mathbf h_j, \quad
              p(y_t) = \mathrm{softmax}(W_o [\mathbf s_t; \mathbf c_t])

    (the placement of Luong et al.'s global attention: the query is the state *after* the RNN
    step, so teacher forcing runs all steps in one GRU call; Bahdanau et al. query with
    ``s_{t-1}`` and feed ``c_t`` into the RNN.) Padded source positions are masked with the
    encoder's ``valid_lens``, so they get exactly zero weight.

    Args:
        vocab_size: V, the number of target tokens.
        embed_size: the size of the target embeddings.
        num_hiddens: H, the GRU's hidden size (the encoder's).
        attention: any layer called as ``attention(queries (B, U, H), keys (B, T, H),
            values (B, T, H), valid_lens (B,))`` that returns ``(B, U, context_size)`` and
            keeps ``attention_weights``: :class:`d2lattn.AdditiveAttention`,
            :class:`d2lattn.DotProductAttention`, :class:`d2lattn.MultiHeadAttention`, ...
        context_size: the feature size of the attention's output (default ``num_hiddens``).

    Shapes: as :class:`Seq2SeqDecoder`.

    Attributes:
        attention_weights: the attention layer's weights of the last call, ``(B, U, T)``
            (``(B, num_heads, U, T)`` for multi-head attention).

    Raises:
        ValueError: bad sizes; ``attention`` not an ``nn.Module``; ``Y`` not a ``(B, U)``
            LongTensor of indices below ``V``.

    Example:
        >>> enc = Seq2SeqEncoder(10, 8, 16)
        >>> dec = AttentionDecoder(12, 8, 16, AdditiveAttention(16, 16, num_hiddens=8))
        >>> X, X_lens = torch.tensor([[4, 5, 6], [7, 0, 0]]), torch.tensor([3, 1])
        >>> logits, state = dec(torch.tensor([[1, 5], [1, 6]]), dec.init_state(*enc(X, X_lens), X_lens))
        >>> logits.shape, dec.attention_weights.shape
        (torch.Size([2, 2, 12]), torch.Size([2, 2, 3]))
        >>> dec.attention_weights[1]  # one valid source position: all weight on it
        tensor([[1., 0., 0.],
                [1., 0., 0.]])

    Source: Bahdanau et al. (2015), section 3.1 (attention over all encoder states); Luong
    et al. (2015), section 3.1 (global attention, the query after the RNN step).
    """

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int, attention: nn.Module,
                 *, context_size: Optional[int] = None) -> None:
        check_decoder_args(vocab_size, embed_size, num_hiddens, attention, context_size)
        super().__init__(vocab_size, embed_size)  # self.embedding
        self.rnn = nn.GRU(embed_size, num_hiddens, batch_first=True)
        self.attention = attention
        self.dense = nn.Linear(num_hiddens + (context_size or num_hiddens), vocab_size)

    @property
    def attention_weights(self) -> Optional[Tensor]:
        """The attention layer's ``attention_weights`` of the last call."""
        return getattr(self.attention, "attention_weights", None)

    def forward(self, Y: Tensor, state: DecoderState) -> Tuple[Tensor, DecoderState]:
        """One call over ``Y`` ``(B, U)``: logits ``(B, U, V)`` and the updated state.

        ``state`` is ``(enc_outputs (B, T, H), enc_valid_lens (B,), hidden)``, as returned by
        :meth:`init_state` or the previous call.
        """
        emb = self._embed(Y)  # (B, U, E)
        enc_outputs, enc_valid_lens, hidden = state
        # 1. run the RNN over the (shifted) targets: its states are the queries
        queries, hidden = self.rnn(emb, hidden)  # (B, U, H)
        # 2. attend over the encoder states (keys = values), padded positions masked
        context = self.attention(queries, enc_outputs, enc_outputs, enc_valid_lens)  # (B, U, C)
        # 3. predict the next character from the state and the context
        logits = self.dense(torch.cat([queries, context], dim=-1))  # (B, U, V)
        return logits, (enc_outputs, enc_valid_lens, hidden)


class BahdanauDecoder(_Decoder):
    r"""A GRU decoder with attention placed as Bahdanau et al.: the *previous* state is the
    query, and the context is fed into the GRU.

    .. math:: \mathbf c_t = \sum_{j=1}^{T} \alpha(\mathbf s_{t-1}, \mathbf h_j)\, \mathbf h_j,
              \quad \mathbf s_t = \mathrm{GRU}([\mathbf e(y_{t-1}); \mathbf c_t],
              \mathbf s_{t-1}), \quad p(y_t) = \mathrm{softmax}(W_o [\mathbf s_t; \mathbf c_t])

    The context of step ``t`` must be known before the GRU step, and it depends on the state
    of the step before, so even teacher-forced training runs the steps one at a time (a loop
    over ``U``), unlike :class:`AttentionDecoder`, which runs all steps in one GRU call. The
    readout is the same as :class:`AttentionDecoder`'s (a linear layer, not the paper's
    maxout), so the two placements differ only where the query is taken and where the context
    goes. Padded source positions are masked with the encoder's ``valid_lens``.

    Args:
        vocab_size, embed_size, num_hiddens, context_size: as :class:`AttentionDecoder`.
        attention: any layer called as ``attention(queries (B, 1, H), keys (B, T, H),
            values (B, T, H), valid_lens (B,))`` that returns ``(B, 1, context_size)``:
            :class:`d2lattn.AdditiveAttention`, :class:`d2lattn.DotProductAttention`, ...

    Shapes: as :class:`Seq2SeqDecoder`; the returned state holds ``s_U`` ``(1, B, H)``.

    Attributes:
        attention_weights: the weights of every step of the last call, ``(B, U, T)``
            (``(B, num_heads, U, T)`` for multi-head attention).

    Raises:
        ValueError: as :class:`AttentionDecoder`.

    Example:
        >>> dec = BahdanauDecoder(12, 8, 16, DotProductAttention())
        >>> H, s0 = Seq2SeqEncoder(10, 8, 16)(torch.tensor([[4, 5, 6]]), torch.tensor([3]))
        >>> logits, (_, _, s) = dec(torch.tensor([[1, 5, 7, 2]]),
        ...                         dec.init_state(H, s0, torch.tensor([3])))
        >>> logits.shape, dec.attention_weights.shape, s.shape
        (torch.Size([1, 4, 12]), torch.Size([1, 4, 3]), torch.Size([1, 1, 16]))

    Source: Bahdanau et al. (2015), section 3.1 and appendix A.2.2 (the query
    :math:`\mathbf s_{i-1}`, the context as an input of the recurrent step).
    """

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int, attention: nn.Module,
                 *, context_size: Optional[int] = None) -> None:
        check_decoder_args(vocab_size, embed_size, num_hiddens, attention, context_size)
        C = context_size or num_hiddens
        super().__init__(vocab_size, embed_size)  # self.embedding
        self.rnn = nn.GRUCell(embed_size + C, num_hiddens)
        self.attention = attention
        self.dense = nn.Linear(num_hiddens + C, vocab_size)
        self.attention_weights: Optional[Tensor] = None

    def forward(self, Y: Tensor, state: DecoderState) -> Tuple[Tensor, DecoderState]:
        """One call over ``Y`` ``(B, U)``: logits ``(B, U, V)`` and the updated state.

        ``state`` is ``(enc_outputs (B, T, H), enc_valid_lens (B,), hidden)``, as returned by
        :meth:`init_state` or the previous call.
        """
        emb = self._embed(Y)  # (B, U, E)
        enc_outputs, enc_valid_lens, hidden = state
        s = hidden[0]  # (B, H): s_{t-1}
        states, contexts, weights = [], [], []
        for t in range(Y.shape[1]):
            # 1. the previous state queries the encoder states (keys = values)
            c = self.attention(s[:, None], enc_outputs, enc_outputs, enc_valid_lens)  # (B, 1, C)
            weights.append(self.attention.attention_weights)
            # 2. the GRU step reads the previous character and the context
            s = self.rnn(torch.cat([emb[:, t], c[:, 0]], dim=-1), s)  # (B, H)
            states.append(s)
            contexts.append(c[:, 0])
        self.attention_weights = torch.cat(weights, dim=-2) if weights else None  # (B, U, T)
        # 3. predict each character from the new state and the context
        logits = self.dense(torch.cat([torch.stack(states, 1), torch.stack(contexts, 1)],
                                      dim=-1))  # (B, U, V)
        return logits, (enc_outputs, enc_valid_lens, s[None])


class EncoderDecoder(nn.Module):
    """An encoder and a decoder joined: ``model(X, X_valid_lens, Y_in)`` gives the logits.

    Args:
        encoder: a :class:`Seq2SeqEncoder` (or a module with the same call).
        decoder: a :class:`Seq2SeqDecoder`, an :class:`AttentionDecoder`, a
            :class:`BahdanauDecoder`, or a module with
            ``init_state`` and the same call.

    Shapes (``forward``):
        X ``(B, T)`` long, ``X_valid_lens`` ``(B,)``, Y_in ``(B, U)`` long (the target shifted
        right, starting with ``<bos>``). Returns logits ``(B, U, V)``.

    Raises:
        ValueError: from the encoder or the decoder on bad input.

    Example:
        >>> model = EncoderDecoder(Seq2SeqEncoder(10, 8, 16), Seq2SeqDecoder(12, 8, 16))
        >>> model(torch.tensor([[4, 5, 6]]), torch.tensor([3]), torch.tensor([[1, 7]])).shape
        torch.Size([1, 2, 12])

    Source: Sutskever et al. (2014); Cho et al. (2014) (the encoder-decoder architecture).
    """

    def __init__(self, encoder: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def init_state(self, X: Tensor, X_valid_lens: Tensor) -> DecoderState:
        """Encode ``X`` and return the decoder's initial state."""
        enc_outputs, enc_state = self.encoder(X, X_valid_lens)
        return self.decoder.init_state(enc_outputs, enc_state, X_valid_lens)

    def forward(self, X: Tensor, X_valid_lens: Tensor, Y_in: Tensor) -> Tensor:
        """Logits ``(B, U, V)`` for ``Y_in`` ``(B, U)`` given ``X`` ``(B, T)`` and its lengths."""
        logits, _ = self.decoder(Y_in, self.init_state(X, X_valid_lens))
        return logits  # (B, U, V)


def seq2seq_loss(model: EncoderDecoder, X: Tensor, X_valid_lens: Tensor, Y: Tensor,
                 Y_valid_lens: Tensor, *, bos: int = CharVocab.bos) -> Tensor:
    r"""The teacher-forced cross-entropy, averaged over the valid target tokens.

    The decoder reads the true previous character (``<bos>``, then ``Y`` shifted right) and
    is scored on predicting ``Y``; padded target positions do not count:

    .. math:: \mathcal L = -\frac{1}{\sum_b U_b} \sum_b \sum_{t=1}^{U_b} \log p(y_{b,t} \mid
              y_{b,<t}, \mathbf x_b)

    Args:
        model: an :class:`EncoderDecoder`.
        X: ``(B, T)`` long source; X_valid_lens: ``(B,)`` its lengths.
        Y: ``(B, U)`` long target, ending with ``<eos>``, padded; Y_valid_lens: ``(B,)`` its
            lengths in ``[1, U]`` (``<eos>`` included).
        bos: index of ``<bos>`` (keyword-only).

    Returns:
        the mean loss, a 0-dim float tensor (differentiable).

    Raises:
        ValueError: bad shapes or lengths (``Y_valid_lens`` must be ``(B,)`` in ``[1, U]``).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = EncoderDecoder(Seq2SeqEncoder(10, 8, 16), Seq2SeqDecoder(5, 8, 16))
        >>> loss = seq2seq_loss(model, torch.tensor([[4, 5, 6]]), torch.tensor([3]),
        ...                     torch.tensor([[3, 4, 2]]), torch.tensor([3]))
        >>> loss.shape, bool(loss > 0)
        (torch.Size([]), True)

    Source: teacher forcing, Williams and Zipser (1989); the masked loss of d2l.ai section 10.7.
    """
    check_tokens(Y, "Y", vocab_size=model.decoder.vocab_size)
    B, U = Y.shape
    if X.dim() != 2 or X.shape[0] != B:
        raise ValueError(f"X must have shape (B, T) with B = {B} (the batch of Y), got "
                         f"{tuple(X.shape)}")
    check_lengths("Y_valid_lens", Y_valid_lens, B, U)
    Y_in = torch.cat([torch.full((B, 1), bos, dtype=torch.long, device=Y.device), Y[:, :-1]],
                     dim=1)  # (B, U): teacher forcing, the true previous character
    logits = model(X, X_valid_lens, Y_in)  # (B, U, V)
    losses = F.cross_entropy(logits.transpose(1, 2), Y, reduction="none")  # (B, U)
    mask = torch.arange(U, device=Y.device) < Y_valid_lens[:, None]  # (B, U)
    return (losses * mask).sum() / mask.sum()


def train_seq2seq(model: EncoderDecoder, X: Tensor, X_valid_lens: Tensor, Y: Tensor,
                  Y_valid_lens: Tensor, *, steps: int, batch_size: int = 128,
                  lr: float = 0.008, seed: int = 0, stop_after: Optional[int] = None,
                  clip: Optional[float] = None,
                  callback: Optional[Callback] = None) -> List[float]:
    """Train with Adam on teacher-forced batches of similar source length; the losses.

    Each epoch visits every example once in batches from :func:`d2lattn.length_batches`
    (shuffled again every epoch, nothing dropped); each batch is cut to its longest source
    and target, so padding costs little. The loop and its arguments follow the library's
    training convention (:mod:`d2lattn.training`).

    Args:
        model: an :class:`EncoderDecoder`, trained in place.
        X: ``(N, T)`` long sources; X_valid_lens: ``(N,)`` their lengths.
        Y: ``(N, U)`` long targets ending with ``<eos>``; Y_valid_lens: ``(N,)`` their lengths.
        steps: the number of Adam steps, ``>= 1`` (keyword-only, as all below).
        batch_size: the most examples per batch.
        lr: Adam's learning rate, ``> 0``.
        seed: seed of the batch order (the model's initialization is the caller's).
        stop_after: run only the first ``stop_after`` steps.
        clip: clip the gradient's global norm to this value (``None``: no clipping).
        callback: ``callback(step, model, loss)`` after each step, ``step`` from 1.

    Returns:
        the ``steps`` training losses, as Python floats (fewer if a loss is not finite). The
        model is left in eval mode.

    Raises:
        ValueError: bad sizes, or from :func:`seq2seq_loss` on bad shapes.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = EncoderDecoder(Seq2SeqEncoder(10, 8, 16), Seq2SeqDecoder(5, 8, 16))
        >>> X, X_lens = torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([3, 2])
        >>> Y, Y_lens = torch.tensor([[3, 4, 2], [4, 2, 0]]), torch.tensor([3, 2])
        >>> losses = train_seq2seq(model, X, X_lens, Y, Y_lens, steps=30, batch_size=2, lr=0.05)
        >>> len(losses), losses[-1] < losses[0] / 10
        (30, True)

    Source: book chapter 7 (teacher forcing, Williams and Zipser (1989); Adam, Kingma and Ba
    (2015); bucketing by length, Sutskever et al. (2014), section 3.4).
    """
    check_positive_ints(steps=steps, batch_size=batch_size)
    check_positive("lr", lr)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    batches: List[Tensor] = []

    def batch_loss() -> Tensor:
        nonlocal batches
        if not batches:  # a new epoch: a fresh order
            batches = length_batches(X_valid_lens.tolist(), batch_size, generator=g)
        idx = batches.pop()
        T, U = int(X_valid_lens[idx].max()), int(Y_valid_lens[idx].max())
        return seq2seq_loss(model, X[idx, :T], X_valid_lens[idx], Y[idx, :U], Y_valid_lens[idx])

    return fit(model, optimizer, batch_loss, steps=steps, stop_after=stop_after, clip=clip,
               callback=callback)


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, X: Tensor, X_valid_lens: Tensor, *, max_len: int,
                  bos: int = CharVocab.bos, eos: int = CharVocab.eos,
                  pad: int = CharVocab.pad) -> Tuple[Tensor, Optional[Tensor]]:
    """Free-running decoding: feed the model its own most likely character until ``<eos>``.

    Each row stops at its first ``<eos>`` (kept in the output, followed by ``<pad>``); the
    loop ends when every row has stopped or after ``max_len`` steps.

    Args:
        model: an :class:`EncoderDecoder` (put it in eval mode first if it has dropout).
        X: ``(B, T)`` long source; X_valid_lens: ``(B,)`` its lengths.
        max_len: the most characters to emit per row, ``<eos>`` included (keyword-only).
        bos, eos, pad: the special indices (keyword-only; :class:`CharVocab`'s by default).

    Returns:
        ``(Y, attention_weights)``: ``Y`` ``(B, L)`` long with ``L <= max_len``;
        ``attention_weights`` the decoder's weights for every emitted step, ``(B, L, T)``
        (``(B, num_heads, L, T)`` for multi-head attention), or ``None`` without attention.

    Raises:
        ValueError: if ``max_len`` is not a positive integer, or from the model on bad input.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = EncoderDecoder(Seq2SeqEncoder(10, 8, 16),
        ...                        AttentionDecoder(5, 8, 16, DotProductAttention()))
        >>> Y, weights = greedy_decode(model, torch.tensor([[4, 5, 6], [7, 0, 0]]),
        ...                            torch.tensor([3, 1]), max_len=4)
        >>> Y.shape, weights.shape
        (torch.Size([2, 4]), torch.Size([2, 4, 3]))

    Source: greedy search, e.g. Sutskever et al. (2014), section 3.2 (beam size 1).
    """
    check_positive_ints(max_len=max_len)
    B = X.shape[0] if isinstance(X, Tensor) else 0
    state = model.init_state(X, X_valid_lens)
    y = torch.full((B, 1), bos, dtype=torch.long, device=X.device)  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=X.device)
    outputs, weights = [], []
    for _ in range(max_len):
        logits, state = model.decoder(y, state)  # (B, 1, V)
        y = logits.argmax(dim=-1)  # (B, 1)
        y = torch.where(done[:, None], torch.full_like(y, pad), y)
        outputs.append(y)
        w = model.decoder.attention_weights
        if w is not None:
            weights.append(w)
        done = done | (y[:, 0] == eos)
        if bool(done.all()):
            break
    Y = torch.cat(outputs, dim=1)  # (B, L)
    return Y, (torch.cat(weights, dim=-2) if weights else None)
