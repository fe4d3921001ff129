"""The date task of chapters 7 and 8: dates written as the Unicode CLDR writes them, to ISO.

A date as some locale writes it, in one of CLDR's four lengths, read character by character,
is turned into the ISO form ``YYYY-MM-DD``::

    "fr dimanche 22 novembre 2026"  ->  "2026-11-22"
    "ja 2026/11/22"                 ->  "2026-11-22"

:func:`make_date_examples` draws one date per example; :func:`make_multi_date_examples` writes
several dates on one line, each in its own locale and format, so that what the decoder must
recover grows with the number of dates (chapter 7's bottleneck experiment)::

    "de 01.05.03; en Nov 22, 2026"  ->  "2003-05-01 2026-11-22"

:class:`CharVocab` and :func:`pad_batch` turn strings into padded index tensors and
:func:`length_batches` groups examples of similar length into shuffled batches. Everything is
offline (Babel ships the CLDR data); the strings depend on Babel's CLDR version.

Shape legend: B batch, T padded length.
"""

from __future__ import annotations

import datetime
import random
from typing import Iterable, List, NamedTuple, Sequence, Tuple

import torch
from torch import Tensor

from ._checks import (
    check_ids,
    check_non_negative_ints,
    check_positive_ints,
    check_text,
    check_texts,
    check_token_lists,
)

