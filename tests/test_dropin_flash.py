"""d2lattn as a drop-in for PyTorch: flash_attention, local and grouped-query attention.

Every test uses PyTorch as the oracle (``F.scaled_dot_product_attention``, in float64 where
the dtype is not the point).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_upper_left

from d2lattn.multihead import GroupedQueryAttention
from d2lattn.flash import (
    _Tiling,
    flash_attention,
    local_attention,
    sliding_window_mask,
    tile_schedule,
)
from d2lattn.masking import causal_mask, valid_lens_to_mask
from d2lattn.positional import alibi_bias
from d2lattn.transformer import KVCache

from benchmarks.bench_dropin import saved_bytes  # one home: the benchmark measures it too

F64 = dict(rtol=1e-10, atol=1e-12)


def randn(*shape, seed=0, dtype=torch.float64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def qkv(B=2, h=3, Q=5, K=7, d=8, v=6, g=None, seed=0, requires_grad=False):
    g = h if g is None else g
    return (randn(B, h, Q, d, seed=seed, requires_grad=requires_grad),
            randn(B, g, K, d, seed=seed + 1, requires_grad=requires_grad),
            randn(B, g, K, v, seed=seed + 2, requires_grad=requires_grad))


def grads(out, inputs, seed=9):
    d_out = randn(*out.shape, seed=seed)
    return torch.autograd.grad(out, inputs, d_out)


# --- Wrong or silent today ----------------------------------------------------------------

@pytest.mark.parametrize("Q,K", [(0, 7), (5, 0), (0, 0)])
def test_zero_length_queries_or_keys_match_sdpa(Q, K):
    q, k, v = qkv(Q=Q, K=K, requires_grad=True)
    ref = F.scaled_dot_product_attention(q, k, v)  # empty for Q = 0, zeros for K = 0
    for out in (flash_attention(q, k, v), flash_attention(q, k, v, is_causal=True),
                local_attention(q, k, v, window=2),
                flash_attention(q, k, v, valid_lens=torch.zeros(2, dtype=torch.long))):
        assert out.shape == ref.shape == (2, 3, Q, 6)
        torch.testing.assert_close(out, torch.zeros_like(ref))
        assert all(torch.equal(gr, torch.zeros_like(gr)) for gr in grads(out, (q, k, v)))


@pytest.mark.parametrize("Q,K", [(0, 7), (5, 0)])
def test_zero_length_in_grouped_query_attention(Q, K):
    gqa = GroupedQueryAttention(16, num_heads=4, num_kv_heads=2).double()
    out = gqa(randn(2, Q, 16), randn(2, K, 16, seed=1), randn(2, K, 16, seed=2))
    assert out.shape == (2, Q, 16)
    torch.testing.assert_close(out, gqa.W_o(torch.zeros(2, Q, 16, dtype=torch.float64)))


def test_double_backward_raises_instead_of_dropping_the_second_order_term():
    q, k, v = qkv(requires_grad=True)
    out = flash_attention(q, k, v, is_causal=True, block_size=4)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)  # first order: fine
    ref_dq, = torch.autograd.grad(F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_mask(5, 7)).square().sum(), q)
    torch.testing.assert_close(dq, ref_dq, **F64)
    with pytest.raises(RuntimeError, match="differentiable once"):
        dq.square().sum().backward()  # a gradient penalty


def test_first_order_gradients_unchanged_by_create_graph():
    q, k, v = qkv(requires_grad=True)
    plain = grads(flash_attention(q, k, v, block_size=3), (q, k, v))
    d_out = randn(2, 3, 5, 6, seed=9)
    graph = torch.autograd.grad(flash_attention(q, k, v, block_size=3), (q, k, v), d_out,
                                create_graph=True)
    for a, b in zip(plain, graph):
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_accumulate_in_float32(dtype):
    """Error against a float64 reference: no worse than SDPA's in the same dtype."""
    T = 1024
    q64, k64, v64 = (randn(1, 2, T, 64, seed=s) for s in range(3))
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    q, k, v = (t.to(dtype).requires_grad_() for t in (q64, k64, v64))
    out = flash_attention(q, k, v, is_causal=True, block_size=128)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == dtype
    err = (out.double() - ref).abs().max().item()
    err_sdpa = (sdpa.double() - ref).abs().max().item()
    assert err <= 1.05 * err_sdpa, (err, err_sdpa)
    # the output is rounded once: at most half an ulp of the dtype away from float64's result
    assert err <= torch.finfo(dtype).eps * ref.abs().max().item()
    d_out = randn(1, 2, T, 64, seed=7)
    q64.requires_grad_(), k64.requires_grad_(), v64.requires_grad_()
    ref_g = torch.autograd.grad(F.scaled_dot_product_attention(q64, k64, v64, is_causal=True),
                                (q64, k64, v64), d_out)
    ours = torch.autograd.grad(out, (q, k, v), d_out.to(dtype))
    theirs = torch.autograd.grad(sdpa, (q, k, v), d_out.to(dtype))
    for a, b, r in zip(ours, theirs, ref_g):
        assert a.dtype == dtype
        assert (a.double() - r).abs().max() <= 1.05 * (b.double() - r).abs().max()


