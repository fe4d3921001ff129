"""One home per idea: one multi-head core, one scoring base, one public surface, and the old
import paths of moved names (which warn for one release)."""

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import d2lattn
from d2lattn import (AdditiveAttention, Attention, BilinearAttention, DotProductAttention,
                     GroupedQueryAttention, MultiHeadAttention, causal_mask, dot_product_scores,
                     masked_softmax)
from d2lattn.multihead import merge_heads, split_heads


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("is_causal", [False, True])
def test_multi_head_attention_with_kv_heads_is_grouped_query_attention(g, is_causal):
    """The materialised core with g key/value heads, the tiled layer and SDPA agree."""
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(16, num_heads=4, num_kv_heads=g, bias=True).double()
    mha = MultiHeadAttention(16, 4, bias=True, num_kv_heads=g).double()
    mha.load_state_dict(gqa.state_dict())
    X = randn(2, 5, 16)
    lens = torch.tensor([5, 3])
    out = gqa(X, X, X, lens, is_causal=is_causal)
    torch.testing.assert_close(mha(X, X, X, lens, is_causal=is_causal), out)
    q = split_heads(gqa.W_q(X), 4)
    k, v = split_heads(gqa.W_k(X), g), split_heads(gqa.W_v(X), g)
    mask = d2lattn.valid_lens_to_mask(lens, 5, 5)[:, None]
    if is_causal:
        mask = mask & causal_mask(5, 5)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, gqa.W_o(merge_heads(ref)))
    assert isinstance(gqa, MultiHeadAttention) and gqa.attention_weights is None
    assert mha.attention_weights.shape == (2, 4, 5, 5)


@pytest.mark.parametrize("g", [1, 4])
def test_packed_projection_at_inference_equals_three_projections(g):
    gqa = GroupedQueryAttention(16, 4, g, bias=True).double()
    X = randn(2, 5, 16)
    with torch.no_grad():
        packed = gqa(X, X, X)
    torch.testing.assert_close(packed, gqa(X, X, X).detach(), rtol=1e-12, atol=1e-12)


def test_split_and_merge_heads_have_one_home():
    mha, gqa = MultiHeadAttention(12, 3), GroupedQueryAttention(12, 3, 1)
    X = randn(2, 5, 12)
    assert torch.equal(mha.split_heads(X), split_heads(X, 3))
    assert torch.equal(gqa.split_heads(X[..., :4], 1), split_heads(X[..., :4], 1))
    assert torch.equal(merge_heads(split_heads(X, 3)), X)
    assert GroupedQueryAttention.forward is MultiHeadAttention.forward


@pytest.mark.parametrize("layer", ["dot", "additive", "bilinear", "score_fn"])
def test_every_scoring_layer_takes_the_same_masks_and_options(layer):
    """One base, Attention: a layer defines score() and gets attn_mask, is_causal and scale."""
    torch.manual_seed(0)
    attn = {"dot": DotProductAttention(), "additive": AdditiveAttention(4, 4, 8),
            "bilinear": BilinearAttention(4, 4), "score_fn": Attention(dot_product_scores)}[layer]
    attn = attn.double()
    q, k, v = randn(2, 3, 4), randn(2, 5, 4, seed=1), randn(2, 5, 2, seed=2)
    allowed = randn(3, 5, seed=3) > 0
    allowed[:, 0] = True
    bias = randn(3, 5, seed=4)
    lens = torch.tensor([5, 4])
    out = attn(q, k, v, lens, attn_mask=bias, is_causal=True, scale=0.5)
    scores = attn.score(q, k, 0.5) + bias
    keep = d2lattn.valid_lens_to_mask(lens, 3, 5) & causal_mask(3, 5)
    torch.testing.assert_close(out, masked_softmax(scores, mask=keep) @ v)
    out = attn(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, masked_softmax(attn.score(q, k), mask=allowed) @ v)
    assert isinstance(attn, Attention)


