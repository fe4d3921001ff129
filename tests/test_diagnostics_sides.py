"""d2lattn.diagnostics, the last cases of issue 50: left padding and both mask conventions in
every check that takes padding, outputs of a static length, rounding that is not a leak (an FFT
in float32), and half-precision models decided in a float64 copy.

Each test gives the wrong verdict (or raises, for an option that did not exist) with the
diagnostics before these changes; tests/test_diagnostics*.py keep the earlier cases.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from d2lattn.diagnostics import check_batch_independence, check_causal, check_padding

torch.set_num_threads(1)
D, T = 16, 9
LENS = torch.tensor([T, 6, 4])


def seeded(seed=0, B=3, T=T, d=D):
    torch.manual_seed(seed)
    return torch.randn(B, T, d)


def text(result):
    return " ".join(result.message.split())


def keep_of(lens, T, side):
    """(B, T) bool, True at the valid positions."""
    positions = torch.arange(T)[None, :]
    return positions < lens[:, None] if side == "right" else positions >= T - lens[:, None]


class Encoder(nn.Module):
    """One head of self-attention over the valid keys, told by an ``attention_mask`` (1 =
    valid) or a ``key_padding_mask`` (True = padding). ``bug="right"`` counts the valid
    positions and assumes they come first (right padding); ``bug="none"`` ignores the mask."""

    def __init__(self, bug=None, d=D):
        super().__init__()
        torch.manual_seed(1)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.bug = bug

    def forward(self, x, attention_mask=None, key_padding_mask=None):
        B, T, C = x.shape
        keep = (~key_padding_mask if key_padding_mask is not None
                else attention_mask.bool())  # (B, T)
        if self.bug == "right":
            keep = torch.arange(T)[None, :] < keep.sum(dim=1, keepdim=True)
        q, k, v = self.qkv(x).split(C, dim=2)
        scores = q @ k.transpose(1, 2) / math.sqrt(C)  # (B, T, T)
        if self.bug != "none":
            scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        return self.out(scores.softmax(dim=-1) @ v)  # (B, T, C)


# --- check_padding: left padding, both conventions ----------------------------------------------

@pytest.mark.parametrize("convention", ["keep", "ignore"])
def test_check_padding_left_padding(convention):
    name = "attention_mask" if convention == "keep" else "key_padding_mask"
    options = dict(mask_name=name, padding_side="left", mask_convention=convention)
    result = check_padding(Encoder(), seeded(), LENS, **options)
    assert result.passed and result.details["exact"] is True, result.message
    # a model that assumes right padding reads the left padding at every valid position
    bad = check_padding(Encoder(bug="right"), seeded(), LENS, **options)
    assert not bad.passed and "padding" in text(bad), bad.message
    assert bad.details["sequence"] == 1 and bad.first_position == T - 6, bad.message
    assert not check_padding(Encoder(bug="none"), seeded(), LENS, **options)
    # the same model with right padding passes: the bug needs the left side to show
    right = dict(mask_name=name, mask_convention=convention)
    assert check_padding(Encoder(bug="right"), seeded(), LENS, **right)


def test_check_padding_left_padding_perturbation_tests_alone():
    """The sequences run alone are the last valid_lens[b] positions: a correct model passes
    the perturbation tests without the exact test too, a model that assumes right padding
    fails them."""
    options = dict(mask_name="attention_mask", padding_side="left", exact=False)
    assert check_padding(Encoder(), seeded(), LENS, **options)
    bad = check_padding(Encoder(bug="right"), seeded(), LENS, **options)
    assert not bad.passed and bad.details["exact"] is False, bad.message


def test_check_padding_left_padding_with_pad_id():
    torch.manual_seed(0)
    embed, block = nn.Embedding(11, D), Encoder()
    tokens = torch.randint(1, 11, (3, T)).masked_fill(~keep_of(LENS, T, "left"), 0)

    def model(ids, attention_mask):
        return block(embed(ids), attention_mask)

    assert check_padding(model, tokens, LENS, pad_id=0, mask_name="attention_mask",
                         padding_side="left")
    with pytest.raises(ValueError, match="pad id"):  # the padding is not on the right
        check_padding(model, tokens, LENS, pad_id=0, mask_name="attention_mask")


def test_mask_options_need_mask_name():
    for check in (check_padding, check_batch_independence):
        with pytest.raises(ValueError, match="need mask_name"):
            check(lambda x, lens: x, seeded(), LENS, padding_side="left")
        with pytest.raises(ValueError, match="need mask_name"):
            check(lambda x, lens: x, seeded(), LENS, mask_convention="ignore")
        with pytest.raises(ValueError, match="padding_side must be"):
            check(lambda x, m: x, seeded(), LENS, mask_name="m", padding_side="top")
        with pytest.raises(ValueError, match="mask_convention must be"):
            check(lambda x, m: x, seeded(), LENS, mask_name="m", mask_convention="drop")


# --- check_batch_independence: left padding, both conventions -----------------------------------

class PaddedRowsMixed(nn.Module):
    """Per-sequence work at the valid positions; the outputs at padded positions are the
    batch's mean (nobody should read them). ``bug=True`` mixes the batch at valid positions."""

    def __init__(self, bug=False):
        super().__init__()
        self.encoder, self.bug = Encoder(), bug

    def forward(self, x, attention_mask=None, key_padding_mask=None):
        y = self.encoder(x, attention_mask, key_padding_mask)
        keep = (~key_padding_mask if key_padding_mask is not None
                else attention_mask.bool())[..., None]  # (B, T, 1)
        mixed = y.mean(dim=0, keepdim=True).expand_as(y)
        if self.bug:
            return y + 1e-3 * mixed
        return torch.where(keep, y, mixed)