def test_valid_lens_tiles_are_skipped_per_row(monkeypatch):
    """A short sequence batched with a long one computes only its own tiles."""
    T, bs, h = 64, 8, 2
    lens = torch.tensor([8, 64, 16])  # unsorted on purpose: rows are sorted inside
    q, k, v = qkv(B=3, h=h, Q=T, K=T, requires_grad=True)
    counted = []
    blocks = _Tiling.blocks

    def counting(self, qs, qe):
        for item in blocks(self, qs, qe):
            counted.append(item[3])  # the rows that compute this tile
            yield item

    monkeypatch.setattr(_Tiling, "blocks", counting)
    out = flash_attention(q, k, v, valid_lens=lens, block_size=bs)
    forward_row_tiles = sum(counted)
    monkeypatch.undo()
    # tiles per row: (T / bs) query blocks times ceil(len / bs) key blocks, for each head
    expected = h * (T // bs) * sum(-(-int(n) // bs) for n in lens)
    assert forward_row_tiles == expected == 2 * 8 * (1 + 8 + 2)
    assert forward_row_tiles < 0.5 * h * 3 * (T // bs) ** 2  # the longest row's for all: 384
    schedule = tile_schedule(T, T, block_size=bs, valid_lens=lens)
    assert schedule.shape == (3, 8, 8) and h * int((schedule > 0).sum()) == expected
    mask = valid_lens_to_mask(lens, T, T)[:, None]  # (B, 1, 1, K)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, **F64)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b, **F64)


def test_per_query_valid_lens_with_causal_and_unsorted_rows():
    q, k, v = qkv(B=3, Q=9, K=9, requires_grad=True)
    lens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9], [9] * 9, [2] * 9])
    out = flash_attention(q, k, v, valid_lens=lens, is_causal=True, block_size=2)
    mask = valid_lens_to_mask(lens, 9, 9)[:, None] & causal_mask(9, 9)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, **F64)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize("g", [1, 2, 6])
@pytest.mark.parametrize("is_causal", [False, True])
def test_enable_gqa_matches_sdpa(g, is_causal):
    q, k, v = qkv(h=6, g=g, Q=7, K=9, requires_grad=True)
    lens = torch.tensor([9, 4])
    mask = valid_lens_to_mask(lens, 7, 9)[:, None] & (causal_mask(7, 9) if is_causal else True)
    out = flash_attention(q, k, v, valid_lens=lens, is_causal=is_causal, enable_gqa=True,
                          block_size=4)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, ref, **F64)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b, **F64)


def test_grouped_query_attention_saves_no_copies_of_keys_and_values():
    """Measured: bytes saved for backward by the attention, GQA against repeated heads."""
    B, h, g, T, d = 2, 8, 2, 64, 16
    q, k, v = qkv(B=B, h=h, g=g, Q=T, K=T, d=d, v=d, requires_grad=True)
    r = h // g
    grouped = saved_bytes(lambda: flash_attention(q, k, v, enable_gqa=True, is_causal=True))
    repeated = saved_bytes(lambda: flash_attention(q, k.repeat_interleave(r, 1),
                                                   v.repeat_interleave(r, 1), is_causal=True))
    item = 8  # float64
    head = B * T * d * item  # one head's keys (or values, queries, outputs)
    stats = 2 * B * h * T * item  # each query's maximum score and 1 / sum
    assert grouped == (h + 2 * g + h) * head + stats  # q, k, v (g heads), output, stats
    assert repeated == (h + 2 * h + h) * head + stats  # the copies of k and v are saved
    assert repeated - grouped == 2 * (h - g) * head  # = 98304 bytes here


