"""Nadaraya–Watson regression: the kernels' formulas, weights against a plain reference,
the zero-total-weight rule, bad input, and the learnable version."""

import math

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lattn import KERNELS, NadarayaWatsonRegression, masked_softmax, nadaraya_watson

F64 = torch.float64


def toy_data(seed, n, queries):
    """``n`` training points on ``[0, 5)`` with random targets, and ``linspace(*queries)``."""
    g = torch.Generator().manual_seed(seed)
    x_train = torch.rand(n, generator=g, dtype=F64) * 5
    y_train = torch.randn(n, generator=g, dtype=F64)
    return x_train, y_train, torch.linspace(*queries, dtype=F64)


def reference_nw(x_train, y_train, x_query, kernel_fn, sigma):
    """Pair by pair with Python floats: K(u) / sum K(u), zero rows where the sum is 0."""
    y_hat, rows = [], []
    for q in x_query.tolist():
        k = [kernel_fn((q - xi) / sigma) for xi in x_train.tolist()]
        total = sum(k)
        w = [ki / total for ki in k] if total > 0 else [0.0] * len(k)
        rows.append(w)
        y_hat.append(sum(wi * yi for wi, yi in zip(w, y_train.tolist())))
    return torch.tensor(y_hat, dtype=F64), torch.tensor(rows, dtype=F64).reshape(len(y_hat), -1)


# The textbook formulas, written independently of d2lattn (constant factors dropped).
SCALAR_KERNELS = {
    "gaussian": lambda u: math.exp(-u * u / 2),
    "boxcar": lambda u: 1.0 if abs(u) <= 1 else 0.0,
    "constant": lambda u: 1.0,
    "epanechnikov": lambda u: max(0.0, 1 - u * u),
}


# --- the kernels ---------------------------------------------------------------------------

def test_kernel_names():
    assert set(KERNELS) == {"gaussian", "boxcar", "constant", "epanechnikov"}


@pytest.mark.parametrize("name", sorted(SCALAR_KERNELS))
def test_kernels_match_textbook_formulas(name):
    u = torch.linspace(-3, 3, 121, dtype=F64)
    expected = torch.tensor([SCALAR_KERNELS[name](v) for v in u.tolist()], dtype=F64)
    torch.testing.assert_close(KERNELS[name](u), expected, rtol=0, atol=1e-15)


def test_epanechnikov_is_the_parabola_not_the_triangle():
    u = torch.tensor([-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5], dtype=F64)
    k = KERNELS["epanechnikov"](u)
    torch.testing.assert_close(k, torch.tensor([0, 0, 0.75, 1, 0.75, 0, 0], dtype=F64))
    triangle = torch.clamp(1 - u.abs(), min=0)
    assert k[2] != triangle[2]  # 0.75 against 0.5 at u = -0.5
    # a parabola: constant second difference inside the support, -2 h^2
    h = 0.01
    v = torch.arange(-0.9, 0.9, h, dtype=F64)
    second = KERNELS["epanechnikov"](v[2:]) - 2 * KERNELS["epanechnikov"](v[1:-1]) \
        + KERNELS["epanechnikov"](v[:-2])
    torch.testing.assert_close(second, torch.full_like(second, -2 * h * h))


def test_boxcar_includes_the_edge():
    u = torch.tensor([-1.0, 1.0, 1.0 + 1e-12], dtype=F64)
    assert KERNELS["boxcar"](u).tolist() == [1.0, 1.0, 0.0]


def test_kernels_do_not_modify_their_input():
    u = torch.linspace(-2, 2, 9, dtype=F64)
    before = u.clone()
    for fn in KERNELS.values():
        fn(u)
    assert torch.equal(u, before)


# --- nadaraya_watson -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SCALAR_KERNELS))
@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5])
def test_matches_reference(name, sigma):
    x_train, y_train, x_query = toy_data(0, 12, (-1, 6, 15))
    y_hat, w = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train, kernel=name,
                               bandwidth=sigma)
    y_ref, w_ref = reference_nw(x_train, y_train, x_query, SCALAR_KERNELS[name], sigma)
    assert y_hat.shape == (15,) and w.shape == (15, 12)
    torch.testing.assert_close(w, w_ref)
    torch.testing.assert_close(y_hat, y_ref)


