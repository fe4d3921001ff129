"""Two real texts for character-level language models, their fixed splits and a tokenizer.

The corpora ship with the library, compressed (``d2lattn/corpora/``, provenance in the README
there), so that a chapter trains on real text with no network:

* ``"shakespeare"``: the tiny-Shakespeare text of char-rnn (1,115,394 characters, 65 distinct).
  Held out: the last tenth of the characters (the split of nanoGPT's character-level model).
* ``"tang"``: 18,492 Tang poems in five-character half-lines (4 or 8 of them), one poem per
  line, traditional script (792,241 characters without the newlines, 810,733 with them, 6,073
  distinct). The file holds some poems more than once, word for word or in variant readings, so
  the split first removes
  duplicates, in file order, keeping the first: 306 exact repeats, then 838 near-duplicates, a
  poem that shares at least half of the half-lines of the shorter of the two with a poem kept
  before it. Of the 17,348 poems left, every tenth one is held out (poems ``9, 19, 29, ...`` of
  them). No held-out poem then shares half its half-lines with a training poem; 71 of the 1,734
  share at least one (92 of their 12,452 half-lines: stock phrases, the refrain of a series,
  single couplets), which the split keeps.

Example:
    >>> split = load_split("tang")
    >>> len(split.train_poems), len(split.held_out_poems)
    (15614, 1734)
    >>> split.held_out_poems[0][:12]
    '新豐停翠輦，譙邑駐鳴笳。'
"""

from __future__ import annotations

import lzma
import re
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ._checks import (
    check_ids,
    check_positive_ints,
    check_text,
    check_token_stream,
)

__all__ = ["CORPORA", "CharTokenizer", "TextSplit", "distinct_poems", "load_corpus", "load_split",
           "random_windows"]

_DIR = Path(__file__).parent / "corpora"
#: The shipped corpora: name -> file in ``d2lattn/corpora/``.
CORPORA = {"shakespeare": "tinyshakespeare.txt.xz", "tang": "tang_wuyan.txt.xz"}


def load_corpus(name: str) -> str:
    """The full text of a shipped corpus (``"shakespeare"`` or ``"tang"``), decompressed.

    Raises:
        ValueError: an unknown name.
    """
    if name not in CORPORA:
        raise ValueError(f"name must be one of {sorted(CORPORA)}, got {name!r}")
    with lzma.open(_DIR / CORPORA[name], "rt", encoding="utf-8") as f:
        return f.read()


class TextSplit(NamedTuple):
    """A corpus split into training and held-out text.

    Attributes:
        name: the corpus.
        text: the whole corpus (the tokenizer's vocabulary is built from it).
        train, held_out: the two parts, as one string each (poems joined by newlines).
        train_poems, held_out_poems: for ``"tang"``, the poems of each part (empty otherwise).
    """

    name: str
    text: str
    train: str
    held_out: str
    train_poems: List[str]
    held_out_poems: List[str]


_HALF_LINE = re.compile(r"[^，。？！；]+")  # a half-line's characters, without its mark


def distinct_poems(poems: List[str]) -> List[str]:
    """The poems without repeats, in order: a poem is dropped when it equals a poem kept before
    it, or shares at least half of the (distinct) half-lines of the shorter of the two with one.

    Example:
        >>> distinct_poems(["白日依山盡，黃河入海流。", "白日依山盡，黃河入海流。",
        ...                 "白日依山盡，長河入海流。", "欲窮千里目，更上一層樓。"])
        ['白日依山盡，黃河入海流。', '欲窮千里目，更上一層樓。']
    """
    kept: List[str] = []
    halves: List[set] = []
    index: defaultdict = defaultdict(list)  # half-line -> kept poems that have it
    seen = set()
    for poem in poems:
        if poem in seen:
            continue
        seen.add(poem)
        mine = set(_HALF_LINE.findall(poem))
        shared = Counter(j for h in mine for j in index[h])
        if any(2 * n >= min(len(mine), len(halves[j])) for j, n in shared.items()):
            continue
        for h in mine:
            index[h].append(len(kept))
        kept.append(poem)
        halves.append(mine)
    return kept


@lru_cache(maxsize=None)
def _distinct_tang() -> Tuple[str, Tuple[str, ...]]:
    """The Tang text and its distinct poems, computed once (about half a CPU-second)."""
    text = load_corpus("tang")
    return text, tuple(distinct_poems(text.splitlines()))


def load_split(name: str) -> TextSplit:
    """The corpus with its fixed held-out split (see the module's docstring).

    Raises:
        ValueError: an unknown name.
    """
    if name == "tang":
        text = _distinct_tang()[0]
    else:
        text = load_corpus(name)
    if name == "shakespeare":
        cut = int(0.9 * len(text))
        return TextSplit(name, text, text[:cut], text[cut:], [], [])
    poems = _distinct_tang()[1]
    train = [p for i, p in enumerate(poems) if i % 10 != 9]
    held_out = [p for i, p in enumerate(poems) if i % 10 == 9]
    return TextSplit(name, text, "\n".join(train) + "\n", "\n".join(held_out) + "\n",
                     train, held_out)


class CharTokenizer:
    """Characters as tokens: the distinct characters of a text, sorted, are ids ``0 .. V-1``.

    A character language model needs no special tokens: a newline ends a speech line or a
    poem. The vocabulary is closed: encoding a character it does not know is an error.

    Args:
        text: the text whose characters make up the vocabulary.

    Example:
        >>> tok = CharTokenizer("hello world")
        >>> len(tok), tok.encode("hold")
        (8, tensor([3, 5, 4, 1]))
        >>> tok.decode(tok.encode("hold"))
        'hold'
    """

    def __init__(self, text: str) -> None:
        check_text(text, non_empty=True)
        self.itos: List[str] = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"CharTokenizer({len(self)} characters)"

    def encode(self, text: str) -> Tensor:
        """``(len(text),)`` int64 ids. Raises ``ValueError`` on a character not in the vocabulary."""
        check_text(text)
        try:
            return torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of a 1-D sequence (list or tensor) of ids."""
        return "".join(self.itos[i] for i in check_ids(ids, len(self.itos)))


def random_windows(data: Tensor, batch_size: int, block_size: int, *,
                   generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor]:
    """A batch of random windows of a token stream and their next tokens.

    Args:
        data: ``(N,)`` int64 token ids, ``N > block_size``.
        batch_size: B. block_size: T, the context length.
        generator: keyword-only; the random generator of the window starts.

    Returns:
        ``(X, Y)``, both ``(B, T)`` int64: ``X[b] = data[s : s+T]``, ``Y[b] = data[s+1 : s+T+1]``.

    Example:
        >>> X, Y = random_windows(torch.arange(10), 2, 4, generator=torch.Generator().manual_seed(0))
        >>> bool((Y == X + 1).all()), X.shape
        (True, torch.Size([2, 4]))
    """
    check_positive_ints(batch_size=batch_size, block_size=block_size)
    check_token_stream(data, block_size)
    starts = torch.randint(0, data.numel() - block_size, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(block_size)  # (B, T)
    return data[index], data[index + 1]