def test_grouped_query_attention_kv_cache_decodes_like_the_full_sequence():
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(32, num_heads=8, num_kv_heads=2).double()
    X = randn(2, 7, 32)
    full = gqa(X, X, X, is_causal=True)
    cache = KVCache()
    steps = [gqa(X[:, :4], X[:, :4], X[:, :4], is_causal=True, kv_cache=cache)]
    for t in range(4, 7):
        x = X[:, t:t + 1]
        steps.append(gqa(x, x, x, kv_cache=cache))  # one query: is_causal not needed
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **F64)
    assert cache.keys.shape == (2, 2, 7, 4)  # g = 2 heads cached, not h = 8
    assert cache.nbytes == gqa.kv_cache_bytes(2, 7, torch.float64) == 2 * 2 * 7 * 2 * 4 * 8
    mha_cache_bytes = GroupedQueryAttention(32, 8, 8).kv_cache_bytes(2, 7, torch.float64)
    assert mha_cache_bytes == 4 * cache.nbytes


def test_grouped_query_attention_checks():
    gqa = GroupedQueryAttention(16, num_heads=4, num_kv_heads=2)
    X = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="is_causal=False"):
        gqa(X, X, X, kv_cache=KVCache())
    with pytest.raises(ValueError, match="dtype torch.float64"):
        gqa(X.double(), X.double(), X.double())
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        flash_attention(*qkv(h=3, g=2), enable_gqa=True)


# --- Missing arguments ----------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 7), (3, 5, 7), (2, 1, 5, 7), (2, 3, 1, 7)])
def test_float_attn_mask_matches_sdpa(shape):
    q, k, v = qkv(requires_grad=True)
    bias = randn(*shape, seed=4)
    bias[..., 0, 1:3] = -math.inf  # forbidden keys, as SDPA takes them
    out = flash_attention(q, k, v, attn_mask=bias, block_size=3)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out, ref, **F64)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fill", ["finfo.min", -1e9])
@pytest.mark.parametrize("block_size", [3, 256])
def test_finite_float_mask_on_every_key_gives_sdpa_uniform_weights(dtype, fill, block_size):
    """Hugging Face pads with finfo(dtype).min: a query whose keys all carry it gets SDPA's
    (nearly) uniform weights, not the zero row that only -inf or a False everywhere gives."""
    fill = torch.finfo(dtype).min if fill == "finfo.min" else fill
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in qkv())
    bias = torch.zeros(2, 1, 5, 7, dtype=dtype)
    bias[0, :, 1] = fill  # one query of the first sequence: every key
    bias[1, :, :, 4:] = fill  # the last three keys of the second sequence
    bias[1, :, 2] = fill  # and one query of it sees only such keys
    out = flash_attention(q, k, v, attn_mask=bias, block_size=block_size)
    with sdpa_kernel(SDPBackend.MATH):  # the formula itself (a fused kernel that keeps one
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # lse may not be)
    tol = F64 if dtype == torch.float64 else {}
    if dtype == torch.float64 and fill == -1e9:
        # in float64 the scores still differ, but a score near -1e9 carries a rounding of
        # ulp(1e9) ~ 1e-7 (ulp(1.44e9) in the kernel's base-2 units): so do the weights
        tol = dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, ref, **tol)
    if fill == torch.finfo(dtype).min:  # every score rounds to finfo.min: uniform weights
        torch.testing.assert_close(out[0, :, 1], v[0].mean(dim=-2), **tol)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b.to(dtype), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_only_minus_inf_or_false_everywhere_gives_the_zero_row(dtype):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in qkv())
    bias = torch.zeros(5, 7, dtype=dtype)
    bias[1] = -math.inf
    allowed = torch.ones(5, 7, dtype=torch.bool)
    allowed[1] = False
    for mask in (bias, allowed):
        out = flash_attention(q, k, v, attn_mask=mask, block_size=3)
        assert bool((out[:, :, 1] == 0).all())
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).nan_to_num(0.0)
        torch.testing.assert_close(out, ref)  # SDPA: NaN there; elsewhere the same
        assert all(bool(g.isfinite().all()) for g in grads(out, (q, k, v)))