@settings(deadline=None, max_examples=50)
@given(
    n=st.integers(1, 20),
    m=st.integers(1, 10),
    sigma=st.floats(0.05, 20.0),
    name=st.sampled_from(["gaussian", "boxcar", "constant", "epanechnikov"]),
    seed=st.integers(0, 2**16),
)
def test_rows_sum_to_one_or_zero_and_are_nonnegative(n, m, sigma, name, seed):
    g = torch.Generator().manual_seed(seed)
    x_train = torch.rand(n, generator=g, dtype=F64) * 10
    y_train = torch.randn(n, generator=g, dtype=F64)
    x_query = torch.rand(m, generator=g, dtype=F64) * 12 - 1
    y_hat, w = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train, kernel=name,
                               bandwidth=sigma)
    assert torch.all(w >= 0) and torch.all(torch.isfinite(y_hat))
    sums = w.sum(-1)
    if name in ("gaussian", "constant"):
        torch.testing.assert_close(sums, torch.ones(m, dtype=F64))
    else:
        ones = torch.isclose(sums, torch.ones(m, dtype=F64))
        assert torch.all(ones | (sums == 0))
    # the prediction is a convex combination of the targets, or 0 for an empty row
    full = sums > 0
    assert torch.all(y_hat[full] <= y_train.max() + 1e-12)
    assert torch.all(y_hat[full] >= y_train.min() - 1e-12)
    assert torch.all(y_hat[~full] == 0)


def test_gaussian_weights_are_a_softmax_of_scaled_squared_distances():
    x_train, y_train, x_query = toy_data(1, 30, (0, 5, 11))
    sigma = 0.7
    _, w = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train, kernel="gaussian",
                           bandwidth=sigma)
    scores = -((x_query[:, None] - x_train[None, :]) ** 2) / (2 * sigma**2)
    torch.testing.assert_close(w, torch.softmax(scores, dim=-1))
    torch.testing.assert_close(w, masked_softmax(scores))
    k = torch.exp(scores)
    torch.testing.assert_close(w, k / k.sum(-1, keepdim=True))


def test_constant_kernel_gives_the_plain_average():
    x_train = torch.tensor([0.0, 1.0, 5.0], dtype=F64)
    y_train = torch.tensor([1.0, 2.0, 6.0], dtype=F64)
    y_hat, w = nadaraya_watson(x_query=torch.tensor([-100.0, 0.5, 100.0], dtype=F64),
                               x_train=x_train, y_train=y_train, kernel="constant", bandwidth=0.1)
    torch.testing.assert_close(y_hat, torch.full((3,), 3.0, dtype=F64))
    torch.testing.assert_close(w, torch.full((3, 3), 1 / 3, dtype=F64))


def test_rescaling_x_and_bandwidth_together_changes_nothing():
    g = torch.Generator().manual_seed(2)
    x_train = torch.rand(10, generator=g, dtype=F64)
    y_train = torch.randn(10, generator=g, dtype=F64)
    x_query = torch.rand(4, generator=g, dtype=F64)
    for name in KERNELS:
        a = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train, kernel=name,
                            bandwidth=0.3)
        b = nadaraya_watson(x_query=4 * x_query, x_train=4 * x_train, y_train=y_train,
                            kernel=name, bandwidth=1.2)
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["boxcar", "epanechnikov"])
def test_zero_total_weight_gives_a_zero_row_and_zero_prediction(name):
    x_train = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
    y_train = torch.tensor([3.0, 4.0, 5.0], dtype=F64)
    x_query = torch.tensor([0.5, 10.0], dtype=F64)  # the second query is far from every key
    y_hat, w = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train, kernel=name,
                               bandwidth=1.0)
    assert torch.equal(w[1], torch.zeros(3, dtype=F64))
    assert y_hat[1].item() == 0.0
    torch.testing.assert_close(w[0].sum(), torch.tensor(1.0, dtype=F64))
    assert not torch.any(torch.isnan(w))


