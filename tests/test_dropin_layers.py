"""d2lattn as a drop-in for PyTorch: attention layers, Transformer blocks, ALiBi, checks.

Oracles: ``F.scaled_dot_product_attention`` (math backend for dropout), ``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``, in float64.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import d2lattn._checks as checks
from d2lattn import flash, masking, multihead, scoring, transformer
from d2lattn.masking import causal_mask, masked_softmax, valid_lens_to_mask
from d2lattn.multihead import GroupedQueryAttention, MultiHeadAttention
from d2lattn.positional import alibi_bias, alibi_slopes
from d2lattn.scoring import DotProductAttention
from d2lattn.transformer import (KVCache, PositionWiseFFN, TransformerDecoderBlock,
                                 TransformerEncoderBlock)

F64 = dict(rtol=1e-10, atol=1e-10)


def randn(*shape, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(requires_grad)


# --- scale and float attn_mask in DotProductAttention and MultiHeadAttention ----------------

@pytest.mark.parametrize("scale", [None, 1.0, 0.05])
@pytest.mark.parametrize("mask_shape", [None, (5, 7), (2, 3, 5, 7), (3, 1, 7)])
def test_dot_product_attention_float_mask_and_scale_match_sdpa(scale, mask_shape):
    q, k, v = (randn(2, 3, n, 8, seed=s, requires_grad=True) for s, n in enumerate((5, 7, 7)))
    bias = None if mask_shape is None else randn(*mask_shape, seed=5, requires_grad=True)
    out = DotProductAttention()(q, k, v, attn_mask=bias, scale=scale)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    torch.testing.assert_close(out, ref, **F64)
    inputs = (q, k, v) + ((bias,) if bias is not None else ())
    d_out = randn(*out.shape, seed=9)
    ours, theirs = (torch.autograd.grad(t, inputs, d_out) for t in (out, ref))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **F64)  # the float mask gets SDPA's gradient too


def test_float_mask_with_valid_lens_and_is_causal_matches_sdpa():
    q, k, v = (randn(2, 3, n, 8, seed=s, requires_grad=True) for s, n in enumerate((5, 7, 7)))
    bias = alibi_bias(3, 5, 7).double()
    lens = torch.tensor([[7, 6, 5, 4, 3], [1, 2, 3, 4, 5]])
    out = DotProductAttention()(q, k, v, lens, attn_mask=bias, is_causal=True)
    keep = valid_lens_to_mask(lens, 5, 7)[:, None] & causal_mask(5, 7)  # (B, 1, Q, K)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~keep, -math.inf))
    torch.testing.assert_close(out, ref, **F64)
    flash_out = flash.flash_attention(q, k, v, valid_lens=lens, attn_mask=bias, is_causal=True,
                                      block_size=2)
    torch.testing.assert_close(flash_out, ref, **F64)


def test_float_mask_minus_inf_rows_give_zeros_not_nan():
    q, k, v = (randn(1, 4, 3, seed=s, requires_grad=True) for s in range(3))
    bias = torch.zeros(4, 4, dtype=torch.float64)
    bias[1:3, 2:] = -math.inf  # forbidden keys
    bias[3] = -math.inf  # query 3 sees nothing
    attn = DotProductAttention()
    out = attn(q, k, v, attn_mask=bias)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out[:, :3], ref[:, :3], **F64)
    assert torch.equal(out[:, 3], torch.zeros(1, 3, dtype=torch.float64))  # never NaN
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert attn.attention_weights[0, 1, 2:].eq(0).all()


def test_dot_product_attention_dropout_reproduces_sdpa_math_backend():
    q, k, v = (randn(2, 3, n, 8, seed=s) for s, n in enumerate((5, 7, 7)))
    attn = DotProductAttention(dropout=0.4).train()
    torch.manual_seed(11)
    out = attn(q, k, v, is_causal=True)
    torch.manual_seed(11)
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(5, 7), dropout_p=0.4)
    torch.testing.assert_close(out, ref, **F64)


def torch_mha(seed=0, d=16, h=4):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d, h, batch_first=True, dtype=torch.float64)
    ours = MultiHeadAttention(d, h, bias=True).double()
    with torch.no_grad():
        transformer._copy_mha(ours, ref)
    return ours, ref


def test_multihead_dropout_reproduces_nn_multiheadattention_from_the_same_seed():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(16, 4, dropout=0.3, batch_first=True, dtype=torch.float64)
    ours = MultiHeadAttention(16, 4, dropout=0.3, bias=True).double()
    with torch.no_grad():
        transformer._copy_mha(ours, ref)
    x = randn(2, 5, 16, seed=1)
    torch.manual_seed(5)
    out = ours(x, x, x)
    torch.manual_seed(5)
    expected, weights = ref(x, x, x, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, expected, **F64)


@pytest.mark.parametrize("per_head", [False, True])
def test_multihead_float_attn_mask_matches_nn_multiheadattention(per_head):
    ours, ref = torch_mha()
    B, h, Q, K = 2, 4, 5, 6
    x, m = randn(B, Q, 16, seed=1), randn(B, K, 16, seed=2)
    bias = randn(B, h, Q, K, seed=3) if per_head else randn(Q, K, seed=3)
    torch_mask = bias.reshape(B * h, Q, K) if per_head else bias  # PyTorch: (B*h, Q, K)
    expected, _ = ref(x, m, m, attn_mask=torch_mask, need_weights=False)
    torch.testing.assert_close(ours(x, m, m, attn_mask=bias), expected, **F64)


def test_multihead_alibi_and_scale():
    ours, _ = torch_mha()
    x = randn(2, 6, 16, seed=1)
    bias = alibi_bias(4, 6, 6).double()
    out = ours(x, x, x, attn_mask=bias[None], is_causal=True, scale=0.5)
    q, k, v = (ours.split_heads(W(x)) for W in (ours.W_q, ours.W_k, ours.W_v))
    causal_bias = bias.masked_fill(~causal_mask(6, 6), -math.inf)
    heads = F.scaled_dot_product_attention(q, k, v, scale=0.5, attn_mask=causal_bias)
    torch.testing.assert_close(out, ours.W_o(ours.merge_heads(heads)), **F64)


# --- ALiBi --------------------------------------------------------------------------------

def paper_slopes(n):
    """Press et al.'s recipe, restated: geometric for 2^k heads; otherwise the 2^k slopes of
    the largest power of two below n, then every other slope of 2^(k+1) heads."""
    if math.log2(n).is_integer():
        first = 2.0 ** (-8.0 / n)
        return [first ** (i + 1) for i in range(n)]
    k = 2 ** math.floor(math.log2(n))
    return paper_slopes(k) + paper_slopes(2 * k)[0::2][: n - k]


@pytest.mark.parametrize("H", [1, 2, 4, 6, 8, 12, 16, 20])
def test_alibi_slopes_follow_the_paper(H):
    torch.testing.assert_close(alibi_slopes(H), torch.tensor(paper_slopes(H), dtype=torch.float64))


def test_alibi_slopes_for_6_and_12_heads():
    assert alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    expected_12 = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in (0, 1, 2, 3)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected_12, dtype=torch.float64))
    # the old formula 2^(-8h/H) differs for these head counts
    old = torch.tensor([2 ** (-8 * h / 6) for h in range(1, 7)], dtype=torch.float64)
    assert not torch.allclose(alibi_slopes(6), old)


def test_alibi_user_slopes_and_symmetric_form():
    slopes = torch.tensor([0.5, 0.1], dtype=torch.float64, requires_grad=True)
    bias = alibi_bias(2, 3, 5, slopes=slopes)
    i = torch.arange(3)[:, None] + 2
    j = torch.arange(5)[None, :]
    torch.testing.assert_close(bias, slopes.detach()[:, None, None] * (j - i).double())
    bias.sum().backward()
    assert slopes.grad is not None  # learnable slopes
    sym = alibi_bias(2, 3, 5, slopes=slopes.detach(), symmetric=True)
    torch.testing.assert_close(sym, -slopes.detach()[:, None, None] * (j - i).abs().double())
    with pytest.raises(ValueError, match="slopes"):
        alibi_bias(3, 2, 2, slopes=torch.ones(2))
    with pytest.raises(ValueError, match="symmetric"):
        alibi_bias(3, 2, 2, symmetric=1)


def test_symmetric_alibi_in_dot_product_attention_matches_sdpa():
    q, k, v = (randn(2, 6, 5, 8, seed=s) for s in range(3))
    bias = alibi_bias(6, 5, 5, symmetric=True).double()
    torch.testing.assert_close(DotProductAttention()(q, k, v, attn_mask=bias),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=bias), **F64)


# --- Transformer blocks against PyTorch's layers --------------------------------------------

def perturbed(layer, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "module": nn.SiLU(),
               "function": lambda x: torch.tanh(x) * 2.0}


def torch_and_ours(torch_cls, activation, bias, norm_first):
    """A perturbed float64 PyTorch layer and our block copied from it."""
    layer = perturbed(torch_cls(16, 4, 24, dropout=0.0, activation=ACTIVATIONS[activation],
                                batch_first=True, norm_first=norm_first, bias=bias,
                                dtype=torch.float64))
    ours = (TransformerEncoderBlock if torch_cls is nn.TransformerEncoderLayer
            else TransformerDecoderBlock)
    return layer, ours.from_torch(layer)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_from_torch_activation_bias_float_mask(activation, bias, norm_first):
    layer, block = torch_and_ours(nn.TransformerEncoderLayer, activation, bias, norm_first)
    assert (block.norm1.bias is None) == (not bias)
    X = randn(3, 7, 16, seed=1)
    src_mask = randn(7, 7, seed=2)  # a float mask, added to the scores
    lens = torch.tensor([7, 4, 2])
    padding = torch.zeros(3, 7, dtype=torch.float64).masked_fill(
        ~valid_lens_to_mask(lens, 7, 7)[:, 0], -math.inf)  # float, like src_mask
    expected = layer(X, src_mask=src_mask, src_key_padding_mask=padding)
    torch.testing.assert_close(block(X, lens, attn_mask=src_mask), expected, **F64)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_from_torch_activation_and_bias(activation, bias, norm_first):
    """A GELU decoder layer was once accepted and then differed by up to 0.145: no longer."""
    layer, block = torch_and_ours(nn.TransformerDecoderLayer, activation, bias, norm_first)
    X, memory = randn(2, 5, 16, seed=1), randn(2, 6, 16, seed=2)
    expected = layer(X, memory, tgt_mask=~causal_mask(5, 5), tgt_is_causal=True)
    torch.testing.assert_close(block(X, memory), expected, **F64)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_decoder_target_padding_target_mask_and_memory_mask(kind):
    layer = perturbed(nn.TransformerDecoderLayer(16, 4, 24, dropout=0.0, batch_first=True,
                                                 dtype=torch.float64))
    block = TransformerDecoderBlock.from_torch(layer)
    B, T, S = 3, 5, 6
    X, memory = randn(B, T, 16, seed=1), randn(B, S, 16, seed=2)
    tgt_lens, src_lens = torch.tensor([5, 3, 1]), torch.tensor([6, 2, 4])
    if kind == "bool":
        tgt_allowed = causal_mask(T, T) & (randn(T, T, seed=3) > -1.0)
        mem_allowed = randn(T, S, seed=4) > -0.5
        mem_allowed[:, 0] = True
        tgt_torch, mem_torch = ~tgt_allowed, ~mem_allowed  # PyTorch's True = ignore
        tgt_ours, mem_ours = tgt_allowed, mem_allowed
    else:
        tgt_torch = tgt_ours = randn(T, T, seed=3).masked_fill(~causal_mask(T, T), -math.inf)
        mem_torch = mem_ours = randn(T, S, seed=4)
    tgt_pad = ~valid_lens_to_mask(tgt_lens, T, T)[:, 0]  # PyTorch: True = ignore
    mem_pad = ~valid_lens_to_mask(src_lens, T, S)[:, 0]
    if kind == "float":  # the same kind of mask for padding, as PyTorch asks
        tgt_pad = torch.zeros(B, T, dtype=torch.float64).masked_fill(tgt_pad, -math.inf)
        mem_pad = torch.zeros(B, S, dtype=torch.float64).masked_fill(mem_pad, -math.inf)
    expected = layer(X, memory, tgt_mask=tgt_torch, memory_mask=mem_torch,
                     tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=mem_pad)
    out = block(X, memory, src_lens, is_causal=False, valid_lens=tgt_lens, attn_mask=tgt_ours,
                memory_mask=mem_ours)
    torch.testing.assert_close(out, expected, **F64)


def test_position_wise_ffn_activation_and_bias():
    ffn = PositionWiseFFN(4, 8, activation="gelu", bias=False).double()
    X = randn(2, 3, 4)
    torch.testing.assert_close(ffn(X), ffn.dense2(F.gelu(ffn.dense1(X))), **F64)
    assert ffn.dense1.bias is None
    with pytest.raises(ValueError, match="activation"):
        PositionWiseFFN(4, 8, activation="swish")
    with pytest.raises(ValueError, match="activation"):
        PositionWiseFFN(4, 8, activation=3)


# --- Clear errors ---------------------------------------------------------------------------

def test_kv_cache_with_a_non_causal_chunk_is_rejected():
    mha = MultiHeadAttention(8, 2)
    X = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="is_causal=False"):
        mha(X, X, X, kv_cache=KVCache())
    block = TransformerEncoderBlock(8, 2, 16)
    with pytest.raises(ValueError, match="is_causal=False"):
        block(X, kv_cache=KVCache())
    # defined behaviours: one query at a time, or an explicit mask over all keys
    cache = KVCache()
    mha(X, X, X, kv_cache=cache, is_causal=True)
    mha(X[:, :1], X[:, :1], X[:, :1], kv_cache=cache)
    mha(X, X, X, kv_cache=cache, attn_mask=torch.ones(3, 7, dtype=torch.bool))
    assert len(cache) == 7


def test_float64_input_into_a_float32_block_is_a_clear_error():
    X = torch.randn(2, 3, 8, dtype=torch.float64)
    for call in (lambda: MultiHeadAttention(8, 2)(X, X, X),
                 lambda: TransformerEncoderBlock(8, 2, 16)(X),
                 lambda: TransformerEncoderBlock(8, 2, 16, norm_first=True)(X),
                 lambda: TransformerDecoderBlock(8, 2, 16)(X, X)):
        with pytest.raises(ValueError, match="dtype torch.float64 but the layer's parameters are "
                                             "torch.float32"):
            call()


@pytest.mark.parametrize("eps", [-1e-5, 0.0, math.inf, "1e-5", True])
def test_bad_layer_norm_eps(eps):
    for cls in (TransformerEncoderBlock, TransformerDecoderBlock):
        with pytest.raises(ValueError, match="layer_norm_eps"):
            cls(8, 2, 16, layer_norm_eps=eps)


def test_mixed_dtype_cache_updates_are_rejected():
    cache = KVCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="not promoted silently"):
        cache.update(torch.zeros(1, 2, 1, 4, dtype=torch.float64),
                     torch.zeros(1, 2, 1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="share one dtype"):
        KVCache().update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4, dtype=torch.float16))
    assert cache.keys.dtype == torch.float32 and len(cache) == 3


# --- One validation module ------------------------------------------------------------------

def test_one_definition_of_each_check():
    """Every check lives in d2lattn._checks: no other module defines a function named
    check_* or _check_*, and the names the modules import are _checks' own objects (the
    public checks of d2lattn.diagnostics, which examine a model rather than an argument, are
    that module's purpose)."""
    import importlib
    import inspect
    import pkgutil

    import d2lattn

    modules = [importlib.import_module(f"d2lattn.{info.name}")
               for info in pkgutil.iter_modules(d2lattn.__path__)]
    assert len(modules) >= 14 and checks in modules
    found = []
    for module in modules:
        for name, obj in vars(module).items():
            if inspect.isfunction(obj) and name.lstrip("_").startswith("check"):
                if module.__name__ == "d2lattn.diagnostics" and name in module.__all__:
                    continue  # the diagnostics' public checks examine models, not arguments
                found.append(name)
                assert obj.__module__ == "d2lattn._checks", f"{module.__name__}.{name}"
                assert obj is getattr(checks, obj.__name__), f"{module.__name__}.{name}"
    assert len(found) > 40  # the test looked at the modules' imports, not at nothing
    assert masking.ValidLens is flash.ValidLens is transformer.ValidLens is checks.ValidLens
    assert multihead.ValidLens is checks.ValidLens


