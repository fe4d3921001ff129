"""Tests of d2lattn.circuits: head scores, the attention-only model, ablation, the data."""

import pytest
import torch
import torch.nn.functional as F

from d2lattn.circuits import (AttentionOnlyBlock, AttentionOnlyTransformer,
                              determined_positions, head_means, induction_accuracy,
                              induction_loss, k_composition_circuit, ov_circuit,
                              prefix_matching_score, previous_token_score, repeated_sequences)
from d2lattn.masking import causal_mask
from d2lattn.multihead import MultiHeadAttention


def uniform_causal(T: int) -> torch.Tensor:
    """(T, T) weights spread evenly over keys 0..i: row i is 1/(i+1) on its prefix."""
    mask = causal_mask(T, T).double()
    return mask / mask.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------- head scores, by hand
def test_previous_token_score_by_hand():
    exact = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=torch.float64)
    weights = torch.stack([exact, uniform_causal(3)])[None]  # (B=1, h=2, 3, 3)
    # head 0: weight 1 on i - 1 at queries 1 and 2; head 1: (1/2 + 1/3) / 2
    expected = torch.tensor([1.0, (1 / 2 + 1 / 3) / 2], dtype=torch.float64)
    torch.testing.assert_close(previous_token_score(weights), expected)


def test_previous_token_score_averages_over_batch():
    weights = torch.stack([uniform_causal(3), torch.eye(3, dtype=torch.float64)])  # (B=2, 3, 3)
    # batch 0: (1/2 + 1/3) / 2; batch 1 (attends to itself): 0
    assert previous_token_score(weights).item() == pytest.approx((1 / 2 + 1 / 3) / 4)


def test_prefix_matching_score_by_hand_one_repeat():
    tokens = torch.tensor([[3, 5, 7, 3, 5]])
    # query 3 (a 3, earlier at 0) targets key 1; query 4 (a 5, earlier at 1) targets key 2
    weights = uniform_causal(5)[None, None]  # (1, 1, 5, 5)
    expected = (1 / 4 + 1 / 5) / 2
    assert prefix_matching_score(weights, tokens).item() == pytest.approx(expected)


def test_prefix_matching_score_counts_every_earlier_occurrence():
    tokens = torch.tensor([[1, 2, 1, 2, 1]])
    # query 2 -> {1}; query 3 -> {2}; query 4 (a 1, earlier at 0 and 2) -> {1, 3}
    weights = uniform_causal(5)[None, None]
    expected = (1 / 3 + 1 / 4 + 2 / 5) / 3
    assert prefix_matching_score(weights, tokens).item() == pytest.approx(expected)


def test_prefix_matching_score_perfect_induction_head_and_no_target():
    g = torch.Generator().manual_seed(1)
    tokens, period = repeated_sequences(4, 20, 16, (3, 6), generator=g)
    T = tokens.shape[1]
    weights = torch.zeros(4, 1, T, T)
    for b in range(4):
        p = int(period[b])
        for i in range(T):  # an ideal induction head: the token after the last earlier copy
            weights[b, 0, i, i - p + 1 if i >= p else i] = 1.0
    assert prefix_matching_score(weights, tokens).item() == pytest.approx(1.0)
    assert previous_token_score(weights).item() < 0.2
    distinct = torch.arange(6)[None]  # no repeats: no query has a target, score 0 (not NaN)
    assert prefix_matching_score(uniform_causal(6)[None, None], distinct).item() == 0.0


