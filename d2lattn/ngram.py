r"""Character n-gram language models with interpolated Kneser-Ney smoothing, plain and
modified: the baselines a Transformer language model has to beat; and a paired bootstrap for
the margin between two models scored on the same text.

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

**Modified** Kneser-Ney (:class:`ModifiedKneserNeyLM`) keeps the formula but gives each order
three discounts instead of one, chosen by the count being discounted:

.. math::
    P_n(w \mid h) = \frac{\max(c(hw) - D(c(hw)), 0)}{c(h\cdot)}
        + \frac{D_1 N_1(h\cdot) + D_2 N_2(h\cdot) + D_{3+} N_{3+}(h\cdot)}{c(h\cdot)}
          \, P_{n-1}(w \mid h'),

with :math:`D(c) = D_1, D_2, D_{3+}` for :math:`c = 1, 2, \ge 3`, :math:`N_r(h\cdot)` the
number of characters seen exactly :math:`r` times after :math:`h` (:math:`N_{3+}`: three times
or more), and, from the numbers :math:`n_r` of the order's n-grams seen exactly :math:`r` times,

.. math::
    Y = \frac{n_1}{n_1 + 2 n_2},\quad D_1 = 1 - 2Y\frac{n_2}{n_1},\quad
    D_2 = 2 - 3Y\frac{n_3}{n_2},\quad D_{3+} = 3 - 4Y\frac{n_4}{n_3}.

The lower orders use continuation counts as above, and their discounts come from the counts of
those counts. On tiny texts an :math:`n_r` in a denominator can be zero or a :math:`D_r` can fall
outside :math:`(0, r]`; that discount is then :math:`Y` (and :math:`Y = 1/2` when
:math:`n_1 = 0`), so every discount is positive and no probability is zero or negative. With :math:`D_1 = D_2 = D_{3+} = Y` the model is plain Kneser-Ney (``D_1`` always
equals ``Y``).

Source: Kneser & Ney (1995); Chen & Goodman (1999), "An Empirical Study of Smoothing Techniques
for Language Modeling", equations (17)-(18) and (26) (interpolated Kneser-Ney), and section 3
(modified Kneser-Ney: the three discounts and their estimates from counts of counts).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Dict, List, Sequence, Tuple

import torch

__all__ = ["KneserNeyLM", "ModifiedKneserNeyLM", "paired_bootstrap"]


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


def _modified_stats(counts: Dict[str, int], equal: bool = False
                    ) -> Tuple[Dict[str, int], Dict[str, float], Tuple[float, float, float]]:
    """Per history: the total count and the mass the three discounts free; the discounts."""
    n = Counter(min(c, 5) for c in counts.values())  # n[r]: n-grams seen r times (r <= 4)
    if equal:  # plain Kneser-Ney's one discount, as _context_stats computes it
        Y = n[1] / (n[1] + 2 * n[2]) if n[1] + n[2] > 0 else 0.5
        D = (Y, Y, Y)
    else:
        Y = n[1] / (n[1] + 2 * n[2]) if n[1] > 0 else 0.5
        D = (1 - 2 * Y * n[2] / n[1] if n[1] else Y,
             2 - 3 * Y * n[3] / n[2] if n[2] else Y,
             3 - 4 * Y * n[4] / n[3] if n[3] else Y)
        D = tuple(d if 0 < d <= r else Y for r, d in zip((1, 2, 3), D))
    total: Dict[str, int] = Counter()
    freed: Dict[str, float] = Counter()
    for gram, c in counts.items():
        total[gram[:-1]] += c
        freed[gram[:-1]] += D[min(c, 3) - 1]
    return dict(total), dict(freed), D


class ModifiedKneserNeyLM(KneserNeyLM):
    """An interpolated *modified* Kneser-Ney character model (three discounts per order).

    Args:
        text: the training text.
        max_order: the largest n, a positive integer.
        vocab: the characters the model predicts over (default: those of ``text``); must
            include every character of ``text``.
        equal_discounts: set ``D_1 = D_2 = D_3+ = Y`` at every order, which is plain
            Kneser-Ney (:class:`KneserNeyLM`); for tests and comparisons.

    Attributes:
        discounts(kind, k): the ``(D_1, D_2, D_3+)`` of the order-``k`` counts, ``kind``
            ``"raw"`` (the highest order of a model) or ``"cont"`` (the lower ones).

    Example:
        >>> lm = ModifiedKneserNeyLM("abababab", 2, vocab="abc")
        >>> round(sum(lm.prob(w, "a", order=2) for w in "abc"), 6)
        1.0

    Raises:
        ValueError: as :class:`KneserNeyLM`; ``equal_discounts`` not a bool.

    Source: Chen & Goodman (1999), section 3 (modified Kneser-Ney); the module's equations;
    book chapter 12.
    """

    def __init__(self, text: str, max_order: int, vocab: str | None = None, *,
                 equal_discounts: bool = False) -> None:
        if not isinstance(equal_discounts, bool):
            raise ValueError(f"equal_discounts must be a bool, got {equal_discounts!r}")
        super().__init__(text, max_order, vocab)
        self.equal_discounts = equal_discounts

    def _level(self, kind: str, k: int):
        if (kind, k) not in self._stats:
            counts = self.raw[k] if kind == "raw" else self.cont[k]
            self._stats[kind, k] = _modified_stats(counts, self.equal_discounts)
        counts = self.raw[k] if kind == "raw" else self.cont[k]
        return counts, self._stats[kind, k]

    def discounts(self, kind: str, k: int) -> Tuple[float, float, float]:
        """The three discounts ``(D_1, D_2, D_3+)`` of the order-``k`` counts of ``kind``."""
        if kind not in ("raw", "cont"):
            raise ValueError(f"kind must be 'raw' or 'cont', got {kind!r}")
        top = self.max_order if kind == "raw" else self.max_order - 1
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= top:
            raise ValueError(f"k must be an integer in [1, {top}] for {kind!r}, got {k!r}")
        return self._level(kind, k)[1][2]

    def prob(self, char: str, history: str, *, order: int) -> float:
        """P(char | the last ``order - 1`` characters of ``history``) under the order-``order`` model."""
        self._check_order(order)
        p = 1.0 / len(self.vocab)  # order 0: uniform
        for k in range(1, order + 1):
            counts, (total, freed, D) = self._level("raw" if k == order else "cont", k)
            if k - 1 > len(history):
                continue  # not enough history: this order is skipped
            h = history[len(history) - (k - 1):] if k > 1 else ""
            tot = total.get(h)
            if tot:
                c = counts.get(h + char, 0)
                seen = c - D[min(c, 3) - 1] if c else 0.0
                p = (max(seen, 0.0) + freed[h] * p) / tot
        return p


def paired_bootstrap(a: Sequence[float] | torch.Tensor, b: Sequence[float] | torch.Tensor, *,
                     resamples: int = 10_000, level: float = 0.95, seed: int = 0
                     ) -> Tuple[float, float, float]:
    """The mean of ``a - b`` over paired units and a percentile bootstrap interval for it.

    Both models are scored on the same units (held-out windows, say): unit ``i`` gives loss
    ``a[i]`` to one model and ``b[i]`` to the other. Each resample draws ``len(a)`` units with
    replacement, the *same* units for both, so the interval reflects how much the margin
    depends on which text was held out, not the two models' separate spreads.

    Args:
        a, b: ``(U,)`` float losses per unit (each unit's mean, for units of equal size), ``U >= 2``.
        resamples: the number of bootstrap resamples, a positive integer.
        level: the interval's coverage, in ``(0, 1)``.
        seed: seeds the resampling (a ``torch.Generator`` on the CPU).

    Returns:
        ``(mean, low, high)`` floats: the mean of ``a - b`` and the ``(1 - level) / 2`` and
        ``(1 + level) / 2`` quantiles of the resampled means.

    Raises:
        ValueError: ``a`` and ``b`` not 1-D of the same length >= 2, a non-finite value, or a
            bad ``resamples`` or ``level``.

    Example:
        >>> m, lo, hi = paired_bootstrap([2.0, 2.1, 2.2, 2.3], [1.9, 2.0, 2.2, 2.2])
        >>> round(m, 3), lo <= m <= hi
        (0.075, True)

    Source: Efron & Tibshirani (1993), *An Introduction to the Bootstrap*, ch. 13 (percentile
    interval); the paired design as in Koehn (2004), "Statistical significance tests for
    machine translation evaluation"; book chapter 12.
    """
    a = torch.as_tensor(a, dtype=torch.float64).cpu()
    b = torch.as_tensor(b, dtype=torch.float64).cpu()
    if a.dim() != 1 or a.shape != b.shape or a.numel() < 2:
        raise ValueError(f"a and b must be 1-D with the same length >= 2, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise ValueError("a and b must be finite")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    diff = a - b
    g = torch.Generator().manual_seed(seed)
    means = torch.cat([diff[torch.randint(0, diff.numel(), (min(1000, resamples - i),
                                              diff.numel()), generator=g)].mean(1)
                       for i in range(0, resamples, 1000)])  # 1,000 resamples at a time
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    low, high = torch.quantile(means, q).tolist()
    return diff.mean().item(), low, high
