r"""Character n-gram language models with interpolated Kneser-Ney smoothing: the baseline a
Transformer language model has to beat.

For the highest order the probability of character :math:`w` after the history :math:`h`
(the last :math:`n-1` characters) discounts every seen count by :math:`D` and gives the mass
it frees to the next lower order:

.. math::
    P_n(w \mid h) = \frac{\max(c(hw) - D_n, 0)}{c(h\cdot)}
        + \frac{D_n\, N_{1+}(h\cdot)}{c(h\cdot)}\, P_{n-1}(w \mid h'),

where :math:`h'` drops the oldest character of :math:`h`, :math:`c(h\cdot) = \sum_w c(hw)`
and :math:`N_{1+}(h\cdot)` counts the distinct characters seen after :math:`h`. The lower
orders use the same formula with *continuation* counts in place of :math:`c`: the number of
distinct characters seen before :math:`hw`, :math:`N_{1+}(\cdot hw)`, which is what makes the
method Kneser-Ney. Order 0 is the uniform distribution over the vocabulary, so every character
of the vocabulary has a non-zero probability; a history never seen falls back to the lower
order. The discount of each order is :math:`D = n_1 / (n_1 + 2 n_2)` from the numbers of
n-grams seen once and twice.

Source: Kneser & Ney (1995); Chen & Goodman (1999), "An Empirical Study of Smoothing Techniques
for Language Modeling", equations (17)-(18) and (26) (interpolated Kneser-Ney).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Dict, List, Tuple

__all__ = ["KneserNeyLM"]


def _context_stats(counts: Dict[str, int]) -> Tuple[Dict[str, int], Dict[str, int], float]:
    """Per history: total count and number of distinct next characters; the discount."""
    total: Dict[str, int] = Counter()
    types: Dict[str, int] = Counter()
    n1 = n2 = 0
    for gram, c in counts.items():
        total[gram[:-1]] += c
        types[gram[:-1]] += 1
        n1 += c == 1
        n2 += c == 2
    D = n1 / (n1 + 2 * n2) if n1 + n2 > 0 else 0.5
    return dict(total), dict(types), D


class KneserNeyLM:
    """An interpolated Kneser-Ney character model of every order up to ``max_order``.

    Args:
        text: the training text.
        max_order: the largest n (1 = unigram, 2 = bigram, ...), a positive integer.
        vocab: the characters the model predicts over (default: those of ``text``); must
            include every character of ``text``.

    Example:
        >>> lm = KneserNeyLM("abababab", 2, vocab="abc")
        >>> round(lm.prob("b", "a", order=2), 3), round(lm.prob("c", "a", order=2), 3)
        (0.917, 0.042)
        >>> round(sum(lm.prob(w, "a", order=2) for w in "abc"), 6)
        1.0

    Source: Chen & Goodman (1999), interpolated Kneser-Ney; book chapter 12.
    """

    def __init__(self, text: str, max_order: int, vocab: str | None = None) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty string")
        if isinstance(max_order, bool) or not isinstance(max_order, int) or max_order < 1:
            raise ValueError(f"max_order must be a positive integer, got {max_order!r}")
        self.vocab = sorted(set(vocab if vocab is not None else text))
        if not set(text) <= set(self.vocab):
            raise ValueError("vocab must contain every character of text")
        self.max_order = max_order
        # raw[k]: counts of the k-grams; cont[k]: continuation counts (distinct left neighbours)
        self.raw: List[Dict[str, int]] = [{}]
        self.cont: List[Dict[str, int]] = [{}]
        for k in range(1, max_order + 1):
            self.raw.append(dict(Counter(text[i:i + k] for i in range(len(text) - k + 1))))
        for k in range(1, max_order):
            cont: Dict[str, int] = Counter()
            for gram in self.raw[k + 1]:
                cont[gram[1:]] += 1
            self.cont.append(dict(cont))
        self._stats: Dict[Tuple[str, int], Tuple[Dict[str, int], Dict[str, int], float]] = {}

    def _level(self, kind: str, k: int):
        """The counts of order ``k`` (``"raw"`` or ``"cont"``) and their history statistics,
        computed on first use (an order-n model needs the raw counts of order n only)."""
        if (kind, k) not in self._stats:
            counts = self.raw[k] if kind == "raw" else self.cont[k]
            self._stats[kind, k] = _context_stats(counts)
        counts = self.raw[k] if kind == "raw" else self.cont[k]
        return counts, self._stats[kind, k]

    def _check_order(self, order: int) -> None:
        if isinstance(order, bool) or not isinstance(order, int) \
                or not 1 <= order <= self.max_order:
            raise ValueError(f"order must be an integer in [1, {self.max_order}], got {order!r}")

    def prob(self, char: str, history: str, *, order: int) -> float:
        """P(char | the last ``order - 1`` characters of ``history``) under the order-``order`` model."""
        self._check_order(order)
        p = 1.0 / len(self.vocab)  # order 0: uniform
        for k in range(1, order + 1):  # build up from the unigram to order n
            counts, (total, types, D) = self._level("raw" if k == order else "cont", k)
            h = history[len(history) - (k - 1):] if k > 1 else ""
            if k - 1 > len(history):
                continue  # not enough history: this order is skipped
            tot = total.get(h)
            if tot:
                c = counts.get(h + char, 0)
                p = (max(c - D, 0.0) + D * types[h] * p) / tot
        return p

    def bits(self, text: str, *, order: int, start: int = 1) -> List[float]:
        """``-log2 P`` of each character ``text[i]``, ``i >= start``, given the text before it.

        Raises:
            ValueError: a bad order or a character outside the vocabulary.
        """
        self._check_order(order)
        known = set(self.vocab)
        out = []
        for i in range(start, len(text)):
            if text[i] not in known:
                raise ValueError(f"character {text[i]!r} is not in the vocabulary")
            out.append(-math.log2(self.prob(text[i], text[max(0, i - order + 1):i],
                                            order=order)))
        return out
