"""d2lattn.serving: cache byte counts, multi-head latent attention (absorbed = explicit), the
paged cache (= a contiguous cache), the streaming cache policies and the rotary scalings."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lattn import GPT, GPTConfig, KVCache, causal_mask, rotary_embedding
from d2lattn.serving import (MultiHeadLatentAttention, PagedKVCache, contiguous_waste,
                             gpt_logits, kv_cache_bytes, mla_cache_bytes, paged_waste,
                             rope_attention_scale, rope_frequencies, rotate_pairs)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- bytes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("L,g,d_h,T,B,b", [(4, 4, 32, 128, 1, 4), (32, 8, 128, 4096, 3, 2),
                                           (1, 1, 1, 1, 1, 1)])
def test_kv_cache_bytes_formula_and_a_real_cache(L, g, d_h, T, B, b):
    assert kv_cache_bytes(num_layers=L, num_kv_heads=g, head_size=d_h, seq_len=T,
                          batch_size=B, bytes_per_value=b) == 2 * B * L * g * d_h * T * b
    assert kv_cache_bytes(num_layers=L, num_kv_heads=g, head_size=d_h, seq_len=T, batch_size=B,
                          bytes_per_value=b, window=5) == 2 * B * L * g * d_h * min(T, 5) * b
    if T <= 128:  # against what a KVCache of float32 tensors holds
        caches = [KVCache() for _ in range(L)]
        for c in caches:
            c.update(torch.zeros(B, g, T, d_h), torch.zeros(B, g, T, d_h))
        assert sum(c.nbytes for c in caches) == kv_cache_bytes(
            num_layers=L, num_kv_heads=g, head_size=d_h, seq_len=T, batch_size=B,
            bytes_per_value=4)


def test_mla_cache_bytes_formula_and_deepseek_v2():
    assert mla_cache_bytes(num_layers=3, latent_size=10, rope_head_size=4, seq_len=7,
                           batch_size=2, bytes_per_value=2) == 2 * 3 * 14 * 7 * 2
    # DeepSeek-V2: d_c = 4 d_h = 512, d_R = d_h / 2 = 64: 4.5 d_h per token and layer (table 1)
    assert mla_cache_bytes(num_layers=1, latent_size=512, rope_head_size=64, seq_len=1,
                           bytes_per_value=1) == 4.5 * 128


def test_mla_layer_caches_what_the_formula_counts():
    mla = MultiHeadLatentAttention(16, 4, 6, rope_head_size=2)
    cache = KVCache()
    mla(randn(2, 5, 16, dtype=torch.float32), cache=cache)
    assert cache.nbytes == mla_cache_bytes(num_layers=1, latent_size=6, rope_head_size=2,
                                           seq_len=5, batch_size=2, bytes_per_value=4)


@pytest.mark.parametrize("bad", [dict(num_layers=0), dict(head_size=1.5), dict(window=0),
                                 dict(seq_len=True)])
def test_byte_counts_reject_bad_sizes(bad):
    args = dict(num_layers=2, num_kv_heads=2, head_size=4, seq_len=3) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        kv_cache_bytes(**args)


# --- multi-head latent attention ----------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 4), d_h=st.integers(1, 6), d_c=st.integers(1, 9),
       d_r=st.sampled_from([2, 4]), T=st.integers(1, 7), B=st.integers(1, 2),
       seed=st.integers(0, 2**16))
def test_mla_absorbed_equals_explicit_float64(h, d_h, d_c, d_r, T, B, seed):
    torch.manual_seed(seed)
    d = 8
    mla = MultiHeadLatentAttention(d, h, d_c, head_size=d_h, rope_head_size=d_r).double()
    X = randn(B, T, d, seed=seed)
    for is_causal in (True, False):
        explicit = mla(X, is_causal=is_causal)
        absorbed = mla(X, is_causal=is_causal, absorbed=True)
        torch.testing.assert_close(absorbed, explicit, rtol=1e-10, atol=1e-12)


def test_mla_explicit_is_attention_with_up_projected_keys_and_values():
    """The explicit form against SDPA over concatenated [content; rotary] queries and keys."""
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(12, 3, 5, head_size=4, rope_head_size=2).double()
    X = randn(2, 6, 12)
    pos = torch.arange(6)
    c = mla.W_dkv(X)
    q = torch.cat([mla.W_q(X).view(2, 6, 3, 4).transpose(1, 2),
                   rotary_embedding(mla.W_qr(X).view(2, 6, 3, 2).transpose(1, 2), pos)], -1)
    k_r = rotary_embedding(mla.W_kr(X), pos)[:, None].expand(2, 3, 6, 2)
    k = torch.cat([mla.W_uk(c).view(2, 6, 3, 4).transpose(1, 2), k_r], -1)
    v = mla.W_uv(c).view(2, 6, 3, 4).transpose(1, 2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(mla(X), mla.W_o(ref.transpose(1, 2).reshape(2, 6, 12)))


@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_decoding_with_the_latent_cache_equals_recomputation(absorbed):
    torch.manual_seed(1)
    mla = MultiHeadLatentAttention(8, 2, 3, rope_head_size=4).double()
    X = randn(1, 7, 8)
    cache = KVCache()
    steps = [mla(X[:, :3], cache=cache, absorbed=absorbed)]
    steps += [mla(X[:, t:t + 1], cache=cache, absorbed=absorbed) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), mla(X))
    assert cache.keys.shape == (1, 1, 7, 3) and cache.values.shape == (1, 1, 7, 4)


def test_mla_rejects_bad_sizes_and_inputs():
    with pytest.raises(ValueError, match="rope_head_size must be even"):
        MultiHeadLatentAttention(8, 2, 3, rope_head_size=3)
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadLatentAttention(9, 2, 3)
    with pytest.raises(ValueError, match="latent_size"):
        MultiHeadLatentAttention(8, 2, 0)
    with pytest.raises(ValueError, match="num_hiddens = 8"):
        MultiHeadLatentAttention(8, 2, 3)(torch.zeros(1, 2, 7))


# --- paged cache ---------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=4),
       block_size=st.integers(1, 8), chunk=st.integers(1, 5), Q=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_paged_attention_equals_contiguous(lengths, block_size, chunk, Q, seed):
    h, d_h = 2, 3
    need = sum(-(-n // block_size) for n in lengths)
    cache = PagedKVCache(need + 1, block_size, h, d_h, dtype=torch.float64)
    full = {i: (randn(h, n, d_h, seed=seed + i), randn(h, n, d_h, seed=seed + 99 + i))
            for i, n in enumerate(lengths)}
    # interleave the sequences chunk by chunk, as a server does
    for start in range(0, max(lengths), chunk):
        for i, (k, v) in full.items():
            if start < k.shape[1]:
                cache.append(i, k[:, start:start + chunk], v[:, start:start + chunk])
    assert cache.num_free_blocks == 1
    assert cache.wasted_slots() == paged_waste(lengths, block_size)
    for i, (k, v) in full.items():
        gk, gv = cache.gather(i)
        assert torch.equal(gk, k) and torch.equal(gv, v)
        q = randn(h, min(Q, k.shape[1]), d_h, seed=seed + 7)
        for is_causal in (True, False):
            mask = None
            if is_causal:
                n, nq = k.shape[1], q.shape[1]
                mask = torch.ones(nq, n, dtype=torch.bool).tril(n - nq)
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            torch.testing.assert_close(cache.attend(i, q, is_causal=is_causal), ref)


def test_paged_cache_frees_and_reuses_blocks():
    cache = PagedKVCache(3, 4, 1, 2)
    cache.append("a", torch.ones(1, 5, 2), torch.ones(1, 5, 2))
    cache.append("b", torch.ones(1, 3, 2), torch.ones(1, 3, 2))
    assert cache.block_tables == {"a": [0, 1], "b": [2]} and cache.num_free_blocks == 0
    with pytest.raises(RuntimeError, match="out of blocks"):
        cache.append("b", torch.ones(1, 2, 2), torch.ones(1, 2, 2))
    with pytest.raises(RuntimeError, match="out of blocks"):
        cache.append("new", torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    assert cache.lengths == {"a": 5, "b": 3}  # a failed append changes nothing
    assert "new" not in cache.block_tables
    cache.free("a")
    cache.append("c", torch.ones(1, 6, 2), torch.ones(1, 6, 2))
    assert cache.block_tables["c"] == [0, 1] and cache.num_free_blocks == 0


def test_paged_cache_rejects_bad_input():
    cache = PagedKVCache(2, 4, 2, 3)
    with pytest.raises(ValueError, match="keys must have shape"):
        cache.append(0, torch.ones(3, 1, 3), torch.ones(3, 1, 3))
    with pytest.raises(ValueError, match="dtype"):
        cache.append(0, torch.ones(2, 1, 3, dtype=torch.float64), torch.ones(2, 1, 3))
    with pytest.raises(ValueError, match="unknown sequence"):
        cache.free(5)
    cache.append(0, torch.ones(2, 2, 3), torch.ones(2, 2, 3))
    with pytest.raises(ValueError, match="queries"):
        cache.attend(0, torch.ones(2, 3, 3))  # 3 causal queries, 2 tokens
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(0, 4, 2, 3)


def test_waste_counts():
    assert contiguous_waste([3, 10, 7], 16) == 13 + 6 + 9
    assert paged_waste([3, 10, 7, 8], 4) == 1 + 2 + 1 + 0
    assert paged_waste([3, 10], 1) == 0
    with pytest.raises(ValueError, match="max_len"):
        contiguous_waste([3, 17], 16)
    with pytest.raises(ValueError, match="lengths"):
        paged_waste([], 4)
    with pytest.raises(ValueError, match="lengths"):
        paged_waste([2, -1], 4)


# --- rotary scalings and the GPT with cache policies --------------------------------------------

def test_rope_frequencies_and_rotation():
    X = randn(2, 3, 5, 8)
    pos = torch.arange(5)
    assert torch.equal(rotate_pairs(X, pos, rope_frequencies(8)), rotary_embedding(X))
    # interpolation: position m * s rotated with omega / s is position m rotated with omega
    torch.testing.assert_close(
        rotate_pairs(X, pos * 4, rope_frequencies(8, method="interpolation", factor=4)),
        rotary_embedding(X))
    omega = rope_frequencies(32)
    ntk = rope_frequencies(32, method="ntk", factor=4)
    assert ntk[0] == omega[0] and math.isclose(ntk[-1] / omega[-1], 1 / 4)
    yarn = rope_frequencies(32, method="yarn", factor=4, original_context=4096)
    turns = 4096 * omega / (2 * math.pi)
    assert torch.equal(yarn[turns > 32], omega[turns > 32])
    torch.testing.assert_close(yarn[turns < 1], omega[turns < 1] / 4)
    assert torch.equal(rope_frequencies(32, method="yarn", factor=1, original_context=64), omega)
    assert rope_attention_scale("yarn", 1) == 1.0


@pytest.mark.parametrize("bad,match", [(dict(method="linear"), "method"),
                                       (dict(factor=0.5), "factor"),
                                       (dict(method="yarn", factor=2), "original_context")])
def test_rope_frequencies_reject_bad_scalings(bad, match):
    with pytest.raises(ValueError, match=match):
        rope_frequencies(8, **bad)
    with pytest.raises(ValueError, match="head_size must be even"):
        rope_frequencies(7)


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                         num_layers=2, ffn_num_hiddens=32)).double().eval()


def test_gpt_logits_equal_the_model_and_run_past_block_size(gpt):
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(gpt_logits(gpt, tokens), gpt(tokens))
    long = torch.randint(0, 11, (1, 20), generator=torch.Generator().manual_seed(1))
    assert gpt_logits(gpt, long, window=4, num_sinks=2).shape == (1, 20, 11)


def _decode_with_evicting_cache(model, tokens, window, num_sinks):
    """Token by token with a real evicting cache that stores unrotated keys and re-rotates
    them by their cache slot at every step (StreamingLLM's recipe)."""
    h = model.config.num_heads
    d_h = model.config.num_hiddens // h
    omega = rope_frequencies(d_h)
    caches = [([], []) for _ in model.blocks]
    out = []
    for t in range(tokens.shape[1]):
        X = model.embedding(tokens[:, t:t + 1])  # (1, 1, d)
        for (ks, vs), block in zip(caches, model.blocks):
            mha = block.self_attention
            Z = block.norm1(X)
            q, k, v = (mha.W_q(Z).view(1, 1, h, d_h).transpose(1, 2),
                       mha.W_k(Z).view(1, 1, h, d_h).transpose(1, 2),
                       mha.W_v(Z).view(1, 1, h, d_h).transpose(1, 2))
            ks.append(k), vs.append(v)
            if window is not None and len(ks) > num_sinks + window:
                del ks[num_sinks], vs[num_sinks]  # evict the oldest non-sink token
            K, V = torch.cat(ks, 2), torch.cat(vs, 2)
            slots = torch.arange(K.shape[2])
            qr = rotate_pairs(q, slots[-1:], omega)
            a = F.scaled_dot_product_attention(qr, rotate_pairs(K, slots, omega), V)
            X = X + mha.W_o(a.transpose(1, 2).reshape(1, 1, -1))
            X = X + block.ffn(block.norm2(X))
        out.append(model.head(model.norm(X)))
    return torch.cat(out, 1)


@pytest.mark.parametrize("window,num_sinks", [(None, 0), (5, 0), (4, 2), (3, 1)])
def test_gpt_logits_equal_decoding_with_an_evicting_cache(gpt, window, num_sinks):
    tokens = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(gpt_logits(gpt, tokens, window=window, num_sinks=num_sinks),
                                   _decode_with_evicting_cache(gpt, tokens, window, num_sinks))


def test_gpt_logits_rejects_bad_input(gpt):
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="num_sinks"):
        gpt_logits(gpt, tokens, num_sinks=2)
    with pytest.raises(ValueError, match="window"):
        gpt_logits(gpt, tokens, window=0)
    with pytest.raises(ValueError, match="tokens"):
        gpt_logits(gpt, tokens + 20)
    learned = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                            num_layers=1, ffn_num_hiddens=32, positions="learned"))
    with pytest.raises(ValueError, match="rotary"):
        gpt_logits(learned, tokens)


