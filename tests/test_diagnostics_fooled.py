"""d2lattn.diagnostics against models built to fool it (issue 39): one test per way a check
could be fooled or raise a false alarm, each of which passed (or failed) wrongly before.

Every test here fails with the diagnostics as they were before the fix (a leak passed, a
correct model failed, state changed, or the option did not exist); tests/test_diagnostics.py
holds the classic bugs and the correct models.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import d2lattn.diagnostics as diagnostics
from d2lattn import KVCache, MultiHeadAttention, TransformerEncoderBlock
from d2lattn.diagnostics import (check_attention_weights, check_causal, check_finite,
                                 check_kv_cache, check_padding, check_permutation_equivariance)

torch.set_num_threads(1)
D, H, T = 16, 4, 7
LENS = torch.tensor([7, 4, 2])


def seeded(seed=0, B=3, T=T, d=D):
    torch.manual_seed(seed)
    return torch.randn(B, T, d)


def keep_of(lens, T):
    """(B, T) bool, True = a valid position."""
    return torch.arange(T)[None, :] < lens[:, None]


# --- a leak that shows only as NaN ------------------------------------------------------------

def nan_only_causal(X):
    """Causal in its values, but position t becomes NaN when position t + 1 turns negative."""
    nxt = torch.cat([X[:, 1:], torch.ones_like(X[:, :1])], dim=1)
    return X.cumsum(dim=1) + 0.0 * nxt.log()  # log(< 0) = NaN; 0 * NaN = NaN


def test_nan_only_leak_fails_check_causal():
    X = seeded().abs() + 1.0  # all positive: the reference run is finite
    result = check_causal(nan_only_causal, X)
    assert not result.passed and result.first_position is not None, result.message
    assert result.max_deviation == float("inf") and "inf" in result.message


def test_nan_only_leak_fails_check_padding():
    def model(X, lens):
        padded = ~keep_of(lens, X.shape[1])
        # valid outputs are NaN when the padding holds a value below 0.5; finite otherwise
        poison = 0.0 * (X.masked_fill(~padded[..., None], 1.0) - 0.5).log()
        return (X + poison.sum(dim=1, keepdim=True)).masked_fill(padded[..., None], 0.0)

    X = seeded().masked_fill(~keep_of(LENS, T)[..., None], 1.0)  # the padding holds 1.0
    result = check_padding(model, X, LENS)
    assert not result.passed and result.max_deviation == float("inf"), result.message


def test_nan_only_leak_fails_check_permutation_equivariance():
    def model(X):  # NaN when the positions are not in increasing order of the first feature
        steps = X[:, 1:, :1] - X[:, :-1, :1]
        return X + 0.0 * steps.log().sum(dim=1, keepdim=True)

    X = torch.arange(T, dtype=torch.float32)[None, :, None].expand(2, T, 3).contiguous()
    result = check_permutation_equivariance(model, X)
    assert not result.passed and result.max_deviation == float("inf"), result.message


# --- a sentinel (-inf, -1e9) widens every tolerance -------------------------------------------

@pytest.mark.parametrize("sentinel", [float("-inf"), -1e9])
def test_sentinel_at_padded_positions_hides_no_padding_leak(sentinel):
    def leaky(X, lens):  # reads the padding (an unmasked mean), then writes a sentinel there
        padded = ~keep_of(lens, X.shape[1])
        return (X + X.mean(dim=1, keepdim=True)).masked_fill(padded[..., None], sentinel)

    result = check_padding(leaky, seeded(), LENS)
    assert not result.passed, result.message
    assert result.tolerance <= 1e-4 and result.max_deviation > 0.01


def test_sentinel_beside_a_causal_leak():
    def leaky(X):  # position 0 reads position 1 by 0.5; the last position holds -1e9
        out = X.clone()
        out[:, 0] = X[:, 0] + 0.5 * X[:, 1]
        out[:, -1] = -1e9
        return out

    result = check_causal(leaky, seeded())
    assert not result.passed and result.first_position == 0, result.message
    assert result.tolerance <= 1e-4


# --- check_attention_weights: bounds that grow with K -----------------------------------------

@pytest.mark.parametrize("dtype, K", [(torch.float32, 4096), (torch.float16, 256),
                                      (torch.bfloat16, 128)])
def test_uniform_weight_on_masked_keys_fails_at_any_k(dtype, K):
    mask = torch.ones(2, K, dtype=torch.bool)
    mask[:, K // 2:] = False  # the second half of the keys is masked
    weights = torch.full((2, K), 1.0 / K, dtype=dtype)  # uniform: 1/K on each masked key too
    result = check_attention_weights(weights, mask)
    assert not result.passed and "masked key" in result.message, result.message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_summing_to_two_fail_at_any_k(dtype):
    weights = 2 * torch.randn(4, 128).softmax(dim=-1)
    result = check_attention_weights(weights.to(dtype))
    assert not result.passed and "does not sum" in result.message, result.message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("K", [5, 128, 4096])
def test_correct_softmax_passes_at_any_k(dtype, K):
    """No false alarm from the fixed bounds: a softmax computed in the dtype, masked or not."""
    torch.manual_seed(K)
    scores = (3 * torch.randn(3, 8, K)).to(dtype)
    mask = torch.rand(3, 8, K) < 0.7
    mask[0, 0] = False  # an empty row
    assert check_attention_weights(scores.softmax(dim=-1))
    from d2lattn import masked_softmax
    assert check_attention_weights(masked_softmax(scores, mask=mask), mask)


# --- outputs that depend on the sequence length -----------------------------------------------

@pytest.mark.parametrize("name, model", [
    ("sum divided by T", lambda X: X.cumsum(dim=1) / X.shape[1]),
    ("positions counted from the end",
     lambda X: X * torch.arange(X.shape[1], 0, -1, dtype=X.dtype)[:, None]),
])
def test_length_leak_fails_check_causal(name, model):
    result = check_causal(model, seeded())
    assert not result.passed and result.first_position == 0, result.message
    assert "depend on the sequence length" in result.message
    assert check_causal(model, seeded(), prefix=False).passed  # what the old check saw


def test_prefix_test_errors_clearly_on_fixed_length_models():
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    layer = nn.TransformerEncoderLayer(D, H, 32, batch_first=True)
    fixed = lambda X: layer(X, src_mask=mask, is_causal=True)  # noqa: E731  length T only
    with pytest.raises(ValueError, match="prefix=False"):
        check_causal(fixed, seeded())
    assert check_causal(fixed, seeded(), prefix=False)


# --- one permutation with a fixed point ------------------------------------------------------

def test_special_case_at_a_fixed_point_fails():
    # the old check drew one permutation, which for T = 7 and seed 0 keeps position 3 in place
    assert int(torch.randperm(T, generator=torch.Generator().manual_seed(0))[3]) == 3
    special = lambda X: X * (1 + (torch.arange(X.shape[1]) == 3).to(X.dtype))[:, None]  # noqa
    result = check_permutation_equivariance(special, seeded())
    assert not result.passed, result.message
    for perm in result.details["permutations"]:
        assert not bool((perm == torch.arange(T)).any())  # derangements
    assert len(result.details["permutations"]) == 2


# --- a correct model that writes into its input ----------------------------------------------

def test_model_writing_into_its_input_is_no_leak():
    def scales_in_place(X):  # causal, but doubles its input in place
        X.mul_(2)
        return X.cumsum(dim=1)

    X = seeded()
    before = X.clone()
    result = check_causal(scales_in_place, X)
    assert result.passed, result.message
    assert torch.equal(X, before)  # the caller's tensor is untouched


def test_padding_model_writing_into_its_input():
    def zeroes_padding_in_place(X, lens):  # correct masking, by writing zeros into X
        X[~keep_of(lens, X.shape[1])] = 0.0
        lens += 0  # and touches the lengths (in place, a no-op)
        return X.cumsum(dim=1)

    X, lens = seeded(), LENS.clone()
    before = X.clone()
    assert check_padding(zeroes_padding_in_place, X, lens)
    assert torch.equal(X, before) and lens.tolist() == LENS.tolist()
    assert check_finite(zeroes_padding_in_place, X, lens)
    assert torch.equal(X, before)


# --- a correct encoder that masks by pad id; (B, T) outputs ----------------------------------

PAD = 0


class PadIdEncoder(nn.Module):
    """Token ids -> (B, T, d); finds its padding by the pad id (as Hugging Face tokenizers
    mark it), so it ignores valid_lens."""

    def __init__(self, vocab=11):
        super().__init__()
        self.embed = nn.Embedding(vocab, D)
        self.block = TransformerEncoderBlock(D, H, 32)

    def forward(self, tokens, lens=None):
        return self.block(self.embed(tokens), (tokens != PAD).sum(dim=1))


def pad_tokens(seed=0):
    tokens = torch.randint(1, 11, (3, T), generator=torch.Generator().manual_seed(seed))
    return tokens.masked_fill(~keep_of(LENS, T), PAD)


def test_pad_id_masking_passes_and_its_absence_fails():
    torch.manual_seed(0)
    encoder = PadIdEncoder()
    result = check_padding(encoder, pad_tokens(), LENS, pad_id=PAD)
    assert result.passed, result.message
    no_mask = lambda tokens, lens: encoder.block(encoder.embed(tokens))  # noqa: E731
    assert not check_padding(no_mask, pad_tokens(), LENS, pad_id=PAD)
    with pytest.raises(ValueError, match="pad id"):
        check_padding(encoder, pad_tokens().masked_fill(~keep_of(LENS, T), 3), LENS, pad_id=PAD)


def test_per_position_scores_are_not_read_as_pooled():
    torch.manual_seed(0)
    enc = TransformerEncoderBlock(D, H, 32)
    scores = lambda X, lens: enc(X, lens)[..., 0]  # noqa: E731  (B, T): one per position
    result = check_padding(scores, seeded(), LENS)
    assert result.passed and result.details["pooled"] is False, result.message
    leaky = lambda X, lens: enc(X)[..., 0]  # noqa: E731
    result = check_padding(leaky, seeded(), LENS)
    assert not result.passed and "pooled" not in result.message, result.message
    assert result.details["pooled"] is False


# --- no module found: honest message, no state changed ---------------------------------------

class NotAModule:
    """A callable object that holds a BatchNorm (in training mode) and is no nn.Module."""

    def __init__(self):
        self.norm = nn.BatchNorm1d(D).train()

    def __call__(self, X):
        return self.norm(X.transpose(1, 2)).transpose(1, 2)


def test_modules_a_function_calls_are_held_still():
    model = NotAModule()
    result = check_causal(model, seeded())
    assert result.passed and "eval mode" in result.message, result.message  # found and set
    assert int(model.norm.num_batches_tracked) == 0 and model.norm.training
    assert torch.equal(model.norm.running_mean, torch.zeros(D))
    assert not check_causal(model, seeded(), mode="train")  # batch statistics leak
    assert int(model.norm.num_batches_tracked) == 0 and model.norm.training


def test_no_module_message_claims_no_mode():
    result = check_causal(lambda X: X.cumsum(dim=1), seeded())
    assert "eval mode" not in result.message and "no nn.Module" in result.message


# --- batch mixing ----------------------------------------------------------------------------

def batch_models():
    torch.manual_seed(9)
    mha = nn.MultiheadAttention(D, H)  # (T, B, C) layout

    def time_first(X, bug):
        B, T_, C = X.shape
        Y = X.view(T_, B, C) if bug else X.transpose(0, 1)  # (T, B, C)
        out = mha(Y, Y, Y, need_weights=False)[0]
        return out.view(B, T_, C) if bug else out.transpose(0, 1)  # (B, T, C)

    return {
        "transpose (correct)": (lambda X: time_first(X, False), True),
        "view for a transpose": (lambda X: time_first(X, True), False),
        "sequence b reads b - 1": (lambda X: X + 0.5 * X.roll(1, dims=0), False),
        "per-sequence softmax (correct)": (lambda X: X.softmax(dim=1), True),
    }


@pytest.mark.parametrize("name", list(batch_models()))
def test_check_batch_independence(name):
    model, independent = batch_models()[name]
    result = diagnostics.check_batch_independence(model, seeded())
    assert result.passed == independent, result.message
    if not independent:
        assert "read other sequences" in result.message


def test_batch_independence_with_padding_and_batchnorm():
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H)
    check = diagnostics.check_batch_independence
    assert check(lambda X, lens: mha(X, X, X, lens), seeded(), LENS)
    bn = nn.BatchNorm1d(D)
    model = lambda X: bn(X.transpose(1, 2)).transpose(1, 2)  # noqa: E731
    assert check(model, seeded())
    assert not check(model, seeded(), mode="train")  # batch statistics mix the batch
    with pytest.raises(ValueError, match="B >= 2"):
        check(lambda X: X, seeded(B=1))


# --- mode="train" and numpy's generator ------------------------------------------------------

def numpy_noisy(X, cache=None):
    """A model that draws from numpy's (and Python's) global generators."""
    return X + float(np.random.rand()) + random.random()


def test_numpy_generator_reseeded_and_restored():
    np.random.seed(123)
    random.seed(123)
    np_state, py_state = np.random.get_state(), random.getstate()
    X = seeded()
    assert check_causal(lambda X: numpy_noisy(X).cumsum(dim=1), X)
    assert check_kv_cache(numpy_noisy, X, KVCache)
    assert check_permutation_equivariance(numpy_noisy, X)
    after = np.random.get_state()
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np_state, after))
    assert random.getstate() == py_state


def test_kv_cache_train_mode_is_documented():
    doc = check_kv_cache.__doc__
    assert 'mode="train"' in doc and "dropout" in doc and "fails" in doc
    torch.manual_seed(0)
    block = TransformerEncoderBlock(D, H, 32, dropout=0.3)
    decoder = lambda X, cache: block(X, is_causal=True, kv_cache=cache)  # noqa: E731
    assert check_kv_cache(decoder, seeded(), KVCache, module=block)
    assert not check_kv_cache(decoder, seeded(), KVCache, module=block, mode="train")
    block0 = TransformerEncoderBlock(D, H, 32, dropout=0.0)
    decoder0 = lambda X, cache: block0(X, is_causal=True, kv_cache=cache)  # noqa: E731
    assert check_kv_cache(decoder0, seeded(), KVCache, module=block0, mode="train")


# --- a pass reports its largest deviation -----------------------------------------------------

def test_passes_report_their_largest_deviation():
    torch.manual_seed(0)
    enc = TransformerEncoderBlock(D, H, 32)
    X = seeded()
    results = [
        check_causal(lambda X: enc(X, is_causal=True), X),
        check_padding(enc, X, LENS),
        check_permutation_equivariance(enc, X),
        check_kv_cache(lambda X, c: enc(X, is_causal=True, kv_cache=c), X, KVCache),
        diagnostics.check_batch_independence(enc, X),
    ]
    for result in results:
        assert result.passed, result.message
        assert "the largest deviation is" in " ".join(result.message.split()), result.message
        assert 0 <= result.max_deviation <= result.tolerance
    # a near miss shows: a deviation just under the tolerance is reported as such
    # (exact=False: the gradient test finds this leak of 5e-6, as it should; issue 50)
    near = check_causal(lambda X: X + 0.3e-5 * X.flip(1).cumsum(dim=1).tanh(), X, exact=False)
    assert near.passed and near.max_deviation > 0.1 * near.tolerance, near.message


# --- keyword inputs and dict / ModelOutput outputs --------------------------------------------

class ModelOutput(OrderedDict):
    """Like transformers' ModelOutput: a dict whose keys are also attributes."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class HFStyle(nn.Module):
    """Called as Hugging Face models are: model(input_ids=..., attention_mask=...)."""

    def __init__(self, vocab=11, causal=False):
        super().__init__()
        self.embed, self.causal = nn.Embedding(vocab, D), causal
        self.block = TransformerEncoderBlock(D, H, 32, dropout=0.2)
        self.head = nn.Linear(D, vocab)

    def forward(self, input_ids=None, attention_mask=None, return_dict=True):
        lens = None if attention_mask is None else attention_mask.sum(dim=1)
        hidden = self.block(self.embed(input_ids), lens, is_causal=self.causal)
        out = ModelOutput(last_hidden_state=hidden, logits=self.head(hidden))
        return out if return_dict else tuple(out.values())


