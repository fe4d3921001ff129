"""sinusoidal_positional_encoding and PositionalEncoding."""

import math

import pytest
import torch

from d2lattn import PositionalEncoding, sinusoidal_positional_encoding


def test_table_matches_formula_entry_by_entry():
    P = sinusoidal_positional_encoding(7, 6, dtype=torch.float64)
    assert P.shape == (7, 6) and P.dtype == torch.float64
    for pos in range(7):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert P[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-15)
            assert P[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-15)


def test_odd_num_hiddens_ends_with_a_sine():
    P = sinusoidal_positional_encoding(4, 5, dtype=torch.float64)
    assert P.shape == (4, 5)
    angle = 3 / 10000 ** (4 / 5)
    assert P[3, 4].item() == pytest.approx(math.sin(angle), abs=1e-15)


def test_module_adds_table_as_buffer_and_checks_length():
    pe = PositionalEncoding(8, max_len=10)
    assert "P" in dict(pe.named_buffers()) and pe.P.shape == (10, 8)
    assert "P" not in pe.state_dict()
    X = torch.randn(2, 6, 8)
    X0 = X.clone()
    torch.testing.assert_close(pe(X), X + pe.P[:6])
    assert torch.equal(X, X0)
    assert pe.double().P.dtype == torch.float64
    with pytest.raises(ValueError, match="exceeds max_len = 10"):
        pe(torch.randn(1, 11, 8))
    with pytest.raises(ValueError, match="num_hiddens = 8"):
        pe(torch.randn(1, 3, 7))


@pytest.mark.parametrize("args", [(0, 4), (4, 0), (2.5, 4)])
def test_bad_sizes_raise(args):
    with pytest.raises(ValueError):
        sinusoidal_positional_encoding(*args)


def test_dropout_only_in_training():
    pe = PositionalEncoding(4, dropout=0.5, max_len=5)
    X = torch.zeros(1, 5, 4)
    pe.eval()
    torch.testing.assert_close(pe(X), pe.P[None])
    pe.train()
    torch.manual_seed(0)
    out = pe(X)
    assert torch.all((out == 0) | torch.isclose(out, 2 * pe.P[None]))
