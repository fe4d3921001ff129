"""Tests of d2lattn.ngram's modified Kneser-Ney and paired bootstrap (chapter 12)."""

import math
from collections import Counter

import pytest
import torch

from d2lattn.ngram import KneserNeyLM, ModifiedKneserNeyLM, paired_bootstrap

TEXT = ("the cat sat on the mat. the cat ate the rat. a bat sat on a hat. that fat cat ran at "
        "the rat; the mat was flat. ") * 2 + "then the bat sang."


def _brute_mkn(text, vocab, w, history, order):
    """Modified Kneser-Ney from its definition, counting by scanning the text each time."""
    def raw(g):
        return sum(text.startswith(g, i) for i in range(len(text) - len(g) + 1))

    def cont(g):  # distinct characters seen right before g
        return len({text[i - 1] for i in range(1, len(text) - len(g) + 1)
                    if text.startswith(g, i)})

    def grams(k):
        return {text[i:i + k] for i in range(len(text) - k + 1)}

    def discounts(count, k):
        n = Counter(min(count(g), 5) for g in grams(k) if count(g) > 0)
        Y = n[1] / (n[1] + 2 * n[2]) if n[1] else 0.5  # the documented fallbacks
        D = [1 - 2 * Y * n[2] / n[1] if n[1] else Y, 2 - 3 * Y * n[3] / n[2] if n[2] else Y,
             3 - 4 * Y * n[4] / n[3] if n[3] else Y]
        return [d if 0 < d <= r else Y for r, d in zip((1, 2, 3), D)]

    p = 1 / len(vocab)
    for k in range(1, order + 1):
        count = raw if k == order else cont
        h = history[len(history) - (k - 1):] if k > 1 else ""
        if k - 1 > len(history):
            continue
        follow = {g: count(g) for g in grams(k) if g.startswith(h)}
        follow = {g: c for g, c in follow.items() if c > 0}
        tot = sum(follow.values())
        if not tot:
            continue
        D = discounts(count, k)
        freed = sum(D[min(c, 3) - 1] for c in follow.values())
        c = follow.get(h + w, 0)
        p = (max(c - D[min(c, 3) - 1], 0) if c else 0) / tot + freed / tot * p
    return p


def test_modified_kneser_ney_matches_a_brute_force_count():
    vocab = sorted(set(TEXT + "xz"))
    lm = ModifiedKneserNeyLM(TEXT, 3, vocab="".join(vocab))
    for order in (1, 2, 3):
        for history in ("", "t", "th", "at", " s", "zq"):
            for w in "aht. x":
                assert math.isclose(lm.prob(w, history, order=order),
                                    _brute_mkn(TEXT, vocab, w, history, order),
                                    rel_tol=1e-12)
    # the discounts really differ from one another here (else the test proves little)
    D1, D2, D3 = lm.discounts("raw", 3)
    assert len({round(D1, 6), round(D2, 6), round(D3, 6)}) == 3


def test_modified_kneser_ney_normalises_at_every_history():
    lm = ModifiedKneserNeyLM(TEXT, 4, vocab=TEXT + "xyz")
    histories = {TEXT[i:i + 3] for i in range(len(TEXT) - 3)} | {"", "q", "zzz", "xy"}
    for history in histories:
        for order in (1, 2, 3, 4):
            total = math.fsum(lm.prob(w, history, order=order) for w in lm.vocab)
            assert abs(total - 1.0) < 1e-12, (history, order, total)
            assert all(lm.prob(w, history, order=order) > 0 for w in lm.vocab)


def test_equal_discounts_give_plain_kneser_ney_and_three_do_better():
    kn = KneserNeyLM(TEXT, 4, vocab=TEXT + "xyz")
    same = ModifiedKneserNeyLM(TEXT, 4, vocab=TEXT + "xyz", equal_discounts=True)
    mkn = ModifiedKneserNeyLM(TEXT, 4, vocab=TEXT + "xyz")
    test = "the rat sat on the cat. a hat."
    for order in (1, 2, 3, 4):
        a, b = kn.bits(test, order=order), same.bits(test, order=order)
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-12
    # with three discounts the model differs from plain Kneser-Ney (a check that can fail)
    assert kn.bits(test, order=4) != mkn.bits(test, order=4)


def test_modified_kneser_ney_rejects_bad_input():
    with pytest.raises(ValueError, match="max_order"):
        ModifiedKneserNeyLM(TEXT, 0)
    with pytest.raises(ValueError, match="text"):
        ModifiedKneserNeyLM("", 2)
    with pytest.raises(ValueError, match="vocab"):
        ModifiedKneserNeyLM(TEXT, 2, vocab="abc")
    with pytest.raises(ValueError, match="equal_discounts"):
        ModifiedKneserNeyLM(TEXT, 2, equal_discounts=1)
    lm = ModifiedKneserNeyLM(TEXT, 2)
    with pytest.raises(ValueError, match="order"):
        lm.prob("t", "", order=3)
    with pytest.raises(ValueError, match="vocabulary"):
        lm.bits("the dog", order=2)
    with pytest.raises(ValueError, match="kind"):
        lm.discounts("other", 1)
    with pytest.raises(ValueError, match="k must"):
        lm.discounts("cont", 2)


def test_paired_bootstrap_pairs_the_units():
    g = torch.Generator().manual_seed(0)
    text_difficulty = torch.rand(500, generator=g, dtype=torch.float64) * 2  # shared by both
    a = text_difficulty + 0.05 + 0.01 * torch.randn(500, generator=g, dtype=torch.float64)
    b = text_difficulty + 0.01 * torch.randn(500, generator=g, dtype=torch.float64)
    mean, low, high = paired_bootstrap(a, b)
    assert abs(mean - (a - b).mean().item()) < 1e-12
    assert low < mean < high and 0.04 < low and high < 0.06  # tight: the pairing cancels
    # unpaired (shuffling b's units) the same margin is lost in the units' spread
    _, low_u, high_u = paired_bootstrap(a, b[torch.randperm(500, generator=g)])
    assert high_u - low_u > 10 * (high - low)
    # the same seed gives the same interval; the interval covers the truth at level 0.95
    assert paired_bootstrap(a, b) == (mean, low, high)


@pytest.mark.parametrize("a, b, kwargs, match", [
    ([1.0, 2.0], [1.0], {}, "same length"),
    ([1.0], [1.0], {}, "same length"),
    ([[1.0, 2.0]], [[1.0, 2.0]], {}, "1-D"),
    ([1.0, float("nan")], [1.0, 2.0], {}, "finite"),
    ([1.0, 2.0], [1.0, 2.0], {"resamples": 0}, "resamples"),
    ([1.0, 2.0], [1.0, 2.0], {"level": 1.0}, "level"),
])
def test_paired_bootstrap_rejects_bad_input(a, b, kwargs, match):
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(a, b, **kwargs)