def test_gaussian_never_underflows_to_an_empty_row():
    x_train = torch.tensor([0.0, 1.0], dtype=F64)
    y_train = torch.tensor([2.0, 7.0], dtype=F64)
    y_hat, w = nadaraya_watson(x_query=torch.tensor([1000.0], dtype=F64), x_train=x_train,
                               y_train=y_train, kernel="gaussian", bandwidth=0.01)
    # exp(-0.5 * (1e5)^2) underflows, but the softmax still gives the nearest key weight 1
    assert w.tolist() == [[0.0, 1.0]] and y_hat.item() == 7.0


def test_inputs_are_left_unmodified():
    x_train = torch.tensor([0.0, 1.0, 2.0])
    y_train = torch.tensor([1.0, -1.0, 2.0])
    x_query = torch.tensor([0.5, 3.0])
    copies = [t.clone() for t in (x_train, y_train, x_query)]
    for name in KERNELS:
        nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train, kernel=name,
                        bandwidth=0.8)
    for t, c in zip((x_train, y_train, x_query), copies):
        assert torch.equal(t, c)


@pytest.mark.parametrize("bandwidth", [0.0, -1.0, float("nan"), float("inf"), "wide", None, True])
def test_bad_bandwidth_raises(bandwidth):
    x = torch.tensor([0.0, 1.0])
    with pytest.raises(ValueError, match="bandwidth"):
        nadaraya_watson(x_query=x, x_train=x, y_train=x, bandwidth=bandwidth)


def test_bandwidth_may_be_an_int_or_a_0d_tensor():
    x = torch.tensor([0.0, 1.0, 3.0])
    a = nadaraya_watson(x_query=x, x_train=x, y_train=x, bandwidth=2)
    b = nadaraya_watson(x_query=x, x_train=x, y_train=x, bandwidth=torch.tensor(2.0))
    c = nadaraya_watson(x_query=x, x_train=x, y_train=x, bandwidth=2.0)
    torch.testing.assert_close(a, c)
    torch.testing.assert_close(b, c)


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.zeros(3, 1), torch.zeros(3), torch.zeros(2)), "x_train"),
        ((torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.zeros(2)), "y_train"),
        ((torch.zeros(3), torch.zeros(3), [0.0, 1.0]), "x_query"),
        ((torch.zeros(3), torch.zeros(4), torch.zeros(2)), "same length"),
        ((torch.zeros(0), torch.zeros(0), torch.zeros(2)), "at least one"),
        ((torch.zeros(3, dtype=F64), torch.zeros(3), torch.zeros(2)), "dtype"),
    ],
)
def test_bad_inputs_raise(args, match):
    x_train, y_train, x_query = args
    with pytest.raises(ValueError, match=match):
        nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train)


@pytest.mark.parametrize("missing", ["x_query", "x_train", "y_train"])
def test_a_missing_tensor_is_named(missing):
    tensors = {"x_query": torch.zeros(2), "x_train": torch.zeros(3), "y_train": torch.zeros(3)}
    del tensors[missing]
    with pytest.raises(ValueError, match=f"{missing} must be a 1-D floating-point tensor"):
        nadaraya_watson(**tensors)


# --- one argument order: by name; the old positional order deprecated ---------------------

@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_old_positional_order_still_works_with_a_deprecation_warning(dtype):
    x_train, y_train, x_query = (t.to(dtype) for t in toy_data(5, 30, (-1, 6, 12)))
    expected = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train,
                               kernel="epanechnikov", bandwidth=0.7)
    for call in (lambda: nadaraya_watson(x_train, y_train, x_query, "epanechnikov", 0.7),
                 lambda: nadaraya_watson(x_train, y_train, x_query, kernel="epanechnikov",
                                         bandwidth=0.7),
                 lambda: nadaraya_watson(x_train, y_train, x_query=x_query,
                                         kernel="epanechnikov", bandwidth=0.7)):
        with pytest.warns(DeprecationWarning, match=r"x_query=\.\.\., x_train=\.\.\."):
            y_hat, w = call()
        assert torch.equal(y_hat, expected[0]) and torch.equal(w, expected[1])
        assert y_hat.dtype == dtype


