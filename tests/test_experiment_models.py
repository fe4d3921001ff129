"""The experiments' own models against the library's: where a sweep computes a layer for a few
rows only (chapter 17's recall task reads the questions' rows), it must compute the library's
layer for those rows."""

import torch

from experiments import ch17_sparse as ch17


def test_recall_nsa_rows_equal_native_sparse_attention():
    """``Recall.nsa`` (the questions' rows) = ``NativeSparseAttention`` run on the whole
    sequence, read at those rows: values, selection and gradients, float64."""
    torch.manual_seed(0)
    model = ch17.Recall("nsa").double()
    T, Q = 160, ch17.NUM_QUERIES  # 5 blocks of 32; the questions in the last one
    X = torch.randn(3, T, ch17.NUM_HIDDENS, dtype=torch.float64, requires_grad=True)
    rows = model.nsa(X, X[:, -Q:])
    (grad_rows,) = torch.autograd.grad(rows.square().sum(), X)
    full = model.attention(X)[:, -Q:]
    (grad_full,) = torch.autograd.grad(full.square().sum(), X)
    assert torch.allclose(rows, full, rtol=0, atol=1e-12)
    assert torch.equal(model.selection, model.attention.selection[:, :, -Q:])
    assert torch.allclose(grad_rows, grad_full, rtol=0, atol=1e-12)


def test_recall_nsa_cut_stops_the_compression_gradient_only():
    """``nsa_cut``: the same output, and no gradient reaches the compression maps."""
    torch.manual_seed(0)
    cut = ch17.Recall("nsa_cut").double()
    whole = ch17.Recall("nsa").double()
    whole.load_state_dict(cut.state_dict())
    X = torch.randn(2, 128, ch17.NUM_HIDDENS, dtype=torch.float64)
    for model in (cut, whole):
        model.zero_grad()
        model.nsa(X, X[:, -ch17.NUM_QUERIES:]).sum().backward()
    assert torch.equal(cut.nsa(X, X[:, -16:]), whole.nsa(X, X[:, -16:]))
    m_cut, m_whole = cut.attention, whole.attention
    for name in ("compress_keys", "compress_values"):
        assert getattr(m_cut, name).weight.grad is None or not getattr(
            m_cut, name).weight.grad.any(), name
        assert getattr(m_whole, name).weight.grad.abs().sum() > 0, name
    assert m_cut.W_q.weight.grad.abs().sum() > 0  # the rest still learns
