"""d2lattn.diagnostics on the cases of issue 50: leaks a tolerance hides, false alarms a
tolerance raises, and what only an exact (gradient) verdict or a new option sees.

Every test here gives the wrong verdict (or raises, for an option that did not exist) with the
diagnostics as they were before issue 50; tests/test_diagnostics.py and
tests/test_diagnostics_fooled.py keep the earlier cases.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from d2lattn.diagnostics import (check_batch_independence, check_causal, check_padding,
                                 check_permutation_equivariance)

torch.set_num_threads(1)
D, H, T = 16, 4, 9


def seeded(seed=0, B=3, T=T, d=D):
    torch.manual_seed(seed)
    return torch.randn(B, T, d)


def text(result):
    return " ".join(result.message.split())


class Attention(nn.Module):
    """One head of self-attention whose mask is given as a function of the scores."""

    def __init__(self, d=D, mask=None, layer_scale=None, leak_scale=None, sentinel=None,
                 out_scale=1.0):
        super().__init__()
        torch.manual_seed(1)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mask, self.leak_scale, self.sentinel, self.out_scale = (
            mask, leak_scale, sentinel, out_scale)

    def forward(self, x, attention_mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        scores = q @ k.transpose(1, 2) / math.sqrt(C)  # (B, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        if self.mask == "soft":  # scores + log(mask + 1e-7): a mask that is almost one
            scores = scores + torch.log(causal.float() + 1e-7)
        elif self.mask == "or":  # causal OR not padding (True = attend): should be AND
            keep = attention_mask.bool()[:, None, :]  # (B, 1, T)
            scores = scores.masked_fill(~(causal | keep), float("-inf"))
        elif self.mask == "and":  # a padded query attends to itself alone (no NaN rows)
            keep = attention_mask.bool()[:, None, :]
            allowed = (causal & keep) | torch.eye(T, dtype=torch.bool)
            scores = scores.masked_fill(~allowed, float("-inf"))
        elif self.mask == "causal only":  # ignores attention_mask
            scores = scores.masked_fill(~causal, float("-inf"))
        else:
            scores = scores.masked_fill(~causal, float("-inf"))
        y = self.out(scores.softmax(dim=-1) @ v)  # (B, T, C)
        if self.leak_scale is not None:  # LayerScale-sized leak of the whole sequence's mean
            y = y + self.leak_scale * x.mean(dim=1, keepdim=True)
        y = y * self.out_scale
        if self.sentinel is not None:  # an action mask: one feature banned at every position
            y = torch.cat([torch.full_like(y[..., :1], self.sentinel), y[..., 1:]], dim=-1)
        return y


# --- leaks a tolerance hides --------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e-5, 1e-6])
def test_layer_scale_leak_fails_check_causal(scale):
    result = check_causal(Attention(leak_scale=scale), seeded())
    assert not result.passed and result.first_position == 0, result.message
    assert result.tolerance == 0.0 and "exactly 0 is required" in text(result)


def test_soft_mask_fails_check_causal():
    result = check_causal(Attention(mask="soft"), seeded())
    assert not result.passed and result.first_position == 0, result.message
    assert result.details["reads"] == list(range(1, T)), result.message


@pytest.mark.parametrize("sentinel", [-1e8, torch.finfo(torch.float32).min])
def test_huge_finite_feature_blinds_no_other_feature(sentinel):
    model = Attention(leak_scale=1e-3, sentinel=sentinel)
    assert not check_causal(model, seeded())
    assert not check_causal(model, seeded(), exact=False)  # per-feature tolerances see it too
    assert check_causal(Attention(sentinel=sentinel), seeded())


def test_tiny_outputs_leak_fails():
    model = Attention(leak_scale=1e-2, out_scale=1e-6)
    assert not check_causal(model, seeded())
    assert not check_causal(model, seeded(), exact=False)  # no max(1, size) floor any more
    assert check_causal(Attention(out_scale=1e-6), seeded())


def test_bfloat16_probabilities_leak_fails():
    model = Attention(leak_scale=1e-3).to(torch.bfloat16)
    result = check_causal(lambda x: model(x).softmax(dim=-1), seeded().to(torch.bfloat16))
    assert not result.passed, result.message


def test_path_chosen_by_grad_mode_fails():
    causal, leaky = Attention(), Attention(leak_scale=1.0)

    def model(x):  # causal at inference, leaky when training computes gradients
        return leaky(x) if torch.is_grad_enabled() else causal(x)

    result = check_causal(model, seeded())
    assert not result.passed and "torch.is_grad_enabled()" in text(result), result.message
    lens = torch.tensor([T, 5, 3])
    assert not check_padding(lambda x, lens: model(x), seeded(), lens)
    assert not check_batch_independence(model, seeded())


class FutureGradient(torch.autograd.Function):
    """Identity forward; the backward hands position t's gradient to position t + 1 too."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad + F.pad(grad[:, :-1], (0, 0, 1, 0))