__all__ = [
    "DATE_FORMATS",
    "DATE_LOCALES",
    "CharVocab",
    "DateExample",
    "MultiDateExample",
    "length_batches",
    "make_date_examples",
    "make_date_pairs",
    "make_multi_date_examples",
    "pad_batch",
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

    check_non_negative_ints(n=n)
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
        check_texts(texts)
        chars = set()
        for text in texts:
            check_text(text, "texts' entries")
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
        check_text(text)
        ids = [self.stoi.get(ch, self.unk) for ch in text]
        return ([self.bos] if bos else []) + ids + ([self.eos] if eos else [])

    def decode(self, ids: Iterable[int]) -> str:
        """The string of ``ids`` (a list or a 1-D tensor): stops at the first ``<eos>``, skips
        ``<pad>`` and ``<bos>``, writes ``<unk>`` as ``"?"``."""
        out = []
        for i in check_ids(ids, len(self.itos)):
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
        check_texts(texts)
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
    rows = check_token_lists(sequences)
    T = max(1, max(len(row) for row in rows))
    X = torch.full((len(rows), T), pad_id, dtype=torch.long)  # (B, T)
    for b, row in enumerate(rows):
        if row:
            X[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    valid_lens = torch.tensor([len(row) for row in rows], dtype=torch.long)  # (B,)
    return X, valid_lens




class MultiDateExample(NamedTuple):
    """One example of the multi-date task: the ``source`` line, its ``target`` (the ISO dates
    in source order, separated by spaces), and per date its ``locales`` and ``formats``."""

    source: str
    target: str
    locales: Tuple[str, ...]
    formats: Tuple[str, ...]

    @property
    def num_dates(self) -> int:
        """The number of dates on the line."""
        return len(self.locales)


def make_multi_date_examples(
    n: int,
    num_dates: Sequence[int] = (1, 2, 3, 4, 5, 6),
    locales: Sequence[str] = DATE_LOCALES,
    formats: Sequence[str] = DATE_FORMATS,
    *,
    seed: int = 0,
    separator: str = "; ",
) -> List[MultiDateExample]:
    """Draw ``n`` lines, each holding several dates in mixed locales and formats.

    Each example draws its number of dates ``k`` uniformly from ``num_dates``, then ``k``
    dates as :func:`make_date_examples` does (a day in 1950-2049, a locale, a format, each
    uniform and independent), each written with its locale tag (``"de 01.05.03"``). The source
    joins them with ``separator``; the target joins their ISO forms with one space, in the
    same order. The information the target carries grows linearly with ``k`` (about 15 bits
    per date: 36,524 possible days), which is what makes a fixed-size state a bottleneck.

    Args:
        n: number of examples, ``>= 0``.
        num_dates: non-empty sequence of positive ints, the possible numbers of dates.
        locales: non-empty sequence of Babel locale codes.
        formats: non-empty sequence drawn from ``"full"``, ``"long"``, ``"medium"``,
            ``"short"``.
        seed: seed of the private random generator (the global ``random`` state is untouched).
        separator: the string between two dates of a source; it must not be empty.

    Returns:
        a list of ``n`` :class:`MultiDateExample` ``(source, target, locales, formats)``.

    Raises:
        ValueError: if ``n`` is negative, ``num_dates`` is empty or holds a non-positive or
            non-integer entry, ``separator`` is empty, or from :func:`make_date_examples`
            (bad ``locales`` or ``formats``).

    Example:
        >>> for ex in make_multi_date_examples(2, (1, 2, 3), ["en", "de"], ["short"], seed=0):
        ...     print(ex.num_dates, repr(ex.source), "->", repr(ex.target))
        2 'de 20.01.48; en 11/29/61' -> '2048-01-20 1961-11-29'
        2 'de 18.09.47; en 4/8/30' -> '2047-09-18 2030-04-08'

    Source: book chapter 7 (a task whose information grows with the input, as the sentence
    lengths of Bahdanau et al. (2015), figure 2).
    """
    check_non_negative_ints(n=n)
    if isinstance(num_dates, (str, int)) or len(num_dates) == 0:
        raise ValueError(f"num_dates must be a non-empty sequence of positive ints, got "
                         f"{num_dates!r}")
    for k in num_dates:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_dates must hold positive ints, got {k!r}")
    if not isinstance(separator, str) or separator == "":
        raise ValueError(f"separator must be a non-empty string, got {separator!r}")
    make_date_examples(0, locales, formats)  # validates locales and formats
    rng = random.Random(seed)
    ks = [rng.choice(list(num_dates)) for _ in range(n)]
    dates = make_date_examples(sum(ks), locales, formats, seed=rng.randrange(2**31))
    examples, i = [], 0
    for k in ks:
        part = dates[i:i + k]
        i += k
        examples.append(MultiDateExample(separator.join(ex.source for ex in part),
                                         " ".join(ex.target for ex in part),
                                         tuple(ex.locale for ex in part),
                                         tuple(ex.format for ex in part)))
    return examples


def length_batches(lengths: Sequence[int], batch_size: int, *,
                   generator: torch.Generator | None = None, pool: int = 16) -> List[Tensor]:
    """One epoch of batches of similar length: every example exactly once, in a fresh order.

    The examples are shuffled, cut into pools of ``pool * batch_size``, each pool is sorted by
    length and cut into batches (the last batch of a pool may be smaller: nothing is dropped),
    and the batches are shuffled. Call it again for each epoch: with a generator the order
    changes every call. Sorting within pools keeps padding (and time) low while every batch
    still mixes examples from all over the data set.

    Args:
        lengths: the length of each example (e.g. of its source), ``N >= 1`` ints.
        batch_size: the most examples per batch, ``>= 1``.
        generator: a ``torch.Generator`` for the shuffles (keyword-only; the global RNG if
            ``None``).
        pool: how many batches are sorted together (keyword-only, ``>= 1``).

    Returns:
        a list of 1-D LongTensors of example indices; together they hold ``0..N-1`` once each.

    Raises:
        ValueError: if ``lengths`` is empty or ``batch_size`` or ``pool`` is not a positive int.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> batches = length_batches([5, 1, 4, 2, 3], 2, generator=g)
        >>> sorted(torch.cat(batches).tolist()), [len(b) for b in batches]
        ([0, 1, 2, 3, 4], [2, 1, 2])

    Source: the bucketing of Sutskever et al. (2014), section 3.4 (batches of sentences of
    similar length); book chapter 7.
    """
    if len(lengths) == 0:
        raise ValueError("lengths must hold at least one length")
    check_positive_ints(batch_size=batch_size, pool=pool)
    lengths_t = torch.as_tensor(list(lengths), dtype=torch.long)  # (N,)
    perm = torch.randperm(len(lengths_t), generator=generator)  # (N,)
    batches: List[Tensor] = []
    step = pool * batch_size
    for i in range(0, len(perm), step):
        chunk = perm[i:i + step]
        chunk = chunk[torch.argsort(lengths_t[chunk], stable=True)]
        batches.extend(chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size))
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in order]
