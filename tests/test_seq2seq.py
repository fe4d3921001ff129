"""d2lattn.seq2seq: the encoder-decoder models, greedy decoding, training."""

import pytest
import torch
from torch import nn

from d2lattn import (
    AdditiveAttention,
    AttentionDecoder,
    BahdanauDecoder,
    CharVocab,
    DotProductAttention,
    EncoderDecoder,
    MultiHeadAttention,
    Seq2SeqDecoder,
    Seq2SeqEncoder,
    greedy_decode,
    make_date_examples,
    make_multi_date_examples,
    seq2seq_loss,
    train_seq2seq,
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
    if kind == "bahdanau":
        return EncoderDecoder(encoder, BahdanauDecoder(V_TGT, E, H, AdditiveAttention(H, H, 8)))
    return EncoderDecoder(encoder, AttentionDecoder(V_TGT, E, H, attention_layers()[kind]()))


def padded_batch():
    X = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 0, 0, 0], [4, 4, 4, 0, 0]])
    return X, torch.tensor([5, 2, 3])


# ---------------------------------------------------------------- models

@pytest.mark.parametrize("kind", ["none", "additive", "dot", "multihead", "bahdanau"])
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


@pytest.mark.parametrize("kind", ["additive", "dot", "multihead", "bahdanau"])
def test_padded_source_positions_get_exactly_zero_weight(kind):
    model = make_model(kind)
    X, X_valid_lens = padded_batch()
    model(X, X_valid_lens, torch.ones(3, 4, dtype=torch.long))
    weights = model.decoder.attention_weights  # (B, [h,] U, T)
    for b, n in enumerate(X_valid_lens.tolist()):
        assert torch.all(weights[b, ..., n:] == 0)
        assert torch.all(weights[b, ..., :n] > 0)
        torch.testing.assert_close(weights[b].sum(-1), torch.ones(weights[b].shape[:-1]))


@pytest.mark.parametrize("kind", ["none", "additive", "dot", "multihead", "bahdanau"])
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


@pytest.mark.parametrize("kind", ["none", "additive", "bahdanau"])
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


def test_bahdanau_decoder_follows_its_equations():
    """One hand-written step: the previous state queries, the context enters the GRU."""
    model = make_model("bahdanau")
    dec = model.decoder
    X, X_valid_lens = padded_batch()
    enc_outputs, s0 = model.encoder(X, X_valid_lens)
    y0 = torch.tensor([[1], [1], [1]])
    logits, state = dec(y0, dec.init_state(enc_outputs, s0, X_valid_lens))
    c = dec.attention(s0[0][:, None], enc_outputs, enc_outputs, X_valid_lens)[:, 0]  # (B, H)
    s1 = dec.rnn(torch.cat([dec.embedding(y0[:, 0]), c], dim=-1), s0[0])
    torch.testing.assert_close(logits[:, 0], dec.dense(torch.cat([s1, c], dim=-1)))
    torch.testing.assert_close(state[2][0], s1)
    # the placement differs from AttentionDecoder's: the first query is the encoder's state
    w = dec.attention_weights[:, 0]  # (B, T)
    scores = dec.attention.w_v(torch.tanh(dec.attention.W_q(s0[0])[:, None]
                                          + dec.attention.W_k(enc_outputs))).squeeze(-1)
    mask = torch.arange(5) < X_valid_lens[:, None]
    torch.testing.assert_close(w, scores.masked_fill(~mask, float("-inf")).softmax(-1))


def test_bahdanau_decoder_with_multihead_attention_keeps_heads():
    torch.manual_seed(0)
    dec = BahdanauDecoder(V_TGT, E, H, MultiHeadAttention(H, num_heads=4))
    enc = Seq2SeqEncoder(V_SRC, E, H)
    X, X_valid_lens = padded_batch()
    logits, _ = dec(torch.ones(3, 2, dtype=torch.long), dec.init_state(*enc(X, X_valid_lens),
                                                                       X_valid_lens))
    assert logits.shape == (3, 2, V_TGT) and dec.attention_weights.shape == (3, 4, 2, 5)


def test_train_seq2seq_learns_and_is_seeded():
    exs = make_multi_date_examples(48, [1, 2], ["de"], ["short"], seed=0)
    src_vocab = CharVocab([ex.source for ex in exs])
    tgt_vocab = CharVocab([ex.target for ex in exs])
    X, X_valid_lens = src_vocab.encode_batch([ex.source for ex in exs])
    Y, Y_valid_lens = tgt_vocab.encode_batch([ex.target for ex in exs], eos=True)

    def run():
        torch.manual_seed(0)
        model = EncoderDecoder(Seq2SeqEncoder(len(src_vocab), 8, 32),
                               AttentionDecoder(len(tgt_vocab), 8, 32, DotProductAttention()))
        return train_seq2seq(model, X, X_valid_lens, Y, Y_valid_lens, steps=40, batch_size=16,
                             lr=0.02, seed=1, clip=1.0)

    losses = run()
    assert len(losses) == 40 and losses[-1] < 0.7 * losses[0]
    assert run() == losses  # same seeds, same run
    for bad in (dict(steps=0), dict(steps=2, lr=0.0), dict(steps=2, clip=-1.0),
                dict(steps=2, batch_size=0)):
        with pytest.raises(ValueError):
            train_seq2seq(make_model("dot"), X, X_valid_lens, Y, Y_valid_lens, **bad)


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
    with pytest.raises(ValueError, match="attention"):
        BahdanauDecoder(V_TGT, E, H, attention="additive")
    with pytest.raises(ValueError, match="num_hiddens"):
        Seq2SeqEncoder(V_SRC, E, 0)


def test_inputs_are_not_modified():
    model = make_model("dot")
    X, X_valid_lens = padded_batch()
    X0, L0 = X.clone(), X_valid_lens.clone()
    greedy_decode(model, X, X_valid_lens, max_len=4)
    assert torch.equal(X, X0) and torch.equal(X_valid_lens, L0)
