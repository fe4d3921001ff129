"""d2lattn.sparse: the gathered block-sparse attention equals its definition, and the choosers
choose what their papers say."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from d2lattn.sparse import (bigbird_selection, block_sparse_attention,
                            block_sparse_attention_reference, indexer_scores, indexer_select,
                            keys_read, moba_select, selection_mask, strided_selection)


def _qkv(B=2, h=3, T_q=11, T_k=11, d=4, d_v=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=dtype, requires_grad=True)  # noqa: E731
    return make(B, h, T_q, d), make(B, h, T_k, d), make(B, h, T_k, d_v)


def _random_selection(B, h, T_q, n, k, seed=0):
    """Distinct blocks per query, some slots empty (-1)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(B, h, T_q, n, generator=g).argsort(dim=-1)[..., :k]
    empty = torch.rand(B, h, T_q, k, generator=g) < 0.25
    return torch.where(empty, torch.full_like(rows, -1), rows)


@pytest.mark.parametrize("T_q, T_k, S, k, causal", [
    (11, 11, 3, 2, False), (11, 11, 3, 2, True), (11, 11, 1, 4, True), (5, 11, 4, 2, True),
    (7, 13, 20, 1, False), (9, 9, 2, 5, True), (6, 10, 3, 4, False)])
def test_gathered_equals_the_masked_reference_values_and_gradients(T_q, T_k, S, k, causal):
    q, kk, v = _qkv(T_q=T_q, T_k=T_k)
    n = -(-T_k // S)
    sel = _random_selection(2, 3, T_q, n, min(k, n), seed=T_q + S)
    out = block_sparse_attention(q, kk, v, sel, block_size=S, causal=causal)
    ref, weights = block_sparse_attention_reference(q, kk, v, sel, block_size=S, causal=causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    chunked = block_sparse_attention(q, kk, v, sel, block_size=S, causal=causal, query_chunk=4)
    torch.testing.assert_close(chunked, ref, rtol=0, atol=1e-12)
    assert torch.allclose(weights.sum(-1)[weights.sum(-1) > 0], torch.ones(()).double())
    grad = torch.randn_like(out)
    g_out = torch.autograd.grad(out, (q, kk, v), grad)
    g_ref = torch.autograd.grad(ref, (q, kk, v), grad)
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_every_block_selected_is_full_attention(causal):
    q, k, v = _qkv(T_q=10, T_k=10)
    S = 3
    sel = torch.arange(4).expand(1, 1, 10, 4)
    out = block_sparse_attention(q, k, v, sel, block_size=S, causal=causal)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    assert keys_read(sel, 10, block_size=S, causal=causal) == (55 if causal else 100)


def test_a_query_that_reads_nothing_gets_zeros_and_half_precision_is_accumulated():
    q, k, v = _qkv(B=1, h=1, T_q=4, T_k=4)
    sel = torch.tensor([[[[-1], [0], [-1], [1]]]])
    out = block_sparse_attention(q, k, v, sel, block_size=2)
    assert torch.equal(out[0, 0, 0], torch.zeros(5, dtype=torch.float64))
    assert torch.isfinite(out).all()
    half = [x.detach().to(torch.bfloat16) for x in (q, k, v)]
    out16 = block_sparse_attention(*half, sel, block_size=2)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.double(), out.detach(), rtol=0, atol=0.05)


def test_inputs_are_not_written():
    q, k, v = _qkv()
    copies = [x.detach().clone() for x in (q, k, v)]
    sel = _random_selection(2, 3, 11, 4, 2)
    sel_copy = sel.clone()
    block_sparse_attention(q, k, v, sel, block_size=3, causal=True)
    for a, b in zip((q, k, v), copies):
        assert torch.equal(a.detach(), b)
    assert torch.equal(sel, sel_copy)


def test_bad_input_is_refused_with_the_argument_named():
    q, k, v = _qkv(T_q=6, T_k=6)
    good = torch.zeros(1, 1, 6, 1, dtype=torch.long)
    cases = [
        (dict(block_index=good.float()), "block_index"),
        (dict(block_index=torch.zeros(1, 1, 5, 1, dtype=torch.long)), "block_index"),
        (dict(block_index=torch.full((1, 1, 6, 1), 2)), r"\[0, 2\)"),
        (dict(block_index=torch.full((1, 1, 6, 1), -2)), "-1"),
        (dict(block_index=torch.zeros(1, 1, 6, 2, dtype=torch.long)), "twice"),
        (dict(block_size=0), "block_size"),
    ]
    for change, message in cases:
        kwargs = dict(block_index=good, block_size=3, **{})
        kwargs.update(change)
        for fn in (block_sparse_attention, block_sparse_attention_reference):
            with pytest.raises(ValueError, match=message):
                fn(q, k, v, kwargs["block_index"], block_size=kwargs["block_size"])
    with pytest.raises(ValueError, match="keys"):
        block_sparse_attention(q, k[..., :3], v, good, block_size=3)
    with pytest.raises(ValueError, match="values"):
        block_sparse_attention(q, k, v[:, :, :4], good, block_size=3)
    with pytest.raises(ValueError, match="dtype"):
        block_sparse_attention(q, k.float(), v, good, block_size=3)


def test_moba_reads_its_own_block_never_a_later_one_and_the_top_scored_others():
    g = torch.Generator().manual_seed(3)
    B, h, T, d, S, top_k = 2, 2, 19, 4, 4, 3
    q, k = torch.randn(B, h, T, d, generator=g), torch.randn(B, h, T, d, generator=g)
    sel = moba_select(q, k, block_size=S, top_k=top_k, causal=True)
    assert sel.shape == (B, h, T, top_k)
    n = -(-T // S)
    for b, hh, t in itertools.product(range(B), range(h), range(T)):
        own = t // S
        chosen = [int(x) for x in sel[b, hh, t] if x >= 0]
        assert own in chosen and max(chosen) == own
        # the others: the best of the earlier blocks by q . mean(block keys), by a loop
        means = [k[b, hh, j * S:min(T, (j + 1) * S)].mean(0) for j in range(n)]
        earlier = sorted(range(own), key=lambda j: -float(q[b, hh, t] @ means[j]))
        assert sorted(chosen) == sorted([own] + earlier[:top_k - 1])
        assert len(chosen) == min(top_k, own + 1)
    # not causal: the plain top-k of every block
    free = moba_select(q, k, block_size=S, top_k=2, causal=False)
    scores = torch.einsum("bhtd,bhnd->bhtn", q, torch.stack(
        [k[:, :, j * S:(j + 1) * S].mean(2) for j in range(n)], dim=2))
    assert torch.equal(free, scores.topk(2, dim=-1).indices.sort(-1).values)


def test_fixed_patterns_as_their_papers_define_them():
    sel = strided_selection(16, block_size=2, local_blocks=2, stride=3)
    assert sel.shape[:3] == (1, 1, 16)
    rows = {b: {int(x) for x in sel[0, 0, 2 * b] if x >= 0} for b in range(8)}
    assert rows[0] == {0} and rows[1] == {0, 1} and rows[7] == {7, 6, 4, 1}
    mask = selection_mask(sel, 16, block_size=2, causal=True)
    assert not (mask & ~torch.ones(16, 16, dtype=torch.bool).tril()).any()
    g = torch.Generator().manual_seed(0)
    big = bigbird_selection(20, block_size=2, window_blocks=3, global_blocks=1, random_blocks=1,
                            generator=g)
    rows = [{int(x) for x in big[0, 0, 2 * b] if x >= 0} for b in range(10)]
    assert rows[0] == set(range(10))  # a global block reads everything
    for b in range(1, 10):
        window = set(range(max(0, b - 1), min(10, b + 2)))
        assert window | {0} <= rows[b] and len(rows[b] - window - {0}) == 1


def test_the_indexer_scores_as_its_equation_and_selects_past_tokens():
    g = torch.Generator().manual_seed(1)
    B, T, H, d = 2, 9, 3, 4
    qi, ki, w = (torch.randn(B, T, H, d, generator=g), torch.randn(B, T, d, generator=g),
                 torch.rand(B, T, H, generator=g))
    scores = indexer_scores(qi, ki, w)
    for b, t, s in itertools.product(range(B), range(T), range(T)):
        want = sum(float(w[b, t, j]) * max(0.0, float(qi[b, t, j] @ ki[b, s])) for j in range(H))
        assert abs(float(scores[b, t, s]) - want) < 1e-5
    sel = indexer_select(scores, top_k=4, causal=True)
    assert sel.shape == (B, 1, T, 4)
    for b, t in itertools.product(range(B), range(T)):
        chosen = [int(x) for x in sel[b, 0, t] if x >= 0]
        assert len(chosen) == min(4, t + 1) and max(chosen) <= t
    # the selection drives attention over single tokens (block_size=1)
    q, k, v = _qkv(B=B, h=2, T_q=T, T_k=T)
    out = block_sparse_attention(q, k, v, sel, block_size=1, causal=True)
    ref, _ = block_sparse_attention_reference(q, k, v, sel, block_size=1, causal=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="head_weights"):
        indexer_scores(qi, ki, w[..., :2])
    with pytest.raises(ValueError, match="top_k"):
        indexer_select(scores, top_k=0)


def test_the_gathered_form_reads_only_the_selected_keys():
    """Its scores tensor holds T_q * k * S entries, whatever T_k: the count that grows with
    the keys read, not with T_q * T_k."""
    T, S, k = 64, 4, 2
    sel = moba_select(*_qkv(B=1, h=1, T_q=T, T_k=T)[:2], block_size=S, top_k=k)
    assert keys_read(sel, T, block_size=S, causal=True) <= T * k * S < T * (T + 1) // 2


def _nsa_by_the_equations(m, X):
    """NSA's output token by token, from the paper's equations and the module's weights."""
    from d2lattn.sparse import NativeSparseAttention  # noqa: F401 (the class under test)

    B, T, D = X.shape
    h, l = m.num_heads, m.block_size
    d_h = D // h
    q, k, v = (W(X).reshape(B, T, h, d_h) for W in (m.W_q, m.W_k, m.W_v))
    gates = torch.sigmoid(m.W_gate(X)).reshape(B, T, h, 3)
    out = torch.zeros(B, T, h, d_h, dtype=X.dtype)
    c = d_h ** -0.5

    def attend(qt, keys, vals):
        if len(keys) == 0:
            return torch.zeros(d_h, dtype=X.dtype), None
        w = torch.softmax(torch.stack([qt @ kk for kk in keys]) * c, 0)
        return sum(wi * vi for wi, vi in zip(w, vals)), w

    for b, t, hh in itertools.product(range(B), range(T), range(h)):
        qt = q[b, t, hh]
        blocks = [i for i in range(T // l) if i * l + l - 1 <= t]
        kc = [m.compress_keys((k[b, i * l:(i + 1) * l, hh] + m.block_positions).reshape(-1))
              for i in blocks]
        vc = [m.compress_values((v[b, i * l:(i + 1) * l, hh] + m.block_positions).reshape(-1))
              for i in blocks]
        o_cmp, p = attend(qt, kc, vc)
        own = t // l
        ranked = sorted(blocks, key=lambda i: -float(p[blocks.index(i)].detach())) if blocks else []
        chosen = {own} | set([i for i in ranked if i != own][:m.top_n - 1])
        sel = [s for s in range(t + 1) if s // l in chosen]
        o_slc, _ = attend(qt, [k[b, s, hh] for s in sel], [v[b, s, hh] for s in sel])
        win = range(max(0, t - m.window + 1), t + 1)
        o_win, _ = attend(qt, [k[b, s, hh] for s in win], [v[b, s, hh] for s in win])
        g = gates[b, t, hh]
        out[b, t, hh] = g[0] * o_cmp + g[1] * o_slc + g[2] * o_win
    return m.W_o(out.reshape(B, T, D))


def test_native_sparse_attention_follows_its_equations_and_is_causal():
    from d2lattn.sparse import NativeSparseAttention

    torch.manual_seed(0)
    m = NativeSparseAttention(8, 2, block_size=3, top_n=2, window=4).double()
    torch.nn.init.normal_(m.block_positions)
    X = torch.randn(2, 11, 8, dtype=torch.float64, requires_grad=True)
    Y = m(X)
    torch.testing.assert_close(Y, _nsa_by_the_equations(m, X), rtol=0, atol=1e-12)
    assert m.selection.shape == (2, 2, 11, 2) and m.gates.shape == (2, 11, 2, 3)
    own = torch.arange(11) // 3
    assert ((m.selection == own[:, None]).any(-1)).all()
    # causal, exactly: the output at t has a zero gradient with respect to every later input
    for t in range(10):
        (grad,) = torch.autograd.grad(Y[:, t].sum(), X, retain_graph=True)
        assert torch.count_nonzero(grad[:, t + 1:]) == 0 and torch.count_nonzero(grad[:, :t + 1]) > 0
    # the compressed branch learns the scores that choose: its parameters get gradients
    Y.sum().backward()
    assert m.compress_keys.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="divisible"):
        NativeSparseAttention(10, 3, block_size=2, top_n=1, window=2)
    with pytest.raises(ValueError, match="top_n"):
        NativeSparseAttention(8, 2, block_size=2, top_n=0, window=2)
    with pytest.raises(ValueError, match="X must be"):
        m(torch.randn(2, 5, 7, dtype=torch.float64))