@pytest.mark.parametrize("convention", ["keep", "ignore"])
def test_check_batch_independence_left_padding(convention):
    name = "attention_mask" if convention == "keep" else "key_padding_mask"
    options = dict(mask_name=name, padding_side="left", mask_convention=convention)
    result = check_batch_independence(PaddedRowsMixed(), seeded(), LENS, **options)
    assert result.passed, result.message
    assert not check_batch_independence(PaddedRowsMixed(bug=True), seeded(), LENS, **options)


# --- outputs of a static length -----------------------------------------------------------------

class StaticLength(nn.Module):
    """A masked encoder (valid_lens, right padding) whose outputs are padded with zeros, or cut,
    to a fixed length S, as models compiled for static shapes return them."""

    def __init__(self, S, masked=True):
        super().__init__()
        self.encoder, self.S, self.masked = Encoder(bug=None if masked else "none"), S, masked

    def forward(self, x, valid_lens):
        keep = torch.arange(x.shape[1])[None, :] < valid_lens[:, None]
        y = self.encoder(x, keep.long())  # (B, T, d)
        if y.shape[1] >= self.S:
            return y[:, :self.S]  # (B, S, d)
        return F.pad(y, (0, 0, 0, self.S - y.shape[1]))  # (B, S, d)


def test_static_output_length_is_no_leak():
    """Outputs padded (or cut) to the batch's length T for every input length: per position."""
    result = check_padding(StaticLength(T), seeded(), LENS)
    assert result.passed and result.details["static"] == T, result.message
    assert result.details["pooled"] is False
    bad = check_padding(StaticLength(T, masked=False), seeded(), LENS)
    assert not bad.passed and bad.details["sequence"] == 1, bad.message
    assert not check_padding(StaticLength(T, masked=False), seeded(), LENS, exact=False)