# --- numbers a server would trust, any device (issue 40) ------------------------------------------

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _paged(n, dtype, seed=0, h=2, d_h=16, block_size=16, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(h, n, d_h, generator=g) * 3, torch.randn(h, n, d_h, generator=g)
    cache = PagedKVCache(-(-n // block_size) + 1, block_size, h, d_h, dtype=dtype,
                         device=device)
    cache.append("s", k.to(device, dtype), v.to(device, dtype))
    return cache, k.double(), v.double()


def test_paged_attend_in_float16_accumulates_in_float32():
    """2,000 keys in float16: against a float64 reference over the same (rounded) keys, the
    error is the rounding of the float16 output, not that of float16 sums."""
    cache, k, v = _paged(2000, torch.float16)
    q = (torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1)) * 3).half()
    out = cache.attend("s", q, is_causal=False)
    assert out.dtype == torch.float16
    kh, vh = cache.gather("s")
    ref = F.scaled_dot_product_attention(q.double(), kh.double(), vh.double())
    err = (out.double() - ref).abs().max().item()
    rounding = (ref.half().double() - ref).abs().max().item()  # the float16 output's own
    # float32 sums leave only the output's rounding (5e-4 here); float16 sums gave 8e-3
    assert err <= 1.5 * rounding, (err, rounding)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_paged_attend_over_no_tokens_gives_zeros_like_sdpa(dtype):
    cache = PagedKVCache(2, 4, 2, 3, dtype=dtype)
    cache.append("empty", torch.ones(2, 0, 3, dtype=dtype), torch.ones(2, 0, 3, dtype=dtype))
    q = torch.ones(2, 2, 3, dtype=dtype)
    out = cache.attend("empty", q, is_causal=False)
    ref = F.scaled_dot_product_attention(q.float(), torch.ones(2, 0, 3), torch.ones(2, 0, 3))
    assert out.dtype == dtype and torch.equal(out.float(), ref) and not out.isnan().any()
    assert cache.attend("empty", q[:, :0]).shape == (2, 0, 3)  # causal: no query either