def test_leak_only_in_gradients_fails():
    block = Attention()
    result = check_causal(lambda x: block(FutureGradient.apply(x)), seeded())
    assert not result.passed and result.first_position == 0, result.message
    assert "non-zero gradient" in text(result)


# --- false alarms a tolerance raises ------------------------------------------------------------

def test_reduced_matmul_precision_raises_no_false_alarm():
    before = torch.get_float32_matmul_precision()
    try:
        for precision in ("high", "medium"):
            torch.set_float32_matmul_precision(precision)
            result = check_causal(Attention(), seeded())
            assert result.passed, result.message
            # the tolerance follows the precision in force (TF32, bfloat16 products)
            assert result.tolerance > 1e-4, (precision, result.tolerance)
            assert not check_causal(Attention(mask="soft"), seeded())  # exact: still caught
    finally:
        torch.set_float32_matmul_precision(before)


def test_banned_logit_minus_inf_is_compared():
    block = Attention()

    def lm(x):
        y = block(x)
        return torch.cat([torch.full_like(y[..., :1], float("-inf")), y[..., 1:]], dim=-1)

    result = check_causal(lm, seeded())
    assert result.passed, result.message
    leaky = Attention(mask="soft")
    assert not check_causal(lambda x: torch.cat([torch.full_like(x[..., :1], float("-inf")),
                                                  leaky(x)[..., 1:]], dim=-1), seeded())


# --- causality with masks -----------------------------------------------------------------------

def test_causal_and_padding_combined_with_or_fails():
    lens = torch.tensor([T, 6, 4])
    good = check_causal(Attention(mask="and"), seeded(), lens, mask_name="attention_mask")
    assert good.passed, good.message
    bad = check_causal(Attention(mask="or"), seeded(), lens, mask_name="attention_mask")
    assert not bad.passed, bad.message


def test_left_padding_ignored_by_the_model_fails():
    lens = torch.tensor([T, 6, 4])
    good = check_causal(Attention(mask="and"), seeded(), lens, mask_name="attention_mask",
                        padding_side="left")
    assert good.passed, good.message
    bad = check_causal(Attention(mask="causal only"), seeded(), lens,
                       mask_name="attention_mask", padding_side="left")
    assert not bad.passed and "padding" in text(bad), bad.message
    # right padding hides this bug from a causal check: the padding is in the future
    assert check_causal(Attention(mask="causal only"), seeded(), lens,
                        mask_name="attention_mask")


def test_mask_convention_ignore():
    lens = torch.tensor([T, 6, 4])
    block = Attention(mask="and")
    result = check_causal(lambda x, key_padding_mask: block(x, (~key_padding_mask).long()),
                          seeded(), lens, mask_name="key_padding_mask", mask_convention="ignore")
    assert result.passed, result.message


# --- batches ------------------------------------------------------------------------------------

def test_batch_sorted_and_never_unsorted_fails():
    block = Attention()

    def model(x, lens):  # sorts the batch by length (descending) and returns it sorted
        order = lens.argsort(descending=True, stable=True)
        keep = torch.arange(x.shape[1])[None, :] < lens[order][:, None]
        return block(x[order]) * keep[..., None]

    lens = torch.tensor([T, 6, 4])  # already sorted: every sequence alone gets its outputs
    result = check_batch_independence(model, seeded(), lens)
    assert not result.passed and "another order" in text(result), result.message


def test_batch_mixing_by_a_tiny_amount_fails():
    block = Attention()
    result = check_batch_independence(lambda x: block(x) + 1e-7 * x.roll(1, dims=0), seeded())
    assert not result.passed and "non-zero gradient" in text(result), result.message


# --- the cost -----------------------------------------------------------------------------------

def test_check_causal_calls_the_model_a_fixed_number_of_times():
    calls = []
    block = Attention()

    def model(x):
        calls.append(x.shape[1])
        return block(x)

    for length in (32, 128):
        calls.clear()
        assert check_causal(model, seeded(T=length, B=2))
        # 1 reference + 1 with gradients + 8 cuts changed + 8 prefixes (was 2 T)
        assert len(calls) == 18, (length, len(calls))


# --- permutations, weights, state, randomness ---------------------------------------------------

def circular_convolution(x):
    """Equivariant to cyclic shifts only: y_t = x_t + 2 x_{t-1} (indices mod T)."""
    return x + 2 * x.roll(1, dims=1)


@pytest.mark.parametrize("length", [3, 6])
def test_circular_convolution_is_not_permutation_equivariant(length):
    for seed in range(5):
        result = check_permutation_equivariance(circular_convolution, seeded(T=length), seed=seed)
        assert not result.passed, (seed, result.message)


def test_pairwise_outputs_are_permuted_on_both_axes():
    def scores(x):  # (B, T, T): equivariant when both axes are permuted
        return x @ x.transpose(1, 2)

    assert check_permutation_equivariance(scores, seeded())
    assert not check_permutation_equivariance(lambda x: scores(x).cumsum(dim=2), seeded())


