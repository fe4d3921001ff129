"""Empty inputs (batch 0, no queries, no keys) give empty results of the right shape, as
PyTorch's layers do, never a raw error from a reshape.

The oracles: ``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer`` with the same weights, in
float32 and float64; gradients wherever the output is not empty.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from d2lattn.flash import flash_attention
from d2lattn.multihead import GroupedQueryAttention, MultiHeadAttention
from d2lattn.transformer import TransformerDecoderBlock, TransformerEncoderBlock, _copy_mha

DTYPES = [torch.float32, torch.float64]


def randn(*shape, seed=0, dtype=torch.float64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def assert_same_grads(out, ref, ours_inputs, ref_inputs):
    """Equal gradients of a random projection of the outputs (zeros when they are empty)."""
    d_out = randn(*out.shape, seed=9, dtype=out.dtype)
    for a, b in zip(torch.autograd.grad(out, ours_inputs, d_out, allow_unused=True),
                    torch.autograd.grad(ref, ref_inputs, d_out, allow_unused=True)):
        a = torch.zeros((), dtype=out.dtype) if a is None else a  # unused: zero gradient
        b = torch.zeros((), dtype=ref.dtype) if b is None else b
        torch.testing.assert_close(a.expand_as(b) if a.dim() == 0 else a,
                                   b.expand_as(a) if b.dim() == 0 else b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", [{}, {"is_causal": True}, {"window": 1},
                                     {"valid_lens": torch.zeros(0, dtype=torch.long)}])
def test_flash_attention_with_batch_zero_matches_sdpa(dtype, options):
    q, k, v = (randn(0, 3, 5, 8, dtype=dtype, requires_grad=True),
               randn(0, 3, 7, 8, seed=1, dtype=dtype, requires_grad=True),
               randn(0, 3, 7, 6, seed=2, dtype=dtype, requires_grad=True))
    out = flash_attention(q, k, v, **options)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == ref.shape == (0, 3, 5, 6) and out.dtype == dtype
    assert_same_grads(out, ref, (q, k, v), (q, k, v))


@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attention_gqa_with_batch_zero_matches_sdpa(dtype):
    q = randn(0, 4, 5, 8, dtype=dtype, requires_grad=True)
    k, v = randn(0, 2, 7, 8, seed=1, dtype=dtype), randn(0, 2, 7, 6, seed=2, dtype=dtype)
    out = flash_attention(q, k, v, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out.shape == ref.shape == (0, 4, 5, 6)
    assert_same_grads(out, ref, (q,), (q,))


def mha_pair(dtype, num_kv_heads=None):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(16, 4, batch_first=True, dtype=dtype)
    if num_kv_heads is None:
        ours = MultiHeadAttention(16, 4, bias=True).to(dtype)
    else:
        ours = GroupedQueryAttention(16, 4, num_kv_heads, bias=True).to(dtype)
    with torch.no_grad():
        _copy_mha(ours, ref)
    return ours, ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Q,K", [(0, 5, 5), (2, 0, 5), (2, 5, 0), (2, 0, 0), (0, 0, 0)])
@pytest.mark.parametrize("layer", ["mha", "gqa with g = h"])
def test_multi_head_attention_with_empty_axes_matches_nn_multiheadattention(dtype, B, Q, K,
                                                                          layer):
    ours, ref = mha_pair(dtype, None if layer == "mha" else 4)
    q = randn(B, Q, 16, dtype=dtype, requires_grad=True)
    kv = randn(B, K, 16, seed=1, dtype=dtype, requires_grad=True)
    out = ours(q, kv, kv)
    expected, _ = ref(q, kv, kv, need_weights=False)
    assert out.shape == expected.shape == (B, Q, 16)
    torch.testing.assert_close(out, expected)
    params = [ours.W_q.weight, ours.W_o.weight, ours.W_o.bias]
    ref_params = [ref.in_proj_weight, ref.out_proj.weight, ref.out_proj.bias]
    d_out = randn(*out.shape, seed=9, dtype=dtype)
    got = torch.autograd.grad(out, [q, kv, *params], d_out, allow_unused=True)
    want = torch.autograd.grad(expected, [q, kv, *ref_params], d_out, allow_unused=True)
    want = list(want[:2]) + [want[2][:16] if want[2] is not None else None, *want[3:]]
    for a, b in zip(got, want):
        a = torch.zeros_like(b) if a is None and b is not None else a
        b = torch.zeros_like(a) if b is None and a is not None else b
        if a is not None:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Q,K", [(0, 5, 5), (2, 0, 5), (2, 5, 0), (0, 0, 0)])
def test_grouped_query_attention_with_fewer_kv_heads_and_empty_axes_matches_sdpa(dtype, B, Q,
                                                                                 K):
    """g = 2 key/value heads for h = 4: nn.MultiheadAttention has no such layer, so the oracle
    is PyTorch's own pieces with our weights: F.linear, SDPA with enable_gqa, F.linear."""
    torch.manual_seed(0)
    ours = GroupedQueryAttention(16, 4, 2, bias=True).to(dtype)
    q = randn(B, Q, 16, dtype=dtype, requires_grad=True)
    kv = randn(B, K, 16, seed=1, dtype=dtype, requires_grad=True)
    out = ours(q, kv, kv)

    def heads(x, n):  # (B, T, n * 4) -> (B, n, T, 4)
        return x.reshape(x.shape[0], x.shape[1], n, 4).transpose(1, 2)

    attn = F.scaled_dot_product_attention(
        heads(F.linear(q, ours.W_q.weight, ours.W_q.bias), 4),
        heads(F.linear(kv, ours.W_k.weight, ours.W_k.bias), 2),
        heads(F.linear(kv, ours.W_v.weight, ours.W_v.bias), 2), enable_gqa=True)
    ref = F.linear(attn.transpose(1, 2).reshape(B, Q, 16), ours.W_o.weight, ours.W_o.bias)
    if K == 0:  # SDPA: NaN for a query with no key; the book (and nn.MultiheadAttention's
        ref = F.linear(torch.zeros_like(attn.transpose(1, 2).reshape(B, Q, 16)),  # rule): 0
                       ours.W_o.weight, ours.W_o.bias)
    assert out.shape == ref.shape == (B, Q, 16)
    torch.testing.assert_close(out, ref)
    assert_same_grads(out, ref, (q, kv, ours.W_q.weight), (q, kv, ours.W_q.weight))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T", [(0, 5), (2, 0), (0, 0)])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_with_empty_axes_matches_nn_transformer_encoder_layer(dtype, B, T,
                                                                           norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True,
                                       norm_first=norm_first, dtype=dtype)
    block = TransformerEncoderBlock.from_torch(layer)
    X = randn(B, T, 16, dtype=dtype, requires_grad=True)
    out, expected = block(X), layer(X)
    assert out.shape == expected.shape == (B, T, 16)
    assert_same_grads(out, expected, (X,), (X,))
    out = block(X, torch.zeros(B, dtype=torch.long), is_causal=True)  # options still accepted
    assert out.shape == (B, T, 16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,S", [(0, 5, 3), (2, 0, 3), (2, 4, 0), (0, 0, 0)])
def test_decoder_block_with_empty_axes_matches_nn_transformer_decoder_layer(dtype, B, T, S):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 4, 24, dropout=0.0, batch_first=True, dtype=dtype)
    block = TransformerDecoderBlock.from_torch(layer)
    X = randn(B, T, 16, dtype=dtype, requires_grad=True)
    memory = randn(B, S, 16, seed=1, dtype=dtype, requires_grad=True)
    out = block(X, memory)
    expected = layer(X, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(
        T, dtype=dtype), tgt_is_causal=True)
    assert out.shape == expected.shape == (B, T, 16)
    torch.testing.assert_close(out, expected)
    assert_same_grads(out, expected, (X, memory), (X, memory))
