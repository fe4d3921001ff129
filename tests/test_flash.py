"""Tests of d2lattn.flash against F.scaled_dot_product_attention and nn modules."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from d2lattn import (
    GroupedQueryAttention,
    MultiHeadAttention,
    flash_attention,
    local_attention,
    online_softmax_stats,
    sliding_window_mask,
    valid_lens_to_mask,
)
from d2lattn.flash import _Tiling

DTYPES = [torch.float64, torch.float32]
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-5)}
# (Q, K, block_size): one block; a block larger than both; many blocks; lengths that are not
# multiples of the block; Q < K; Q > K (then causal leaves the first queries with no key).
SIZES = [(8, 8, 8), (5, 7, 64), (64, 64, 16), (33, 65, 8), (37, 19, 5), (1, 40, 7), (40, 1, 7)]


def qkv(B=2, h=3, Q=5, K=7, d=8, v=6, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, h, Q, d), (B, h, K, d), (B, h, K, v))
    return tuple(torch.randn(s, generator=g, dtype=dtype).requires_grad_(requires_grad)
                 for s in shapes)


def reference(q, k, v, mask):
    """SDPA with a boolean mask; rows with no key are NaN there, so they are zeroed here."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return torch.where(mask.any(-1, keepdim=True), out, torch.zeros((), dtype=out.dtype))


def brute_mask(Q, K, window=None, is_causal=False):
    """The mask rule written out entry by entry."""
    off = K - Q
    return torch.tensor([[(not is_causal or j <= i + off)
                          and (window is None or abs(j - (i + off)) <= window)
                          for j in range(K)] for i in range(Q)])


# --- online softmax -------------------------------------------------------------------------

@pytest.mark.parametrize("block_size", [1, 2, 3, 10])
def test_online_softmax_stats_match_logsumexp(block_size):
    x = torch.randn(4, 3, 10, dtype=torch.float64) * 5
    m, l = online_softmax_stats(x, block_size=block_size)
    torch.testing.assert_close(m, x.amax(-1))
    torch.testing.assert_close(m + torch.log(l), torch.logsumexp(x, -1))


def test_online_softmax_stats_row_of_minus_inf():
    x = torch.tensor([[-math.inf, -math.inf, -math.inf], [-math.inf, 0.0, -math.inf]])
    m, l = online_softmax_stats(x, block_size=1)
    assert m.tolist() == [-math.inf, 0.0] and l.tolist() == [0.0, 1.0]


def test_online_softmax_stats_bad_input():
    with pytest.raises(ValueError, match="scores"):
        online_softmax_stats(torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="block_size"):
        online_softmax_stats(torch.ones(3), block_size=0)


# --- forward equality -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q,K,block_size", SIZES)
def test_forward_matches_sdpa(dtype, Q, K, block_size):
    q, k, v = qkv(Q=Q, K=K, dtype=dtype)
    out = flash_attention(q, k, v, block_size=block_size)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Q,K,block_size", SIZES)
def test_causal_matches_sdpa_lower_right(dtype, Q, K, block_size):
    q, k, v = qkv(Q=Q, K=K, dtype=dtype)
    out = flash_attention(q, k, v, is_causal=True, block_size=block_size)
    mask = brute_mask(Q, K, is_causal=True)
    has_key = mask.any(-1)
    if bool(has_key.all()):  # PyTorch's own lower-right causal bias
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(Q, K))
        torch.testing.assert_close(out, ref, **TOL[dtype])
    torch.testing.assert_close(out[..., has_key, :], reference(q, k, v, mask)[..., has_key, :],
                               **TOL[dtype])
    assert bool((out[..., ~has_key, :] == 0).all())  # queries before the first key: zeros


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens_2d", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
def test_valid_lens_match_sdpa_and_empty_rows_are_zero(dtype, lens_2d, is_causal):
    B, h, Q, K = 3, 2, 11, 13
    q, k, v = qkv(B=B, h=h, Q=Q, K=K, dtype=dtype)
    if lens_2d:
        valid_lens = torch.randint(0, K + 1, (B, Q), generator=torch.Generator().manual_seed(1))
        valid_lens[0, 3] = 0
    else:
        valid_lens = torch.tensor([0, 5, 13])  # an empty sequence, a short one, a full one
    out = flash_attention(q, k, v, valid_lens=valid_lens, is_causal=is_causal, block_size=4)
    mask = valid_lens_to_mask(valid_lens, Q, K)[:, None] & brute_mask(Q, K, is_causal=is_causal)
    mask = mask.expand(B, h, Q, K)  # (B, h, Q, K)
    has_key = mask.any(-1)  # (B, h, Q)
    assert not bool(has_key.all())  # the test covers empty rows
    ref = reference(q, k, v, mask)
    torch.testing.assert_close(out[has_key], ref[has_key], **TOL[dtype])
    assert bool((out[~has_key] == 0).all())
    assert not bool(out.isnan().any())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 1, 4, 100])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Q,K", [(30, 30), (17, 29), (29, 17)])
