"""DotProductAttention and AdditiveAttention against PyTorch and plain references."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lattn import AdditiveAttention, DotProductAttention, valid_lens_to_mask

torch.set_default_dtype(torch.float32)


def qkv(B=2, Q=3, K=5, d=4, v=6, dtype=torch.float64, seed=0, extra=()):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, *extra, Q, d, generator=g, dtype=dtype),
        torch.randn(B, *extra, K, d, generator=g, dtype=dtype),
        torch.randn(B, *extra, K, v, generator=g, dtype=dtype),
    )


@pytest.mark.parametrize("lens", [None, torch.tensor([2, 5]), torch.tensor([[1, 4, 5], [3, 3, 2]])])
def test_dot_product_matches_sdpa(lens):
    q, k, v = qkv()
    attn = DotProductAttention()
    out = attn(q, k, v, lens)
    mask = None if lens is None else valid_lens_to_mask(lens, 3, 5)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert attn.attention_weights.shape == (2, 3, 5)
    torch.testing.assert_close(attn.attention_weights @ v, out, rtol=1e-12, atol=1e-12)


def test_dot_product_with_head_axis_matches_sdpa():
    q, k, v = qkv(extra=(4,))  # (B, h, T, d)
    lens = torch.tensor([[1, 4, 5], [3, 3, 2]])
    out = DotProductAttention()(q, k, v, lens)
    mask = valid_lens_to_mask(lens, 3, 5)[:, None]  # (B, 1, Q, K)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               rtol=1e-12, atol=1e-12)


def test_dot_product_scale_is_one_over_sqrt_d():
    q, k, v = qkv(d=16)
    attn = DotProductAttention()
    attn(q, k, v)
    expected = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(16), dim=-1)
    torch.testing.assert_close(attn.attention_weights, expected, rtol=1e-12, atol=1e-12)


def test_dot_product_empty_row_gives_zero_output_and_finite_grad():
    q, k, v = (t.requires_grad_() for t in qkv())
    out = DotProductAttention()(q, k, v, torch.tensor([0, 3]))
    assert torch.all(out[0] == 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_dot_product_gradcheck():
    q, k, v = (t.requires_grad_() for t in qkv(B=2, Q=2, K=3, d=2, v=2))
    lens = torch.tensor([[0, 2], [3, 1]])
    assert torch.autograd.gradcheck(lambda a, b, c: DotProductAttention()(a, b, c, lens), (q, k, v))


def additive_reference(attn, q, k, v, lens):
    """One score at a time with Python loops."""
    B, Q, K = q.shape[0], q.shape[1], k.shape[1]
    scores = torch.empty(B, Q, K, dtype=q.dtype)
    for b in range(B):
        for i in range(Q):
            for j in range(K):
                h = torch.tanh(attn.W_q.weight @ q[b, i] + attn.W_k.weight @ k[b, j])
                scores[b, i, j] = attn.w_v.weight[0] @ h
    W = torch.zeros_like(scores)
    for b in range(B):
        n = K if lens is None else int(lens[b])
        if n:
            W[b, :, :n] = torch.softmax(scores[b, :, :n], dim=-1)
    return W @ v


@pytest.mark.parametrize("lens", [None, torch.tensor([2, 0])])
def test_additive_matches_loop_reference(lens):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    k = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 4, 2, generator=g, dtype=torch.float64)
    attn = AdditiveAttention(query_size=7, key_size=5, num_hiddens=6).double()
    assert attn.W_q.bias is None and attn.W_k.bias is None and attn.w_v.bias is None
    assert attn.w_v.weight.shape == (1, 6)
    torch.testing.assert_close(attn(q, k, v, lens), additive_reference(attn, q, k, v, lens),
                               rtol=1e-12, atol=1e-12)


def test_additive_gradcheck():
    attn = AdditiveAttention(3, 2, 4).double()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: attn(a, b, c, torch.tensor([1, 0])), (q, k, v))


@pytest.mark.parametrize("make", [lambda: DotProductAttention(0.5), lambda: AdditiveAttention(4, 4, 3, 0.5)])
def test_dropout_only_in_training_and_weights_stored_before_dropout(make):
    attn = make().double()
    q, k, v = qkv()
    attn.eval()
    out_eval = attn(q, k, v)
    torch.testing.assert_close(out_eval, attn.attention_weights @ v)
    attn.train()
    torch.manual_seed(0)
    out_train = attn(q, k, v)
    assert not torch.allclose(out_train, out_eval)
    torch.testing.assert_close(attn.attention_weights.sum(-1), torch.ones(2, 3, dtype=torch.float64))


def test_inputs_not_modified():
    q, k, v = qkv()
    lens = torch.tensor([1, 2])
    copies = [t.clone() for t in (q, k, v, lens)]
    DotProductAttention()(q, k, v, lens)
    AdditiveAttention(4, 4, 3).double()(q, k, v, lens)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, lens), copies))


def test_bad_shapes_raise_value_error():
    q, k, v = qkv()
    dot = DotProductAttention()
    with pytest.raises(ValueError, match="queries and keys must have the same feature size"):
        dot(q, k[..., :3], v)
    with pytest.raises(ValueError, match="values must have shape"):
        dot(q, k, v[:, :4])
    with pytest.raises(ValueError, match="keys must have the leading axes of queries"):
        dot(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="queries must have shape"):
        dot(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="keys must be a floating-point"):
        dot(q, k.long(), v)
    with pytest.raises(ValueError, match="valid_lens"):
        dot(q, k, v, torch.tensor([6, 1]))
    add = AdditiveAttention(query_size=4, key_size=4, num_hiddens=3).double()
    with pytest.raises(ValueError, match="queries must have feature size query_size = 4"):
        add(q[..., :3], k, v)
    with pytest.raises(ValueError, match="keys must have feature size key_size = 4"):
        add(q, k[..., :2], v)
    with pytest.raises(ValueError, match="dropout"):
        DotProductAttention(1.0)
    with pytest.raises(ValueError, match="num_hiddens"):
        AdditiveAttention(4, 4, 0)


@settings(deadline=None, max_examples=30)
@given(B=st.integers(1, 3), Q=st.integers(1, 5), K=st.integers(1, 6), d=st.integers(1, 8),
       seed=st.integers(0, 2**16))
def test_property_dot_product_matches_sdpa(B, Q, K, d, seed):
    q, k, v = qkv(B, Q, K, d, 3, seed=seed)
    lens = torch.randint(1, K + 1, (B,), generator=torch.Generator().manual_seed(seed))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=valid_lens_to_mask(lens, Q, K))
    torch.testing.assert_close(DotProductAttention()(q, k, v, lens), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lens", [None, torch.tensor([2, 0]), torch.tensor([[1, 4, 5], [0, 3, 2]])])
def test_inference_path_equals_training_path(lens):
    """Without autograd the layer writes the weights over its own scores; same numbers."""
    q, k, v = qkv()
    attn = DotProductAttention()
    with torch.no_grad():
        out_fast = attn(q, k, v, lens)
        w_fast = attn.attention_weights
    out_slow = attn(q.requires_grad_(), k, v, lens)
    torch.testing.assert_close(out_fast, out_slow, rtol=0, atol=0)
    torch.testing.assert_close(w_fast, attn.attention_weights, rtol=0, atol=0)


def test_public_masked_softmax_never_overwrites_even_without_grad():
    from d2lattn import masked_softmax

    X = torch.randn(2, 3, 4)
    X0 = X.clone()
    with torch.no_grad():
        masked_softmax(X)
        masked_softmax(X, torch.tensor([1, 0]))
    assert torch.equal(X, X0)


def test_bool_sizes_are_rejected():
    with pytest.raises(ValueError, match="query_size"):
        AdditiveAttention(True, 2, 8)
    from d2lattn import MultiHeadAttention

    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(8, True)
    with pytest.raises(ValueError, match="key_size"):
        MultiHeadAttention(8, 2, key_size=True)
