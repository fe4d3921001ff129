"""d2lattn.linear: the three forms of causal linear attention agree (values and gradients, in
float64, on random shapes and chunk sizes that do and do not divide T), the state does not grow
with T, the delta rule follows its matrix formula, and bad input raises a clear ValueError."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lattn import (GPT, GPTConfig, KVCache, LinearMultiHeadAttention, MultiHeadAttention,
                     MultiHeadLatentAttention, RecurrentState, TransformerEncoderBlock,
                     delta_rule_chunked, delta_rule_recurrent, delta_rule_step,
                     elu_feature_map, linear_attention_chunked, linear_attention_quadratic,
                     linear_attention_recurrent, linear_attention_step)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def grads(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    (out * randn(*out.shape, seed=99)).sum().backward()
    return out.detach(), [t.grad for t in inputs]


shapes = st.tuples(st.integers(1, 3), st.integers(1, 13), st.integers(1, 5),
                   st.integers(1, 4), st.integers(1, 14), st.integers(0, 10_000))


@settings(max_examples=25, deadline=None)
@given(shapes, st.booleans())
def test_three_forms_agree_values_and_gradients(shape, normalize):
    B, T, d_k, d_v, chunk, seed = shape
    q = elu_feature_map(randn(B, T, d_k, seed=seed))
    k = elu_feature_map(randn(B, T, d_k, seed=seed + 1))
    v = randn(B, T, d_v, seed=seed + 2)
    forms = [lambda q, k, v: linear_attention_quadratic(q, k, v, normalize=normalize),
             lambda q, k, v: linear_attention_recurrent(q, k, v, normalize=normalize),
             lambda q, k, v: linear_attention_chunked(q, k, v, chunk, normalize=normalize)]
    ref, ref_grads = grads(forms[0], q, k, v)
    for form in forms[1:]:
        out, g = grads(form, q, k, v)
        torch.testing.assert_close(out, ref)
        for a, b in zip(g, ref_grads):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 12, 20])  # 12 = T, 20 > T, 5 does not divide
def test_chunk_sizes_divide_or_not(chunk):
    q, k = elu_feature_map(randn(2, 3, 12, 4)), elu_feature_map(randn(2, 3, 12, 4, seed=1))
    v = randn(2, 3, 12, 5, seed=2)
    torch.testing.assert_close(linear_attention_chunked(q, k, v, chunk),
                               linear_attention_quadratic(q, k, v))


def test_quadratic_is_softmax_attention_with_another_kernel():
    """With phi = exp (one feature per dimension is not exact, so use the scores directly):
    the quadratic form with exp(q k^T) weights is causal softmax attention."""
    q, k, v = randn(1, 6, 3), randn(1, 6, 3, seed=1), randn(1, 6, 2, seed=2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
    A = (q @ k.transpose(-2, -1)).exp().tril()  # (1, 6, 6)
    torch.testing.assert_close(A @ v / A.sum(-1, keepdim=True), ref)


def test_recurrent_state_can_be_carried_across_calls():
    q, k = elu_feature_map(randn(2, 9, 4)), elu_feature_map(randn(2, 9, 4, seed=1))
    v = randn(2, 9, 3, seed=2)
    whole = linear_attention_recurrent(q, k, v)
    first, state = linear_attention_chunked(q[:, :4], k[:, :4], v[:, :4], 3, return_state=True)
    second = linear_attention_recurrent(q[:, 4:], k[:, 4:], v[:, 4:], initial_state=state)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)


@pytest.mark.parametrize("T", [1, 10, 100])
def test_state_size_does_not_depend_on_length(T):
    q = k = elu_feature_map(randn(2, T, 4))
    v = randn(2, T, 3, seed=1)
    _, (S, z) = linear_attention_recurrent(q, k, v, return_state=True)
    _, S_delta = delta_rule_recurrent(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v,
                                      torch.ones(2, T, dtype=torch.float64), return_state=True)
    assert S.shape == S_delta.shape == (2, 4, 3) and z.shape == (2, 4)


def delta_reference(q, k, v, beta, alpha=None):
    """The papers' matrix formula, one sequence: S_t = a_t S_{t-1} (I - b_t k_t k_t^T)
    + b_t v_t k_t^T, S of shape (d_v, d_k), o_t = S_t q_t."""
    T, d_k = k.shape
    S = torch.zeros(v.shape[1], d_k, dtype=k.dtype)
    out = []
    for t in range(T):
        a = 1.0 if alpha is None else alpha[t]
        kt = k[t][:, None]  # (d_k, 1)
        S = a * S @ (torch.eye(d_k, dtype=k.dtype) - beta[t] * kt @ kt.T) \
            + beta[t] * v[t][:, None] @ kt.T
        out.append(S @ q[t])
    return torch.stack(out)


@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_recurrent_matches_the_matrix_formula(gated):
    T, d_k, d_v = 9, 4, 3
    q, k = randn(T, d_k), F.normalize(randn(T, d_k, seed=1), dim=-1)
    v, beta = randn(T, d_v, seed=2), torch.rand(T, dtype=torch.float64) * 2
    alpha = torch.rand(T, dtype=torch.float64) * 0.5 + 0.5 if gated else None
    torch.testing.assert_close(delta_rule_recurrent(q, k, v, beta, alpha=alpha),
                               delta_reference(q, k, v, beta, alpha))


@settings(max_examples=25, deadline=None)
@given(shapes, st.booleans())
def test_delta_rule_chunked_equals_recurrent(shape, gated):
    B, T, d_k, d_v, chunk, seed = shape
    q = randn(B, T, d_k, seed=seed)
    k = F.normalize(randn(B, T, d_k, seed=seed + 1), dim=-1)
    v = randn(B, T, d_v, seed=seed + 2)
    g = torch.Generator().manual_seed(seed)
    beta = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    alpha = torch.rand(B, T, generator=g, dtype=torch.float64) * 0.9 + 0.1 if gated else None
    ref, ref_grads = grads(lambda q, k, v: delta_rule_recurrent(q, k, v, beta, alpha=alpha),
                           q, k, v)
    out, g_ = grads(lambda q, k, v: delta_rule_chunked(q, k, v, beta, chunk, alpha=alpha),
                    q, k, v)
    torch.testing.assert_close(out, ref)
    for a, b in zip(g_, ref_grads):
        torch.testing.assert_close(a, b)


def test_delta_rule_overwrites_where_additive_piles_up():
    """Write v1 then v2 at the same unit key: beta = 1 reads back v2 exactly; the additive
    (unnormalised) state reads v1 + v2."""
    k = F.normalize(randn(1, 4), dim=-1).repeat(2, 1)  # (2, 4), the same key twice
    v = randn(2, 3, seed=1)
    _, S = delta_rule_recurrent(k, k, v, torch.ones(2, dtype=torch.float64),
                                return_state=True)
    torch.testing.assert_close(k[0] @ S, v[1])
    _, (S_add, _) = linear_attention_recurrent(k, k, v, normalize=False, return_state=True)
    torch.testing.assert_close(k[0] @ S_add, v[0] + v[1])


def test_steps_do_not_modify_the_state():
    S, z = torch.zeros(4, 3), torch.zeros(4)
    linear_attention_step(torch.ones(4), torch.ones(4), torch.ones(3), (S, z))
    delta_rule_step(torch.ones(4), torch.ones(4) / 2, torch.ones(3), torch.tensor(1.0), S)
    assert not S.any() and not z.any()


@pytest.mark.parametrize("rule", ["additive", "delta", "gated_delta"])
def test_layer_cache_equals_recomputation(rule):
    torch.manual_seed(0)
    layer = LinearMultiHeadAttention(8, 2, rule=rule, chunk_size=3).double()
    X = randn(2, 7, 8)
    whole = layer(X, X, X, is_causal=True)
    cache, outs = RecurrentState(), []
    for t in range(7):
        x = X[:, t:t + 1]
        outs.append(layer(x, x, x, is_causal=True, kv_cache=cache))
    torch.testing.assert_close(torch.cat(outs, dim=1), whole)
    assert len(cache) == 7
    assert cache.nbytes == 8 * (2 * 2 * 4 * 4 + (2 * 2 * 4 if rule == "additive" else 0))


@pytest.mark.parametrize("attention", ["linear", "delta", "gated_delta"])
def test_gpt_with_a_recurrent_core_generates_with_and_without_cache(attention):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, num_hiddens=16, num_heads=2,
                          num_layers=2, ffn_num_hiddens=32, positions="learned",
                          attention=attention)).double()
    assert all(isinstance(b.self_attention, LinearMultiHeadAttention) for b in model.blocks)
    prompt = torch.randint(0, 11, (2, 3))
    with_cache = model.generate(prompt, 8, greedy=True, use_cache=True)
    without = model.generate(prompt, 8, greedy=True, use_cache=False)
    assert torch.equal(with_cache, without)
    tokens = torch.randint(0, 11, (2, 10))
    logits = model(tokens)
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 11
    torch.testing.assert_close(model(changed)[:, :6], logits[:, :6])  # causal


def _small(attention, positions="learned", **kwargs):
    return GPTConfig(vocab_size=11, block_size=16, num_hiddens=16, num_heads=2, num_layers=4,
                     ffn_num_hiddens=32, positions=positions, attention=attention, **kwargs)


@pytest.mark.parametrize("attention, positions, kinds", [
    ("linear", "learned", [LinearMultiHeadAttention] * 4),
    (("gated_delta",) * 3 + ("softmax",), "learned",
     [LinearMultiHeadAttention] * 3 + [MultiHeadAttention]),
    ("mla", "rotary", [MultiHeadLatentAttention] * 4),
])
def test_gpt_builds_each_layer_attention_directly(attention, positions, kinds):
    """The attention factory: every layer holds the attention its config names, built in
    place (no softmax attention built and thrown away), with a matching cache, and decoding
    with the caches gives the logits of the whole sequence."""
    torch.manual_seed(0)
    model = GPT(_small(attention, positions)).double()
    for block, kind in zip(model.blocks, kinds):
        layer = block.self_attention
        assert isinstance(getattr(layer, "mla", layer), kind)
    built = [type(m) for m in model.modules()]
    assert built.count(MultiHeadAttention) == kinds.count(MultiHeadAttention)
    caches = model.new_caches()
    assert [type(c) for c in caches] == [RecurrentState if k is LinearMultiHeadAttention
                                         else KVCache for k in kinds]
    tokens = torch.randint(0, 11, (2, 12))
    steps = torch.cat([model(tokens[:, :5], kv_caches=caches)]
                      + [model(tokens[:, t:t + 1], kv_caches=caches) for t in range(5, 12)],
                      dim=1)
    torch.testing.assert_close(steps, model(tokens))
    assert len(caches[0]) == 12


def test_gpt_latent_attention_takes_the_sizes_of_its_config():
    model = GPT(_small("mla", "rotary"))  # d_h = 8: d_c = 32 and d^R = 4 by default
    assert model.blocks[0].self_attention.mla.cache_values_per_token() == 32 + 4
    model = GPT(_small("mla", "rotary", latent_size=6, rope_head_size=2))
    assert model.blocks[0].self_attention.mla.cache_values_per_token() == 6 + 2
    X = torch.randn(1, 3, 16)
    with pytest.raises(ValueError, match="keys and values must be the queries"):
        model.blocks[0].self_attention(X, X.clone(), X, is_causal=True)
    with pytest.raises(ValueError, match="takes no valid_lens or attn_mask"):
        model.blocks[0].self_attention(X, X, X, torch.tensor([2]), is_causal=True)


def test_gpt_softmax_default_is_unchanged():
    assert GPTConfig().attention == "softmax"
    torch.manual_seed(0)
    a = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2, num_layers=1,
                      ffn_num_hiddens=32))
    torch.manual_seed(0)
    b = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2, num_layers=1,
                      ffn_num_hiddens=32, attention="softmax"))
    for (n, p), (_, r) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, r), n


def test_clear_errors():
    q = k = torch.rand(2, 5, 4)
    v = torch.rand(2, 5, 3)
    with pytest.raises(ValueError, match="queries and keys must have the same shape"):
        linear_attention_quadratic(q, torch.rand(2, 5, 3), v)
    with pytest.raises(ValueError, match="values must have shape"):
        linear_attention_recurrent(q, k, torch.rand(2, 4, 3))
    with pytest.raises(ValueError, match="same dtype"):
        linear_attention_chunked(q, k, v.double(), 2)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        linear_attention_chunked(q, k, v, 0)
    with pytest.raises(ValueError, match="floating tensor"):
        linear_attention_quadratic(q, k, torch.ones(2, 5, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="eps must be a positive"):
        linear_attention_quadratic(q, k, v, eps=0.0)
    with pytest.raises(ValueError, match="initial_state S must be None or a tensor of shape"):
        linear_attention_recurrent(q, k, v, initial_state=(torch.zeros(4, 3), torch.zeros(4)))
    with pytest.raises(ValueError, match="beta must lie in"):
        delta_rule_recurrent(q, k, v, torch.full((2, 5), 3.0))
    with pytest.raises(ValueError, match=r"beta must be a tensor of shape \(..., T\)"):
        delta_rule_recurrent(q, k, v, torch.ones(2, 4))
    with pytest.raises(ValueError, match="alpha must lie in"):
        delta_rule_chunked(q, k, v, torch.ones(2, 5), 2, alpha=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="rule must be"):
        LinearMultiHeadAttention(8, 2, rule="mamba")
    layer = LinearMultiHeadAttention(8, 2)
    X = torch.rand(1, 3, 8)
    with pytest.raises(ValueError, match="is_causal=True"):
        layer(X, X, X)
    with pytest.raises(ValueError, match="self-attention"):
        layer(X, X.clone(), X, is_causal=True)
    with pytest.raises(ValueError, match="no valid_lens"):
        layer(X, X, X, torch.tensor([2]), is_causal=True)
    with pytest.raises(ValueError, match="kv_cache must be None or a RecurrentState"):
        layer(X, X, X, is_causal=True, kv_cache={})
    with pytest.raises(ValueError, match="positions='learned'"):
        GPTConfig(attention="linear")
    with pytest.raises(ValueError, match="attention must be one of"):
        GPTConfig(attention="performer", positions="learned")
    with pytest.raises(ValueError, match=r"one per layer \(num_layers = 4\), got 3 names"):
        GPTConfig(attention=("softmax",) * 3)
    with pytest.raises(ValueError, match="attention must be one of"):
        GPTConfig(attention=("softmax", "softmax", "rnn", "softmax"))
    with pytest.raises(ValueError, match="'gated_delta' has no rotary positions"):
        GPTConfig(attention=("gated_delta",) * 3 + ("softmax",))
    with pytest.raises(ValueError, match="rope_head_size must be even"):
        GPTConfig(attention="mla", rope_head_size=3)
    with pytest.raises(ValueError, match="latent_size must be a positive integer"):
        GPTConfig(attention="mla", latent_size=0)
    with pytest.raises(ValueError, match="self_attention must be None or an nn.Module"):
        TransformerEncoderBlock(8, 2, 16, self_attention=lambda Z: Z)
    with pytest.raises(ValueError, match="use causal=True"):
        GPTConfig(attention="delta", positions="learned", causal=False)


def test_inputs_are_not_modified():
    q = k = elu_feature_map(randn(2, 6, 4))
    v, beta = randn(2, 6, 3, seed=1), torch.ones(2, 6, dtype=torch.float64)
    copies = [t.clone() for t in (q, k, v, beta)]
    linear_attention_chunked(q, k, v, 4)
    delta_rule_chunked(q, F.normalize(k, dim=-1), v, beta, 4)
    for t, c in zip((q, k, v, beta), copies):
        assert torch.equal(t, c)


# --- half precision: float32 inside, the input dtype out (issue 40) ------------------------------

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_in_half_precision_accumulates_in_float32(dtype, gated):
    """torch's triangular solve has no half-precision kernel; the forms compute in float32 and
    return the input dtype, within the rounding of the half-precision inputs and output."""
    k = F.normalize(randn(2, 3, 20, 8), dim=-1)
    q, v, beta = randn(2, 3, 20, 8, seed=1), randn(2, 3, 20, 4, seed=2), randn(2, 3, 20).sigmoid()
    alpha = randn(2, 3, 20, seed=4).sigmoid() if gated else None
    half = [t.to(dtype) for t in (q, k, v, beta)]
    a = None if alpha is None else alpha.to(dtype)
    ref = delta_rule_recurrent(*[t.double() for t in half],
                               alpha=None if a is None else a.double())
    tol = 3e-2 if dtype == torch.bfloat16 else 4e-3
    for out, S in (delta_rule_chunked(*half, 8, alpha=a, return_state=True),
                   delta_rule_recurrent(*half, alpha=a, return_state=True)):
        assert out.dtype == dtype and S.dtype == torch.float32  # the state is carried wide
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", HALF)
def test_additive_forms_in_half_precision(dtype):
    """The additive forms return the input dtype, close to float64 over the same inputs (on the
    CPU, half-precision matrix products already accumulate in float32, so this checks the
    dtype and the agreement, not the widening)."""
    q, k = elu_feature_map(randn(2, 50, 8)), elu_feature_map(randn(2, 50, 8, seed=1))
    v = randn(2, 50, 4, seed=2)
    half = [t.to(dtype) for t in (q, k, v)]
    ref = linear_attention_quadratic(*[t.double() for t in half])
    tol = 3e-2 if dtype == torch.bfloat16 else 4e-3
    for out in (linear_attention_quadratic(*half), linear_attention_recurrent(*half),
                linear_attention_chunked(*half, 16)):
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_delta_rule_on_cuda_equals_the_cpu(dtype):
    """Run where a GPU is present (skipped otherwise): the chunked delta rule on CUDA."""
    k = F.normalize(randn(2, 3, 20, 8), dim=-1)
    q, v, beta = randn(2, 3, 20, 8, seed=1), randn(2, 3, 20, 4, seed=2), randn(2, 3, 20).sigmoid()
    alpha = randn(2, 3, 20, seed=4).sigmoid()
    args = [t.to(dtype) for t in (q, k, v, beta)]
    ref = delta_rule_chunked(*args, 8, alpha=alpha.to(dtype))
    out = delta_rule_chunked(*[t.cuda() for t in args], 8, alpha=alpha.to(dtype).cuda())
    assert out.device.type == "cuda" and out.dtype == dtype
    tol = 1e-9 if dtype == torch.float64 else 2e-2
    torch.testing.assert_close(out.cpu().double(), ref.double(), atol=tol, rtol=tol)