def test_window_matches_sdpa(dtype, window, is_causal, Q, K):
    q, k, v = qkv(Q=Q, K=K, dtype=dtype)
    mask = sliding_window_mask(Q, K, window, is_causal=is_causal)
    assert torch.equal(mask, brute_mask(Q, K, window, is_causal))
    out = local_attention(q, k, v, window, is_causal=is_causal, block_size=4)
    has_key = mask.any(-1)
    torch.testing.assert_close(out[..., has_key, :], reference(q, k, v, mask)[..., has_key, :],
                               **TOL[dtype])
    assert bool((out[..., ~has_key, :] == 0).all())


def test_sliding_window_mask_without_window_is_causal_lower_right():
    for Q, K in ((3, 5), (5, 5), (5, 3)):
        expected = torch.ones(Q, K, dtype=torch.bool).tril(diagonal=K - Q)
        assert torch.equal(sliding_window_mask(Q, K, is_causal=True), expected)
    assert bool(sliding_window_mask(4, 6).all())


@pytest.mark.parametrize("shape", [(2, 9, 8), (2, 3, 2, 9, 8)])
def test_any_number_of_middle_axes(shape):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=g)
    out = flash_attention(q, q, q, is_causal=True, valid_lens=torch.tensor([4, 9]), block_size=4)
    mask = valid_lens_to_mask(torch.tensor([4, 9]), 9, 9) & brute_mask(9, 9, is_causal=True)
    mask = mask.view(2, *([1] * (len(shape) - 3)), 9, 9)
    torch.testing.assert_close(out, reference(q, q, q, mask), rtol=1e-5, atol=1e-5)
    assert out.shape == shape


def test_scale_option_and_large_scores_do_not_overflow():
    q, k, v = qkv(Q=20, K=20, dtype=torch.float32)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    for scale in (0.5, 300.0):  # 300: scores in the thousands, exp would overflow unshifted
        out = flash_attention(q, k, v, scale=scale, block_size=6)
        ref = F.scaled_dot_product_attention(q64, k64, v64, scale=scale)
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
        assert bool(out.isfinite().all())


# --- backward ---------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    dict(),
    dict(is_causal=True),
    dict(valid_lens=torch.tensor([0, 3])),  # with an empty sequence
    dict(valid_lens=torch.tensor([[1, 0, 4, 4, 2], [2, 2, 0, 1, 3]]), is_causal=True),
    dict(window=1),
    dict(window=2, is_causal=True),
])
@pytest.mark.parametrize("Q,K", [(4, 5), (5, 4)])
def test_gradcheck_float64(options, Q, K):
    if "valid_lens" in options and options["valid_lens"].dim() == 2:  # one length per query
        options = dict(options, valid_lens=options["valid_lens"][:, :Q])
    q, k, v = qkv(B=2, h=1, Q=Q, K=K, d=3, v=2, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, block_size=2, **options), (q, k, v))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Q,K,block_size", [(64, 64, 16), (37, 53, 8), (10, 10, 64)])
def test_float32_gradients_match_sdpa(is_causal, Q, K, block_size):
    q, k, v = qkv(Q=Q, K=K, d=16, v=16, dtype=torch.float32, requires_grad=True)
    grad_out = torch.randn(2, 3, Q, 16, generator=torch.Generator().manual_seed(5))
    out = flash_attention(q, k, v, is_causal=is_causal, block_size=block_size)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    mask = causal_lower_right(Q, K) if is_causal else None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    theirs = torch.autograd.grad(ref, (q, k, v), grad_out)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_empty_rows_give_zero_gradients_not_nan():
    q, k, v = qkv(B=2, h=1, Q=3, K=4, requires_grad=True)
    out = flash_attention(q, k, v, valid_lens=torch.tensor([0, 2]), block_size=2)
    out.sum().backward()
    for t in (q, k, v):
        assert bool(t.grad.isfinite().all())
    assert bool((q.grad[0] == 0).all()) and bool((k.grad[0] == 0).all())
    assert bool((v.grad[1, :, 2:] == 0).all())  # keys beyond the valid length get nothing