def _valid_lens_callers(q, k, v):
    """Everything that takes ``valid_lens``, called with it as the fourth argument."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(q.shape[-1], 2).to(q.dtype)
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(q.shape[-1], 2, 1).to(q.dtype)
    return {
        "masked_softmax": lambda lens: masked_softmax(q @ k.transpose(1, 2), lens),
        "DotProductAttention": lambda lens: DotProductAttention()(q, k, v, lens),
        "flash_attention": lambda lens: flash.flash_attention(q, k, v, lens),
        "flash_attention(valid_lens=)": lambda lens: flash.flash_attention(q, k, v,
                                                                           valid_lens=lens),
        "MultiHeadAttention": lambda lens: mha(q, k, v, lens),
        "GroupedQueryAttention": lambda lens: gqa(q, k, v, lens),
    }


@pytest.mark.parametrize("form", ["tensor", "int32", "list", "tuple", "per-query", "nested list"])
def test_one_valid_lens_convention(form):
    """Every caller takes the same forms of valid_lens, positional or by name, and means the
    same by them: (B,) or (B, Q) integers, as a tensor of any integer dtype or a sequence."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, n, 8, generator=g, dtype=torch.float64) for n in (3, 5, 5))
    per_seq, per_query = [2, 5], [[1, 2, 3], [5, 0, 4]]
    lens = {"tensor": torch.tensor(per_seq), "int32": torch.tensor(per_seq, dtype=torch.int32),
            "list": per_seq, "tuple": tuple(per_seq), "per-query": torch.tensor(per_query),
            "nested list": per_query}[form]
    as_tensor = torch.as_tensor(lens, dtype=torch.long)
    for name, call in _valid_lens_callers(q, k, v).items():
        torch.testing.assert_close(call(lens), call(as_tensor), rtol=0, atol=0, msg=name)
    # the same meaning as a boolean mask, True = may attend (DotProductAttention vs SDPA)
    mask = valid_lens_to_mask(as_tensor, 3, 5)  # (B, 1|Q, K)
    rows = mask.any(-1, keepdim=True)
    expected = torch.where(rows, F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask | ~rows), 0.0)
    torch.testing.assert_close(DotProductAttention()(q, k, v, lens), expected)
    torch.testing.assert_close(flash.flash_attention(q, k, v, lens), expected)


