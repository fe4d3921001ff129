"""The chapter-4 scoring functions (dot, cosine, Gaussian), Attention and BilinearAttention,
against plain loops, einsum and PyTorch builtins in float64."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lattn import DotProductAttention, masked_softmax, nadaraya_watson, valid_lens_to_mask
from d2lattn.scoring import (
    Attention,
    BilinearAttention,
    cosine_scores,
    dot_product_scores,
    gaussian_scores,
)

SCORE_FNS = [dot_product_scores, cosine_scores, gaussian_scores]


def qk(B=2, Q=3, K=5, d=4, seed=0, extra=(), dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, *extra, Q, d, generator=g, dtype=dtype),
            torch.randn(B, *extra, K, d, generator=g, dtype=dtype))


def loop_scores(score, queries, keys):
    """Apply score(q, k) to one query vector and one key vector at a time."""
    lead = queries.shape[:-2]
    q2 = queries.reshape(-1, *queries.shape[-2:])  # (N, Q, d)
    k2 = keys.reshape(-1, *keys.shape[-2:])  # (N, K, d)
    out = torch.empty(q2.shape[0], q2.shape[1], k2.shape[1], dtype=queries.dtype)
    for n in range(q2.shape[0]):
        for i in range(q2.shape[1]):
            for j in range(k2.shape[1]):
                out[n, i, j] = score(q2[n, i], k2[n, j])
    return out.reshape(*lead, q2.shape[1], k2.shape[1])


# --- dot_product_scores ------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [(), (3,)])
def test_dot_product_scores_match_loop_and_einsum(extra):
    q, k = qk(d=6, extra=extra)
    expected = loop_scores(lambda a, b: torch.dot(a, b) / math.sqrt(6), q, k)
    torch.testing.assert_close(dot_product_scores(q, k), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dot_product_scores(q, k, scale=1.0),
                               torch.einsum("...qd,...kd->...qk", q, k), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dot_product_scores(q, k, scale=0.25),
                               0.25 * torch.einsum("...qd,...kd->...qk", q, k),
                               rtol=1e-12, atol=1e-12)


def test_attention_with_dot_scores_matches_sdpa_and_dot_product_attention():
    q, k = qk()
    v = torch.randn(2, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    lens = torch.tensor([[1, 4, 5], [3, 0, 2]])
    attn = Attention(dot_product_scores)
    out = attn(q, k, v, lens)
    mask = valid_lens_to_mask(lens, 3, 5)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, DotProductAttention()(q, k, v, lens), rtol=1e-12, atol=1e-12)
    assert torch.equal(attn.attention_weights[1, 1], torch.zeros(5, dtype=torch.float64))


# --- cosine_scores -----------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_cosine_scores_match_builtin_and_loop(temperature):
    q, k = qk(extra=(2,))
    got = cosine_scores(q, k, temperature=temperature)
    builtin = F.cosine_similarity(q.unsqueeze(-2), k.unsqueeze(-3), dim=-1) / temperature
    torch.testing.assert_close(got, builtin, rtol=1e-12, atol=1e-12)
    loop = loop_scores(lambda a, b: torch.dot(a, b) / (a.norm() * b.norm()) / temperature, q, k)
    torch.testing.assert_close(got, loop, rtol=1e-12, atol=1e-12)


def test_cosine_scores_zero_vector_gives_zero_and_finite_gradient():
    q, k = qk(Q=2, K=3)
    q = q.clone()
    q[0, 1] = 0.0
    q.requires_grad_()
    s = cosine_scores(q, k)
    assert torch.equal(s[0, 1].detach(), torch.zeros(3, dtype=torch.float64))
    s.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_cosine_scores_ignore_lengths():
    q, k = qk()
    torch.testing.assert_close(cosine_scores(3.0 * q, 0.5 * k), cosine_scores(q, k),
                               rtol=1e-12, atol=1e-12)


# --- gaussian_scores ---------------------------------------------------------------------------

@pytest.mark.parametrize("bandwidth", [1.0, 0.3])
def test_gaussian_scores_match_cdist_and_loop(bandwidth):
    q, k = qk(extra=(2,))
    got = gaussian_scores(q, k, bandwidth=bandwidth)
    dist = torch.cdist(q, k, compute_mode="donot_use_mm_for_euclid_dist")
    torch.testing.assert_close(got, -0.5 * (dist / bandwidth) ** 2, rtol=1e-12, atol=1e-12)
    loop = loop_scores(lambda a, b: -((a - b) ** 2).sum() / (2 * bandwidth**2), q, k)
    torch.testing.assert_close(got, loop, rtol=1e-12, atol=1e-12)


def test_gaussian_scores_softmax_is_nadaraya_watson_for_scalars():
    g = torch.Generator().manual_seed(3)
    x_train = torch.rand(7, generator=g, dtype=torch.float64) * 5
    x_query = torch.linspace(0, 5, 4, dtype=torch.float64)
    _, expected = nadaraya_watson(x_query=x_query, x_train=x_train,
                                  y_train=torch.zeros_like(x_train), kernel="gaussian",
                                  bandwidth=0.7)
    scores = gaussian_scores(x_query[None, :, None], x_train[None, :, None], bandwidth=0.7)
    torch.testing.assert_close(torch.softmax(scores, -1)[0], expected, rtol=1e-12, atol=1e-12)


def test_gaussian_scores_exact_zero_on_equal_vectors():
    q, _ = qk()
    s = gaussian_scores(q, q)
    diag = torch.diagonal(s, dim1=-2, dim2=-1)
    assert torch.equal(diag, torch.zeros_like(diag))
    assert not torch.signbit(diag).any()  # +0.0, not -0.0
    assert (s <= 0).all()


# --- BilinearAttention -------------------------------------------------------------------------

def test_bilinear_matches_loop_reference():
    torch.manual_seed(0)
    attn = BilinearAttention(query_size=3, key_size=5).double()
    W = attn.W_b.weight
    assert W.shape == (3, 5) and attn.W_b.bias is None
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    k = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 6, 2, generator=g, dtype=torch.float64)
    lens = torch.tensor([6, 2])
    scores = torch.empty(2, 4, 6, dtype=torch.float64)
    for b in range(2):
        for i in range(4):
            for j in range(6):
                scores[b, i, j] = q[b, i] @ W @ k[b, j]
    expected = torch.zeros_like(scores)
    for b in range(2):
        n = int(lens[b])
        expected[b, :, :n] = torch.softmax(scores[b, :, :n], dim=-1)
    torch.testing.assert_close(attn(q, k, v, lens), expected @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attn.attention_weights, expected, rtol=1e-12, atol=1e-12)


def test_bilinear_with_scaled_identity_is_scaled_dot_product_attention():
    attn = BilinearAttention(4, 4).double()
    with torch.no_grad():
        attn.W_b.weight.copy_(torch.eye(4, dtype=torch.float64) / 2.0)  # 1 / sqrt(4)
    q, k = qk()
    v = torch.randn(2, 5, 3, dtype=torch.float64)
    torch.testing.assert_close(attn(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               rtol=1e-12, atol=1e-12)


def test_bilinear_gradcheck_with_empty_row():
    attn = BilinearAttention(3, 2).double()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    lens = torch.tensor([[0, 2], [3, 1]])
    assert torch.autograd.gradcheck(lambda a, b, c: attn(a, b, c, lens), (q, k, v))


# --- Attention (generic) -----------------------------------------------------------------------

@pytest.mark.parametrize("score_fn",
                         [cosine_scores, functools.partial(gaussian_scores, bandwidth=2.0)])
def test_attention_is_masked_softmax_of_scores_then_pooling(score_fn):
    q, k = qk(extra=(2,))
    v = torch.randn(2, 2, 5, 3, dtype=torch.float64)
    lens = torch.tensor([3, 0])
    attn = Attention(score_fn)
    weights = masked_softmax(score_fn(q, k), lens)
    torch.testing.assert_close(attn(q, k, v, lens), weights @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attn.attention_weights, weights, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("score_fn", SCORE_FNS)
def test_attention_gradcheck(score_fn):
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    lens = torch.tensor([2, 0])
    assert torch.autograd.gradcheck(lambda a, b, c: Attention(score_fn)(a, b, c, lens), (q, k, v))


def test_dropout_only_in_training_and_weights_stored_before_dropout():
    q, k = qk()
    v = torch.randn(2, 5, 3, dtype=torch.float64)
    for attn in (Attention(dot_product_scores, dropout=0.5), BilinearAttention(4, 4, 0.5).double()):
        attn.eval()
        out_eval = attn(q, k, v)
        torch.testing.assert_close(out_eval, attn.attention_weights @ v, rtol=1e-12, atol=1e-12)
        attn.train()
        torch.manual_seed(0)
        out_train = attn(q, k, v)
        assert not torch.allclose(out_train, out_eval)
        torch.testing.assert_close(attn.attention_weights.sum(-1),
                                   torch.ones(2, 3, dtype=torch.float64))


def test_repr_names_the_score_function_without_addresses():
    text = repr(Attention(functools.partial(cosine_scores, temperature=0.1)))
    assert "partial(cosine_scores, temperature=0.1)" in text and "0x" not in text


# --- inputs and errors -------------------------------------------------------------------------

def test_inputs_not_modified():
    q, k = qk()
    v = torch.randn(2, 5, 3, dtype=torch.float64)
    lens = torch.tensor([1, 2])
    copies = [t.clone() for t in (q, k, v, lens)]
    for fn in SCORE_FNS:
        fn(q, k)
        Attention(fn)(q, k, v, lens)
    BilinearAttention(4, 4).double()(q, k, v, lens)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, lens), copies))


@pytest.mark.parametrize("score_fn", SCORE_FNS)
def test_score_functions_reject_bad_input(score_fn):
    q, k = qk()
    with pytest.raises(ValueError, match="queries and keys must have the same feature size"):
        score_fn(q, k[..., :3])
    with pytest.raises(ValueError, match="keys must have the leading axes of queries"):
        score_fn(q, k[:1])
    with pytest.raises(ValueError, match="queries must have shape"):
        score_fn(q[0], k[0])
    with pytest.raises(ValueError, match="keys must be a floating-point"):
        score_fn(q, k.long())
    with pytest.raises(ValueError, match="same dtype"):
        score_fn(q, k.float())


def test_options_must_be_positive():
    q, k = qk()
    with pytest.raises(ValueError, match="scale"):
        dot_product_scores(q, k, scale=0.0)
    with pytest.raises(ValueError, match="temperature"):
        cosine_scores(q, k, temperature=-1.0)
    with pytest.raises(ValueError, match="eps"):
        cosine_scores(q, k, eps=0.0)
    with pytest.raises(ValueError, match="bandwidth"):
        gaussian_scores(q, k, bandwidth=float("inf"))


def test_modules_reject_bad_input():
    q, k = qk()
    v = torch.randn(2, 5, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="score_fn must be callable"):
        Attention("dot")
    with pytest.raises(ValueError, match="dropout"):
        Attention(dot_product_scores, dropout=1.0)
    with pytest.raises(ValueError, match=r"score_fn must return scores of shape"):
        Attention(lambda a, b: a @ a.transpose(-2, -1))(q, k, v)
    with pytest.raises(ValueError, match="values must have shape"):
        Attention(dot_product_scores)(q, k, v[:, :4])
    with pytest.raises(ValueError, match="valid_lens"):
        Attention(dot_product_scores)(q, k, v, torch.tensor([6, 1]))
    with pytest.raises(ValueError, match="query_size"):
        BilinearAttention(0, 4)
    with pytest.raises(ValueError, match="key_size"):
        BilinearAttention(4, True)
    with pytest.raises(ValueError, match="dropout"):
        BilinearAttention(4, 4, dropout=-0.1)
    bil = BilinearAttention(4, 4).double()
    with pytest.raises(ValueError, match="queries must have feature size query_size = 4"):
        bil(q[..., :3], k, v)
    with pytest.raises(ValueError, match="keys must have feature size key_size = 4"):
        bil(q, k[..., :2], v)


# --- properties --------------------------------------------------------------------------------

@settings(deadline=None, max_examples=40)
@given(B=st.integers(1, 3), Q=st.integers(1, 5), K=st.integers(1, 6), d=st.integers(1, 8),
       bandwidth=st.floats(0.1, 10.0), seed=st.integers(0, 2**16))
def test_property_gaussian_softmax_is_dot_product_minus_half_key_norm(B, Q, K, d, bandwidth, seed):
    """The |q|^2 term of -|q - k|^2 / 2 is the same for every key, so the softmax drops it."""
    q, k = qk(B, Q, K, d, seed=seed)
    lhs = torch.softmax(gaussian_scores(q, k, bandwidth=bandwidth), dim=-1)
    adjusted = (q @ k.transpose(-2, -1) - 0.5 * (k**2).sum(-1)[:, None, :]) / bandwidth**2
    torch.testing.assert_close(lhs, torch.softmax(adjusted, dim=-1), rtol=1e-9, atol=1e-12)


@settings(deadline=None, max_examples=40)
@given(B=st.integers(1, 3), Q=st.integers(1, 5), K=st.integers(1, 6), d=st.integers(1, 8),
       temperature=st.floats(0.05, 5.0), seed=st.integers(0, 2**16))
def test_property_cosine_scores_are_bounded(B, Q, K, d, temperature, seed):
    q, k = qk(B, Q, K, d, seed=seed)
    s = cosine_scores(q, k, temperature=temperature) * temperature
    assert (s.abs() <= 1 + 1e-12).all()


@settings(deadline=None, max_examples=40)
@given(B=st.integers(1, 3), Q=st.integers(1, 5), K=st.integers(1, 6), d=st.integers(1, 8),
       seed=st.integers(0, 2**16))
def test_property_attention_rows_sum_to_one_or_zero(B, Q, K, d, seed):
    q, k = qk(B, Q, K, d, seed=seed)
    v = torch.randn(B, K, 2, dtype=torch.float64)
    lens = torch.randint(0, K + 1, (B, Q), generator=torch.Generator().manual_seed(seed))
    for fn in SCORE_FNS:
        attn = Attention(fn)
        attn(q, k, v, lens)
        sums = attn.attention_weights.sum(-1)
        torch.testing.assert_close(sums, (lens > 0).to(torch.float64), rtol=0, atol=1e-12)