def test_hugging_face_style_model_without_a_wrapper():
    torch.manual_seed(0)
    tokens = torch.randint(0, 11, (3, T))
    lm, encoder = HFStyle(causal=True), HFStyle()
    assert check_causal(lm, tokens, input_name="input_ids", output="logits", vocab_size=11)
    assert not check_causal(encoder, tokens, input_name="input_ids", output="logits")
    call = dict(input_name="input_ids", mask_name="attention_mask")
    assert check_padding(encoder, tokens, LENS, output="last_hidden_state", **call)
    assert check_padding(encoder, tokens, LENS, output=lambda out: out.logits, **call)
    assert check_finite(encoder, tokens, LENS, output="logits", **call)
    assert diagnostics.check_batch_independence(encoder, tokens, LENS, output="logits", **call)
    assert check_permutation_equivariance(encoder, tokens, input_name="input_ids", output=0,
                                          kwargs={"return_dict": False})
    with pytest.raises(ValueError, match="output="):
        check_causal(lm, tokens, input_name="input_ids")  # a dict: which tensor?
    with pytest.raises(ValueError, match="no such key"):
        check_causal(lm, tokens, input_name="input_ids", output="hidden_states")
    with pytest.raises(ValueError, match="mask_name"):
        check_padding(encoder, tokens, LENS, input_name="input_ids")
    with pytest.raises(ValueError, match="kwargs must not hold"):
        check_causal(lm, tokens, input_name="input_ids", kwargs={"input_ids": tokens})