def test_backward_saves_only_inputs_output_and_logsumexp():
    B, h, T, d = 1, 2, 256, 8
    q, k, v = qkv(B=B, h=h, Q=T, K=T, d=d, v=d, dtype=torch.float32, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        flash_attention(q, k, v, block_size=32)
    # q, k, v (3 B h T d), output (B h T d), each row's maximum and 1 / sum (2 B h T):
    # nothing of size T * T
    assert sum(saved) == 4 * B * h * T * d + 2 * B * h * T
    assert max(saved) < T * T


def test_only_needed_tiles_are_visited():
    def visited(T, **kw):
        tiling = _Tiling(1, T, T, None, kw.get("is_causal", False), kw.get("window"), 64,
                         torch.device("cpu"))
        return sum(1 for qs in range(0, T, 64) for _ in tiling.blocks(qs, min(qs + 64, T)))

    assert visited(1024) == 16 * 16
    assert visited(1024, is_causal=True) == 16 * 17 // 2
    # window 64 < block size: each query block needs at most 3 key blocks, so O(T) tiles
    assert visited(1024, window=64) <= 3 * 16 and visited(2048, window=64) <= 3 * 32


@pytest.mark.parametrize("requires_grad", [False, True])
def test_inputs_are_not_modified(requires_grad):
    q, k, v = qkv(Q=9, K=9, requires_grad=requires_grad)
    copies = [t.detach().clone() for t in (q, k, v)]
    versions = [t._version for t in (q, k, v)]
    lens = torch.tensor([3, 9])
    out = flash_attention(q, k, v, valid_lens=lens, is_causal=True, block_size=4)
    if requires_grad:
        out.sum().backward()
    for t, c, ver in zip((q, k, v), copies, versions):
        assert torch.equal(t.detach(), c) and t._version == ver
    assert lens.tolist() == [3, 9]


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,kwargs,match", [
    ((torch.ones(2, 3, 4, dtype=torch.int64), torch.ones(2, 3, 4), torch.ones(2, 3, 4)), {},
     "queries"),
    ((torch.ones(3, 4), torch.ones(3, 4), torch.ones(3, 4)), {}, "queries"),
    ((torch.ones(2, 3, 4), torch.ones(2, 3, 5), torch.ones(2, 3, 4)), {}, "feature size d"),
    ((torch.ones(2, 3, 4), torch.ones(2, 3, 4), torch.ones(2, 5, 4)), {}, "values"),
    ((torch.ones(2, 3, 4), torch.ones(1, 3, 4), torch.ones(1, 3, 4)), {}, "leading axes"),
    ((torch.ones(2, 3, 4), torch.ones(2, 3, 4, dtype=torch.float64), torch.ones(2, 3, 4)), {},
     "dtype"),
    ((torch.ones(2, 3, 4),) * 3, dict(valid_lens=torch.tensor([1.0, 2.0])), "integer dtype"),
    ((torch.ones(2, 3, 4),) * 3, dict(valid_lens=torch.tensor([1, 2, 3])), r"shape \(B,\)"),
    ((torch.ones(2, 3, 4),) * 3, dict(valid_lens=torch.tensor([1, 4])), r"\[0, 3\]"),
    ((torch.ones(2, 3, 4),) * 3, dict(valid_lens=torch.tensor([-1, 2])), r"\[0, 3\]"),
    ((torch.ones(2, 3, 4),) * 3, dict(window=-1), "window"),
    ((torch.ones(2, 3, 4),) * 3, dict(window=1.5), "window"),
    ((torch.ones(2, 3, 4),) * 3, dict(window=True), "window"),
    ((torch.ones(2, 3, 4),) * 3, dict(block_size=0), "block_size"),
    ((torch.ones(2, 3, 4),) * 3, dict(scale=-1.0), "scale"),
    ((torch.ones(2, 3, 4),) * 3, dict(scale=float("nan")), "scale"),
    ((torch.ones(2, 3, 4),) * 3, dict(is_causal=1), "is_causal"),
])
def test_bad_input_raises(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        flash_attention(*args, **kwargs)


def test_local_attention_needs_a_window():
    x = torch.ones(1, 3, 4)
    with pytest.raises(ValueError, match="window"):
        local_attention(x, x, x, None)
    with pytest.raises(ValueError, match="num_keys"):
        sliding_window_mask(3, 0, 1)


# --- grouped-query attention ----------------------------------------------------------------

@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gqa_matches_sdpa_enable_gqa(num_kv_heads, is_causal):
    torch.manual_seed(0)
    B, Q, K, num_hiddens, h = 2, 7, 9, 32, 4
    gqa = GroupedQueryAttention(num_hiddens, h, num_kv_heads, bias=True, block_size=4).double()
    X, Y = torch.randn(B, Q, num_hiddens).double(), torch.randn(B, K, num_hiddens).double()
    out = gqa(X, Y, Y, is_causal=is_causal)
    d_h = num_hiddens // h
    q = gqa.W_q(X).view(B, Q, h, d_h).transpose(1, 2)  # (B, h, Q, d_h)
    k = gqa.W_k(Y).view(B, K, num_kv_heads, d_h).transpose(1, 2)  # (B, g, K, d_h)
    v = gqa.W_v(Y).view(B, K, num_kv_heads, d_h).transpose(1, 2)  # (B, g, K, d_h)
    mask = causal_lower_right(Q, K) if is_causal else None
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    ref = gqa.W_o(heads.transpose(1, 2).reshape(B, Q, num_hiddens))
    torch.testing.assert_close(out, ref, **TOL[torch.float64])


def test_gqa_with_as_many_kv_heads_is_multi_head_attention():
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(16, 4, 4).double()
    mha = MultiHeadAttention(16, 4).double()
    mha.load_state_dict(gqa.state_dict(), strict=False)
    for name in ("W_q", "W_k", "W_v", "W_o"):
        assert torch.equal(getattr(mha, name).weight, getattr(gqa, name).weight)
    X = torch.randn(3, 6, 16).double()
    valid_lens = torch.tensor([2, 6, 4])
    torch.testing.assert_close(gqa(X, X, X, valid_lens), mha(X, X, X, valid_lens),
                               **TOL[torch.float64])


def test_gqa_parameters_and_kv_cache():
    mha_like = GroupedQueryAttention(64, 8, 8)
    gqa = GroupedQueryAttention(64, 8, 2)
    mqa = GroupedQueryAttention(64, 8, 1)
    assert gqa.W_k.weight.shape == (16, 64) and mqa.W_v.weight.shape == (8, 64)
    full = mha_like.kv_cache_bytes(batch_size=2, seq_len=100)
    assert full == 2 * 2 * 100 * 64 * 4
    assert gqa.kv_cache_bytes(2, 100) * 4 == full and mqa.kv_cache_bytes(2, 100) * 8 == full
    assert gqa.kv_cache_bytes(2, 100, dtype=torch.float16) * 2 == gqa.kv_cache_bytes(2, 100)


def test_gqa_trains():
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(8, 4, 2)
    X = torch.randn(2, 5, 8)
    gqa(X, X, X, is_causal=True).square().sum().backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in gqa.parameters())


