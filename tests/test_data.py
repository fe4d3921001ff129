"""d2lattn.data: the CLDR date task (one or several dates per line), vocabulary, padding,
batches of similar length."""

import datetime

import pytest
import torch

import d2lattn
from d2lattn import (
    DATE_FORMATS,
    DATE_LOCALES,
    CharVocab,
    MultiDateExample,
    length_batches,
    make_date_examples,
    make_date_pairs,
    make_multi_date_examples,
    pad_batch,
)


def test_data_names_live_in_the_data_module_and_at_top_level():
    from d2lattn import data, seq2seq
    for name in data.__all__:
        assert getattr(d2lattn, name) is getattr(data, name)
        assert name in d2lattn.__all__
    assert "make_date_examples" not in seq2seq.__all__


# ---------------------------------------------------------------- data helpers

def test_date_examples_are_seeded_correct_and_cover_all_locales_and_formats():
    a = make_date_examples(400, seed=3)
    assert a == make_date_examples(400, seed=3)
    assert a != make_date_examples(400, seed=4)
    assert {ex.locale for ex in a} == set(DATE_LOCALES)
    assert {ex.format for ex in a} == set(DATE_FORMATS)
    from babel.dates import format_date
    for ex in a[:50]:
        day = datetime.date.fromisoformat(ex.target)
        assert ex.source == f"{ex.locale} " + format_date(day, ex.format, locale=ex.locale)
    assert make_date_pairs(5, seed=3) == [(ex.source, ex.target) for ex in a[:5]]


def test_date_examples_respect_range_and_tag():
    start, end = datetime.date(2001, 1, 1), datetime.date(2001, 1, 31)
    exs = make_date_examples(50, ["de"], ["short"], seed=0, start=start, end=end, locale_tag=False)
    for ex in exs:
        assert start <= datetime.date.fromisoformat(ex.target) <= end
        assert ex.source.endswith(".01.01") and not ex.source.startswith("de ")


def test_date_sources_with_locale_tag_are_unambiguous():
    targets = {}
    for ex in make_date_examples(5000, seed=0):
        assert targets.setdefault(ex.source, ex.target) == ex.target


@pytest.mark.parametrize("kwargs", [dict(n=-1), dict(n=2.0), dict(n=3, locales=[]),
                                    dict(n=3, locales="en"), dict(n=3, formats=["tiny"]),
                                    dict(n=3, locales=["xx_NOPE"]),
                                    dict(n=3, start=datetime.date(2000, 1, 2),
                                         end=datetime.date(2000, 1, 1))])
def test_date_examples_bad_input(kwargs):
    with pytest.raises(ValueError):
        make_date_examples(**kwargs)


def test_vocab_round_trip_specials_and_unknown():
    vocab = CharVocab(["abc", "cd"])
    assert vocab.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert (vocab.pad, vocab.bos, vocab.eos, vocab.unk) == (0, 1, 2, 3)
    assert len(vocab) == 8
    ids = vocab.encode("dab", bos=True, eos=True)
    assert ids[0] == vocab.bos and ids[-1] == vocab.eos
    assert vocab.decode(ids + [0, 0]) == "dab"
    assert vocab.decode(vocab.encode("az")) == "a?"
    assert vocab.decode(torch.tensor([4, 2, 5])) == "a"  # stops at <eos>


@pytest.mark.parametrize("call", [lambda v: CharVocab("abc"), lambda v: CharVocab([1, 2]),
                                  lambda v: v.encode(5), lambda v: v.decode([99]),
                                  lambda v: v.decode(torch.zeros(2, 2, dtype=torch.long)),
                                  lambda v: v.encode_batch("ab")])
def test_vocab_bad_input(call):
    with pytest.raises(ValueError):
        call(CharVocab(["ab"]))


def test_pad_batch():
    X, valid_lens = pad_batch([[3, 4], [], [5, 6, 7]], pad_id=0)
    assert X.dtype == torch.long and X.shape == (3, 3)
    assert X.tolist() == [[3, 4, 0], [0, 0, 0], [5, 6, 7]]
    assert valid_lens.tolist() == [2, 0, 3]
    X, valid_lens = CharVocab(["ab"]).encode_batch(["ab", "b"], eos=True)
    assert X.tolist() == [[4, 5, 2], [5, 2, 0]] and valid_lens.tolist() == [3, 2]
    for bad in ([], [[1, -1]], [[1.5]], [[True]]):
        with pytest.raises(ValueError):
            pad_batch(bad)


# ---------------------------------------------------------------- several dates per line

def test_multi_date_examples_are_seeded_and_consistent():
    exs = make_multi_date_examples(300, seed=5)
    assert exs == make_multi_date_examples(300, seed=5)
    assert exs != make_multi_date_examples(300, seed=6)
    assert {ex.num_dates for ex in exs} == {1, 2, 3, 4, 5, 6}
    assert {loc for ex in exs for loc in ex.locales} == set(DATE_LOCALES)
    assert {fmt for ex in exs for fmt in ex.formats} == set(DATE_FORMATS)
    from babel.dates import format_date
    for ex in exs[:40]:
        assert isinstance(ex, MultiDateExample)
        isos = ex.target.split(" ")
        assert len(isos) == len(ex.locales) == len(ex.formats) == ex.num_dates
        parts = [f"{loc} " + format_date(datetime.date.fromisoformat(iso), fmt, locale=loc)
                 for iso, loc, fmt in zip(isos, ex.locales, ex.formats)]
        assert ex.source == "; ".join(parts)


def test_multi_date_examples_options():
    exs = make_multi_date_examples(50, [3], ["de"], ["short"], seed=0, separator=" | ")
    for ex in exs:
        assert ex.num_dates == 3 and ex.source.count(" | ") == 2
        assert len(ex.target) == 3 * 10 + 2


@pytest.mark.parametrize("kwargs", [dict(n=-1), dict(n=3, num_dates=[]), dict(n=3, num_dates=[0]),
                                    dict(n=3, num_dates=3), dict(n=3, num_dates=[1.5]),
                                    dict(n=3, separator=""), dict(n=3, locales=["xx_NOPE"]),
                                    dict(n=3, formats=["tiny"])])
def test_multi_date_examples_bad_input(kwargs):
    with pytest.raises(ValueError):
        make_multi_date_examples(**kwargs)


# ---------------------------------------------------------------- batches

def test_length_batches_cover_every_example_once_and_reshuffle():
    lengths = [(7 * i) % 23 + 1 for i in range(101)]  # 101: the last batch is partial
    g = torch.Generator().manual_seed(0)
    epoch1 = length_batches(lengths, 8, generator=g, pool=4)
    epoch2 = length_batches(lengths, 8, generator=g, pool=4)
    for epoch in (epoch1, epoch2):
        assert sorted(torch.cat(epoch).tolist()) == list(range(101))  # nothing dropped
        assert max(len(b) for b in epoch) == 8
    assert [b.tolist() for b in epoch1] != [b.tolist() for b in epoch2]  # a fresh order
    longest = max(range(101), key=lambda i: lengths[i])
    assert any(longest in b.tolist() for b in epoch1)
    # within a pool, batches hold similar lengths: less padding than random batches
    pad = sum(max(lengths[i] for i in b) * len(b) for b in epoch1)
    assert pad < 0.8 * sum(23 * len(b) for b in epoch1)


@pytest.mark.parametrize("kwargs", [dict(lengths=[], batch_size=2), dict(lengths=[1], batch_size=0),
                                    dict(lengths=[1], batch_size=2, pool=0)])
def test_length_batches_bad_input(kwargs):
    with pytest.raises(ValueError):
        length_batches(**kwargs)