def test_the_keyword_form_warns_nothing_and_takes_any_order():
    x_train, y_train, x_query = toy_data(6, 20, (1, 4, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train)
        b = nadaraya_watson(y_train=y_train, x_train=x_train, x_query=x_query)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_the_function_and_the_layer_agree_with_queries_first():
    """The layer takes (x_query, x_train, y_train) by position; the function takes the same
    names; with w = 1 / sigma they compute the same weights."""
    x_train, y_train, x_query = (t.double() for t in toy_data(7, 25, (0, 5, 9)))
    sigma = 0.4
    layer = NadarayaWatsonRegression(w=1 / sigma).double()
    by_position = layer(x_query, x_train, y_train)
    by_name = layer(x_query=x_query, x_train=x_train, y_train=y_train)
    y_fn, w_fn = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train,
                                 bandwidth=sigma)
    torch.testing.assert_close(by_position, by_name, rtol=0, atol=0)
    torch.testing.assert_close(by_position, y_fn, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer.attention_weights, w_fn, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda x: nadaraya_watson(x, x, x, x_query=x), "x_query both by position and by name"),
    (lambda x: nadaraya_watson(x, x, x, "boxcar", kernel="boxcar"), "kernel both"),
    (lambda x: nadaraya_watson(x, x, x, "boxcar", 1.0, bandwidth=1.0), "bandwidth both"),
    (lambda x: nadaraya_watson(x, x, x, "boxcar", 1.0, 2), "at most 5 positional"),
])
def test_old_form_conflicts_raise_type_error(call, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=match):
            call(torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("kernel", ["triangle", "Gaussian", None])
def test_unknown_kernel_raises(kernel):
    x = torch.tensor([0.0, 1.0])
    with pytest.raises(ValueError, match="kernel"):
        nadaraya_watson(x_query=x, x_train=x, y_train=x, kernel=kernel)


# --- NadarayaWatsonRegression --------------------------------------------------------------

def test_learnable_w_is_the_inverse_bandwidth():
    x_train, y_train, x_query = toy_data(3, 20, (0, 5, 9))
    sigma = 0.4
    model = NadarayaWatsonRegression(w=1 / sigma).double()
    y_hat = model(x_query, x_train, y_train)
    y_ref, w_ref = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train,
                                   kernel="gaussian", bandwidth=sigma)
    torch.testing.assert_close(y_hat, y_ref)
    torch.testing.assert_close(model.attention_weights, w_ref)
    # reading w as the standard deviation would give different weights
    _, w_wrong = nadaraya_watson(x_query=x_query, x_train=x_train, y_train=y_train,
                                 kernel="gaussian", bandwidth=1 / sigma)
    assert (model.attention_weights - w_wrong).abs().max() > 0.1


def test_parameter_and_attention_weights():
    model = NadarayaWatsonRegression(w=1.5)
    params = dict(model.named_parameters())
    assert list(params) == ["w"] and params["w"].shape == () and params["w"].dtype == torch.float32
    assert model.attention_weights is None
    x = torch.tensor([0.0, 1.0, 2.0])
    model(x, x, x)
    assert model.attention_weights.shape == (3, 3) and not model.attention_weights.requires_grad


def test_gradient_of_w_matches_finite_differences():
    g = torch.Generator().manual_seed(4)
    x_train = torch.rand(8, generator=g, dtype=F64) * 3
    y_train = torch.randn(8, generator=g, dtype=F64)
    x_query = torch.rand(5, generator=g, dtype=F64) * 3
    mask = torch.rand(5, 8, generator=g) > 0.3

    def predict(w):
        model = NadarayaWatsonRegression().double()
        with torch.no_grad():
            model.w.copy_(w)
        return model, model(x_query, x_train, y_train, mask)

    model, y = predict(torch.tensor(1.3, dtype=F64))
    loss = (y**2).sum()
    loss.backward()
    eps = 1e-6
    lp = (predict(torch.tensor(1.3 + eps, dtype=F64))[1] ** 2).sum()
    lm = (predict(torch.tensor(1.3 - eps, dtype=F64))[1] ** 2).sum()
    torch.testing.assert_close(model.w.grad, (lp - lm) / (2 * eps), rtol=1e-6, atol=1e-8)