@pytest.mark.parametrize("S", [16, 7])
def test_other_static_lengths_need_pooled_false(S):
    """A length S other than T reads as k = S pooled vectors (a Perceiver's latents, all
    compared), so a static length S is read per position only with pooled=False, which the
    message of the pooled reading suggests."""
    result = check_padding(StaticLength(S), seeded(), LENS)
    assert not result.passed and "pass pooled=False" in text(result), result.message
    result = check_padding(StaticLength(S), seeded(), LENS, pooled=False)
    assert result.passed and result.details["static"] == S, result.message
    assert not check_padding(StaticLength(S, masked=False), seeded(), LENS, pooled=False)
    assert not check_padding(StaticLength(S, masked=False), seeded(), LENS, pooled=False,
                             exact=False)


class Latents(nn.Module):
    """k learned queries attend to the valid positions (a Perceiver's read-out): (B, k, d)
    for every length. ``bug``: the queries also read the padding."""

    def __init__(self, k, bug=False):
        super().__init__()
        torch.manual_seed(2)
        self.queries, self.bug = nn.Parameter(torch.randn(k, D)), bug

    def forward(self, x, valid_lens):
        scores = self.queries @ x.transpose(1, 2)  # (B, k, T)
        if not self.bug:
            keep = torch.arange(x.shape[1])[None, :] < valid_lens[:, None]
            scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        return scores.softmax(dim=-1) @ x  # (B, k, d)


@pytest.mark.parametrize("k", [1, 8])
def test_pooled_vectors_are_not_read_as_a_static_length(k):
    assert check_padding(Latents(k), seeded(), LENS).details["pooled"] is True
    result = check_padding(Latents(k, bug=True), seeded(), LENS)
    assert not result.passed and result.details["pooled"] is True, result.message


def test_static_length_of_two_axes_needs_pooled_false():
    """(B, S) outputs of the same shape for every length read as pooled by default (the
    stronger test); the message says how to read them per position."""
    static, leaks = StaticLength(12), StaticLength(12, masked=False)
    model = lambda x, lens: static(x, lens)[..., 0]  # noqa: E731  (B, S)
    result = check_padding(model, seeded(), LENS)
    assert not result.passed and "pooled=False" in text(result), result.message
    result = check_padding(model, seeded(), LENS, pooled=False)
    assert result.passed and result.details["static"] == 12, result.message
    leaky = lambda x, lens: leaks(x, lens)[..., 0]  # noqa: E731
    assert not check_padding(leaky, seeded(), LENS, pooled=False)


# --- rounding is no leak: decided in a float64 copy of the model -------------------------------

def fft_causal_convolution(x, kernel):
    """y_t = sum_j kernel_j x_{t-j}, by the convolution theorem (zero padded)."""
    T, n = x.shape[1], 2 * x.shape[1] + kernel.numel()
    X = torch.fft.rfft(x, n=n, dim=1)
    K = torch.fft.rfft(kernel.to(x.dtype), n=n)[None, :, None]
    return torch.fft.irfft(X * K, n=n, dim=1)[:, :T]


class FFTConvolution(nn.Module):
    """A causal convolution computed by FFT, its kernel a Parameter; ``leak`` adds a
    LayerScale-sized read of the whole sequence (as small as the FFT's rounding in float32)."""

    def __init__(self, leak=0.0, size=5):
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(size, generator=torch.Generator().manual_seed(0)))
        self.leak = leak

    def forward(self, x):
        return fft_causal_convolution(x, self.kernel) + self.leak * x.mean(dim=1, keepdim=True)


def test_fft_causal_convolution_in_float32_passes():
    model = FFTConvolution()
    result = check_causal(model, seeded())
    assert result.passed and result.details.get("float64") is True, result.message
    assert "float64 copy" in text(result)
    assert model.kernel.dtype == torch.float32  # the caller's model is not touched
    # a function of its inputs alone is run on float64 inputs
    kernel = model.kernel.detach()
    assert check_causal(lambda x: fft_causal_convolution(x, kernel), seeded())


@pytest.mark.parametrize("leak", [1e-6, 1e-5])
def test_leak_as_small_as_float32_rounding_still_fails(leak):
    result = check_causal(FFTConvolution(leak=leak), seeded())
    assert not result.passed and result.first_position == 0, result.message
    assert "float64 copy" in text(result) and result.tolerance == 0.0, result.message


