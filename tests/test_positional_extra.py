"""sinusoidal_shift_matrix and LearnedPositionalEmbedding against plain references."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from d2lattn.positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    sinusoidal_positional_encoding,
    sinusoidal_shift_matrix,
)

# float64 sines and cosines of angles up to ~1e3 rad are accurate to a few 1e-13.
ATOL = 1e-11


def reference_code(pos: int, d: int) -> torch.Tensor:
    """PE(pos) from the formula of Vaswani et al. (2017), one number at a time with math."""
    out = []
    for j in range(d):
        w = 1.0 / 10000.0 ** ((j - j % 2) / d)
        out.append(math.sin(pos * w) if j % 2 == 0 else math.cos(pos * w))
    return torch.tensor(out, dtype=torch.float64)


def reference_shift(k: int, d: int) -> torch.Tensor:
    """M_k built with torch.block_diag from explicit 2x2 rotations."""
    blocks = []
    for i in range(d // 2):
        a = k / 10000.0 ** (2 * i / d)
        blocks.append(torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]],
                                   dtype=torch.float64))
    return torch.block_diag(*blocks)


# --- sinusoidal_shift_matrix -------------------------------------------------------------

@pytest.mark.parametrize("k, d", [(0, 2), (1, 4), (5, 16), (-3, 8), (200, 32)])
def test_shift_matrix_matches_block_diag_reference(k, d):
    torch.testing.assert_close(sinusoidal_shift_matrix(k, d), reference_shift(k, d),
                               rtol=0, atol=ATOL)


@settings(deadline=None, max_examples=50)
@given(k=st.integers(-300, 300), half_d=st.integers(1, 24), pos=st.integers(0, 400))
def test_shift_moves_a_code_k_steps(k, half_d, pos):
    d = 2 * half_d
    M = sinusoidal_shift_matrix(k, d)
    torch.testing.assert_close(M @ reference_code(pos, d), reference_code(pos + k, d),
                               rtol=0, atol=ATOL)


@pytest.mark.parametrize("k", [1, 7, 64, -5])
def test_shift_holds_for_every_row_of_the_table(k):
    d, T = 32, 300
    P = sinusoidal_positional_encoding(T, d, dtype=torch.float64)
    M = sinusoidal_shift_matrix(k, d)
    if k > 0:
        torch.testing.assert_close(P[:-k] @ M.T, P[k:], rtol=0, atol=ATOL)
    else:
        torch.testing.assert_close(P[-k:] @ M.T, P[:k], rtol=0, atol=ATOL)


@settings(deadline=None, max_examples=30)
@given(a=st.integers(-100, 100), b=st.integers(-100, 100), half_d=st.integers(1, 16))
def test_shift_matrices_are_orthogonal_and_compose(a, b, half_d):
    d = 2 * half_d
    Ma, Mb = sinusoidal_shift_matrix(a, d), sinusoidal_shift_matrix(b, d)
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(Ma @ Ma.T, eye, rtol=0, atol=ATOL)
    torch.testing.assert_close(Ma @ Mb, sinusoidal_shift_matrix(a + b, d), rtol=0, atol=ATOL)
    torch.testing.assert_close(sinusoidal_shift_matrix(-a, d), Ma.T, rtol=0, atol=ATOL)


def test_shift_zero_is_identity_and_dtype_is_honoured():
    torch.testing.assert_close(sinusoidal_shift_matrix(0, 6), torch.eye(6, dtype=torch.float64),
                               rtol=0, atol=0)
    assert sinusoidal_shift_matrix(2, 6, dtype=torch.float32).dtype == torch.float32
    assert sinusoidal_shift_matrix(2, 6).dtype == torch.float64


@pytest.mark.parametrize("k, d", [(1.0, 4), (True, 4), (torch.tensor(1), 4), ("1", 4)])
def test_shift_rejects_a_non_integer_k(k, d):
    with pytest.raises(ValueError, match="k must be an integer"):
        sinusoidal_shift_matrix(k, d)


@pytest.mark.parametrize("d", [0, -2, 3, 7, 4.0, True])
def test_shift_rejects_a_bad_num_hiddens(d):
    with pytest.raises(ValueError, match="num_hiddens must be a positive even integer"):
        sinusoidal_shift_matrix(1, d)


# --- LearnedPositionalEmbedding ---------------------------------------------------------

def test_learned_adds_the_embedding_rows_like_nn_embedding():
    torch.manual_seed(0)
    pe = LearnedPositionalEmbedding(num_hiddens=6, max_len=10).double()
    X = torch.randn(3, 7, 6, dtype=torch.float64)
    X_before = X.clone()
    expected = X + pe.embedding(torch.arange(7))[None]  # plain reference: look up positions
    out = pe(X)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(X, X_before, rtol=0, atol=0)  # input left unmodified
    assert out.shape == (3, 7, 6)
    assert pe.P is pe.embedding.weight


def test_learned_accepts_exactly_max_len_and_refuses_one_more():
    pe = LearnedPositionalEmbedding(num_hiddens=4, max_len=5)
    assert pe.max_len == 5
    assert pe(torch.zeros(1, 5, 4)).shape == (1, 5, 4)
    with pytest.raises(ValueError, match="exceeds max_len = 5"):
        pe(torch.zeros(1, 6, 4))


def test_learned_has_max_len_times_d_parameters_and_trains_only_used_rows():
    torch.manual_seed(0)
    pe = LearnedPositionalEmbedding(num_hiddens=3, max_len=8)
    assert sum(p.numel() for p in pe.parameters()) == 8 * 3
    assert [name for name, _ in pe.named_parameters()] == ["embedding.weight"]
    pe(torch.zeros(2, 5, 3)).sum().backward()
    grad = pe.embedding.weight.grad
    torch.testing.assert_close(grad[:5], torch.full((5, 3), 2.0), rtol=0, atol=0)  # B = 2
    torch.testing.assert_close(grad[5:], torch.zeros(3, 3), rtol=0, atol=0)


def test_learned_dropout_only_in_training():
    torch.manual_seed(0)
    pe = LearnedPositionalEmbedding(num_hiddens=4, dropout=0.5, max_len=6)
    X = torch.randn(2, 6, 4)
    pe.eval()
    torch.testing.assert_close(pe(X), X + pe.P.detach(), rtol=0, atol=0)
    pe.train()
    out = pe(X)
    kept = out != 0
    assert 0 < kept.sum() < kept.numel()  # some entries dropped, some kept
    torch.testing.assert_close(out[kept], 2.0 * (X + pe.P.detach())[kept], rtol=0, atol=0)


def test_learned_and_sinusoidal_share_an_interface():
    X = torch.zeros(2, 4, 8)
    for module in (PositionalEncoding(8, dropout=0.0, max_len=6),
                   LearnedPositionalEmbedding(8, dropout=0.0, max_len=6)):
        assert module.max_len == 6
        assert module.P.shape == (6, 8)
        torch.testing.assert_close(module(X), X + module.P[:4].detach(), rtol=0, atol=0)


def test_learned_follows_double():
    pe = LearnedPositionalEmbedding(num_hiddens=4, max_len=6).double()
    assert pe.P.dtype == torch.float64
    assert pe(torch.zeros(1, 3, 4, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_hiddens=0), "num_hiddens"),
    (dict(num_hiddens=4.0), "num_hiddens"),
    (dict(num_hiddens=4, max_len=0), "max_len"),
    (dict(num_hiddens=4, max_len=True), "max_len"),
    (dict(num_hiddens=4, dropout=1.0), "dropout"),
    (dict(num_hiddens=4, dropout=-0.1), "dropout"),
])
def test_learned_rejects_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LearnedPositionalEmbedding(**kwargs)


@pytest.mark.parametrize("X, match", [
    (torch.zeros(1, 3, 5), "num_hiddens = 4"),
    (torch.zeros(1, 3, 4, dtype=torch.long), "floating-point"),
    (torch.zeros(4), "floating-point"),
    ([[0.0] * 4], "floating-point"),
])
def test_learned_rejects_bad_inputs(X, match):
    pe = LearnedPositionalEmbedding(num_hiddens=4, max_len=6)
    with pytest.raises(ValueError, match=match):
        pe(X)


def test_learned_table_is_an_nn_embedding():
    pe = LearnedPositionalEmbedding(num_hiddens=4, max_len=6)
    assert isinstance(pe.embedding, nn.Embedding)
    assert (pe.embedding.num_embeddings, pe.embedding.embedding_dim) == (6, 4)