# --- messages fit the page -------------------------------------------------------------------

def test_messages_lines_fit_88_characters():
    torch.manual_seed(0)
    X, long_X = seeded(), seeded(T=300, B=2, d=4)
    enc = TransformerEncoderBlock(D, H, 32)
    weights = torch.randn(2, 3, 4, 5).softmax(dim=-2)
    results = [
        check_causal(lambda X: X + X.roll(-1, dims=1), long_X),
        check_causal(lambda X: X.cumsum(dim=1) / X.shape[1], long_X, tolerance=1e-300),
        check_causal(lambda X: X.cumsum(dim=1), X),
        check_padding(lambda X, lens: X.mean(dim=1), X, LENS),
        check_padding(lambda X, lens: X - X.mean(dim=1, keepdim=True), X, LENS),
        check_padding(enc, X, LENS),
        check_permutation_equivariance(lambda X: X.cumsum(dim=1), long_X),
        check_kv_cache(lambda X, c: X if c is None else X * 2, X, KVCache),
        check_finite(lambda X: X.log(), X),
        check_attention_weights(weights),
        check_attention_weights(weights.transpose(-1, -2).softmax(dim=-1)),
        diagnostics.check_batch_independence(lambda X: X.roll(1, dims=0), long_X),
    ]
    for result in results:
        for text in (result.message, str(result)):
            lines = text.splitlines()
            assert max(len(line) for line in lines) <= 88, text
            assert len(lines) >= 1 and "\n\n" not in text
    assert any(len(str(r).splitlines()) > 1 for r in results)  # long ones were wrapped