@pytest.mark.parametrize("args,match", [
    ((16, 3, 1), "divisible by num_heads"),
    ((16, 4, 3), "divisible by num_kv_heads"),
    ((16, 4, 0), "num_kv_heads"),
    ((0, 4, 2), "num_hiddens"),
])
def test_gqa_bad_construction(args, match):
    with pytest.raises(ValueError, match=match):
        GroupedQueryAttention(*args)


def test_gqa_bad_forward():
    gqa = GroupedQueryAttention(16, 4, 2)
    with pytest.raises(ValueError, match="query_size"):
        gqa(torch.ones(2, 3, 8), torch.ones(2, 3, 16), torch.ones(2, 3, 16))
    with pytest.raises(ValueError, match="queries must have shape"):
        gqa(torch.ones(2, 1, 3, 16), torch.ones(2, 1, 3, 16), torch.ones(2, 1, 3, 16))
    with pytest.raises(ValueError, match="valid_lens"):
        gqa(torch.ones(2, 3, 16), torch.ones(2, 3, 16), torch.ones(2, 3, 16), torch.tensor([4, 1]))


# --- tile_schedule: the tiles flash_attention computes, checked against the element mask -------

@pytest.mark.parametrize("Q, K, block_size", [(16, 16, 4), (13, 29, 5), (30, 7, 8), (9, 9, 16)])
@pytest.mark.parametrize("is_causal, window", [(False, None), (True, None), (False, 3), (True, 6)])
def test_tile_schedule_matches_the_mask(Q, K, block_size, is_causal, window):
    from d2lattn import sliding_window_mask, tile_schedule

    grid = tile_schedule(Q, K, block_size=block_size, is_causal=is_causal, window=window)
    mask = sliding_window_mask(Q, K, window, is_causal=is_causal)  # (Q, K), True = may attend
    assert grid.shape == (-(-Q // block_size), -(-K // block_size))
    for qi in range(grid.shape[0]):
        for ki in range(grid.shape[1]):
            tile = mask[qi * block_size:(qi + 1) * block_size, ki * block_size:(ki + 1) * block_size]
            expected = 0 if not tile.any() else (2 if tile.all() else 1)
            assert grid[qi, ki] == expected, (qi, ki)


@pytest.mark.parametrize("kwargs", [dict(block_size=0), dict(window=-1), dict(is_causal=1)])
def test_tile_schedule_rejects_bad_options(kwargs):
    from d2lattn import tile_schedule

    with pytest.raises(ValueError):
        tile_schedule(8, 8, **kwargs)