@pytest.mark.parametrize("lens", [3, torch.tensor([[2], [4]]),
                                  torch.ones(2, 2, 3, dtype=torch.long),
                                  torch.tensor([1, 2, 3]), torch.tensor([2.0, 4.0])])
def test_the_same_valid_lens_mistake_gets_the_same_message_everywhere(lens):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, n, 8, generator=g) for n in (3, 4, 4))
    messages = set()
    for name, call in _valid_lens_callers(q, k, v).items():
        with pytest.raises(ValueError) as info:
            call(lens)
        messages.add(str(info.value))
    assert len(messages) == 1, messages
    assert messages.pop().startswith("valid_lens must have")


def test_same_message_for_the_same_mistake_everywhere():
    q = torch.randn(2, 3, 4)
    lens = torch.tensor([1, 9])
    messages = set()
    for call in (lambda: masked_softmax(torch.randn(2, 3, 3), lens),
                 lambda: DotProductAttention()(q, q, q, lens),
                 lambda: flash.flash_attention(q, q, q, valid_lens=lens)):
        with pytest.raises(ValueError) as info:
            call()
        messages.add(str(info.value))
    assert messages == {"valid_lens entries must lie in [0, 3] (the number of keys); "
                        "got values in [1, 9]"}
    for call in (lambda: DotProductAttention()(q, q, q, scale=0.0),
                 lambda: flash.flash_attention(q, q, q, scale=0.0)):
        with pytest.raises(ValueError, match=r"scale must be None or a positive finite number"):
            call()
    for call in (lambda: DotProductAttention()(q, q, q, is_causal=1),
                 lambda: flash.flash_attention(q, q, q, is_causal=1),
                 lambda: flash.tile_schedule(3, 3, is_causal=1),
                 lambda: MultiHeadAttention(4, 2)(q, q, q, is_causal=1)):
        with pytest.raises(ValueError, match="is_causal must be a bool, got 1"):
            call()
