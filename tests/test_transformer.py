"""Transformer blocks against PyTorch's layers, the KV cache, rotary embeddings and ALiBi."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from d2lattn import (KVCache, MultiHeadAttention, PositionWiseFFN, TransformerDecoderBlock,
                     TransformerEncoderBlock, valid_lens_to_mask)
from d2lattn.masking import causal_mask
from d2lattn.positional import alibi_bias, rotary_embedding

TOL = dict(rtol=1e-10, atol=1e-10)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def torch_encoder_layer(norm_first, seed=0, d=16, h=4, ffn=24):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d, h, ffn, dropout=0.0, batch_first=True,
                                       norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():  # LayerNorms start at (1, 0); perturb them so the copy is tested
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def torch_decoder_layer(norm_first, seed=0, d=16, h=4, ffn=24):
    torch.manual_seed(seed)
    layer = nn.TransformerDecoderLayer(d, h, ffn, dropout=0.0, batch_first=True,
                                       norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "both"])
def test_encoder_block_from_torch_matches(norm_first, mask):
    layer = torch_encoder_layer(norm_first)
    block = TransformerEncoderBlock.from_torch(layer)
    assert block.norm_first is norm_first
    B, T = 3, 7
    X = randn(B, T, 16, seed=1)
    lens = torch.tensor([7, 4, 1]) if mask in ("padding", "both") else None
    is_causal = mask in ("causal", "both")
    kwargs = {}
    if lens is not None:
        kwargs["src_key_padding_mask"] = ~valid_lens_to_mask(lens, T, T)[:, 0]  # True = ignore
    if is_causal:
        kwargs["src_mask"] = ~causal_mask(T, T)  # bool, True = ignore, like the padding mask
        kwargs["is_causal"] = True
    expected = layer(X, **kwargs)
    out = block(X, lens, is_causal=is_causal)
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("memory_padding", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
def test_decoder_block_from_torch_matches(norm_first, memory_padding, is_causal):
    layer = torch_decoder_layer(norm_first)
    block = TransformerDecoderBlock.from_torch(layer)
    B, T, S = 3, 6, 5
    X, memory = randn(B, T, 16, seed=1), randn(B, S, 16, seed=2)
    lens = torch.tensor([5, 2, 3]) if memory_padding else None
    kwargs = {}
    if lens is not None:
        kwargs["memory_key_padding_mask"] = ~valid_lens_to_mask(lens, T, S)[:, 0]
    if is_causal:
        kwargs["tgt_mask"] = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
        kwargs["tgt_is_causal"] = True
    expected = layer(X, memory, **kwargs)
    out = block(X, memory, lens, is_causal=is_causal)
    torch.testing.assert_close(out, expected, **TOL)
    assert block.cross_attention.attention_weights.shape == (B, 4, T, S)


def test_from_torch_keeps_mode_dtype_and_rejects_other_layers():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True).eval()
    block = TransformerEncoderBlock.from_torch(layer)
    assert not block.training and block.norm1.weight.dtype == torch.float32
    assert block.self_attention.attention.dropout.p == 0.1
    with pytest.raises(ValueError, match="batch_first"):
        TransformerEncoderBlock.from_torch(nn.TransformerEncoderLayer(8, 2, 16))
    with pytest.raises(ValueError, match="TransformerDecoderLayer"):
        TransformerDecoderBlock.from_torch(layer)


def test_pre_norm_and_post_norm_differ():
    layer = torch_encoder_layer(False)
    post = TransformerEncoderBlock.from_torch(layer)
    pre = TransformerEncoderBlock.from_torch(torch_encoder_layer(True))
    pre.load_state_dict(post.state_dict())
    X = randn(2, 5, 16)
    assert not torch.allclose(pre(X), post(X))


def test_block_bad_input():
    with pytest.raises(ValueError, match="num_heads"):
        TransformerEncoderBlock(8, 0, 16)
    with pytest.raises(ValueError, match="norm_first"):
        TransformerDecoderBlock(8, 2, 16, norm_first=1)
    with pytest.raises(ValueError, match="dropout"):
        TransformerEncoderBlock(8, 2, 16, dropout=1.0)
    block = TransformerDecoderBlock(8, 2, 16)
    with pytest.raises(ValueError, match="memory"):
        block(torch.ones(2, 3, 8), torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="batch size"):
        block(torch.ones(2, 3, 8), torch.ones(1, 3, 8))
    with pytest.raises(ValueError, match="X must be"):
        TransformerEncoderBlock(8, 2, 16)(torch.ones(2, 3, 7))


def test_ffn_is_position_wise():
    ffn = PositionWiseFFN(4, 8).double()
    X = randn(2, 5, 4)
    torch.testing.assert_close(ffn(X)[:, 2], ffn(X[:, 2:3])[:, 0], rtol=0, atol=1e-14)


# ---- KV cache ------------------------------------------------------------------------------

@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_kv_cache_decoding_equals_full_causal_recompute_encoder_stack(rotary, norm_first):
    torch.manual_seed(0)
    blocks = [TransformerEncoderBlock(16, 4, 32, norm_first=norm_first, rotary=rotary).double()
              for _ in range(2)]
    B, T = 2, 9
    X = randn(B, T, 16)
    full = X
    for blk in blocks:
        full = blk(full, is_causal=True)
    caches = [KVCache() for _ in blocks]
    # first a prompt of 4 positions at once, then one position at a time
    steps, outs = [slice(0, 4)] + [slice(t, t + 1) for t in range(4, T)], []
    for s in steps:
        h = X[:, s]
        for blk, cache in zip(blocks, caches):
            h = blk(h, is_causal=True, kv_cache=cache)
        outs.append(h)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TOL)
    assert all(len(c) == T for c in caches)
    assert caches[0].nbytes == 2 * B * 16 * T * 8  # keys and values, float64


def test_kv_cache_decoder_block_equals_full_recompute():
    torch.manual_seed(0)
    block = TransformerDecoderBlock.from_torch(torch_decoder_layer(True))
    X, memory = randn(2, 6, 16, seed=1), randn(2, 4, 16, seed=2)
    lens = torch.tensor([4, 2])
    full = block(X, memory, lens)
    cache = KVCache()
    steps = [block(X[:, t:t + 1], memory, lens, kv_cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)


def test_kv_cache_rejects_mismatched_shapes():
    cache = KVCache()
    assert len(cache) == 0 and cache.nbytes == 0
    with pytest.raises(ValueError, match="share"):
        cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4))
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="do not fit"):
        cache.update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))


# ---- rotary position embedding ----------------------------------------------------------------

def test_rotary_scores_depend_only_on_offset():
    d, T = 8, 12
    q, k = randn(d, seed=1), randn(d, seed=2)
    Q = rotary_embedding(q.expand(T, d).contiguous())  # the same query at positions 0..T-1
    K = rotary_embedding(k.expand(T, d).contiguous())
    scores = Q @ K.T  # (T, T), scores[i, j] for query position i and key position j
    for offset in range(-T + 1, T):
        diag = torch.diagonal(scores, offset=offset)  # all (i, j) with j - i = offset
        torch.testing.assert_close(diag, diag[0].expand_as(diag), rtol=0, atol=1e-12)
    assert torch.unique(scores.round(decimals=6)).numel() > T  # not trivially constant


def test_rotary_preserves_norms_and_matches_complex_rotation():
    X = randn(2, 3, 5, 8)
    R = rotary_embedding(X, base=100.0)
    torch.testing.assert_close(R.norm(dim=-1), X.norm(dim=-1), rtol=1e-12, atol=0)
    # reference: pairs as complex numbers times exp(i * m * omega)
    z = torch.view_as_complex(X.reshape(2, 3, 5, 4, 2).contiguous())
    omega = 100.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    rot = torch.polar(torch.ones(5, 4, dtype=torch.float64), torch.arange(5.0, dtype=torch.float64)[:, None] * omega)
    expected = torch.view_as_real(z * rot).reshape(2, 3, 5, 8)
    torch.testing.assert_close(R, expected, rtol=1e-12, atol=1e-12)
    X0 = X.clone()
    rotary_embedding(X, torch.arange(10, 15))
    assert torch.equal(X, X0)


def test_rotary_bad_input():
    with pytest.raises(ValueError, match="even"):
        rotary_embedding(torch.ones(3, 5))
    with pytest.raises(ValueError, match="positions"):
        rotary_embedding(torch.ones(3, 4), torch.arange(4))
    with pytest.raises(ValueError, match="base"):
        rotary_embedding(torch.ones(3, 4), base=1.0)
    with pytest.raises(ValueError, match="even head size"):
        MultiHeadAttention(12, 4, rotary=True)


def test_rotary_attention_is_shift_invariant():
    """With RoPE and no other position signal, shifting every position leaves outputs alone."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, rotary=True).double()
    X = randn(2, 6, 16)
    base = mha(X, X, X, is_causal=True)
    cache = KVCache()  # pretend 5 tokens came before: positions of X become 5..10
    cache.update(torch.zeros(2, 2, 5, 8, dtype=torch.float64), torch.zeros(2, 2, 5, 8, dtype=torch.float64))
    mask = torch.ones(6, 11, dtype=torch.bool)
    mask[:, :5] = False  # ... but hide them
    shifted = mha(X, X, X, attn_mask=mask, is_causal=True, kv_cache=cache)
    torch.testing.assert_close(shifted, base, **TOL)


# ---- ALiBi ----------------------------------------------------------------------------------

def test_alibi_bias_slopes_and_distances():
    bias = alibi_bias(8, 4, 6)
    assert bias.shape == (8, 4, 6)
    slopes = 2.0 ** (-torch.arange(1, 9, dtype=torch.float32))
    torch.testing.assert_close(bias[:, -1, 0], -slopes * 5)  # last query, first key: distance 5
    assert torch.all(bias[:, torch.arange(4), torch.arange(2, 6)] == 0)  # a query vs its own key
    with pytest.raises(ValueError, match="num_heads"):
        alibi_bias(0, 2, 2)


def test_alibi_weights_decay_geometrically_with_distance():
    """With equal scores, ALiBi alone gives weights proportional to exp(-m * distance)."""
    bias = alibi_bias(2, 6, 6).double()
    weights = torch.softmax(bias.masked_fill(~causal_mask(6, 6), float("-inf")), dim=-1)
    for head, m in enumerate([2.0 ** -4, 2.0 ** -8]):
        row = weights[head, -1]  # the last query sees all 6 keys
        torch.testing.assert_close(row[1:] / row[:-1], torch.full((5,), 2.718281828459045 ** m,
                                   dtype=torch.float64), rtol=1e-12, atol=0)
