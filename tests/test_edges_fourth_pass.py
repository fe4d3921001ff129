"""Issue 51, part A: the edges an outside review found in the modules added since the third pass.

Each test fails on the library before the fix: a clear ``ValueError`` naming the argument, or
the right answer where there was a wrong one.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from d2lattn.gpt import (GPT, GPTConfig, held_out_losses, next_token_probs,
                         sliding_window_losses, top_k_filter, top_p_filter)
from d2lattn.linear import LinearMultiHeadAttention, RecurrentState, delta_rule_chunked
from d2lattn.pointcloud import knn_indices, make_point_clouds
from d2lattn.scaling import compute_frontier, fit_frontier
from d2lattn.sets import SetRegressor, make_diameter_sets
from d2lattn.training import fit


def tiny_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2, num_layers=2,
               ffn_num_hiddens=32)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).eval()


STREAM = torch.randint(0, 10, (60,), generator=torch.Generator().manual_seed(1))


# --- held_out_losses: the checks of sliding_window_losses, and float32 losses --------------------

def test_held_out_losses_refuses_a_bidirectional_model_as_sliding_windows_do():
    model = tiny_gpt(causal=False)
    messages = []
    for score in (held_out_losses, sliding_window_losses):
        with pytest.raises(ValueError, match="model must be causal") as err:
            score(model, STREAM)
        messages.append(str(err.value))
    assert messages[0] == messages[1]  # one shared check


@pytest.mark.parametrize("bad", [STREAM[None], STREAM.float(), STREAM[:8], torch.full((20,), 11)])
def test_held_out_losses_checks_its_data(bad):
    with pytest.raises(ValueError, match="data"):
        held_out_losses(tiny_gpt(), bad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_held_out_losses_of_a_half_model_are_float32(dtype):
    """A bfloat16 cross-entropy moves in steps of 1/64 bit near 2 bits; the chapter reads gaps
    of 0.03 bit. The losses are computed from float32 logits and returned in float32, and they
    equal those of the same logits widened by hand."""
    model = tiny_gpt().to(dtype)
    bits = held_out_losses(model, STREAM)
    assert bits.dtype == torch.float32
    windows = STREAM[: 7 * 8 + 1].unfold(0, 9, 8)  # (7, 9)
    with torch.no_grad():
        logits = model(windows[:, :-1]).float()
    expect = F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none") / math.log(2)
    torch.testing.assert_close(bits, expect, rtol=0, atol=0)
    assert held_out_losses(tiny_gpt().double(), STREAM).dtype == torch.float64


# --- knn_indices: exact distances, ties by index, any float dtype ------------------------------

def exact_knn(points: torch.Tensor, k: int) -> torch.Tensor:
    """The reference: squared distances in float64 from differences, self first, stable."""
    P = points.double()
    d = (P[:, :, None] - P[:, None]).square().sum(-1)
    d = d.masked_fill(torch.eye(P.shape[1], dtype=torch.bool), -1.0)
    return d.sort(dim=-1, stable=True).indices[..., :k]


@pytest.mark.parametrize("offset", [0.0, 100.0, 1000.0, 1e4])
def test_knn_is_exact_for_a_cloud_far_from_the_origin(offset):
    """torch.cdist's matrix-product form (above 25 points) cancels catastrophically: at +1000,
    17% of the 16 nearest were wrong and 85% at the wrong rank; at +1e4 a point was not its
    own nearest. Differences of float32 coordinates this close are exact."""
    clouds = make_point_clouds(6, min_points=64, max_points=64, seed=3)
    P = clouds.points + offset  # float32
    assert torch.equal(knn_indices(P, 16), exact_knn(P, 16))


def test_knn_breaks_ties_by_index_and_puts_the_point_first():
    P = torch.zeros(1, 4, 3)  # four copies of one point
    assert knn_indices(P, 4)[0].tolist() == [[0, 1, 2, 3], [1, 0, 2, 3], [2, 0, 1, 3],
                                             [3, 0, 1, 2]]
    line = torch.tensor([[[0.0], [1.0], [-1.0], [2.0], [-2.0]]])  # 1 and 2 tie from 0
    assert knn_indices(line, 5)[0, 0].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_knn_of_half_points_is_computed_in_float32(dtype):
    clouds = make_point_clouds(3, min_points=20, max_points=30, seed=2)
    P = clouds.points.to(dtype)
    got = knn_indices(P, 5, clouds.valid_lens)
    assert torch.equal(got, knn_indices(P.float(), 5, clouds.valid_lens))


# --- SetRegressor("deepsets"): the valid_lens check of the attention kinds --------------------

@pytest.mark.parametrize("bad", ["column", "too long", "list", "zero", "float"])
def test_set_regressor_checks_valid_lens_alike_for_every_kind(bad):
    P, lens, _ = make_diameter_sets(4, min_size=2, max_size=5)
    valid_lens = {"column": lens[:, None], "too long": torch.tensor([7, 2, 3, 4]),
                  "list": lens.tolist(), "zero": torch.tensor([0, 2, 3, 4]),
                  "float": lens.float()}[bad]
    messages = set()
    for kind in SetRegressor.KINDS:
        with pytest.raises(ValueError, match="valid_lens") as err:
            SetRegressor(kind, 2)(P, valid_lens)
        messages.add(str(err.value))
    assert len(messages) == 1  # the same words for the three kinds: one check


# --- make_point_clouds: a cloud of one point -------------------------------------------------

def test_point_clouds_of_one_point_are_finite():
    clouds = make_point_clouds(5, min_points=1, max_points=1, noise=0.0, seed=0)
    assert torch.isfinite(clouds.points).all()
    assert torch.equal(clouds.points, torch.zeros(5, 1, 3))  # the centre, noise 0


# --- next_token_probs and generate: float16 logits, tiny and zero temperatures -----------------

@pytest.mark.parametrize("temperature", [1e-3, 1e-30, 1e-45])
def test_next_token_probs_of_float16_logits_at_tiny_temperatures(temperature):
    logits = torch.tensor([[3.0, 1.0, -2.0, 2.9], [0.5, 0.5, -70000.0 / 2, 0.0]],
                          dtype=torch.float16)
    probs = next_token_probs(logits, temperature=temperature)
    assert probs.dtype == torch.float32 and torch.isfinite(probs).all()
    expect = (logits.double() / temperature).softmax(-1)  # float64 does not overflow here
    torch.testing.assert_close(probs.double(), expect, rtol=0, atol=1e-6)
    assert probs[0, 0] == 1.0 and probs[1, :2].tolist() == [0.5, 0.5]


def test_temperature_zero_is_greedy():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0]])
    assert next_token_probs(logits, temperature=0).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="temperature"):
        next_token_probs(logits, temperature=-1e-9)
    model = tiny_gpt()
    prompt = torch.tensor([[1, 2]])
    greedy = model.generate(prompt, 5, greedy=True)
    assert torch.equal(model.generate(prompt, 5, temperature=0), greedy)
    assert torch.equal(model.half().generate(prompt, 5, temperature=1e-4,
                                             generator=torch.Generator().manual_seed(0)),
                       model.generate(prompt, 5, greedy=True))


# --- fit: a batch source that runs out, gradients that are not finite ------------------------

def test_fit_reports_a_batch_source_that_runs_out_and_restores_eval_mode():
    torch.manual_seed(0)
    w = nn.Linear(2, 1)
    batches = iter([torch.randn(4, 2) for _ in range(2)])
    opt = torch.optim.SGD(w.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="ran out of batches at step 3 of 5"):
        fit(w, opt, lambda: w(next(batches)).square().mean(), steps=5)
    assert not w.training
    # inside map() a StopIteration would end the map silently: now it is an error
    with pytest.raises(RuntimeError, match="ran out"):
        list(map(lambda s: fit(w, opt, lambda: w(next(batches)).mean(), steps=s), [1]))


def test_fit_refuses_a_step_with_gradients_that_are_not_finite():
    torch.manual_seed(0)
    w = nn.Linear(2, 1)
    before = [p.detach().clone() for p in w.parameters()]
    opt = torch.optim.SGD(w.parameters(), lr=0.1)

    def batch_loss():  # finite, but sqrt'(0) = inf and 0 * inf = NaN in the gradient
        return (w(torch.zeros(3, 2)) * 0).abs().sqrt().sum() + 1.0

    with pytest.raises(FloatingPointError, match="step 1: the loss is finite but the gradients"):
        fit(w, opt, batch_loss, steps=3)
    assert all(torch.equal(a, b) for a, b in zip(before, w.parameters()))
    assert not w.training


def test_fit_leaves_eval_mode_after_an_error_in_the_callback():
    w = nn.Linear(1, 1)

    def callback(step, model, loss):
        raise KeyError("stop")

    with pytest.raises(KeyError):
        fit(w, torch.optim.SGD(w.parameters(), lr=0.1), lambda: w(torch.ones(1, 1)).sum(),
            steps=2, callback=callback)
    assert not w.training


# --- fit_frontier / compute_frontier -----------------------------------------------------------

def test_fit_frontier_needs_four_distinct_computes():
    with pytest.raises(ValueError, match="flops must hold at least 4 distinct computes"):
        fit_frontier([1e12] * 4, [3.0, 2.9, 2.8, 2.7])
    with pytest.raises(ValueError, match="distinct"):
        fit_frontier([1e12, 1e12, 2e12, 4e12], [3.0, 2.9, 2.8, 2.7])


@pytest.mark.parametrize("scale", [-1.0, 0.0, math.inf, float("nan")])
def test_fit_frontier_refuses_a_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        fit_frontier([1e12, 2e12, 4e12, 8e12], [3.0, 2.9, 2.8, 2.75], scale=scale)


def test_frontier_functions_take_tensors_and_arrays():
    C, L = [1e12, 2e12, 4e12, 8e12], [3.0, 2.9, 2.8, 2.75]
    ref = fit_frontier(C, L)
    for convert in (torch.tensor, np.asarray):
        fit = fit_frontier(convert(C, dtype=torch.float64) if convert is torch.tensor
                           else convert(C), convert(L))
        assert math.isclose(fit.E, ref.E, rel_tol=1e-6)
    assert compute_frontier(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 3.5, 2.0])) == [0, 2]


def test_fit_frontier_never_returns_its_starting_guess(monkeypatch):
    """A fit that does not move from its starting point is not a fit (scipy says so only with
    a warning); data that lie exactly on the starting curve are still fitted."""
    import scipy.optimize

    monkeypatch.setattr(scipy.optimize, "curve_fit", lambda f, x, y, p0, **kw: (np.array(p0), None))
    with pytest.raises(RuntimeError, match="starting guess"):
        fit_frontier([1e12, 2e12, 4e12, 8e12], [3.0, 2.9, 2.8, 2.75])
    monkeypatch.undo()
    on_start = fit_frontier([1e12, 4e12, 16e12, 64e12], [2.8, 2.4, 2.2, 2.1])
    assert math.isclose(on_start.E, 2.0) and math.isclose(on_start.g, 0.5)


# --- GPT.forward: integer dtypes, the meta device, caches of different lengths ---------------

@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_gpt_takes_any_integer_tokens(dtype):
    model = tiny_gpt()
    x = torch.tensor([[1, 2, 3], [4, 5, 10]])
    torch.testing.assert_close(model(x.to(dtype)), model(x), rtol=0, atol=0)


def test_gpt_refuses_float_tokens():
    with pytest.raises(ValueError, match="tokens must be an integer tensor"):
        tiny_gpt()(torch.zeros(1, 3))


def test_gpt_runs_on_the_meta_device():
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2,
                              num_layers=2, ffn_num_hiddens=32))
        out = model(torch.zeros(2, 5, dtype=torch.long))
    assert out.shape == (2, 5, 11) and out.device.type == "meta"


def test_gpt_refuses_caches_of_different_lengths():
    model = tiny_gpt()
    caches = model.new_caches()
    model(torch.tensor([[1, 2, 3]]), kv_caches=caches)
    short = model.new_caches()
    model(torch.tensor([[1]]), kv_caches=short)
    with pytest.raises(ValueError, match="kv_caches must all hold the same number"):
        model(torch.tensor([[4]]), kv_caches=[caches[0], short[1]])


# --- top_p_filter of an empty vocabulary ------------------------------------------------------

def test_top_p_filter_refuses_an_empty_vocabulary_like_top_k():
    empty = torch.zeros(2, 0)
    with pytest.raises(ValueError):
        top_k_filter(empty, 1)
    with pytest.raises(ValueError, match="V >= 1"):
        top_p_filter(empty, 0.9)


# --- GPT.num_parameters: trainable only; non_embedding ----------------------------------------

def test_num_parameters_counts_trainable_parameters_only():
    model = tiny_gpt()
    total = model.num_parameters()
    model.blocks[0].requires_grad_(False)
    frozen = sum(p.numel() for p in model.blocks[0].parameters())
    assert model.num_parameters() == total - frozen


@pytest.mark.parametrize("positions", ["rotary", "learned"])
@pytest.mark.parametrize("tie", [True, False])
def test_num_parameters_non_embedding(positions, tie):
    model = tiny_gpt(positions=positions, tie_weights=tie)
    V, T, d = 11, 8, 16
    embeddings = V * d + (T * d if positions == "learned" else 0)
    assert model.num_parameters(non_embedding=True) == model.num_parameters() - embeddings
    # the scaling sweep's former helper: every parameter but the token embedding and positions
    skip = {id(model.embedding.weight)} | {id(p) for n, p in model.named_parameters()
                                            if "position" in n}
    assert model.num_parameters(non_embedding=True) == sum(
        p.numel() for p in model.parameters() if id(p) not in skip)


# --- recurrent state in half precision: carried in float32 -------------------------------------

def test_delta_rule_state_is_carried_in_float32():
    """256 one-token steps in bfloat16 with the state rounded to bfloat16 at every step strayed
    five times further from float64 (0.155) than the whole sequence at once (0.031); carried
    in float32, the steps equal the whole sequence's error."""
    g = torch.Generator().manual_seed(1)
    T = 256
    q = torch.randn(1, 2, T, 16, generator=g)
    k = F.normalize(torch.randn(1, 2, T, 16, generator=g), dim=-1)
    v, beta = torch.randn(1, 2, T, 16, generator=g), torch.rand(1, 2, T, generator=g)
    qb, kb, vb, bb = (t.bfloat16() for t in (q, k, v, beta))
    ref = delta_rule_chunked(*(t.double() for t in (qb, kb, vb, bb)), 64)
    whole = (delta_rule_chunked(qb, kb, vb, bb, 64).double() - ref).abs().max()
    S, outs = None, []
    for t in range(T):
        o, S = delta_rule_chunked(qb[..., t:t + 1, :], kb[..., t:t + 1, :],
                                  vb[..., t:t + 1, :], bb[..., t:t + 1], 1,
                                  initial_state=S, return_state=True)
        outs.append(o)
    steps = (torch.cat(outs, -2).double() - ref).abs().max()
    assert S.dtype == torch.float32
    assert steps <= 1.5 * whole


def test_a_half_layer_decodes_with_a_float32_state():
    torch.manual_seed(0)
    layer = LinearMultiHeadAttention(16, 2, rule="gated_delta").bfloat16()
    X = torch.randn(1, 6, 16).bfloat16()
    cache = RecurrentState()
    with torch.no_grad():
        outs = [layer(x, x, x, is_causal=True, kv_cache=cache) for x in X.split(1, dim=1)]
    assert cache.state.dtype == torch.float32 and outs[-1].dtype == torch.bfloat16
    q = F.normalize(torch.randn(1, 1, 6, 8), dim=-1)
    with pytest.raises(ValueError, match="initial_state must have dtype torch.float32 on"):
        delta_rule_chunked(q, q, q, torch.rand(1, 1, 6), 2,
                           initial_state=torch.zeros(1, 1, 8, 8, dtype=torch.float64))
    S = torch.zeros(1, 1, 8, 8)  # float32 state, bfloat16 inputs: accepted
    assert delta_rule_chunked(*(t.bfloat16() for t in (q, q, q, torch.rand(1, 1, 6))), 2,
                              initial_state=S).dtype == torch.bfloat16