@pytest.mark.parametrize("r", [2, 3])
@pytest.mark.parametrize("is_causal", [False, True])
def test_paged_attend_with_grouped_query_heads(r, is_causal):
    """H = r g query heads over g cached heads: SDPA with enable_gqa over the gathered keys."""
    cache, _, _ = _paged(37, torch.float64, h=2, d_h=4, block_size=8)
    q = randn(2 * r, 5, 4, seed=3)
    k, v = cache.gather("s")
    mask = causal_mask(5, 37) if is_causal else None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(cache.attend("s", q, is_causal=is_causal), ref)
    with pytest.raises(ValueError, match="multiple of"):
        cache.attend("s", randn(3, 5, 4))


def test_gpt_logits_refuses_a_bidirectional_gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=1, ffn_num_hiddens=32, causal=False)).eval()
    with pytest.raises(ValueError, match="causal=False"):
        gpt_logits(model, torch.zeros(1, 4, dtype=torch.long))


def test_gpt_logits_refuses_a_gpt_with_other_attention():
    """gpt_logits runs softmax attention under a cache policy: a GPT with latent attention
    (rotary, so it passes the positions check) is refused, not run as softmax attention."""
    model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=2, ffn_num_hiddens=32, attention="mla"))
    with pytest.raises(ValueError, match=r"layers are \('mla', 'mla'\)"):
        gpt_logits(model, torch.zeros(1, 4, dtype=torch.long))


