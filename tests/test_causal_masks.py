"""causal_mask and the attn_mask / is_causal options of the attention layers."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from d2lattn.masking import causal_mask


@pytest.mark.parametrize("Q, K", [(1, 1), (4, 4), (2, 5), (1, 7), (5, 3), (3, 0), (0, 3)])
def test_causal_mask_is_lower_right_aligned(Q, K):
    mask = causal_mask(Q, K)
    assert mask.shape == (Q, K) and mask.dtype == torch.bool
    for i in range(Q):
        for j in range(K):
            assert bool(mask[i, j]) == (j <= i + (K - Q))


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")  # Q > K case
@pytest.mark.parametrize("Q, K", [(4, 4), (2, 5), (1, 7), (5, 3)])
def test_causal_mask_matches_torch_causal_lower_right(Q, K):
    expected = causal_lower_right(Q, K)._materialize()
    assert torch.equal(causal_mask(Q, K), expected)


def test_square_causal_mask_matches_sdpa_is_causal():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(5, 5)),
        F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=1e-15)


@pytest.mark.parametrize("bad", [-1, 2.0, True, "3", None])
def test_causal_mask_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="num_queries"):
        causal_mask(bad, 3)
    with pytest.raises(ValueError, match="num_keys"):
        causal_mask(3, bad)


# --------------------------------------------------------------------------------------------
# attn_mask / is_causal in DotProductAttention and MultiHeadAttention
# --------------------------------------------------------------------------------------------

from d2lattn import DotProductAttention, MultiHeadAttention, valid_lens_to_mask  # noqa: E402


def qkv(B=2, Q=4, K=6, d=4, v=3, extra=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, *extra, Q, d, generator=g, dtype=torch.float64),
            torch.randn(B, *extra, K, d, generator=g, dtype=torch.float64),
            torch.randn(B, *extra, K, v, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("Q, K", [(5, 5), (2, 6), (1, 6)])
def test_is_causal_matches_sdpa_with_causal_lower_right(Q, K):
    q, k, v = qkv(Q=Q, K=K, extra=(3,))  # (B, h, T, d)
    attn = DotProductAttention()
    out = attn(q, k, v, is_causal=True)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(Q, K))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    if Q == K:
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                   rtol=1e-12, atol=1e-12)
    assert torch.all(attn.attention_weights[..., ~causal_mask(Q, K)] == 0)


@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 1, 6), (2, 4, 6), (1, 6)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("lens", [None, torch.tensor([3, 6]), torch.tensor([[1, 2, 6, 5], [6, 4, 3, 2]])])
def test_attn_mask_valid_lens_and_is_causal_combine_with_and(mask_shape, is_causal, lens):
    Q, K = 4, 6
    q, k, v = qkv(Q=Q, K=K)
    g = torch.Generator().manual_seed(1)
    attn_mask = torch.rand(mask_shape, generator=g) < 0.7
    attn_mask[..., 0] = True  # keep key 0 so that no row of the reference is empty
    keep = attn_mask.expand(2, Q, K).clone()
    if lens is not None:
        keep &= valid_lens_to_mask(lens, Q, K)
    if is_causal:
        keep &= causal_mask(Q, K)
    saved = attn_mask.clone()
    out = DotProductAttention()(q, k, v, lens, attn_mask=attn_mask, is_causal=is_causal)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(attn_mask, saved)  # the caller's mask is not written into


def test_query_without_any_key_gets_zero_weights_not_nan():
    q, k, v = (t.requires_grad_() for t in qkv(Q=5, K=3))  # Q > K: queries 0, 1 see nothing
    attn = DotProductAttention()
    out = attn(q, k, v, is_causal=True)
    assert torch.all(out[:, :2] == 0) and torch.all(attn.attention_weights[:, :2] == 0)
    torch.testing.assert_close(attn.attention_weights[:, 2:].sum(-1),
                               torch.ones(2, 3, dtype=torch.float64))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("bad, match", [
    (torch.ones(4, 6, dtype=torch.int64), "attn_mask must be a bool"),  # float: a bias
    ([[True]], "attn_mask must be a bool"),
    (torch.ones(4, 5, dtype=torch.bool), r"broadcast to \(\.\.\., Q, K\)"),
    (torch.ones(6, dtype=torch.bool), r"broadcast to \(\.\.\., Q, K\)"),
])
def test_bad_attn_mask_raises(bad, match):
    with pytest.raises(ValueError, match=match):
        DotProductAttention()(*qkv(), attn_mask=bad)


def test_non_bool_is_causal_raises():
    with pytest.raises(ValueError, match="is_causal"):
        DotProductAttention()(*qkv(), is_causal=1)


def torch_mha_like(ours: MultiHeadAttention) -> torch.nn.MultiheadAttention:
    ref = torch.nn.MultiheadAttention(ours.num_hiddens, ours.num_heads, bias=True, batch_first=True,
                                      dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        ref.out_proj.weight.copy_(ours.W_o.weight)
        ref.out_proj.bias.copy_(ours.W_o.bias)
    return ref.eval()


@pytest.mark.parametrize("mask_kind", ["none", "2d", "3d", "4d"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_multihead_masks_match_nn_multihead_attention(mask_kind, is_causal):
    torch.manual_seed(0)
    B, T, h = 3, 5, 2
    ours = MultiHeadAttention(8, h, bias=True).double()
    ref = torch_mha_like(ours)
    X = torch.randn(B, T, 8, dtype=torch.float64)
    lens = torch.tensor([5, 3, 4])
    g = torch.Generator().manual_seed(2)
    shape = {"none": None, "2d": (T, T), "3d": (B, T, T), "4d": (B, h, T, T)}[mask_kind]
    attn_mask = None if shape is None else torch.rand(shape, generator=g) < 0.6
    if attn_mask is not None:
        attn_mask[..., 0] = True
    keep = valid_lens_to_mask(lens, T, T)[:, None]  # (B, 1, 1, T)
    if attn_mask is not None:
        keep = keep & (attn_mask[:, None] if attn_mask.dim() == 3 else attn_mask)
    if is_causal:
        keep = keep & causal_mask(T, T)
    keep = keep.expand(B, h, T, T).reshape(B * h, T, T)
    out = ours(X, X, X, lens, attn_mask=attn_mask, is_causal=is_causal)
    # nn.MultiheadAttention's boolean masks mean True = ignore: negate ours.
    expected, weights = ref(X, X, X, attn_mask=~keep, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.attention_weights, weights, rtol=1e-10, atol=1e-12)