def test_attention_weights_tolerance_cannot_hide_masked_weight():
    from d2lattn.diagnostics import check_attention_weights
    K = 1000
    mask = torch.zeros(1, 1, K, dtype=torch.bool)
    mask[..., :10] = True
    w = torch.full((1, 1, K), 0.92 / (K - 10))
    w[..., :10] = 0.008  # 8% on the 10 keys it may attend to, 92% on the masked ones
    result = check_attention_weights(w, mask, tolerance=1e-3)
    assert not result.passed and "masked key" in result.message, result.message


class Counter(nn.Module):
    """Reassigns its step buffer and a Parameter in training mode; the output grows with
    the step (a warm-up), so each run sees another step unless the state is put back."""

    def __init__(self):
        super().__init__()
        self.register_buffer("step", torch.zeros(()))
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        if self.training:
            self.step = self.step + 1  # a new tensor, not an in-place change
            self.scale = nn.Parameter(self.scale.detach() * 1.0)
        return x.cumsum(dim=1) * self.scale * (1 + self.step)


def test_reassigned_buffers_and_parameters_are_restored_and_raise_no_alarm():
    model = Counter().train()
    step, scale = model.step, model.scale
    result = check_causal(model, seeded(), mode="train")
    assert result.passed, result.message
    assert model.step is step and float(model.step) == 0 and model.scale is scale


def test_lazy_modules_are_materialised_not_a_crash():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(4))
    assert check_batch_independence(model, seeded())
    assert not check_batch_independence(lambda x: model(x) + model(x).mean(0), seeded())


def test_model_that_samples_raises_no_false_alarm():
    block = Attention()

    def noisy(x):  # draws depend on the tensor's shape
        return block(x) + 0.1 * torch.randn_like(x)

    assert check_causal(noisy, seeded()), check_causal(noisy, seeded()).message
    assert check_batch_independence(noisy, seeded())
    assert not check_causal(lambda x: noisy(x) + x.flip(1), seeded())


# --- KV caches fed in chunks --------------------------------------------------------------------

class ChunkedDecoder(nn.Module):
    """Causal attention over a cache of keys and values, with two bugs that only a chunk of
    several positions appended to a non-empty cache shows."""

    def __init__(self, bug=None, d=D):
        super().__init__()
        torch.manual_seed(2)
        self.qkv, self.bug = nn.Linear(d, 3 * d), bug
        self.pos = nn.Parameter(torch.randn(64, d))

    def forward(self, x, cache):
        cache = {} if cache is None else cache  # new_cache=dict: an empty dict
        for key, empty in (("k", x[:, :0]), ("v", x[:, :0]), ("calls", 0)):
            cache.setdefault(key, empty)
        start = cache["calls"] if self.bug == "calls" else cache["k"].shape[1]
        x = x + self.pos[start:start + x.shape[1]]
        q, k, v = self.qkv(x).split(x.shape[-1], dim=2)
        cache["k"] = k = torch.cat([cache["k"], k], dim=1)
        cache["v"] = v = torch.cat([cache["v"], v], dim=1)
        cache["calls"] += 1
        T_new, K = q.shape[1], k.shape[1]
        if self.bug == "top-left":  # is_causal = T_new > 1: the mask from the top-left corner
            return F.scaled_dot_product_attention(q, k, v, is_causal=T_new > 1)
        allowed = torch.ones(T_new, K, dtype=torch.bool).tril(diagonal=K - T_new)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


@pytest.mark.parametrize("bug", [None, "top-left", "calls"])
def test_kv_cache_chunks_appended_to_a_non_empty_cache(bug):
    from d2lattn.diagnostics import check_kv_cache
    model = ChunkedDecoder(bug)
    result = check_kv_cache(model, seeded(T=10), dict)
    if bug is None:
        assert result.passed, result.message
    else:
        assert not result.passed and "chunk" in text(result), result.message
        # one position at a time after the prompt, both bugs pass unseen
        assert check_kv_cache(model, seeded(T=10), dict, chunks=False)


def fft_causal_convolution(x, kernel):
    """y_t = sum_j kernel_j x_{t-j}, by the convolution theorem (zero padded)."""
    T, n = x.shape[1], 2 * x.shape[1] + kernel.numel()
    X = torch.fft.rfft(x, n=n, dim=1)
    K = torch.fft.rfft(kernel.to(x.dtype), n=n)[None, :, None]
    return torch.fft.irfft(X * K, n=n, dim=1)[:, :T]


def test_fft_causal_convolution_in_float64_passes_the_exact_test():
    kernel = torch.randn(5, generator=torch.Generator().manual_seed(0))
    X = seeded().double()
    result = check_causal(lambda x: fft_causal_convolution(x, kernel), X)
    assert result.passed and result.details["exact"] is True, result.message
    leaky = lambda x: fft_causal_convolution(x, kernel) + 1e-9 * x.flip(1)  # noqa: E731
    assert not check_causal(leaky, X)
