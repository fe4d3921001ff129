"""GraphAttention on an edge list equals the dense masked form (float64, values and
gradients), and its edge cases give the dense form's answer or a clear ValueError."""

import pytest
import torch

from d2lattn import GraphAttention, sparse_to_edge_index

F64 = dict(rtol=1e-12, atol=1e-12)


def _graph(N, E, seed, self_loops_in_list=True):
    g = torch.Generator().manual_seed(seed)
    A = torch.zeros(N, N, dtype=torch.bool)
    A.view(-1)[torch.randperm(N * N, generator=g)[:E]] = True  # directed, no duplicates
    A[1, 1] = A[2, 2] = self_loops_in_list  # self-loops in the list itself
    A[:, 0] = False  # nobody attends to node 0 ...
    A[0] = False  # ... and node 0 attends to nobody: isolated
    targets, sources = A.nonzero().T
    return A, torch.stack([sources, targets])


def _run(gat, X, **graph):
    X = X.clone().requires_grad_(True)
    out = gat(X, **graph)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    grads = [X.grad] + [p.grad.clone() for p in gat.parameters()]
    gat.zero_grad()
    return out, grads


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (4, False)])
@pytest.mark.parametrize("self_loops", [True, False])
def test_edge_list_equals_dense_form(seed, heads, concat, self_loops):
    torch.manual_seed(seed)
    N = 13
    A, edge_index = _graph(N, 40, seed)
    assert not torch.equal(A, A.T) and bool(A.diagonal().any())  # directed, with self-loops
    gat = GraphAttention(5, 4, heads, concat=concat, self_loops=self_loops).double()
    X = torch.randn(N, 5, dtype=torch.float64)
    dense, dense_grads = _run(gat, X, adjacency=A)
    dense_weights = gat.attention_weights
    edges, edge_grads = _run(gat, X, edge_index=edge_index)
    torch.testing.assert_close(edges, dense, **F64)
    for a, b in zip(edge_grads, dense_grads):
        torch.testing.assert_close(a, b, **F64)
    src, dst = gat.attention_edges
    torch.testing.assert_close(gat.attention_weights, dense_weights[:, dst, src], **F64)
    if not self_loops:  # node 0 has no incoming edge: zeros, and no NaN anywhere
        assert torch.equal(edges[0], torch.zeros_like(edges[0]))
    assert bool(torch.isfinite(edges).all())


def test_sparse_adjacency_is_read_as_its_edges():
    torch.manual_seed(0)
    A, _ = _graph(9, 25, 0)
    gat = GraphAttention(5, 4, 2).double()
    X = torch.randn(9, 5, dtype=torch.float64)
    torch.testing.assert_close(gat(X, A.to_sparse()), gat(X, A), **F64)
    torch.testing.assert_close(gat(X, A.to_sparse_csr()), gat(X, A), **F64)
    explicit_false = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]),
                                             torch.tensor([True, False]), (9, 9))
    assert sparse_to_edge_index(explicit_false).tolist() == [[1], [0]]  # False is no edge
    with pytest.raises(ValueError, match="dense"):
        gat(X.expand(2, 9, 5), torch.stack([A, A]).to_sparse())


def test_batch_of_adjacencies_needs_a_batch_of_features():
    gat = GraphAttention(5, 4, 2)
    A = torch.rand(3, 6, 6) < 0.5
    with pytest.raises(ValueError, match=r"\(3, 6, 6\).*\(3, N, F\).*\(6, 5\)"):
        gat(torch.randn(6, 5), A)
    with pytest.raises(ValueError, match=r"\(3, 6, 6\)"):
        gat(torch.randn(2, 6, 5), A)
    X = torch.randn(3, 6, 5)
    out = gat(X, A)
    for b in range(3):  # each graph of the batch alone
        torch.testing.assert_close(out[b], gat(X[b], A[b]))
    assert gat(X, A[0]).shape == (3, 6, 8)  # one (N, N) adjacency serves the whole batch


def test_edge_index_arguments_are_checked():
    gat = GraphAttention(5, 4, 2)
    X = torch.randn(6, 5)
    for bad, match in [(torch.tensor([[0, 1, 2]]), r"\(2, E\)"),
                       (torch.tensor([[0.0], [1.0]]), "integer"),
                       (torch.tensor([[0, 6], [1, 2]]), r"\[0, 6\).*\[0, 6\]"),
                       (torch.tensor([[-1], [2]]), r"\[-1, 2\]")]:
        with pytest.raises(ValueError, match=match):
            gat(X, edge_index=bad)
    with pytest.raises(ValueError, match="exactly one"):
        gat(X)
    with pytest.raises(ValueError, match="exactly one"):
        gat(X, torch.eye(6, dtype=torch.bool), edge_index=torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"\(N, F\)"):
        gat(X.expand(2, 6, 5), edge_index=torch.tensor([[0], [1]]))


def test_edge_list_in_half_precision_accumulates_in_float32():
    torch.manual_seed(0)
    _, edge_index = _graph(40, 300, 0)
    gat = GraphAttention(5, 4, 2)
    X = torch.randn(40, 5)
    ref = gat.double()(X.double(), edge_index=edge_index)
    out = gat.to(torch.bfloat16)(X.to(torch.bfloat16), edge_index=edge_index)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=0.05, atol=0.02)