def test_alibi_bias_in_flash_attention_matches_sdpa():
    q, k, v = qkv(h=6, Q=9, K=9)
    bias = alibi_bias(6, 9, 9).double()
    out = flash_attention(q, k, v, attn_mask=bias, is_causal=True, block_size=4)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(
        ~causal_mask(9, 9), -math.inf))
    torch.testing.assert_close(out, ref, **F64)


def test_bool_attn_mask_with_gqa_and_valid_lens():
    q, k, v = qkv(h=4, g=2, Q=6, K=6)
    mask = randn(2, 4, 6, 6, seed=5) > 0
    mask[..., 0] = True
    lens = torch.tensor([6, 3])
    out = flash_attention(q, k, v, attn_mask=mask, valid_lens=lens, enable_gqa=True,
                          block_size=4)
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask & valid_lens_to_mask(lens, 6, 6)[:, None], enable_gqa=True)
    torch.testing.assert_close(out, ref, **F64)


@pytest.mark.parametrize("Q,K", [(3, 8), (8, 3), (6, 6)])
def test_upper_left_causal_alignment_through_attn_mask(Q, K):
    q, k, v = qkv(Q=Q, K=K)
    mask = causal_mask(Q, K, alignment="upper_left")
    assert torch.equal(mask, causal_upper_left(Q, K)._materialize())
    out = flash_attention(q, k, v, attn_mask=mask, block_size=2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SDPA: upper left
    keep = mask.any(-1, keepdim=True)  # SDPA gives NaN where a query sees no key; we give 0
    torch.testing.assert_close(out, torch.where(keep, ref, 0.0), **F64)


@pytest.mark.parametrize("window", [(2, 0), (0, 2), (3, 1), (None, 1), (1, -1), (0, 0)])
@pytest.mark.parametrize("Q,K", [(9, 9), (4, 11)])
def test_window_left_right_matches_sdpa(window, Q, K):
    q, k, v = qkv(Q=Q, K=K, requires_grad=True)
    left, right = (math.inf if w in (None, -1) else w for w in window)
    rel = torch.arange(K)[None, :] - (torch.arange(Q)[:, None] + K - Q)  # j - i'
    mask = (rel >= -left) & (rel <= right)
    assert torch.equal(sliding_window_mask(Q, K, window), mask)
    out = local_attention(q, k, v, window=window, block_size=2)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref = torch.where(mask.any(-1, keepdim=True), ref, 0.0)
    torch.testing.assert_close(out, ref, **F64)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b, **F64)
    grid = tile_schedule(Q, K, block_size=2, window=window)
    assert grid.shape == (-(-Q // 2), -(-K // 2))


@pytest.mark.parametrize("enable_gqa", [False, True])
def test_dropout_reproduces_sdpa_math_backend_from_the_same_seed(enable_gqa):
    q, k, v = qkv(h=4, g=2 if enable_gqa else 4, Q=6, K=9, requires_grad=True)
    lens = torch.tensor([9, 5])
    mask = valid_lens_to_mask(lens, 6, 9)[:, None] & causal_mask(6, 9)
    torch.manual_seed(3)
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3,
                                             enable_gqa=enable_gqa)
    torch.manual_seed(3)
    out = flash_attention(q, k, v, valid_lens=lens, is_causal=True, dropout_p=0.3,
                          enable_gqa=enable_gqa, block_size=4)
    torch.testing.assert_close(out, ref, **F64)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b, **F64)
    torch.manual_seed(4)
    assert not torch.allclose(flash_attention(q, k, v, dropout_p=0.3, enable_gqa=enable_gqa),
                              out)