def test_gpt_logits_restores_the_mode_and_runs_the_eval_model():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=2, ffn_num_hiddens=32, dropout=0.3)).double()
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.eval()(tokens)
    model.train()
    torch.testing.assert_close(gpt_logits(model, tokens), ref)
    assert model.training and all(m.training for m in model.modules())


def test_gpt_logits_follows_the_blocks_own_forward(monkeypatch):
    """gpt_logits runs each block's forward (its norms, residuals and feed-forward), only the
    attention call is the policy's: a change to the block's forward shows in its logits."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=2, ffn_num_hiddens=32)).double().eval()
    tokens = torch.randint(0, 11, (1, 6), generator=torch.Generator().manual_seed(0))
    before = gpt_logits(model, tokens)
    original = type(model.blocks[0]).forward
    monkeypatch.setattr(type(model.blocks[0]), "forward",
                        lambda self, X, *a, **kw: original(self, X, *a, **kw) * 2)
    with torch.no_grad():
        torch.testing.assert_close(gpt_logits(model, tokens), model(tokens))
    assert not torch.allclose(gpt_logits(model, tokens), before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mla_and_gpt_logits_run_in_half_precision_on_the_cpu(dtype):
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(16, 4, latent_size=6, rope_head_size=2)
    X = torch.randn(2, 5, 16)
    ref = mla(X)
    out = mla.to(dtype)(X.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=1, ffn_num_hiddens=32)).eval()
    tokens = torch.randint(0, 11, (1, 6), generator=torch.Generator().manual_seed(0))
    ref = gpt_logits(model, tokens, window=3, num_sinks=1)
    out = gpt_logits(model.to(dtype), tokens, window=3, num_sinks=1)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)


@cuda
def test_serving_runs_on_cuda():
    """Everything is built on the input's device: the GPT under a cache policy, MLA, and the
    paged cache (run where a GPU is present; skipped otherwise)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=2, ffn_num_hiddens=32)).double().eval()
    tokens = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(0))
    ref = gpt_logits(model, tokens, window=4, num_sinks=2, method="yarn", factor=2)
    out = gpt_logits(model.cuda(), tokens.cuda(), window=4, num_sinks=2, method="yarn",
                     factor=2)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), ref)
    mla = MultiHeadLatentAttention(16, 4, latent_size=6, rope_head_size=2).double()
    X = randn(2, 5, 16)
    torch.testing.assert_close(mla.cuda()(X.cuda(), absorbed=True).cpu(),
                               mla.cpu()(X), rtol=1e-9, atol=1e-9)
    cache, _, _ = _paged(40, torch.float16, device="cuda")
    q = torch.randn(4, 3, 16, device="cuda").half()
    k, v = cache.gather("s")
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                         attn_mask=causal_mask(3, 40, device="cuda"),
                                         enable_gqa=True)
    torch.testing.assert_close(cache.attend("s", q).float(), ref, atol=2e-3, rtol=2e-3)