def test_leave_one_out_mask_zeroes_the_diagonal():
    x = torch.linspace(0, 1, 6, dtype=F64)
    y = torch.sin(x)
    model = NadarayaWatsonRegression(w=3.0).double()
    y_hat = model(x, x, y, mask=~torch.eye(6, dtype=torch.bool))
    W = model.attention_weights
    assert torch.all(torch.diagonal(W) == 0)
    torch.testing.assert_close(W.sum(-1), torch.ones(6, dtype=F64))
    # each prediction equals the plain estimator fitted on the other five points
    for i in range(6):
        keep = torch.arange(6) != i
        ref, _ = nadaraya_watson(x_query=x[i : i + 1], x_train=x[keep], y_train=y[keep],
                                 kernel="gaussian", bandwidth=1 / 3)
        torch.testing.assert_close(y_hat[i : i + 1], ref)


def test_fully_masked_query_predicts_zero_with_finite_gradient():
    x = torch.tensor([0.0, 1.0, 2.0])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    model = NadarayaWatsonRegression(w=1.0)
    y_hat = model(x[:2], x, x + 1, mask=mask)
    assert y_hat[1].item() == 0.0
    y_hat.sum().backward()
    assert torch.isfinite(model.w.grad)


def test_without_leave_one_out_a_larger_w_always_fits_the_training_set_better():
    g = torch.Generator().manual_seed(5)
    x = torch.linspace(0, 5, 40, dtype=F64)  # spacing 0.128
    y = 2 * torch.sin(x) + torch.randn(40, generator=g, dtype=F64) * 0.5
    losses = []
    for w in [1.0, 3.0, 10.0, 30.0, 300.0]:
        model = NadarayaWatsonRegression(w=w).double()
        with torch.no_grad():
            losses.append(((model(x, x, y) - y) ** 2).mean().item())
    assert losses == sorted(losses, reverse=True)
    assert losses[-1] < 1e-6  # the model has memorised the training targets


def test_sgd_steps_lower_the_leave_one_out_loss():
    g = torch.Generator().manual_seed(6)
    x = torch.sort(torch.rand(40, generator=g) * 5).values
    y = 2 * torch.sin(x) + x**0.8 + torch.randn(40, generator=g) * 0.5
    model = NadarayaWatsonRegression(w=1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    mask = ~torch.eye(40, dtype=torch.bool)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = ((model(x, x, y, mask) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_model_leaves_inputs_unmodified():
    x = torch.tensor([0.0, 1.0, 2.0])
    y = torch.tensor([1.0, 0.0, 1.0])
    mask = ~torch.eye(3, dtype=torch.bool)
    copies = [t.clone() for t in (x, y, mask)]
    NadarayaWatsonRegression(w=2.0)(x, x, y, mask)
    for t, c in zip((x, y, mask), copies):
        assert torch.equal(t, c)


@pytest.mark.parametrize("w", [float("nan"), float("inf"), "big"])
def test_model_bad_w_raises(w):
    with pytest.raises(ValueError, match="w must be"):
        NadarayaWatsonRegression(w=w)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m, x: m(x[:, None], x, x), "x_query"),
        (lambda m, x: m(x, x[:2], x), "same length"),
        (lambda m, x: m(x, x, x.double()), "dtype"),
        (lambda m, x: m(x, x, x, mask=torch.ones(3, 3)), "mask"),
        (lambda m, x: m(x, x, x, mask=torch.ones(2, 3, dtype=torch.bool)), "mask"),
    ],
)
def test_model_bad_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call(NadarayaWatsonRegression(), torch.tensor([0.0, 1.0, 2.0]))
