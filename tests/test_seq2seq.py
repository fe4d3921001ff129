"""d2lattn.seq2seq: the date data helpers, the encoder-decoder models, greedy decoding."""

import datetime

import pytest
import torch
from torch import nn

from d2lattn import (
    DATE_FORMATS,
    DATE_LOCALES,
    AdditiveAttention,
    AttentionDecoder,
    CharVocab,
    DotProductAttention,
    EncoderDecoder,
    MultiHeadAttention,
    Seq2SeqDecoder,
    Seq2SeqEncoder,
    greedy_decode,
    make_date_examples,
    make_date_pairs,
    pad_batch,
    seq2seq_loss,
)

V_SRC, V_TGT, E, H = 11, 7, 8, 16


def attention_layers():
    return {
        "additive": lambda: AdditiveAttention(H, H, num_hiddens=8),
        "dot": lambda: DotProductAttention(),
        "multihead": lambda: MultiHeadAttention(H, num_heads=4),
    }


def make_model(kind: str, seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    encoder = Seq2SeqEncoder(V_SRC, E, H)
    if kind == "none":
        return EncoderDecoder(encoder, Seq2SeqDecoder(V_TGT, E, H))
    return EncoderDecoder(encoder, AttentionDecoder(V_TGT, E, H, attention_layers()[kind]()))


def padded_batch():
    X = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 0, 0, 0], [4, 4, 4, 0, 0]])
    return X, torch.tensor([5, 2, 3])


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


# ---------------------------------------------------------------- models

@pytest.mark.parametrize("kind", ["none", "additive", "dot", "multihead"])
def test_shapes(kind):
    model = make_model(kind)
    X, X_valid_lens = padded_batch()
    outputs, state = model.encoder(X, X_valid_lens)
    assert outputs.shape == (3, 5, H) and state.shape == (1, 3, H)
    Y_in = torch.tensor([[1, 4, 5, 6], [1, 6, 6, 6], [1, 5, 4, 4]])
    assert model(X, X_valid_lens, Y_in).shape == (3, 4, V_TGT)
    weights = model.decoder.attention_weights
    if kind == "none":
        assert weights is None
    elif kind == "multihead":
        assert weights.shape == (3, 4, 4, 5)
    else:
        assert weights.shape == (3, 4, 5)


def test_encoder_final_state_ignores_padding():
    torch.manual_seed(0)
    enc = Seq2SeqEncoder(V_SRC, E, H)
    X, X_valid_lens = padded_batch()
    _, state = enc(X, X_valid_lens)
    for b in range(3):
        n = int(X_valid_lens[b])
        _, alone = enc(X[b:b + 1, :n], torch.tensor([n]))
        torch.testing.assert_close(state[:, b], alone[:, 0])


@pytest.mark.parametrize("kind", ["additive", "dot", "multihead"])
def test_padded_source_positions_get_exactly_zero_weight(kind):
    model = make_model(kind)
    X, X_valid_lens = padded_batch()
    model(X, X_valid_lens, torch.ones(3, 4, dtype=torch.long))
    weights = model.decoder.attention_weights  # (B, [h,] U, T)
    for b, n in enumerate(X_valid_lens.tolist()):
        assert torch.all(weights[b, ..., n:] == 0)
        assert torch.all(weights[b, ..., :n] > 0)
        torch.testing.assert_close(weights[b].sum(-1), torch.ones(weights[b].shape[:-1]))