def test_everything_is_built_on_the_inputs_device_meta():
    """On PyTorch's "meta" device (shapes without data) any tensor built on the CPU inside a
    function meets the input on another device and fails: a CPU-only check of the device
    handling that CUDA tests repeat where a GPU is present."""
    from d2lattn import LinearMultiHeadAttention
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                          num_layers=2, ffn_num_hiddens=32)).eval().to("meta")
    tokens = torch.randint(0, 11, (2, 12))  # checked on the CPU, then moved to the model
    for kw in (dict(), dict(window=4, num_sinks=2, method="yarn", factor=2)):
        out = gpt_logits(model, tokens, **kw)
        assert out.device.type == "meta" and out.shape == (2, 12, 11)
    mla = MultiHeadLatentAttention(16, 4, latent_size=6, rope_head_size=2).to("meta")
    X = torch.empty(2, 5, 16, device="meta")
    assert mla(X, absorbed=True).device.type == "meta"
    for rule in ("additive", "delta", "gated_delta"):
        layer = LinearMultiHeadAttention(16, 4, rule=rule).to("meta")
        assert layer(X, X, X, is_causal=True).device.type == "meta"
    cache = PagedKVCache(4, 4, 2, 3, device="meta")
    cache.append("s", torch.empty(2, 6, 3, device="meta"), torch.empty(2, 6, 3, device="meta"))
    assert cache.gather("s")[0].device.type == "meta"
    assert cache.attend("s", torch.empty(4, 2, 3, device="meta")).shape == (4, 2, 3)