def test_a_score_fn_that_keeps_its_scores_is_not_overwritten():
    kept = randn(2, 3, 5)
    attn = Attention(lambda q, k: kept)
    before = kept.clone()
    attn(randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 2), torch.tensor([2, 5]),
         attn_mask=randn(3, 5), is_causal=True)
    assert torch.equal(kept, before)


def test_public_surface_is_the_modules_all():
    modules = [m for m in vars(d2lattn).values()
               if getattr(m, "__name__", "").startswith("d2lattn.") and hasattr(m, "__all__")]
    names = sorted(name for m in modules for name in m.__all__)
    assert d2lattn.__all__ == names and len(names) == len(set(names))
    for m in modules:
        for name in m.__all__:
            assert getattr(d2lattn, name) is getattr(m, name)
    assert "check_qkv" not in d2lattn.__all__ and "check_positive_ints" not in d2lattn.__all__


def test_moved_names_still_work_from_the_old_path_with_a_warning():
    with pytest.warns(DeprecationWarning, match="d2lattn.multihead.GroupedQueryAttention"):
        from d2lattn.flash import GroupedQueryAttention as Old
    assert Old is GroupedQueryAttention
    with pytest.warns(DeprecationWarning, match="no longer public"):
        check_qkv = d2lattn.check_qkv
    with pytest.raises(ValueError, match="values must have shape"):
        check_qkv(randn(2, 1, 4), randn(2, 3, 4), randn(2, 2, 4), same_size=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from d2lattn.multihead import GroupedQueryAttention as New  # the new path: no warning
    assert New is GroupedQueryAttention


# --- Part III: one rotary, one cache-byte count, one mode rule (issue 40) -----------------------

def test_one_cache_byte_count():
    """The layer's method is the serving formula for one layer, in the dtype's item size."""
    from d2lattn.serving import kv_cache_bytes
    for layer in (MultiHeadAttention(64, 8), GroupedQueryAttention(64, 8, 2)):
        for dtype in (torch.float16, torch.float32, torch.float64):
            assert layer.kv_cache_bytes(3, 100, dtype) == kv_cache_bytes(
                num_layers=1, num_kv_heads=layer.num_kv_heads, head_size=layer.head_size,
                seq_len=100, batch_size=3, bytes_per_value=dtype.itemsize)
    with pytest.raises(ValueError, match="seq_len"):
        MultiHeadAttention(64, 8).kv_cache_bytes(1, 0)


def test_one_rotary_implementation():
    """Scaled frequencies go through rotary_embedding; rotate_pairs is that call."""
    from d2lattn.serving import rope_frequencies, rotate_pairs
    X = randn(2, 3, 7, 8)
    pos = torch.arange(5, 12)
    omega = rope_frequencies(8, method="ntk", factor=4)
    out = d2lattn.rotary_embedding(X, pos, frequencies=omega)
    assert torch.equal(rotate_pairs(X, pos, omega), out)
    # the default frequencies are base^(-2i/d): the same numbers either way
    assert torch.equal(d2lattn.rotary_embedding(X, pos, frequencies=rope_frequencies(8)),
                       d2lattn.rotary_embedding(X, pos))
    with pytest.raises(ValueError, match="frequencies"):
        d2lattn.rotary_embedding(X, pos, frequencies=omega[:3])


def test_every_public_module_documents_its_forward_with_shapes():
    """``help(Module.forward)`` answers on its own: every public ``nn.Module`` of d2lattn
    has a ``forward`` docstring that gives a shape, and a class docstring with ``Shapes``."""
    missing = []
    for name in sorted(d2lattn.__all__):
        obj = getattr(d2lattn, name)
        if not (inspect.isclass(obj) and issubclass(obj, nn.Module)):
            continue
        doc = inspect.getdoc(obj.forward) or ""
        if "(" not in doc or "Shapes" not in (inspect.getdoc(obj) or ""):
            missing.append(name)
    assert not missing, f"forward or Shapes undocumented: {missing}"