# ---------------------------------------------------------------- the block and the model
def test_block_equals_multihead_attention():
    torch.manual_seed(0)
    block = AttentionOnlyBlock(12, 3).double()
    X = torch.randn(2, 7, 12, dtype=torch.float64)
    X_before = X.clone()
    Y, heads = block(X)
    expected = block.attention(X, X, X, is_causal=True)  # d2lattn's MultiHeadAttention
    torch.testing.assert_close(Y, X + expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(heads.sum(dim=1), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(block.attention_weights, block.attention.attention_weights,
                               rtol=0, atol=1e-12)
    assert isinstance(block.attention, MultiHeadAttention)
    assert torch.equal(X, X_before)  # the caller's tensor is not written


def test_block_equals_torch_multihead_attention():
    torch.manual_seed(0)
    block = AttentionOnlyBlock(8, 2).double()
    ref = torch.nn.MultiheadAttention(8, 2, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([block.attention.W_q.weight,
                                            block.attention.W_k.weight,
                                            block.attention.W_v.weight]))
        ref.out_proj.weight.copy_(block.attention.W_o.weight)
    X = torch.randn(3, 5, 8, dtype=torch.float64)
    expected, _ = ref(X, X, X, attn_mask=~causal_mask(5, 5), need_weights=False)
    torch.testing.assert_close(block(X)[0], X + expected, rtol=0, atol=1e-12)


def test_ablation_changes_only_the_ablated_head():
    torch.manual_seed(0)
    block = AttentionOnlyBlock(8, 2).double()
    X = torch.randn(2, 5, 8, dtype=torch.float64)
    Y, heads = block(X)
    Y_ablated, heads_ablated = block(X, ablate={1: 0.0})
    torch.testing.assert_close(heads_ablated[:, 0], heads[:, 0], rtol=0, atol=0)
    assert bool((heads_ablated[:, 1] == 0).all())
    torch.testing.assert_close(Y - Y_ablated, heads[:, 1], rtol=0, atol=1e-12)


def test_ablation_in_the_model():
    torch.manual_seed(0)
    model = AttentionOnlyTransformer(10, num_hiddens=8, num_heads=2).double()
    tokens = torch.randint(0, 10, (3, 6))
    logits, heads = model(tokens, return_heads=True)  # heads (L, B, h, T, d)
    # last layer: the logits change by exactly the unembedded output of the ablated head
    logits_ab, heads_ab = model(tokens, ablate={(1, 0): 0.0}, return_heads=True)
    torch.testing.assert_close(logits - logits_ab, model.unembed(heads[1, :, 0]),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(heads_ab[1, :, 1], heads[1, :, 1], rtol=0, atol=0)
    torch.testing.assert_close(heads_ab[0], heads[0], rtol=0, atol=0)
    # first layer: its other head is untouched; the second layer sees the change
    _, heads_ab = model(tokens, ablate={(0, 1): 0.0}, return_heads=True)
    torch.testing.assert_close(heads_ab[0, :, 0], heads[0, :, 0], rtol=0, atol=0)
    assert not torch.allclose(heads_ab[1], heads[1])
    # mean ablation puts the reference mean in the head's place
    means = head_means(model, tokens)  # (L, h, T, d)
    _, heads_mean = model(tokens, ablate={(0, 1): means[0, 1]}, return_heads=True)
    torch.testing.assert_close(heads_mean[0, :, 1], means[0, 1].expand(3, -1, -1),
                               rtol=0, atol=0)
    torch.testing.assert_close(means, heads.mean(dim=1), rtol=0, atol=1e-12)


def test_model_is_causal():
    torch.manual_seed(0)
    model = AttentionOnlyTransformer(10, num_hiddens=8, num_heads=2).double()
    tokens = torch.randint(0, 10, (2, 9))
    logits = model(tokens)
    for i in range(9):
        changed = tokens.clone()
        changed[:, i + 1:] = (changed[:, i + 1:] + 3) % 10  # every later token differs
        torch.testing.assert_close(model(changed)[:, :i + 1], logits[:, :i + 1],
                                   rtol=0, atol=1e-12)


# ---------------------------------------------------------------- data, loss, accuracy
def test_repeated_sequences():
    g = torch.Generator().manual_seed(0)
    tokens, period = repeated_sequences(64, 30, list(range(5, 25)), (4, 9), generator=g)
    assert tokens.shape == (64, 30) and tokens.dtype == torch.int64
    assert int(period.min()) >= 4 and int(period.max()) <= 9
    assert set(period.tolist()) == set(range(4, 10))  # every period occurs in 64 draws
    assert int(tokens.min()) >= 5 and int(tokens.max()) <= 24
    for b in range(64):
        p = int(period[b])
        assert torch.equal(tokens[b, p:], tokens[b, :-p])  # repeats with period p
        assert tokens[b, :p].unique().numel() == p  # a block of distinct tokens
    again, _ = repeated_sequences(64, 30, list(range(5, 25)), (4, 9),
                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again)
    positions = torch.arange(30)[None]
    assert torch.equal(determined_positions(tokens), positions >= period[:, None])


def test_repeated_sequences_with_distractors():
    g = torch.Generator().manual_seed(3)
    tokens, period = repeated_sequences(32, 24, 20, (3, 8), distractors=5, generator=g)
    for b in range(32):
        p = int(period[b])
        assert torch.equal(tokens[b, 5 + p:], tokens[b, 5:-p])
        assert tokens[b, :5 + p].unique().numel() == 5 + p  # distractors and block distinct
    assert torch.equal(determined_positions(tokens), torch.arange(24)[None] >= 5 + period[:, None])


def test_loss_and_accuracy_of_a_perfect_and_a_wrong_predictor():
    tokens, _ = repeated_sequences(8, 20, 12, (3, 5), generator=torch.Generator().manual_seed(2))
    perfect = lambda t: F.one_hot(t.roll(-1, dims=1), 12).double() * 50  # noqa: E731
    assert induction_accuracy(perfect, tokens) == 1.0
    assert induction_loss(perfect(tokens), tokens).item() < 1e-12
    wrong = lambda t: F.one_hot(t, 12).double() * 50  # predicts the current token  # noqa: E731
    assert induction_accuracy(wrong, tokens) == 0.0


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, name", [
    (lambda: repeated_sequences(0, 10, 8), "batch_size"),
    (lambda: repeated_sequences(2, 10, 8, (5, 9)), "periods"),
    (lambda: repeated_sequences(2, 10, 8, (0, 3)), "periods"),
    (lambda: repeated_sequences(2, 10, [1, 1, 2]), "vocab"),
    (lambda: repeated_sequences(2, 10, [[1, 2]]), "vocab"),
    (lambda: repeated_sequences(2, 10, 8, (2, 4), distractors=5), "distractors"),
    (lambda: repeated_sequences(2, 10, 30, (2, 4), distractors=10), "distractors"),
    (lambda: determined_positions(torch.zeros(2, 3)), "tokens"),
    (lambda: previous_token_score(torch.zeros(2, 3, 4)), "attention_weights"),
    (lambda: prefix_matching_score(torch.zeros(2, 1, 4, 4), torch.zeros(2, 5, dtype=torch.long)),
     "attention_weights"),
    (lambda: prefix_matching_score(torch.zeros(2, 1, 4, 4), torch.zeros(2, 4)), "tokens"),
    (lambda: AttentionOnlyTransformer(10, num_hiddens=8, num_heads=3), "num_hiddens"),
    (lambda: AttentionOnlyTransformer(0), "vocab_size"),
    (lambda: AttentionOnlyTransformer(10, 8, 2)(torch.tensor([[1, 10]])), "tokens"),
    (lambda: AttentionOnlyTransformer(10, 8, 2)(torch.tensor([[1, 2]]), ablate={(2, 0): 0.0}),
     "ablate"),
    (lambda: AttentionOnlyTransformer(10, 8, 2)(torch.tensor([[1, 2]]), ablate={(0, 2): 0.0}),
     "ablate"),
    (lambda: AttentionOnlyBlock(8, 2)(torch.zeros(1, 3, 6)), "X"),
    (lambda: AttentionOnlyBlock(8, 2)(torch.zeros(1, 3, 8), ablate={0: torch.zeros(5)}), "ablate"),
    (lambda: induction_accuracy(lambda t: t, torch.arange(5)[None]), "tokens"),
    (lambda: ov_circuit(AttentionOnlyTransformer(10, 8, 2), 2, 0), "layer"),
    (lambda: ov_circuit(AttentionOnlyTransformer(10, 8, 2), 0, 2), "head"),
    (lambda: ov_circuit(AttentionOnlyBlock(8, 2), 0, 0), "model"),
    (lambda: k_composition_circuit(AttentionOnlyTransformer(10, 8, 2), 0, layer=0), "layer"),
    (lambda: k_composition_circuit(AttentionOnlyTransformer(10, 8, 2), 0, source_heads=[3]),
     "head"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def _model_without_positions(num_layers):
    torch.manual_seed(0)
    model = AttentionOnlyTransformer(7, num_hiddens=8, num_heads=2, num_layers=num_layers).double()
    with torch.no_grad():
        for p in model.positions.parameters():
            p.zero_()
    return model


def test_ov_circuit_is_what_a_head_adds_to_the_logits():
    # A one-token sequence: the head's only key is the token itself, with weight 1, and with
    # the positions zeroed the residual stream there is the token's embedding.
    model = _model_without_positions(num_layers=1)
    for head in range(2):
        M = ov_circuit(model, 0, head)  # (V, V)
        for j in range(7):
            _, heads = model(torch.tensor([[j]]), return_heads=True)  # (L, B, h, T, d)
            added = model.unembed(heads[0, 0, head, 0])  # (V,)
            torch.testing.assert_close(M[:, j], added, rtol=0, atol=1e-12)


def test_k_composition_circuit_is_the_score_of_a_key_written_by_layer_1():
    model = _model_without_positions(num_layers=2)
    mha, E = model.blocks[1].attention, model.embedding.weight  # E: (V, d)
    for head in range(2):
        for sources in ([0], [1], [0, 1]):
            S = k_composition_circuit(model, head, source_heads=sources)  # (V, V)
            _, heads = model(torch.arange(7)[:, None], return_heads=True)  # (L, V, h, 1, d)
            written = heads[0, :, sources, 0].sum(dim=1)  # (V, d): layer 1's write per token
            q = mha.split_heads(mha.W_q(E[None]))[0, head]  # (V, d_h)
            k = mha.split_heads(mha.W_k(written[None]))[0, head]  # (V, d_h)
            torch.testing.assert_close(S, q @ k.T, rtol=0, atol=1e-12)
        torch.testing.assert_close(k_composition_circuit(model, head),
                                   k_composition_circuit(model, head, source_heads=[0, 1]))