# --- a check never changes anything, numpy's generator included -------------------------------

def test_batch_independence_changes_nothing():
    torch.manual_seed(0)
    model = TransformerEncoderBlock(D, H, 32, dropout=0.3).train()
    bn = nn.BatchNorm1d(D).train()
    state = {k: v.clone() for k, v in list(model.state_dict().items()) + list(
        bn.state_dict().items())}
    X = seeded()
    before, rng = X.clone(), torch.get_rng_state()
    diagnostics.check_batch_independence(
        lambda X: bn(model(X).transpose(1, 2)).transpose(1, 2), X, mode="train")
    after = dict(list(model.state_dict().items()) + list(bn.state_dict().items()))
    assert all(torch.equal(v, after[k]) for k, v in state.items())
    assert model.training and bn.training and torch.equal(X, before)
    assert torch.equal(torch.get_rng_state(), rng)


# --- the GPU (only where there is one) -------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_inputs_and_generator():
    device = torch.device("cuda")
    torch.manual_seed(0)
    block = TransformerEncoderBlock(D, H, 32, dropout=0.3).to(device)
    X = seeded().to(device)
    noisy = lambda X: F.dropout(X, 0.5, training=True).cumsum(dim=1)  # noqa: E731  CUDA RNG
    cuda_state = torch.cuda.get_rng_state(device)
    assert check_causal(lambda X: block(X, is_causal=True), X)
    assert check_causal(noisy, X, prefix=False)
    assert check_padding(block, X, LENS.to(device))
    assert check_permutation_equivariance(block, X)
    assert check_kv_cache(lambda X, c: block(X, is_causal=True, kv_cache=c), X, KVCache)
    assert diagnostics.check_batch_independence(block, X)
    assert check_finite(block, X, LENS.to(device))
    assert torch.equal(torch.cuda.get_rng_state(device), cuda_state)
    weights = torch.randn(2, 3, 5, device=device).softmax(dim=-1)
    assert check_attention_weights(weights, torch.ones(3, 5, dtype=torch.bool, device=device))
