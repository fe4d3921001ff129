"""Sequence to sequence with attention: reading dates written in many languages.

The task (chapter 7): a date as the Unicode CLDR writes it in some locale and format, read
character by character, is turned into the ISO form ``YYYY-MM-DD``::

    "fr dimanche 22 novembre 2026"  ->  "2026-11-22"
    "ja 2026/11/22"                 ->  "2026-11-22"

This module holds the data helpers (:func:`make_date_examples`, :class:`CharVocab`,
:func:`pad_batch`) and the models: a GRU encoder, a decoder that sees only the encoder's last
state, a decoder that attends over all encoder states with any attention layer of
:mod:`d2lattn`, greedy decoding and the teacher-forced loss.

Shape legend: B batch, T source length, U target length, V vocabulary size, H hidden size.
"""

from __future__ import annotations

import datetime
import random
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .scoring import check_positive_ints

__all__ = [
    "DATE_FORMATS",
    "DATE_LOCALES",
    "AttentionDecoder",
    "CharVocab",
    "DateExample",
    "EncoderDecoder",
    "Seq2SeqDecoder",
    "Seq2SeqEncoder",
    "greedy_decode",
    "make_date_examples",
    "make_date_pairs",
    "pad_batch",
    "seq2seq_loss",
]

#: The locales of the date task: English, French, German, Spanish, Chinese, Japanese, Russian.
DATE_LOCALES: Tuple[str, ...] = ("en", "fr", "de", "es", "zh", "ja", "ru")
#: The four CLDR date lengths, from the most verbose to the most terse.
DATE_FORMATS: Tuple[str, ...] = ("full", "long", "medium", "short")


class DateExample(NamedTuple):
    """One example of the date task: the ``source`` string, its ISO ``target``, and where the
    source came from (``locale``, ``format``)."""

    source: str
    target: str
    locale: str
    format: str


def make_date_examples(
    n: int,
    locales: Sequence[str] = DATE_LOCALES,
    formats: Sequence[str] = DATE_FORMATS,
    *,
    seed: int = 0,
    start: datetime.date = datetime.date(1950, 1, 1),
    end: datetime.date = datetime.date(2049, 12, 31),
    locale_tag: bool = True,
) -> List[DateExample]:
    """Draw ``n`` seeded random dates and write each in a random locale and CLDR format.

    Each example draws a day uniformly in ``[start, end]``, a locale from ``locales`` and a
    format from ``formats`` (uniformly, independently), and writes the source with
    ``babel.dates.format_date``; the target is the ISO date ``YYYY-MM-DD``. With
    ``locale_tag`` the source starts with the locale code and a space: without it some
    sources are ambiguous (``1/5/03`` is 5 January in ``en`` and 1 May in ``es``). Short
    formats print two-digit years; the default 100-year range keeps them unambiguous
    (``50``-``99`` mean 19xx, ``00``-``49`` mean 20xx). Everything is offline (Babel ships the
    CLDR data); the strings depend on Babel's CLDR version.

    Args:
        n: number of examples, ``>= 0``.
        locales: non-empty sequence of Babel locale codes, e.g. ``("en", "fr")``.
        formats: non-empty sequence drawn from ``"full"``, ``"long"``, ``"medium"``,
            ``"short"``.
        seed: seed of the private random generator (the global ``random`` state is untouched).
        start: first possible date (inclusive).
        end: last possible date (inclusive), ``>= start``.
        locale_tag: prefix each source with ``"<locale> "``.

    Returns:
        a list of ``n`` :class:`DateExample` ``(source, target, locale, format)``.

    Raises:
        ValueError: if ``n`` is negative, ``locales`` or ``formats`` is empty or holds an
            unknown name, or ``end < start``.

    Example:
        >>> for ex in make_date_examples(3, seed=1):
        ...     print(ex.target, ex.locale, ex.format, repr(ex.source))
        1974-02-09 zh full 'zh 1974年2月9日星期六'
        1995-10-08 en short 'en 10/8/95'
        2030-08-26 es short 'es 26/8/30'

    Source: dates from the Unicode CLDR via Babel; the task echoes the date-normalization
    demo of neural machine translation courses (book chapter 7).
    """
    from babel import Locale, UnknownLocaleError
    from babel.dates import format_date

    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if isinstance(locales, str) or len(locales) == 0:
        raise ValueError(f"locales must be a non-empty sequence of locale codes, got {locales!r}")
    if isinstance(formats, str) or len(formats) == 0:
        raise ValueError(f"formats must be a non-empty sequence, got {formats!r}")
    for fmt in formats:
        if fmt not in DATE_FORMATS:
            raise ValueError(f"formats must be drawn from {DATE_FORMATS}, got {fmt!r}")
    for loc in locales:
        try:
            Locale.parse(loc)
        except (UnknownLocaleError, ValueError, TypeError) as err:
            raise ValueError(f"locales holds an unknown locale {loc!r}") from err
    if end < start:
        raise ValueError(f"end ({end}) must not be before start ({start})")
    rng = random.Random(seed)
    span = (end - start).days
    examples = []
    for _ in range(n):
        day = start + datetime.timedelta(days=rng.randint(0, span))
        loc = rng.choice(list(locales))
        fmt = rng.choice(list(formats))
        text = format_date(day, format=fmt, locale=loc)
        source = f"{loc} {text}" if locale_tag else text
        examples.append(DateExample(source, day.isoformat(), loc, fmt))
    return examples


