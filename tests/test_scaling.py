"""d2lattn.scaling (loss against compute) and the sliding-window evaluation of chapter 12."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lattn.gpt import GPT, GPTConfig, held_out_losses, sliding_window_losses
from d2lattn.scaling import (PowerLawFit, chinchilla_optimal, compute_frontier, fit_frontier,
                             training_flops)


def test_training_flops_is_six_n_d():
    assert training_flops(3, 7) == 126.0
    for bad in [(0, 1), (1, -1), (math.inf, 1), (math.nan, 1), (True, 1), ("1", 2)]:
        with pytest.raises(ValueError, match="parameters and tokens"):
            training_flops(*bad)


runs = st.lists(st.tuples(st.integers(1, 50), st.integers(0, 100)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(runs)
def test_frontier_is_exactly_the_runs_no_cheaper_run_beats(points):
    flops = [float(c) for c, _ in points]
    losses = [float(l) for _, l in points]
    frontier = compute_frontier(flops, losses)
    for i in range(len(points)):
        # another run at most as costly and at most as lossy, and not the same point
        beaten = any(flops[j] <= flops[i] and losses[j] <= losses[i]
                     and points[j] != points[i] for j in range(len(points)))
        same = [j for j in range(len(points)) if points[j] == points[i]]
        if beaten:
            assert i not in frontier, (i, points)
        else:  # one run of a group of identical points
            assert sum(j in frontier for j in same) == 1, (i, points)
    # from the cheapest, strictly falling
    assert [flops[i] for i in frontier] == sorted(flops[i] for i in frontier)
    assert all(losses[a] > losses[b] for a, b in zip(frontier, frontier[1:]))


def test_frontier_errors():
    with pytest.raises(ValueError, match="same length"):
        compute_frontier([1, 2], [1.0])
    with pytest.raises(ValueError, match="flops"):
        compute_frontier([1, -2], [1.0, 2.0])
    with pytest.raises(ValueError, match="losses"):
        compute_frontier([1, 2], [1.0, math.nan])


def test_fit_recovers_a_known_power_law_and_its_crossover():
    truth = PowerLawFit(E=1.9, A=0.6, g=0.4)
    flops = [10 ** (11 + k / 4) for k in range(12)]
    fit = fit_frontier(flops, [truth(c) for c in flops])
    for name in "EAg":
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-4)
    C = fit.crossover(2.2)
    assert fit(C) == pytest.approx(2.2, abs=1e-9)
    assert C == pytest.approx(1e12 * (0.3 / 0.6) ** (-1 / 0.4), rel=1e-3)


def test_a_pure_power_law_is_not_mistaken_for_one_that_levels_off():
    flops = [10 ** (11 + k / 3) for k in range(10)]
    losses = [3.0 * (c / 1e12) ** -0.05 for c in flops]  # E = 0
    fit = fit_frontier(flops, losses)
    assert abs(fit.E) < 0.05 * min(losses) or fit.g < 0.2  # no false floor near the data


def test_crossover_errors():
    fit = PowerLawFit(E=2.0, A=0.5, g=0.5)
    with pytest.raises(ValueError, match="above the fit's floor"):
        fit.crossover(2.0)
    with pytest.raises(ValueError, match="does not fall"):
        PowerLawFit(E=2.0, A=-0.5, g=0.5).crossover(2.5)
    with pytest.raises(ValueError, match="at least 4"):
        fit_frontier([1, 2, 3], [3.0, 2.0, 1.0])


def test_chinchilla_optimal_spends_the_budget_at_twenty_tokens_a_parameter():
    N, D = chinchilla_optimal(1.2e13)
    assert D / N == pytest.approx(20)
    assert training_flops(N, D) == pytest.approx(1.2e13)
    N2, D2 = chinchilla_optimal(1.2e13, tokens_per_parameter=5)
    assert D2 / N2 == pytest.approx(5) and N2 > N
    with pytest.raises(ValueError):
        chinchilla_optimal(0)


def small_gpt(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, block_size=8, num_hiddens=16, num_heads=2, num_layers=1,
               ffn_num_hiddens=32)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


@pytest.mark.parametrize("n", [10, 17, 40, 41])
@pytest.mark.parametrize("stride", [1, 3, 4, 8])
def test_sliding_windows_score_each_token_once_with_its_context(n, stride):
    model = small_gpt()
    data = torch.randint(0, 11, (n,))
    bits = sliding_window_losses(model, data, stride=stride, batch_size=3)
    T = 8
    # reference: every token t scored from the window that the rule assigns it
    expected = []
    starts = list(range(0, n - T, stride))
    with torch.no_grad():
        for k, s in enumerate(starts):
            window = data[s:s + T + 1]
            nats = torch.nn.functional.cross_entropy(model(window[None, :-1])[0], window[1:],
                                                     reduction="none")
            keep = nats if k == 0 else nats[T - stride:]
            expected.append(keep / math.log(2))
    expected = torch.cat(expected)
    assert bits.shape == expected.shape
    torch.testing.assert_close(bits, expected, rtol=1e-5, atol=1e-6)
    # every token from the second up to the last one a window reaches, exactly once
    assert bits.numel() == starts[-1] + T


def test_sliding_windows_with_a_full_stride_are_the_consecutive_windows():
    model = small_gpt()
    data = torch.randint(0, 11, (75,))
    consecutive = held_out_losses(model, data).reshape(-1)
    torch.testing.assert_close(sliding_window_losses(model, data, stride=8), consecutive)


def test_sliding_windows_give_later_tokens_more_context_and_restore_the_mode():
    model = small_gpt().train()
    data = torch.randint(0, 11, (50,))
    sliding_window_losses(model, data)
    assert model.training


def test_sliding_window_errors():
    model = small_gpt()
    data = torch.randint(0, 11, (50,))
    with pytest.raises(ValueError, match="stride must be at most"):
        sliding_window_losses(model, data, stride=9)
    with pytest.raises(ValueError, match="stride"):
        sliding_window_losses(model, data, stride=0)
    with pytest.raises(ValueError, match="1-D"):
        sliding_window_losses(model, data[None])
    with pytest.raises(ValueError, match="more than block_size"):
        sliding_window_losses(model, data[:9])
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        sliding_window_losses(model, data + 20)
    with pytest.raises(ValueError, match="causal"):
        sliding_window_losses(small_gpt(causal=False), data)