def test_flash_attention_bad_new_arguments():
    q, k, v = qkv()
    for kwargs, match in [
        (dict(attn_mask=torch.ones(5, 7, dtype=torch.long)), "attn_mask must be a bool"),
        (dict(attn_mask=torch.ones(4, 5, 7)), "does not broadcast"),
        (dict(attn_mask=torch.zeros(5, 7, requires_grad=True)), "no gradient to attn_mask"),
        (dict(window=(1, -2)), "window"),
        (dict(window=(1, 2, 3)), "window"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(enable_gqa=1), "enable_gqa"),
        (dict(scale=-1.0), "scale"),
    ]:
        with pytest.raises(ValueError, match=match):
            flash_attention(q, k, v, **kwargs)


# --- Property: every option together, against SDPA with the equivalent mask ---------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(deadline=None, max_examples=25)
@given(Q=st.integers(0, 9), K=st.integers(0, 9), g=st.sampled_from([1, 2, 4]),
       block_size=st.integers(1, 5), is_causal=st.booleans(),
       left=st.sampled_from([None, 0, 2]), right=st.sampled_from([None, 0, 3]),
       use_lens=st.sampled_from([None, "per sequence", "per query"]), use_bias=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_flash_attention_options_together_match_sdpa(Q, K, g, block_size, is_causal, left,
                                                      right, use_lens, use_bias, seed):
    q, k, v = qkv(B=2, h=4, g=g, Q=Q, K=K, seed=seed, requires_grad=True)
    gen = torch.Generator().manual_seed(seed)
    keep = torch.ones(2, 1, Q, K, dtype=torch.bool)
    lens = None
    if use_lens:
        lens = torch.randint(0, K + 1, (2,) if use_lens == "per sequence" else (2, Q),
                             generator=gen)
        keep = keep & valid_lens_to_mask(lens, Q, K)[:, None]
    if is_causal:
        keep = keep & causal_mask(Q, K)
    window = None if left is None and right is None else (left, right)
    if window is not None:
        keep = keep & sliding_window_mask(Q, K, window) if Q and K else keep
    bias = randn(4, Q, K, seed=seed + 5) if use_bias else None
    out = flash_attention(q, k, v, valid_lens=lens, attn_mask=bias, is_causal=is_causal,
                          window=window, enable_gqa=True, block_size=block_size)
    full = torch.zeros(2, 4, Q, K, dtype=torch.float64) if bias is None else bias.expand(2, 4, Q, K)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=full.masked_fill(~keep, -math.inf),
                                         enable_gqa=True)
    ref = torch.where(keep.any(-1, keepdim=True), ref, 0.0)  # no key: 0 (SDPA: NaN or 0)
    torch.testing.assert_close(out, ref, **F64)
    if Q and K:
        for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
            torch.testing.assert_close(a, b, **F64)


def _held_for_backward(out):
    """The bytes the backward pass of ``out`` holds: the saved tensors plus the dropout mask
    the kernel's tiling keeps."""
    fn = out.grad_fn
    while not hasattr(fn, "tiling"):
        fn = fn.next_functions[0][0]
    keep = fn.tiling.keep
    saved = sum(t.numel() * t.element_size() for t in fn.saved_tensors)
    return saved, (0 if keep is None else keep.numel() * keep.element_size())


def test_dropout_costs_the_memory_saving_as_chapter_9_says():
    """Chapter 9 and flash_attention's docstring: without dropout the backward pass holds
    O(Q d) per head and no (Q, K) tensor; with dropout it holds the keep mask of all
    (..., Q, K) weights, one byte each, drawn as SDPA's math backend draws it."""
    B, h, T, d = 1, 2, 256, 8
    q, k, v = (randn(B, h, T, d, seed=s, dtype=torch.float32, requires_grad=True)
               for s in range(3))
    saved, mask = _held_for_backward(flash_attention(q, k, v, block_size=32))
    assert mask == 0
    assert saved < B * h * T * T  # q, k, v, out and two numbers per query: far below Q x K
    _, mask = _held_for_backward(flash_attention(q, k, v, block_size=32, dropout_p=0.1))
    assert mask == B * h * T * T  # the whole (B, h, Q, K) mask, one byte per weight