def make_date_pairs(
    n: int,
    locales: Sequence[str] = DATE_LOCALES,
    formats: Sequence[str] = DATE_FORMATS,
    *,
    seed: int = 0,
    locale_tag: bool = True,
) -> List[Tuple[str, str]]:
    """``(source, target)`` pairs of :func:`make_date_examples` (same draws, same arguments).

    Args:
        n, locales, formats, seed, locale_tag: as in :func:`make_date_examples`.

    Returns:
        a list of ``n`` ``(source, target)`` string pairs.

    Raises:
        ValueError: as :func:`make_date_examples`.

    Example:
        >>> make_date_pairs(2, ["en"], ["short"], seed=0)
        [('en 2/15/19', '2019-02-15'), ('en 6/16/96', '1996-06-16')]

    Source: book chapter 7.
    """
    return [(ex.source, ex.target)
            for ex in make_date_examples(n, locales, formats, seed=seed, locale_tag=locale_tag)]


class CharVocab:
    """A character vocabulary with four special tokens: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2,
    ``<unk>``=3; the characters of the texts follow in sorted order.

    Args:
        texts: the strings whose characters make up the vocabulary.

    Attributes:
        itos: list of tokens, index -> token (the specials, then the sorted characters).
        stoi: dict, token -> index.
        pad, bos, eos, unk: the indices 0, 1, 2, 3 of the special tokens.

    Raises:
        ValueError: if ``texts`` is a single string (pass a list of strings) or holds a
            non-string.

    Example:
        >>> vocab = CharVocab(["2026-11-22"])
        >>> len(vocab), vocab.itos[4:]
        (9, ['-', '0', '1', '2', '6'])
        >>> vocab.encode("2026", eos=True)
        [7, 5, 7, 8, 2]
        >>> vocab.decode([1, 7, 5, 7, 8, 2, 0, 0])
        '2026'
        >>> X, valid_lens = vocab.encode_batch(["21", "2026"], eos=True)
        >>> X, valid_lens
        (tensor([[7, 6, 2, 0, 0],
                [7, 5, 7, 8, 2]]), tensor([3, 5]))

    Source: book chapter 7 (the usual ``<pad>``/``<bos>``/``<eos>``/``<unk>`` convention of
    sequence-to-sequence models, e.g. d2l.ai section 10.5).
    """

    SPECIALS: Tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
    pad, bos, eos, unk = 0, 1, 2, 3

    def __init__(self, texts: Iterable[str]) -> None:
        if isinstance(texts, str):
            raise ValueError("texts must be a list of strings, not a single string")
        chars = set()
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(f"texts must hold strings, got {type(text).__name__}")
            chars.update(text)
        self.itos: List[str] = list(self.SPECIALS) + sorted(chars)
        self.stoi = {token: i for i, token in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"CharVocab({len(self)} tokens)"

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> List[int]:
        """Indices of the characters of ``text`` (``<unk>`` for a character not in the
        vocabulary), with ``<bos>`` in front and/or ``<eos>`` at the end if asked."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        ids = [self.stoi.get(ch, self.unk) for ch in text]
        return ([self.bos] if bos else []) + ids + ([self.eos] if eos else [])

    def decode(self, ids: Iterable[int]) -> str:
        """The string of ``ids`` (a list or a 1-D tensor): stops at the first ``<eos>``, skips
        ``<pad>`` and ``<bos>``, writes ``<unk>`` as ``"?"``."""
        if isinstance(ids, Tensor):
            if ids.dim() != 1:
                raise ValueError(f"ids must be a 1-D tensor, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.itos):
                raise ValueError(f"ids must lie in [0, {len(self.itos)}), got {i}")
            if i == self.eos:
                break
            if i in (self.pad, self.bos):
                continue
            out.append("?" if i == self.unk else self.itos[i])
        return "".join(out)

    def encode_batch(
        self, texts: Sequence[str], *, bos: bool = False, eos: bool = False
    ) -> Tuple[Tensor, Tensor]:
        """Encode and pad ``texts``: ``(X, valid_lens)``, ``X`` a ``(B, T)`` LongTensor padded
        with ``<pad>`` = 0 and ``valid_lens`` the ``(B,)`` lengths (see :func:`pad_batch`)."""
        if isinstance(texts, str):
            raise ValueError("texts must be a list of strings, not a single string")
        return pad_batch([self.encode(t, bos=bos, eos=eos) for t in texts], pad_id=self.pad)


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> Tuple[Tensor, Tensor]:
    """Pad lists of token indices to one length: a ``(B, T)`` LongTensor and ``valid_lens``.

    Args:
        sequences: ``B >= 1`` sequences of non-negative ints (lists or 1-D tensors); ``T`` is
            the longest length (at least 1, so an all-empty batch gives one pad column).
        pad_id: the index written after each sequence's end.

    Returns:
        ``(X, valid_lens)``: ``X`` of shape ``(B, T)``, dtype ``torch.long``; ``valid_lens`` of
        shape ``(B,)``, dtype ``torch.long``, the length of each sequence.

    Raises:
        ValueError: if ``sequences`` is empty or holds a negative or non-integer token.

    Example:
        >>> pad_batch([[5, 6, 7], [8]])
        (tensor([[5, 6, 7],
                [8, 0, 0]]), tensor([3, 1]))

    Source: the ``valid_lens`` convention of d2l.ai, section 10.5.
    """
    if len(sequences) == 0:
        raise ValueError("sequences must hold at least one sequence")
    rows = [s.tolist() if isinstance(s, Tensor) else list(s) for s in sequences]
    for row in rows:
        for tok in row:
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                raise ValueError(f"sequences must hold non-negative integer tokens, got {tok!r}")
    T = max(1, max(len(row) for row in rows))
    X = torch.full((len(rows), T), pad_id, dtype=torch.long)  # (B, T)
    for b, row in enumerate(rows):
        if row:
            X[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    valid_lens = torch.tensor([len(row) for row in rows], dtype=torch.long)  # (B,)
    return X, valid_lens


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------

DecoderState = Tuple[Tensor, Tensor, Tensor]
"""``(enc_outputs (B, T, H), enc_valid_lens (B,), hidden (1, B, H))``."""


def _check_tokens(name: str, X: Tensor, vocab_size: int) -> None:
    if not isinstance(X, Tensor) or X.dtype != torch.long or X.dim() != 2:
        raise ValueError(f"{name} must be a LongTensor of shape (B, T), got "
                         f"{X.dtype if isinstance(X, Tensor) else type(X).__name__} of shape "
                         f"{tuple(X.shape) if isinstance(X, Tensor) else '?'}")
    if X.numel() and (int(X.min()) < 0 or int(X.max()) >= vocab_size):
        raise ValueError(f"{name} entries must lie in [0, {vocab_size}) (the vocabulary size), "
                         f"got values in [{int(X.min())}, {int(X.max())}]")


def _check_lens(name: str, valid_lens: Tensor, B: int, T: int) -> None:
    if not isinstance(valid_lens, Tensor) or valid_lens.dim() != 1 or valid_lens.shape[0] != B \
            or valid_lens.dtype in (torch.bool,) or valid_lens.is_floating_point():
        raise ValueError(f"{name} must be an integer tensor of shape (B,) = ({B},), got "
                         f"{valid_lens!r}")
    if B and (int(valid_lens.min()) < 1 or int(valid_lens.max()) > T):
        raise ValueError(f"{name} entries must lie in [1, {T}] (the padded length), got values "
                         f"in [{int(valid_lens.min())}, {int(valid_lens.max())}]")


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
        _check_tokens("X", X, self.vocab_size)
        B, T = X.shape
        _check_lens("valid_lens", valid_lens, B, T)
        emb = self.embedding(X)  # (B, T, E)
        outputs, _ = self.rnn(emb)  # (B, T, H)
        # the state after each sequence's last real character (causal: padding comes later)
        state = outputs[torch.arange(B), valid_lens - 1].unsqueeze(0)  # (1, B, H)
        return outputs, state


class Seq2SeqDecoder(nn.Module):
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

    attention_weights: Optional[Tensor] = None

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int) -> None:
        super().__init__()
        check_positive_ints(vocab_size=vocab_size, embed_size=embed_size,
                            num_hiddens=num_hiddens)
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, batch_first=True)
        self.dense = nn.Linear(2 * num_hiddens, vocab_size)

    def init_state(self, enc_outputs: Tensor, enc_state: Tensor,
                   enc_valid_lens: Tensor) -> DecoderState:
        """The decoder's initial state: ``(enc_outputs, enc_valid_lens, enc_state)``."""
        return enc_outputs, enc_valid_lens, enc_state

    def forward(self, Y: Tensor, state: DecoderState) -> Tuple[Tensor, DecoderState]:
        _check_tokens("Y", Y, self.vocab_size)
        enc_outputs, enc_valid_lens, hidden = state
        B, U = Y.shape
        # the fixed context: the encoder's final state (top layer), the same at every step
        # (the encoder's state after the last real character)
        context = enc_outputs[torch.arange(B), enc_valid_lens - 1]  # (B, H)
        context = context.unsqueeze(1).expand(B, U, -1)  # (B, U, H)
        emb = self.embedding(Y)  # (B, U, E)
        outputs, hidden = self.rnn(torch.cat([emb, context], dim=-1), hidden)  # (B, U, H)
        logits = self.dense(torch.cat([outputs, context], dim=-1))  # (B, U, V)
        return logits, (enc_outputs, enc_valid_lens, hidden)


class AttentionDecoder(nn.Module):
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
        super().__init__()
        check_positive_ints(vocab_size=vocab_size, embed_size=embed_size,
                            num_hiddens=num_hiddens)
        if context_size is not None:
            check_positive_ints(context_size=context_size)
        if not isinstance(attention, nn.Module):
            raise ValueError(f"attention must be an nn.Module (an attention layer), got "
                             f"{type(attention).__name__}")
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, batch_first=True)
        self.attention = attention
        self.dense = nn.Linear(num_hiddens + (context_size or num_hiddens), vocab_size)

    @property
    def attention_weights(self) -> Optional[Tensor]:
        """The attention layer's ``attention_weights`` of the last call."""
        return getattr(self.attention, "attention_weights", None)

    def init_state(self, enc_outputs: Tensor, enc_state: Tensor,
                   enc_valid_lens: Tensor) -> DecoderState:
        """The decoder's initial state: ``(enc_outputs, enc_valid_lens, enc_state)``."""
        return enc_outputs, enc_valid_lens, enc_state

    def forward(self, Y: Tensor, state: DecoderState) -> Tuple[Tensor, DecoderState]:
        _check_tokens("Y", Y, self.vocab_size)
        enc_outputs, enc_valid_lens, hidden = state
        emb = self.embedding(Y)  # (B, U, E)
        # 1. run the RNN over the (shifted) targets: its states are the queries
        queries, hidden = self.rnn(emb, hidden)  # (B, U, H)
        # 2. attend over the encoder states (keys = values), padded positions masked
        context = self.attention(queries, enc_outputs, enc_outputs, enc_valid_lens)  # (B, U, C)
        # 3. predict the next character from the state and the context
        logits = self.dense(torch.cat([queries, context], dim=-1))  # (B, U, V)
        return logits, (enc_outputs, enc_valid_lens, hidden)


class EncoderDecoder(nn.Module):
    """An encoder and a decoder joined: ``model(X, X_valid_lens, Y_in)`` gives the logits.

    Args:
        encoder: a :class:`Seq2SeqEncoder` (or a module with the same call).
        decoder: a :class:`Seq2SeqDecoder`, an :class:`AttentionDecoder`, or a module with
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
    _check_tokens("Y", Y, model.decoder.vocab_size)
    B, U = Y.shape
    if X.dim() != 2 or X.shape[0] != B:
        raise ValueError(f"X must have shape (B, T) with B = {B} (the batch of Y), got "
                         f"{tuple(X.shape)}")
    _check_lens("Y_valid_lens", Y_valid_lens, B, U)
    Y_in = torch.cat([torch.full((B, 1), bos, dtype=torch.long, device=Y.device), Y[:, :-1]],
                     dim=1)  # (B, U): teacher forcing, the true previous character
    logits = model(X, X_valid_lens, Y_in)  # (B, U, V)
    losses = F.cross_entropy(logits.transpose(1, 2), Y, reduction="none")  # (B, U)
    mask = torch.arange(U, device=Y.device) < Y_valid_lens[:, None]  # (B, U)
    return (losses * mask).sum() / mask.sum()


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