@pytest.mark.parametrize("kind", ["none", "additive", "dot", "multihead"])
def test_outputs_do_not_depend_on_padding(kind):
    model = make_model(kind)
    X, X_valid_lens = padded_batch()
    Y_in = torch.tensor([[1, 4, 5], [1, 6, 6], [1, 5, 4]])
    logits = model(X, X_valid_lens, Y_in)
    garbage = X.clone()
    garbage[1, 2:] = 7  # change only padded positions
    garbage[2, 3:] = 9
    torch.testing.assert_close(model(garbage, X_valid_lens, Y_in), logits)
    more_padding = torch.cat([X, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(more_padding, X_valid_lens, Y_in), logits)


@pytest.mark.parametrize("kind", ["none", "additive"])
def test_step_by_step_decoding_matches_teacher_forcing(kind):
    """Feeding the target one character at a time gives the one-call logits."""
    model = make_model(kind)
    X, X_valid_lens = padded_batch()
    Y_in = torch.tensor([[1, 4, 5, 6], [1, 6, 6, 6], [1, 5, 4, 4]])
    full = model(X, X_valid_lens, Y_in)
    state = model.init_state(X, X_valid_lens)
    steps = []
    for t in range(4):
        logits, state = model.decoder(Y_in[:, t:t + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


class _Scripted(nn.Module):
    """A decoder that emits a fixed script of tokens, one per step, per row."""

    vocab_size = 5
    attention_weights = None

    def __init__(self, script):
        super().__init__()
        self.script = torch.tensor(script)  # (B, steps)

    def init_state(self, enc_outputs, enc_state, enc_valid_lens):
        return torch.zeros((), dtype=torch.long)

    def forward(self, Y, state):
        t = int(state)
        logits = nn.functional.one_hot(self.script[:, t], self.vocab_size).float()[:, None]
        return logits, state + 1


def test_greedy_decoding_stops_at_eos():
    eos, pad = CharVocab.eos, CharVocab.pad
    script = [[4, 2, 4, 4, 4, 4], [4, 4, 3, 2, 4, 4]]  # row 0 stops after 2, row 1 after 4
    model = EncoderDecoder(Seq2SeqEncoder(V_SRC, E, H), _Scripted(script))
    X, X_valid_lens = padded_batch()
    Y, weights = greedy_decode(model, X[:2], X_valid_lens[:2], max_len=10)
    assert weights is None
    assert Y.tolist() == [[4, eos, pad, pad], [4, 4, 3, eos]]  # the loop ends when all stopped
    Y, _ = greedy_decode(model, X[:2], X_valid_lens[:2], max_len=3)  # max_len cuts it short
    assert Y.tolist() == [[4, eos, pad], [4, 4, 3]]


def test_greedy_decode_records_attention_weights_per_step():
    model = make_model("additive")
    X, X_valid_lens = padded_batch()
    Y, weights = greedy_decode(model, X, X_valid_lens, max_len=6)
    assert weights.shape == (3, Y.shape[1], 5)
    assert torch.all(weights[1, :, 2:] == 0)


def test_loss_ignores_padded_targets():
    model = make_model("additive")
    X, X_valid_lens = padded_batch()
    Y = torch.tensor([[4, 5, 2], [6, 2, 0], [5, 2, 0]])
    Y_valid_lens = torch.tensor([3, 2, 2])
    loss = seq2seq_loss(model, X, X_valid_lens, Y, Y_valid_lens)
    Y2 = Y.clone()
    Y2[1, 2], Y2[2, 2] = 6, 6  # change only padded target positions
    torch.testing.assert_close(seq2seq_loss(model, X, X_valid_lens, Y2, Y_valid_lens), loss)
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_tiny_overfit_learns_32_dates_exactly():
    exs = make_date_examples(32, seed=0)
    src_vocab = CharVocab([ex.source for ex in exs])
    tgt_vocab = CharVocab([ex.target for ex in exs])
    X, X_valid_lens = src_vocab.encode_batch([ex.source for ex in exs])
    Y, Y_valid_lens = tgt_vocab.encode_batch([ex.target for ex in exs], eos=True)
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqEncoder(len(src_vocab), 32, 64),
                           AttentionDecoder(len(tgt_vocab), 32, 64, AdditiveAttention(64, 64, 32)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(300):
        loss = seq2seq_loss(model, X, X_valid_lens, Y, Y_valid_lens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out, _ = greedy_decode(model, X, X_valid_lens, max_len=12)
    assert [tgt_vocab.decode(row) for row in out] == [ex.target for ex in exs]


# ---------------------------------------------------------------- bad input

def test_models_bad_input():
    model = make_model("additive")
    X, X_valid_lens = padded_batch()
    with pytest.raises(ValueError, match="X must be a LongTensor"):
        model(X.float(), X_valid_lens, torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="X entries"):
        model(X + V_SRC, X_valid_lens, torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="valid_lens"):
        model(X, torch.tensor([5, 0, 3]), torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="valid_lens"):
        model(X, torch.tensor([6, 2, 3]), torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="valid_lens"):
        model(X, torch.tensor([5, 2]), torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="Y entries"):
        model(X, X_valid_lens, torch.full((3, 2), V_TGT))
    with pytest.raises(ValueError, match="Y_valid_lens"):
        seq2seq_loss(model, X, X_valid_lens, torch.ones(3, 2, dtype=torch.long),
                     torch.tensor([3, 1, 1]))
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, X, X_valid_lens, max_len=0)
    with pytest.raises(ValueError, match="attention"):
        AttentionDecoder(V_TGT, E, H, attention="additive")
    with pytest.raises(ValueError, match="num_hiddens"):
        Seq2SeqEncoder(V_SRC, E, 0)


def test_inputs_are_not_modified():
    model = make_model("dot")
    X, X_valid_lens = padded_batch()
    X0, L0 = X.clone(), X_valid_lens.clone()
    greedy_decode(model, X, X_valid_lens, max_len=4)
    assert torch.equal(X, X0) and torch.equal(X_valid_lens, L0)
