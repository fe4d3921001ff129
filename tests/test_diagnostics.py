"""Tests of d2lattn.diagnostics: correct models pass, the classic bugs fail, nothing changes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from d2lattn import (KVCache, LearnedPositionalEmbedding, MultiHeadAttention, PositionalEncoding,
                     TransformerDecoderBlock, TransformerEncoderBlock, masked_softmax)
from d2lattn.diagnostics import (CheckResult, check_attention_weights, check_batch_independence,
                                 check_causal, check_finite, check_kv_cache, check_padding,
                                 check_permutation_equivariance)

torch.set_num_threads(1)
D, H, T = 16, 4, 7


def seeded(seed=0):
    torch.manual_seed(seed)
    return torch.randn(3, T, D)


# --- models: correct ones ---------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    """A nanoGPT-style causal self-attention, with switches for its classic bugs."""

    def __init__(self, d=D, h=H, bug=None, dropout=0.0):
        super().__init__()
        self.h, self.bug = h, bug
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.dropout = nn.Dropout(dropout)

    def split(self, x):
        B, T, C = x.shape
        if self.bug == "no_transpose":
            return x.reshape(B, self.h, T, C // self.h)  # (B, h, T, hs) but positions mixed
        return x.view(B, T, self.h, C // self.h).transpose(1, 2)  # (B, h, T, hs)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = map(self.split, self.qkv(x).split(C, dim=2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // self.h)  # (B, h, T, T)
        allowed = {None: torch.ones(T, T).tril(), "no_transpose": torch.ones(T, T).tril(),
                   "off_by_one": torch.ones(T, T).tril(1),  # j <= i + 1: sees the next token
                   "upper": torch.ones(T, T).triu(),  # the mask's convention inverted
                   "no_mask": torch.ones(T, T)}[self.bug]
        scores = scores.masked_fill(allowed == 0, float("-inf"))
        y = self.dropout(scores.softmax(dim=-1)) @ v  # (B, h, T, hs)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class TokenLM(nn.Module):
    """Token ids -> logits, with learned positions and a d2lattn block; optional cache."""

    def __init__(self, vocab=11, d=D, offset_bug=False):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), LearnedPositionalEmbedding(d, max_len=32)
        self.block = TransformerEncoderBlock(d, 2, 2 * d, dropout=0.1, norm_first=True)
        self.head, self.offset_bug = nn.Linear(d, vocab), offset_bug

    def forward(self, tokens, cache=None):
        start = 0 if cache is None or self.offset_bug else len(cache)
        X = self.embed(tokens) + self.pos.P[start:start + tokens.shape[1]]
        return self.head(self.block(X, is_causal=True, kv_cache=cache))


def causal_models():
    torch.manual_seed(1)
    mha = MultiHeadAttention(D, H, dropout=0.2).train()
    enc = TransformerEncoderBlock(D, H, 32, dropout=0.3).train()  # dropout in training mode
    dec = TransformerDecoderBlock(D, H, 32, dropout=0.1, norm_first=True)
    memory = torch.randn(3, 5, D)
    pos = PositionalEncoding(D)
    torch_layer = nn.TransformerEncoderLayer(D, H, 32, dropout=0.1, batch_first=True)
    causal = nn.Transformer.generate_square_subsequent_mask  # a mask for each length
    return {
        "MultiHeadAttention": (lambda X: mha(X, X, X, is_causal=True), mha),
        "TransformerEncoderBlock (train mode)": (lambda X: enc(X, is_causal=True), enc),
        "TransformerDecoderBlock": (lambda X: dec(X, memory), dec),
        "sinusoidal positions": (lambda X: enc(pos(X), is_causal=True), enc),
        "rotary": (lambda X: TransformerEncoderBlock(D, H, 32, rotary=True).eval()(
            X, is_causal=True), None),
        "nanoGPT-style": (CausalSelfAttention(dropout=0.1), None),
        "nn.TransformerEncoderLayer": (
            lambda X: torch_layer(X, src_mask=causal(X.shape[1]), is_causal=True), torch_layer),
        "plain function: running mean": (
            lambda X: X.cumsum(dim=1) / torch.arange(1, X.shape[1] + 1)[:, None], None),
        "causal convolution": (lambda X: F.conv1d(F.pad(X.transpose(1, 2), (2, 0)),
                                                  torch.ones(D, 1, 3), groups=D).transpose(1, 2),
                               None),
    }


@pytest.mark.parametrize("name", list(causal_models()))
def test_causal_models_pass(name):
    model, module = causal_models()[name]
    result = check_causal(model, seeded(), module=module)
    assert result.passed and bool(result), result.message
    assert result.first_position is None and "changing the inputs after t" in result.message


def test_causal_token_ids_and_float64():
    torch.manual_seed(0)
    lm = TokenLM().train()
    tokens = torch.randint(0, 11, (2, 9))
    assert check_causal(lm, tokens, vocab_size=11)
    lm64 = TokenLM().double()
    assert check_causal(lm64, tokens).tolerance < 1e-8


# --- models: the classic bugs -----------------------------------------------------------------

def buggy_causal_models():
    torch.manual_seed(2)
    mha = MultiHeadAttention(D, H)
    bn = nn.BatchNorm1d(D)
    return {
        "no mask": (lambda X: mha(X, X, X), 0, None),
        "no mask (nanoGPT-style)": (CausalSelfAttention(bug="no_mask"), 0, None),
        "mask off by one": (CausalSelfAttention(bug="off_by_one"), 0, [1]),
        "mask in the other corner": (CausalSelfAttention(bug="upper"), 0, None),
        "heads split without transpose": (CausalSelfAttention(bug="no_transpose"), 0, None),
        "normalisation across time": (
            lambda X: (X - X.mean(dim=1, keepdim=True)) / X.std(dim=1, keepdim=True), 0, None),
        "convolution that sees the future": (
            lambda X: F.conv1d(X.transpose(1, 2), torch.ones(D, 1, 3), padding=1,
                               groups=D).transpose(1, 2), 0, [1]),
        "d2lattn upper-left mask": (
            lambda X: X + masked_softmax(X @ X.transpose(1, 2),
                                         mask=torch.ones(T, T, dtype=torch.bool).triu(2)) @ X,
            0, None),
        "BatchNorm over time, train mode": (
            lambda X: bn(X.transpose(1, 2)).transpose(1, 2), 0, None),
    }


@pytest.mark.parametrize("name", list(buggy_causal_models()))
def test_causal_bugs_fail(name):
    model, first, reads = buggy_causal_models()[name]
    kwargs = {"mode": "train", "module": model.__closure__[0].cell_contents} \
        if name.startswith("BatchNorm") else {}
    result = check_causal(model, seeded(), **kwargs)
    assert not result.passed and not bool(result), result.message
    assert result.first_position == first
    assert (f"position {first} changed by" in result.message
            or f"position {first} has a non-zero gradient" in result.message)
    if reads is not None:
        assert result.details["reads"] == reads
    assert result.max_deviation > 100 * result.tolerance  # far above the tolerance


def test_batchnorm_leak_only_in_train_mode():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(D).train()
    model = lambda X: bn(X.transpose(1, 2)).transpose(1, 2)  # noqa: E731
    assert check_causal(model, seeded(), module=bn)  # eval: running statistics, no leak
    assert not check_causal(model, seeded(), module=bn, mode="train")
    assert bn.training and int(bn.num_batches_tracked) == 0  # untouched


def test_off_by_one_message_names_the_next_position():
    result = check_causal(CausalSelfAttention(bug="off_by_one"), seeded())
    assert "it reads position 1." in result.message
    assert result.details["deviations"].shape == (T - 1,)
    assert str(result).startswith("check_causal: FAILED.")


# --- padding ----------------------------------------------------------------------------------

LENS = torch.tensor([7, 4, 2])


def masked_mean(X, lens):
    keep = (torch.arange(X.shape[1])[None, :] < lens[:, None]).to(X.dtype)  # (B, T)
    return (X * keep[..., None]).sum(dim=1) / keep.sum(dim=1, keepdim=True).clamp(min=1)


def padding_models():
    torch.manual_seed(3)
    mha = MultiHeadAttention(D, H, dropout=0.5).train()
    enc = TransformerEncoderBlock(D, H, 32, dropout=0.2)
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    # True = ignore; built for the length of the batch (check_padding also runs it unpadded)
    ignore = lambda lens, T: torch.arange(T)[None, :] >= lens[:, None]  # noqa: E731
    return {
        "MultiHeadAttention": (lambda X, lens: mha(X, X, X, lens), mha),
        "TransformerEncoderBlock": (enc, None),
        "nn.MultiheadAttention, True = ignore": (
            lambda X, lens: ref(X, X, X, key_padding_mask=ignore(lens, X.shape[1]))[0], ref),
        "masked mean pooling": (masked_mean, None),
        "encoder then masked mean": (lambda X, lens: masked_mean(enc(X, lens), lens), enc),
    }


@pytest.mark.parametrize("name", list(padding_models()))
def test_padding_models_pass(name):
    model, module = padding_models()[name]
    result = check_padding(model, seeded(), LENS, module=module)
    assert result.passed, result.message


def padding_bugs():
    torch.manual_seed(4)
    mha = MultiHeadAttention(D, H)
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    keep = lambda lens, T: torch.arange(T)[None, :] < lens[:, None]  # noqa: E731  True = attend
    return {
        "no mask": lambda X, lens: mha(X, X, X),
        "inverted mask convention":
            lambda X, lens: ref(X, X, X, key_padding_mask=keep(lens, X.shape[1]))[0],
        "pooling over padding": lambda X, lens: X.mean(dim=1),
        "max pooling over padding": lambda X, lens: mha(X, X, X, lens).amax(dim=1),
        "normalisation across time": lambda X, lens: X - X.mean(dim=1, keepdim=True),
    }


@pytest.mark.parametrize("name", list(padding_bugs()))
def test_padding_bugs_fail(name):
    result = check_padding(padding_bugs()[name], seeded(), LENS)
    assert not result.passed, result.message


def test_padding_messages():
    per_position = check_padding(padding_bugs()["no mask"], seeded(), LENS)
    assert per_position.details["sequence"] == 1 and per_position.first_position == 0
    assert "valid position 0 of sequence 1 (valid length 4)" in per_position.message
    pooled = check_padding(padding_bugs()["pooling over padding"], seeded(), LENS)
    text = " ".join(pooled.message.split())  # the message is wrapped at 88 characters
    assert "pooled output of sequence 1" in text and "reads the padding" in text
    assert pooled.details["deviations"][0] == 0  # sequence 0 has no padding


def test_padding_token_ids():
    torch.manual_seed(0)
    embed, enc = nn.Embedding(11, D), TransformerEncoderBlock(D, H, 32)
    model = lambda tokens, lens: enc(embed(tokens), lens)  # noqa: E731
    assert check_padding(model, torch.randint(0, 11, (3, T)), LENS)
    assert not check_padding(lambda tokens, lens: enc(embed(tokens)), torch.randint(0, 11, (3, T)),
                             LENS)


# --- permutation equivariance -----------------------------------------------------------------

def test_permutation_equivariance():
    torch.manual_seed(5)
    X = seeded()
    mha, enc = MultiHeadAttention(D, H, dropout=0.3).train(), TransformerEncoderBlock(D, H, 32)
    torch_layer = nn.TransformerEncoderLayer(D, H, 32, batch_first=True)
    for model, module in ((lambda X: mha(X, X, X), mha), (enc, None), (torch_layer, None),
                          (lambda X: X.softmax(dim=-1), None)):
        result = check_permutation_equivariance(model, X, module=module)
        assert result.passed, result.message
    # a function hides its module, but the check finds it when it is called: dropout is off
    assert check_permutation_equivariance(lambda X: mha(X, X, X), X)
    # with dropout on (train mode), its masks do not move with positions
    assert not check_permutation_equivariance(lambda X: mha(X, X, X), X, mode="train")
    # positions and causal masks must break it; so must heads split without transpose
    pos = PositionalEncoding(D)
    no_transpose = CausalSelfAttention(bug="no_transpose")
    no_transpose.forward = lambda x: _unmasked(no_transpose, x)
    for model in (lambda X: enc(pos(X)), lambda X: enc(X, is_causal=True),
                  CausalSelfAttention(), no_transpose, TransformerEncoderBlock(D, H, 32,
                                                                             rotary=True)):
        result = check_permutation_equivariance(model, X)
        assert not result.passed and result.first_position is not None, result.message
        assert "did not permute the outputs" in result.message


def _unmasked(attn, x):
    """CausalSelfAttention's heads-without-transpose bug, without any mask."""
    B, T, C = x.shape
    q, k, v = map(attn.split, attn.qkv(x).split(C, dim=2))
    y = (q @ k.transpose(-2, -1) / math.sqrt(C // attn.h)).softmax(dim=-1) @ v
    return attn.out(y.transpose(1, 2).reshape(B, T, C))


def test_permutation_is_never_the_identity():
    for seed in range(20):
        result = check_permutation_equivariance(lambda X: X, torch.ones(1, 2, 1), seed=seed)
        assert result.passed and result.details["permutation"].tolist() == [1, 0]


# --- KV cache ---------------------------------------------------------------------------------

def test_kv_cache():
    torch.manual_seed(6)
    tokens = torch.randint(0, 11, (2, 10))
    good, bad = TokenLM(), TokenLM(offset_bug=True)
    bad.load_state_dict(good.state_dict())
    for prompt_len in (1, 4):
        result = check_kv_cache(good, tokens, KVCache, prompt_len=prompt_len)
        assert result.passed, result.message
        result = check_kv_cache(bad, tokens, KVCache, prompt_len=prompt_len)
        assert not result.passed and result.first_position == prompt_len, result.message
        assert "at cached step 1" in result.message
    rotary = TransformerEncoderBlock(D, H, 32, rotary=True)
    decoder = lambda X, cache: rotary(X, is_causal=True, kv_cache=cache)  # noqa: E731
    assert check_kv_cache(decoder, seeded(), KVCache, prompt_len=3, module=rotary)


def test_kv_cache_upper_left_mask_fails():
    """SDPA's is_causal=True with one new query sees only key 0 (book chapter 8)."""
    torch.manual_seed(7)
    proj = nn.Linear(D, 3 * D)

    def attend(X, cache):
        q, k, v = proj(X).chunk(3, dim=-1)
        if cache is not None:
            k, v = (t[:, 0] for t in cache.update(k[:, None], v[:, None]))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    result = check_kv_cache(attend, seeded(), KVCache, prompt_len=2, module=proj)
    assert not result.passed and result.first_position == 2, result.message


# --- finite -----------------------------------------------------------------------------------

def attention_with(fill):
    def attend(X, lens):
        scores = X @ X.transpose(1, 2) / math.sqrt(X.shape[-1])  # (B, T, T)
        keep = torch.arange(X.shape[1])[None, None, :] < lens[:, None, None]
        if fill == "d2lattn":
            return masked_softmax(scores, lens) @ X
        if fill == "where":  # an additive -inf mask, NaN rows zeroed: forward fine, backward NaN
            bias = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
            w = (scores + bias).softmax(dim=-1)
            return torch.where(keep.any(dim=-1, keepdim=True), w, 0.0) @ X
        return scores.masked_fill(~keep, fill).softmax(dim=-1) @ X
    return attend


def test_finite():
    X, lens = seeded(), torch.tensor([7, 0, 3])
    assert check_finite(attention_with("d2lattn"), X, lens)
    assert check_finite(attention_with(-1e9), X, lens)  # finite, if uniform
    result = check_finite(attention_with(float("-inf")), X, lens)
    assert not result.passed and "sequence 1, positions 0-6" in result.message
    result = check_finite(attention_with("where"), X, lens)
    assert not result.passed and "gradient with respect to the inputs" in result.message
    mha = MultiHeadAttention(D, H)
    assert check_finite(lambda X, lens: mha(X, X, X, lens), X, lens, module=mha)
    for p in mha.parameters():
        assert p.grad is None  # autograd.grad accumulates nothing


def test_finite_parameter_gradient():
    lin = nn.Linear(D, D)
    model = lambda X: lin(X).sqrt().nan_to_num()  # noqa: E731  forward finite, grads not
    result = check_finite(model, seeded(), module=lin)
    assert not result.passed and "gradient" in result.message


# --- attention weights ------------------------------------------------------------------------

def test_attention_weights():
    torch.manual_seed(8)
    scores = torch.randn(2, 4, 5, 6)
    assert check_attention_weights(scores.softmax(dim=-1))
    wrong_axis = check_attention_weights(scores.softmax(dim=-2))
    assert not wrong_axis.passed and "over the queries (dim=-2)" in wrong_axis.message
    mask = torch.ones(5, 6, dtype=torch.bool).tril()
    mask[0] = False  # an empty row
    assert check_attention_weights(masked_softmax(scores, mask=mask), mask)
    uniform = scores.masked_fill(~mask, -1e9).softmax(dim=-1)  # the magic constant
    result = check_attention_weights(uniform, mask)
    assert not result.passed and "masked key" in result.message
    nan_rows = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    result = check_attention_weights(nan_rows, mask)
    assert not result.passed and "not finite" in result.message
    mha = MultiHeadAttention(D, H)
    X = seeded()
    mha(X, X, X, LENS)
    assert check_attention_weights(mha.attention_weights,
                                   (torch.arange(T) < LENS[:, None])[:, None, None, :])


# --- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("call, match", [
    (lambda: check_causal(42, seeded()), "model must be"),
    (lambda: check_causal(lambda x: x, torch.ones(3)), "inputs must be a tensor of shape"),
    (lambda: check_causal(lambda x: x, torch.ones(2, 1, 3)), "T >= 2"),
    (lambda: check_causal(lambda x: x, torch.ones(2, 3, dtype=torch.bool)), "token ids"),
    (lambda: check_causal(lambda x: x, torch.full((1, 3, 2), math.nan)), "finite"),
    (lambda: check_causal(lambda x: x.sum(dim=1), seeded()), r"\(B, T, \.\.\.\)"),
    (lambda: check_causal(lambda x: x[:1], seeded()), "B = 3"),
    (lambda: check_causal(lambda x: x, seeded(), mode="test"), "mode"),
    (lambda: check_causal(lambda x: x, seeded(), tolerance=-1.0), "tolerance"),
    (lambda: check_causal(lambda x: x, torch.zeros(1, 3, dtype=torch.long)), "vocab_size"),
    (lambda: check_causal(lambda x: x, torch.ones(1, 3, dtype=torch.long) * 5, vocab_size=3),
     "vocab_size"),
    (lambda: check_padding(masked_mean, seeded(), torch.tensor([7, 7, 7])), "some padding"),
    (lambda: check_padding(masked_mean, seeded(), torch.tensor([7, 8, 1])), r"\[0, T\]"),
    (lambda: check_padding(masked_mean, seeded(), torch.tensor([1.0, 2.0, 3.0])), "integers"),
    (lambda: check_padding(masked_mean, seeded(), torch.tensor([1, 2])), r"\(B,\) = \(3,\)"),
    (lambda: check_kv_cache(lambda x, c: x, seeded(), KVCache, prompt_len=7), "prompt_len"),
    (lambda: check_kv_cache(lambda x, c: x, seeded(), None), "new_cache"),
    (lambda: check_attention_weights(torch.ones(3)), "weights must be"),
    (lambda: check_attention_weights(torch.ones(2, 3), torch.ones(2, 3)), "bool"),
    (lambda: check_attention_weights(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.bool)),
     "broadcast"),
    (lambda: check_finite(lambda x: x, seeded(), backward=1), "backward"),
    (lambda: check_causal(lambda x: x, seeded(), module=lambda x: x), "module"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_result_object():
    result = check_causal(lambda x: x, seeded())
    assert isinstance(result, CheckResult) and result and result.max_deviation == 0.0
    assert repr(result).startswith("<check_causal: PASSED.")
    with pytest.raises(Exception):
        result.passed = False  # frozen


# --- a check never changes anything -----------------------------------------------------------

class Everything(nn.Module):
    """Dropout, BatchNorm (running statistics), attention: every kind of state a check could touch."""

    def __init__(self):
        super().__init__()
        self.block = TransformerEncoderBlock(D, H, 32, dropout=0.3)
        self.bn = nn.BatchNorm1d(D)

    def forward(self, X, lens=None):
        if isinstance(lens, KVCache):  # called by check_kv_cache as model(chunk, cache)
            return self.block(X, is_causal=True, kv_cache=lens)
        return self.bn(self.block(X, lens).transpose(1, 2)).transpose(1, 2)


def snapshot(model):
    return ({n: t.detach().clone() for n, t in model.state_dict().items()},
            {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
            {n: m.training for n, m in model.named_modules()})


@settings(max_examples=25, deadline=None)
@given(check=st.sampled_from(["causal", "padding", "permutation", "kv_cache", "finite",
                               "batch"]),
       mode=st.sampled_from(["eval", "train"]), training=st.booleans(),
       with_grads=st.booleans(), half_eval=st.booleans(), seed=st.integers(0, 2**16))
def test_checks_never_change_the_model(check, mode, training, with_grads, half_eval, seed):
    torch.manual_seed(seed)
    model = Everything().train(training)
    if half_eval:
        model.block.ffn.eval()  # mixed modes must come back mixed
    X = torch.randn(2, 5, D)
    if with_grads:
        model(X).square().mean().backward()
    before = snapshot(model)
    X_before, lens = X.clone(), torch.tensor([5, 3])
    rng_before, np_before = torch.get_rng_state(), np.random.get_state()[1].copy()
    {"causal": lambda: check_causal(model, X, mode=mode),
     "padding": lambda: check_padding(model, X, lens, mode=mode),
     "permutation": lambda: check_permutation_equivariance(model, X, mode=mode),
     "kv_cache": lambda: check_kv_cache(model, X, KVCache, mode=mode),
     "finite": lambda: check_finite(model, X, lens, mode=mode),
     "batch": lambda: check_batch_independence(model, X, lens, mode=mode)}[check]()
    after = snapshot(model)
    for name, t in before[0].items():
        assert torch.equal(t, after[0][name]), name  # parameters and buffers
    for name, g in before[1].items():
        assert (g is None and after[1][name] is None) or torch.equal(g, after[1][name]), name
    assert before[2] == after[2]  # train/eval flag of every submodule
    assert torch.equal(X, X_before) and lens.tolist() == [5, 3]  # the caller's tensors
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global generator
    assert np.array_equal(np.random.get_state()[1], np_before)  # numpy's


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), T_=st.integers(2, 9), d=st.integers(1, 6))
def test_deterministic_and_exact_for_any_shape(seed, T_, d):
    """The same call gives the same verdict and numbers; causal functions pass any shape."""
    torch.manual_seed(seed)
    X = torch.randn(2, T_, d)
    noisy = lambda X: F.dropout(X.cumsum(dim=1), 0.5, training=True)  # noqa: E731  random
    # no prefix test: a shorter input draws other dropout masks (see check_causal's prefix)
    first = check_causal(noisy, X, seed=seed, prefix=False)
    second = check_causal(noisy, X, seed=seed, prefix=False)
    assert first.passed and second.passed and first.message == second.message
    leaky = check_causal(lambda X: X.flip(1).cumsum(dim=1).flip(1), X)  # sums the future
    assert not leaky.passed and leaky.first_position == 0
