"""MultiHeadAttention against nn.MultiheadAttention(batch_first=True) with copied weights."""

import pytest
import torch
from torch import nn

from d2lattn import MultiHeadAttention, valid_lens_to_mask


def copy_into_torch(ours: MultiHeadAttention, bias: bool, kdim=None, vdim=None) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.num_hiddens, ours.num_heads, bias=bias, batch_first=True,
                                kdim=kdim, vdim=vdim, dtype=torch.float64)
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        else:
            ref.q_proj_weight.copy_(ours.W_q.weight)
            ref.k_proj_weight.copy_(ours.W_k.weight)
            ref.v_proj_weight.copy_(ours.W_v.weight)
        ref.out_proj.weight.copy_(ours.W_o.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
            ref.out_proj.bias.copy_(ours.W_o.bias)
    return ref


def data(B=3, Q=4, K=6, dq=8, dk=8, dv=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Q, dq, generator=g, dtype=torch.float64),
            torch.randn(B, K, dk, generator=g, dtype=torch.float64),
            torch.randn(B, K, dv, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sizes", [(8, 8), (5, 3)])  # (key_size, value_size)
@pytest.mark.parametrize("lens_kind", ["none", "1d", "2d"])
def test_matches_torch_multihead_attention(bias, sizes, lens_kind):
    torch.manual_seed(0)
    key_size, value_size = sizes
    ours = MultiHeadAttention(8, 2, bias=bias, key_size=key_size, value_size=value_size).double()
    kdim = None if key_size == 8 else key_size
    vdim = None if value_size == 8 else value_size
    ref = copy_into_torch(ours, bias, kdim, vdim).eval()
    q, k, v = data(dk=key_size, dv=value_size)
    B, Q, K = 3, 4, 6
    lens, kwargs = None, {}
    if lens_kind == "1d":
        lens = torch.tensor([2, 6, 4])
        kwargs["key_padding_mask"] = ~valid_lens_to_mask(lens, Q, K)[:, 0]  # (B, K), True = ignore
    elif lens_kind == "2d":
        lens = torch.tensor([[1, 2, 3, 4], [6, 5, 4, 3], [2, 2, 6, 1]])
        keep = valid_lens_to_mask(lens, Q, K)  # (B, Q, K)
        kwargs["attn_mask"] = ~keep.repeat_interleave(ours.num_heads, dim=0)  # (B*h, Q, K)
    out = ours(q, k, v, lens)
    expected, weights = ref(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.attention_weights, weights, rtol=1e-10, atol=1e-12)
    assert ours.attention_weights.shape == (B, 2, Q, K)


@pytest.mark.parametrize("bias", [False, True])
def test_self_attention_fast_path_gives_the_same_outputs(bias):
    # queries is keys is values under no_grad takes the packed projection; with grad it does not
    torch.manual_seed(0)
    ours = MultiHeadAttention(8, 2, bias=bias).double()
    ref = copy_into_torch(ours, bias).eval()
    X = data(Q=5, K=5)[0]
    lens = torch.tensor([5, 2, 3])
    expected, weights = ref(X, X, X, need_weights=True, average_attn_weights=False,
                            key_padding_mask=~valid_lens_to_mask(lens, 5, 5)[:, 0])
    with_grad = ours(X, X, X, lens)
    with torch.no_grad():
        packed = ours(X, X, X, lens)
    torch.testing.assert_close(packed, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.attention_weights, weights, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(packed, with_grad.detach(), rtol=1e-12, atol=1e-14)
    assert with_grad.requires_grad and not packed.requires_grad


def test_query_size_different_from_num_hiddens():
    mha = MultiHeadAttention(12, 3, query_size=5, key_size=7, value_size=2)
    out = mha(torch.randn(2, 4, 5), torch.randn(2, 9, 7), torch.randn(2, 9, 2), torch.tensor([3, 9]))
    assert out.shape == (2, 4, 12) and mha.attention_weights.shape == (2, 3, 4, 9)
    assert mha.W_q.in_features == 5 and mha.W_k.in_features == 7 and mha.W_v.in_features == 2
    assert torch.all(mha.attention_weights[0, :, :, 3:] == 0)


def test_heads_are_contiguous_blocks():
    torch.manual_seed(0)
    mha = MultiHeadAttention(6, 3).double()
    q, k, v = data(B=1, Q=2, K=3, dq=6, dk=6, dv=6)
    mha(q, k, v)
    for i in range(3):
        rows = slice(2 * i, 2 * (i + 1))
        qi, ki = q @ mha.W_q.weight[rows].T, k @ mha.W_k.weight[rows].T
        w = torch.softmax(qi @ ki.transpose(1, 2) / 2 ** 0.5, dim=-1)
        torch.testing.assert_close(mha.attention_weights[:, i], w)


def test_split_and_merge_heads_are_inverse():
    mha = MultiHeadAttention(8, 4)
    X = torch.randn(2, 5, 8)
    assert mha.split_heads(X).shape == (2, 4, 5, 2)
    assert torch.equal(mha.merge_heads(mha.split_heads(X)), X)


def test_gradcheck_and_inputs_unmodified():
    torch.manual_seed(0)
    mha = MultiHeadAttention(4, 2, bias=True).double()
    q, k, v = (t.requires_grad_() for t in data(B=2, Q=2, K=3, dq=4, dk=4, dv=4))
    lens = torch.tensor([[0, 3], [2, 1]])
    copies = [t.detach().clone() for t in (q, k, v, lens)]
    assert torch.autograd.gradcheck(lambda a, b, c: mha(a, b, c, lens), (q, k, v))
    assert all(torch.equal(a.detach(), b) for a, b in zip((q, k, v, lens), copies))


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match=r"num_hiddens \(10\) must be divisible by num_heads \(4\)"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match="key_size must be a positive integer"):
        MultiHeadAttention(8, 2, key_size=0)
    mha = MultiHeadAttention(8, 2)
    X = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="queries must have feature size query_size = 8"):
        mha(torch.randn(2, 3, 5), X, X)
    with pytest.raises(ValueError, match="values must have feature size value_size = 8"):
        mha(X, X, torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="values must have shape"):
        mha(X, X, torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match="queries must have shape"):
        mha(torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8))
    with pytest.raises(ValueError, match="valid_lens"):
        mha(X, X, X, torch.tensor([4, 1]))