def test_undecidable_rounding_fails_and_says_why():
    model = FFTConvolution()
    result = check_causal(lambda x: model(x), seeded())  # a function of a module: no copy
    assert not result.passed and result.details["undecided"], result.message
    assert "pass the nn.Module itself" in text(result), result.message


class PaddedFFTConvolution(FFTConvolution):
    """The causal FFT convolution under right padding: the valid outputs read the padding
    only through the FFT's rounding (``leak``: through a read of the whole sequence)."""

    def forward(self, x, valid_lens):
        return super().forward(x)


def test_fft_rounding_is_no_padding_leak():
    result = check_padding(PaddedFFTConvolution(), seeded(), LENS)
    assert result.passed and result.details["float64"] is True, result.message
    bad = check_padding(PaddedFFTConvolution(leak=1e-6), seeded(), LENS)
    assert not bad.passed and "float64 copy" in text(bad), bad.message


class BatchFFT(nn.Module):
    """The identity over the batch computed by FFT along the batch axis: every sequence
    reads the others only through rounding (``leak``: through the batch's mean)."""

    def __init__(self, leak=0.0):
        super().__init__()
        self.scale, self.leak = nn.Parameter(torch.tensor(1.5)), leak

    def forward(self, x):
        y = torch.fft.irfft(torch.fft.rfft(x, dim=0), n=x.shape[0], dim=0) * self.scale
        return y + self.leak * x.mean(dim=0, keepdim=True)


def test_fft_rounding_is_no_batch_leak():
    X = seeded(B=5)
    result = check_batch_independence(BatchFFT(), X)
    assert result.passed and result.details["float64"] is True, result.message
    bad = check_batch_independence(BatchFFT(leak=1e-6), X)
    assert not bad.passed and "float64 copy" in text(bad), bad.message
    model = BatchFFT()
    undecided = check_batch_independence(lambda x: model(x), X)
    assert not undecided.passed and undecided.details["undecided"], undecided.message


# --- half precision: float16 gradients underflow, a float64 copy decides ------------------------

class Causal(nn.Module):
    """One head of causal self-attention; ``leak`` reads the whole sequence's mean, and the
    outputs are scaled by ``out_scale`` (small outputs make small gradients)."""

    def __init__(self, leak=0.0, out_scale=1.0, d=D):
        super().__init__()
        torch.manual_seed(1)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.leak, self.out_scale = leak, out_scale

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, T, C)
        return (self.out(y) + self.leak * x.mean(dim=1, keepdim=True)) * self.out_scale


def test_float16_leak_whose_gradients_underflow_fails():
    model = Causal(leak=1e-5, out_scale=1e-3).half()
    result = check_causal(model, seeded().half())
    assert not result.passed and "float64 copy" in text(result), result.message
    assert "underflowed" in text(result)
    assert next(model.parameters()).dtype == torch.float16  # the caller's model untouched
    good = check_causal(Causal(out_scale=1e-3).half(), seeded().half())
    assert good.passed and good.details["float64"] is True, good.message


def test_float16_pass_without_a_copy_says_what_it_cannot_see():
    model = Causal(out_scale=1e-3).half()
    result = check_causal(lambda x: model(x), seeded().half())
    assert result.passed and "underflow to 0" in text(result), result.message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_padding_and_batch_decided_in_float64(dtype):
    block = Encoder().to(dtype)
    options = dict(mask_name="attention_mask", padding_side="left")
    result = check_padding(block, seeded().to(dtype), LENS, **options)
    assert result.passed, result.message
    assert result.details["float64"] is (dtype == torch.float16), result.message
    assert not check_padding(Encoder(bug="right").to(dtype), seeded().to(dtype), LENS,
                             **options)
    assert check_batch_independence(block, seeded().to(dtype), LENS, **options)
