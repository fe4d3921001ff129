"""masked_softmax and valid_lens_to_mask: correctness, empty rows, gradients, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lattn import masked_softmax, valid_lens_to_mask


def reference_masked_softmax(X, keep):
    """Row by row with plain Python: softmax over the kept keys, zeros elsewhere."""
    out = torch.zeros_like(X)
    flat_X, flat_keep, flat_out = X.reshape(-1, X.shape[-1]), keep.reshape(-1, X.shape[-1]), out.view(-1, X.shape[-1])
    for r in range(flat_X.shape[0]):
        idx = flat_keep[r].nonzero().flatten()
        if len(idx):
            e = torch.exp(flat_X[r, idx] - flat_X[r, idx].max())
            flat_out[r, idx] = e / e.sum()
    return out


def test_no_mask_is_plain_softmax():
    X = torch.randn(2, 3, 5, dtype=torch.float64)
    torch.testing.assert_close(masked_softmax(X), torch.softmax(X, dim=-1), rtol=0, atol=1e-15)


def test_1d_valid_lens_matches_reference():
    X = torch.randn(3, 4, 6, dtype=torch.float64)
    lens = torch.tensor([1, 4, 6])
    keep = torch.arange(6)[None, None, :] < lens[:, None, None]
    keep = keep.expand(3, 4, 6)
    torch.testing.assert_close(masked_softmax(X, lens), reference_masked_softmax(X, keep))


def test_2d_valid_lens_matches_reference():
    X = torch.randn(2, 3, 4, dtype=torch.float64)
    lens = torch.tensor([[1, 2, 4], [3, 0, 2]])
    keep = torch.arange(4)[None, None, :] < lens[:, :, None]
    W = masked_softmax(X, lens)
    torch.testing.assert_close(W, reference_masked_softmax(X, keep))
    assert torch.equal(W[1, 1], torch.zeros(4, dtype=torch.float64))


def test_valid_lens_broadcast_over_heads():
    X = torch.randn(2, 4, 3, 5, dtype=torch.float64)  # (B, h, Q, K)
    lens = torch.tensor([[1, 2, 5], [3, 3, 4]])  # (B, Q)
    W = masked_softmax(X, lens)
    for head in range(4):
        torch.testing.assert_close(W[:, head], masked_softmax(X[:, head], lens))


def test_masked_keys_get_exactly_zero_weight_and_rows_sum_to_one():
    X = torch.randn(4, 7, 9)
    lens = torch.tensor([1, 3, 8, 9])
    W = masked_softmax(X, lens)
    for b, n in enumerate(lens.tolist()):
        assert torch.all(W[b, :, n:] == 0)
        torch.testing.assert_close(W[b].sum(-1), torch.ones(7))


def test_bool_mask_true_means_attend_matches_sdpa_convention():
    X = torch.randn(2, 3, 4, dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True]])
    W = masked_softmax(X, mask=mask)
    # F.scaled_dot_product_attention with bool attn_mask: True = take part in attention
    expected = torch.softmax(X.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(W, expected)
    assert torch.all(W[..., 1] == 0)


def test_mask_and_valid_lens_combine_with_and():
    X = torch.randn(2, 2, 4, dtype=torch.float64)
    lens = torch.tensor([3, 4])
    mask = torch.tensor([False, True, True, True])
    keep = (torch.arange(4)[None, None, :] < lens[:, None, None]) & mask
    torch.testing.assert_close(masked_softmax(X, lens, mask), reference_masked_softmax(X, keep.expand(2, 2, 4)))


@pytest.mark.parametrize("lens", [torch.tensor([0, 2]), torch.tensor([[0, 1], [0, 0]])])
def test_empty_rows_are_zero_not_nan_forward_and_backward(lens):
    X = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)
    W = masked_softmax(X, lens)
    assert not torch.isnan(W).any()
    assert torch.all(W[0, 0] == 0)
    (W * torch.randn_like(W)).sum().backward()
    assert torch.isfinite(X.grad).all()
    assert torch.all(X.grad[0, 0] == 0)


def test_gradcheck_with_empty_and_partial_rows():
    X = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    lens = torch.tensor([[0, 2, 4], [1, 3, 0]])
    assert torch.autograd.gradcheck(lambda x: masked_softmax(x, lens), (X,))
    assert torch.autograd.gradgradcheck(lambda x: masked_softmax(x, lens), (X,))


def test_stable_for_large_logits():
    X = torch.tensor([[[1e4, -1e4, 0.0, 1e4]]])
    W = masked_softmax(X, torch.tensor([3]))
    torch.testing.assert_close(W, torch.tensor([[[1.0, 0.0, 0.0, 0.0]]]))
    W = masked_softmax(-X, torch.tensor([4]))
    torch.testing.assert_close(W, torch.tensor([[[0.0, 1.0, 0.0, 0.0]]]))
    assert torch.isfinite(masked_softmax(torch.full((1, 2, 3), -1e4), torch.tensor([2]))).all()


def test_inputs_are_not_modified():
    X = torch.randn(2, 3, 4)
    lens = torch.tensor([1, 2])
    mask = torch.tensor([True, False, True, True])
    X0, lens0, mask0 = X.clone(), lens.clone(), mask.clone()
    masked_softmax(X, lens, mask)
    masked_softmax(X, torch.tensor([0, 0]))
    assert torch.equal(X, X0) and torch.equal(lens, lens0) and torch.equal(mask, mask0)


def test_list_valid_lens_accepted():
    X = torch.randn(2, 1, 3)
    torch.testing.assert_close(masked_softmax(X, [1, 2]), masked_softmax(X, torch.tensor([1, 2])))


@pytest.mark.parametrize(
    "lens, match",
    [
        # the shapes it takes, with B = X.shape[0] and Q = X.shape[-2], and the shape it got
        (torch.tensor([1, 2, 3]), r"\(B,\) = \(2,\) or \(B, Q\) = \(2, 3\), got shape \(3,\)"),
        (torch.tensor([[1, 2], [1, 2]]), r"\(B, Q\) = \(2, 3\), got shape \(2, 2\)"),
        (torch.tensor([[[1]], [[2]]]), r"got shape \(2, 1, 1\)"),  # 3-D
        (torch.tensor([1, 5]), r"\[0, 4\]"),  # > K
        (torch.tensor([-1, 2]), r"\[0, 4\]"),  # < 0
        (torch.tensor([1.0, 2.0]), "integer dtype"),  # float
        (torch.tensor([True, False]), "integer dtype"),  # bool
    ],
)
def test_bad_valid_lens_raise_value_error_naming_the_argument(lens, match):
    with pytest.raises(ValueError, match="valid_lens") as info:
        masked_softmax(torch.randn(2, 3, 4), lens)
    assert info.match(match)


def test_bad_mask_and_scores_raise_value_error():
    with pytest.raises(ValueError, match="mask must be a bool"):
        masked_softmax(torch.randn(2, 3, 4), mask=torch.ones(4))
    with pytest.raises(ValueError, match="does not broadcast"):
        masked_softmax(torch.randn(2, 3, 4), mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):  # would enlarge X
        masked_softmax(torch.randn(3, 4), mask=torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="X must be a floating-point"):
        masked_softmax(torch.ones(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"X must have shape \(B, \.\.\., Q, K\)"):
        masked_softmax(torch.randn(3, 4), torch.tensor([1, 2, 3]))


def test_valid_lens_to_mask_shapes_and_values():
    m = valid_lens_to_mask(torch.tensor([0, 2]), num_queries=3, num_keys=3)
    assert m.shape == (2, 1, 3) and m.dtype == torch.bool
    assert m[1, 0].tolist() == [True, True, False] and not m[0].any()
    m = valid_lens_to_mask(torch.tensor([[1, 3]]), num_queries=2, num_keys=3)
    assert m.tolist() == [[[True, False, False], [True, True, True]]]


@settings(deadline=None, max_examples=50)
@given(
    B=st.integers(1, 3), Q=st.integers(1, 4), K=st.integers(1, 5), two_d=st.booleans(),
    seed=st.integers(0, 2**16), scale=st.sampled_from([1.0, 30.0, 1e4]),
)
def test_property_weights_are_a_distribution_over_valid_keys(B, Q, K, two_d, seed, scale):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, Q, K, generator=g, dtype=torch.float64) * scale
    shape = (B, Q) if two_d else (B,)
    lens = torch.randint(0, K + 1, shape, generator=g)
    W = masked_softmax(X, lens)
    L = lens[:, :, None] if two_d else lens[:, None, None]
    keep = torch.arange(K) < L
    assert torch.all(W >= 0) and torch.all(W[~keep.expand_as(W)] == 0)
    sums = W.sum(-1)
    expected = (L.squeeze(-1) > 0).to(W.dtype).expand_as(sums)
    torch.testing.assert_close(sums, expected)
    torch.testing.assert_close(W, reference_masked_softmax(X, keep.expand_as(X)))


@pytest.mark.parametrize("lens", [None, torch.tensor([0, 2]), torch.tensor([[1, 3, 4], [2, 0, 4]])])
@pytest.mark.parametrize("grad", [False, True])
def test_inplace_gives_the_same_weights_and_gradients(lens, grad):
    X = torch.randn(2, 3, 4, dtype=torch.float64)
    expected = masked_softmax(X, lens)
    scores = (X.clone().requires_grad_() if grad else X.clone())
    work = scores * 1.0 if grad else scores  # a non-leaf when autograd records it
    torch.testing.assert_close(masked_softmax(work, lens, inplace=True), expected, rtol=0, atol=0)
    if grad:
        masked_softmax(scores * 1.0, lens, inplace=True).sum().backward()
        assert torch.isfinite(scores.grad).all()


def test_inplace_on_a_leaf_that_requires_grad_falls_back_to_a_copy():
    X = torch.zeros(1, 2, 3, requires_grad=True)
    W = masked_softmax(X, torch.tensor([1]), inplace=True)
    assert torch.equal(X, torch.zeros(1, 2, 3))
    torch.testing.assert_close(W, torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]]))
