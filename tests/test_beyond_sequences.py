"""Chapter 16's library: sets (ISAB, PMA), point clouds (vector attention), graphs (GAT)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from d2lattn.graphs import (GraphAttention, GraphNodeClassifier, add_self_loops,
                            normalized_adjacency)
from d2lattn.pointcloud import (SHAPES, PointCloudClassifier, VectorSelfAttention, knn_indices,
                                make_point_clouds, random_rotations)
from d2lattn.sets import (InducedSetAttentionBlock, MultiheadAttentionBlock,
                          PoolingByMultiheadAttention, SetRegressor)


def random_graph(N, p=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.rand(N, N, generator=g) < p
    return A | A.T


# ---------------------------------------------------------------- graphs


def gat_by_loop(layer: GraphAttention, X: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Equations (1)-(4) of Velickovic et al., one node and one neighbour at a time."""
    h, Fo = layer.num_heads, layer.out_features
    WH = layer.W(X).view(X.shape[0], h, Fo)  # (N, h, F')
    A = A | torch.eye(len(A), dtype=torch.bool) if layer.self_loops else A
    out = torch.zeros(X.shape[0], h, Fo, dtype=X.dtype)
    for i in range(X.shape[0]):
        neighbours = [j for j in range(X.shape[0]) if A[i, j]]
        for head in range(h):
            a = torch.cat([layer.a_query[head], layer.a_key[head]])
            e = torch.stack([torch.nn.functional.leaky_relu(
                a @ torch.cat([WH[i, head], WH[j, head]]), layer.negative_slope)
                for j in neighbours]) if neighbours else torch.zeros(0, dtype=X.dtype)
            alpha = torch.softmax(e, dim=0)
            for w, j in zip(alpha, neighbours):
                out[i, head] += w * WH[j, head]
    return out.flatten(1) if layer.concat else out.mean(1)


@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("self_loops", [True, False])
def test_gat_equals_loop_over_neighbours(concat, self_loops):
    torch.manual_seed(0)
    layer = GraphAttention(5, 3, num_heads=2, concat=concat, self_loops=self_loops).double()
    A = random_graph(9)
    A[4] = False  # node 4 has no neighbour (but is someone's)
    X = torch.randn(9, 5, dtype=torch.float64)
    out = layer(X, A)
    assert torch.allclose(out, gat_by_loop(layer, X, A), atol=1e-12)
    if not self_loops:  # an empty neighbourhood pools nothing: zeros, never NaN
        assert torch.equal(out[4], torch.zeros_like(out[4]))


def test_gat_weights_live_on_edges_only():
    torch.manual_seed(1)
    layer = GraphAttention(4, 2, num_heads=3)
    A = random_graph(12, seed=2)
    layer(torch.randn(12, 4), A)
    w = layer.attention_weights  # (h, N, N)
    allowed = add_self_loops(A)
    assert torch.equal(w[:, ~allowed], torch.zeros_like(w[:, ~allowed]))
    assert torch.allclose(w.sum(-1), torch.ones(3, 12))


def test_gat_batch_axis_is_graph_by_graph():
    torch.manual_seed(2)
    layer = GraphAttention(4, 2, num_heads=2)
    A = torch.stack([random_graph(6, seed=s) for s in range(3)])  # (B, N, N)
    X = torch.randn(3, 6, 4)
    batched = layer(X, A)
    for b in range(3):
        assert torch.allclose(batched[b], layer(X[b], A[b]), atol=1e-6)


def test_gat_complete_graph_is_unmasked_attention():
    torch.manual_seed(3)
    layer = GraphAttention(4, 2, num_heads=1)
    X = torch.randn(5, 4)
    full = layer(X, torch.ones(5, 5, dtype=torch.bool))
    WH = layer.W(X)
    scores = torch.nn.functional.leaky_relu(
        (WH @ layer.a_query[0])[:, None] + (WH @ layer.a_key[0])[None, :], 0.2)
    assert torch.allclose(full, torch.softmax(scores, -1) @ WH, atol=1e-6)


def test_gat_bad_input():
    layer = GraphAttention(4, 2)
    with pytest.raises(ValueError, match="adjacency must be a bool tensor"):
        layer(torch.randn(5, 4), torch.ones(5, 5))
    with pytest.raises(ValueError, match="adjacency must be a bool tensor"):
        layer(torch.randn(5, 4), torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="X must be a float tensor"):
        layer(torch.randn(5, 3), torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="out_features"):
        GraphAttention(4, 0)


def test_normalized_adjacency_matches_formula():
    A = random_graph(7, seed=4)
    A.fill_diagonal_(False)
    Ahat = (A | torch.eye(7, dtype=torch.bool)).double()
    D = torch.diag(Ahat.sum(1) ** -0.5)
    assert torch.allclose(normalized_adjacency(A).double(), D @ Ahat @ D, atol=1e-6)
    directed = torch.zeros(3, 3, dtype=torch.bool)
    directed[0, 1] = True
    with pytest.raises(ValueError, match="symmetric"):
        normalized_adjacency(directed)


def test_normalized_adjacency_dtype_follows_the_argument():
    A = random_graph(6, seed=1)
    assert normalized_adjacency(A).dtype == torch.float32
    assert normalized_adjacency(A, dtype=torch.float64).dtype == torch.float64
    with pytest.raises(ValueError, match="dtype"):
        normalized_adjacency(A, dtype=torch.int64)


def test_gcn_is_kipf_welling_bias_after_propagation():
    """Two layers of A_norm X W + b in float64, against the formula written out."""
    from d2lattn.graphs import GraphNodeClassifier, make_block_graph
    X, A, _ = make_block_graph(30, 3, seed=2)
    torch.manual_seed(0)
    model = GraphNodeClassifier("gcn", X.shape[1], 3).double().eval()
    for layer in (model.layer1, model.layer2):
        torch.nn.init.normal_(layer.bias)  # nonzero biases, so their place matters
    An = normalized_adjacency(A, dtype=torch.float64)
    H = torch.nn.functional.elu(An @ X.double() @ model.layer1.weight.T + model.layer1.bias)
    expected = An @ H @ model.layer2.weight.T + model.layer2.bias
    out = model(X.double(), A)
    assert out.dtype == torch.float64
    assert torch.allclose(out, expected, atol=1e-12, rtol=0)
    inside = An @ (H @ model.layer2.weight.T + model.layer2.bias)  # the old Â(XW + b)
    assert not torch.allclose(out, inside, atol=1e-3)


def test_add_self_loops_leaves_input_alone():
    A = torch.zeros(3, 3, dtype=torch.bool)
    B = add_self_loops(A)
    assert not A.any() and B.diagonal().all()


# ---------------------------------------------------------------- point clouds


def test_make_point_clouds_is_seeded_and_well_formed():
    a = make_point_clouds(40, min_points=10, max_points=30, seed=3)
    b = make_point_clouds(40, min_points=10, max_points=30, seed=3)
    c = make_point_clouds(40, min_points=10, max_points=30, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a.points, c.points)
    assert a.points.shape == (40, 30, 3)
    assert ((a.valid_lens >= 10) & (a.valid_lens <= 30)).all()
    for b_, n in enumerate(a.valid_lens.tolist()):
        assert torch.equal(a.points[b_, n:], torch.zeros(30 - n, 3))
    # without noise every point lies in the ball of radius 1.3 (the largest scale)
    clean = make_point_clouds(40, noise=0.0, seed=5)
    assert float(clean.points.norm(dim=-1).max()) <= 1.3 + 1e-5
    assert set(make_point_clouds(200, seed=0).labels.tolist()) == set(range(len(SHAPES)))


def test_rotation_preserves_shape_of_cloud():
    """A cloud and its unrotated twin have the same pairwise distances."""
    kw = dict(min_points=20, max_points=20, noise=0.0, seed=7)
    r, u = make_point_clouds(5, rotate=True, **kw), make_point_clouds(5, rotate=False, **kw)
    assert torch.allclose(torch.cdist(r.points, r.points), torch.cdist(u.points, u.points),
                          atol=1e-5)
    assert not torch.allclose(r.points, u.points, atol=1e-2)


def test_random_rotations_are_rotations():
    R = random_rotations(100, generator=torch.Generator().manual_seed(0)).double()
    assert torch.allclose(R @ R.transpose(1, 2), torch.eye(3).expand(100, 3, 3).double(),
                          atol=1e-5)
    assert torch.allclose(torch.linalg.det(R), torch.ones(100, dtype=torch.float64), atol=1e-5)


def test_make_point_clouds_bad_input():
    with pytest.raises(ValueError, match="min_points"):
        make_point_clouds(3, min_points=10, max_points=5)
    with pytest.raises(ValueError, match="noise"):
        make_point_clouds(3, noise=-1.0)
    with pytest.raises(ValueError, match="outliers"):
        make_point_clouds(3, min_points=4, max_points=8, outliers=5)
    with pytest.raises(ValueError, match="shapes"):
        make_point_clouds(3, shapes=["teapot"])


def test_knn_matches_sorting_and_ignores_padding():
    torch.manual_seed(0)
    P = torch.randn(2, 12, 3)
    lens = torch.tensor([12, 8])
    idx = knn_indices(P, 4, lens)
    for b, n in enumerate(lens.tolist()):
        for i in range(12):
            d = (P[b, :n] - P[b, i]).norm(dim=-1)
            if i < n:
                d[i] = -1.0  # the point itself comes first
            assert idx[b, i].tolist() == d.argsort()[:4].tolist()
    assert int(idx[1].max()) < 8  # padding is nobody's neighbour
    with pytest.raises(ValueError, match="at least k"):
        knn_indices(P, 9, lens)
    with pytest.raises(ValueError, match="k must be"):
        knn_indices(P, 0)


def vector_attention_by_loop(layer, X, P, neighbours):
    """Equation (3) of Zhao et al., one point and one neighbour at a time."""
    B, N, d = X.shape
    out = torch.zeros_like(X)
    for b in range(B):
        for i in range(N):
            js = neighbours[b, i].tolist()
            deltas = [layer.position_mlp(P[b, i] - P[b, j]) for j in js]
            rel = torch.stack([layer.weight_mlp(layer.W_q(X[b, i]) - layer.W_k(X[b, j]) + dl)
                               for j, dl in zip(js, deltas)])  # (k, d)
            w = torch.softmax(rel, dim=0)  # per channel, over the neighbours
            for wj, j, dl in zip(w, js, deltas):
                out[b, i] += wj * (layer.W_v(X[b, j]) + dl)
    return out


def test_vector_attention_equals_loop():
    torch.manual_seed(0)
    layer = VectorSelfAttention(6, k=4).double()
    X, P = torch.randn(2, 7, 6, dtype=torch.float64), torch.randn(2, 7, 3, dtype=torch.float64)
    out = layer(X, P)
    assert torch.allclose(out, vector_attention_by_loop(layer, X, P, layer.neighbours),
                          atol=1e-12)
    w = layer.attention_weights  # (B, N, k, d): one weight per channel
    assert torch.allclose(w.sum(dim=2), torch.ones(2, 7, 6, dtype=torch.float64))
    assert not torch.allclose(w[..., 0], w[..., 1])  # channels differ: vector, not scalar


def test_vector_attention_is_permutation_equivariant():
    torch.manual_seed(1)
    layer = VectorSelfAttention(8, k=5)
    X, P = torch.randn(1, 20, 8), torch.randn(1, 20, 3)
    perm = torch.randperm(20)
    assert torch.allclose(layer(X[:, perm], P[:, perm]), layer(X, P)[:, perm], atol=1e-5)


def test_vector_attention_bad_input():
    layer = VectorSelfAttention(8, k=3)
    with pytest.raises(ValueError, match="X must have shape"):
        layer(torch.randn(1, 5, 7), torch.randn(1, 5, 3))
    with pytest.raises(ValueError, match="positions must have shape"):
        layer(torch.randn(1, 5, 8), torch.randn(1, 5, 2))


def test_uniform_and_edgeconv_against_their_formulas():
    from d2lattn.pointcloud import EdgeConv, UniformNeighbourPooling
    torch.manual_seed(0)
    X, P = torch.randn(2, 9, 6, dtype=torch.float64), torch.randn(2, 9, 3, dtype=torch.float64)
    lens = torch.tensor([9, 7])
    uniform, edge = UniformNeighbourPooling(6, k=4).double(), EdgeConv(6, k=4).double()
    nb = knn_indices(P, 4, lens)
    out_u, out_e = uniform(X, P, lens), edge(X, P, lens)
    for b in range(2):
        for i in range(int(lens[b])):
            js = nb[b, i].tolist()
            vals = [uniform.W_v(X[b, j]) + uniform.position_mlp(P[b, i] - P[b, j]) for j in js]
            assert torch.allclose(out_u[b, i], sum(vals) / 4, atol=1e-12)
            edges = [edge.edge_mlp(torch.cat([X[b, i], X[b, j] - X[b, i], P[b, j] - P[b, i]]))
                     for j in js]
            assert torch.allclose(out_e[b, i], torch.stack(edges).amax(0), atol=1e-12)
    with pytest.raises(ValueError, match="X must have shape"):
        uniform(torch.randn(1, 5, 4), torch.randn(1, 5, 3))
    with pytest.raises(ValueError, match="neighbours must have shape"):
        edge(X, P, lens, neighbours=nb[..., :3])


@pytest.mark.parametrize("kind", PointCloudClassifier.KINDS)
def test_classifier_reads_a_set(kind):
    """Invariant to the order of the points and blind to the padding."""
    torch.manual_seed(2)
    model = PointCloudClassifier(kind, 5, num_hiddens=16, k=6).eval()
    clouds = make_point_clouds(3, min_points=10, max_points=14, seed=3)
    P, lens = clouds.points, clouds.valid_lens
    logits = model(P, lens)
    for b, n in enumerate(lens.tolist()):
        perm = torch.randperm(n)
        alone = model(P[b:b + 1, :n][:, perm], torch.tensor([n]))  # no padding, shuffled
        assert torch.allclose(alone, logits[b:b + 1], atol=1e-5), kind
    junk = P.clone()
    for b, n in enumerate(lens.tolist()):
        junk[b, n:] = 100.0
    assert torch.allclose(model(junk, lens), logits, atol=1e-5)
    with pytest.raises(ValueError, match="kind"):
        PointCloudClassifier("graph", 5)
    with pytest.raises(ValueError, match="points must have shape"):
        model(P[..., :2], lens)


# ---------------------------------------------------------------- sets


def test_mab_is_the_set_transformer_equation():
    torch.manual_seed(0)
    mab = MultiheadAttentionBlock(8, 2).double()
    X, Y = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    torch_mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    a = mab.attention
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        torch_mha.in_proj_bias.copy_(torch.cat([a.W_q.bias, a.W_k.bias, a.W_v.bias]))
        torch_mha.out_proj.weight.copy_(a.W_o.weight)
        torch_mha.out_proj.bias.copy_(a.W_o.bias)
    H = mab.norm1(X + torch_mha(X, Y, Y, need_weights=False)[0])
    assert torch.allclose(mab(X, Y), mab.norm2(H + mab.ffn(H)), atol=1e-12)


def test_isab_is_equivariant_and_linear_in_n():
    torch.manual_seed(1)
    isab = InducedSetAttentionBlock(8, 2, num_inducing=3)
    X = torch.randn(2, 11, 8)
    perm = torch.randperm(11)
    assert torch.allclose(isab(X[:, perm]), isab(X)[:, perm], atol=1e-5)
    assert isab.mab1.attention.attention_weights.shape == (2, 2, 3, 11)  # m x n, not n x n
    assert isab.mab2.attention.attention_weights.shape == (2, 2, 11, 3)


def test_pma_is_invariant_and_ignores_padding():
    torch.manual_seed(2)
    pma = PoolingByMultiheadAttention(8, 2, num_seeds=2)
    Z = torch.randn(2, 9, 8)
    perm = torch.randperm(9)
    assert torch.allclose(pma(Z[:, perm]), pma(Z), atol=1e-5)
    lens = torch.tensor([9, 5])
    padded = pma(Z, lens)
    assert torch.allclose(padded[1], pma(Z[1:, :5])[0], atol=1e-5)
    Z2 = Z.clone()
    Z2[1, 5:] = 1e3
    assert torch.allclose(pma(Z2, lens), padded, atol=1e-5)
    isab = InducedSetAttentionBlock(8, 2, num_inducing=3)
    out = isab(Z, lens)
    assert torch.allclose(out[1, :5], isab(Z[1:, :5])[0], atol=1e-5)


def test_set_blocks_bad_input():
    with pytest.raises(ValueError, match="num_inducing"):
        InducedSetAttentionBlock(8, 2, num_inducing=0)
    with pytest.raises(ValueError, match="num_seeds"):
        PoolingByMultiheadAttention(8, 2, num_seeds=0)
    with pytest.raises(ValueError, match="Y must be a float tensor"):
        MultiheadAttentionBlock(8, 2)(torch.randn(1, 2, 8), torch.randn(1, 2, 4))


@pytest.mark.parametrize("model, sizes", [(PointCloudClassifier, (5,)), (SetRegressor, (2,)),
                                          (GraphNodeClassifier, (8, 3))])
def test_an_unknown_kind_is_refused_with_the_kinds(model, sizes):
    """The three models of the chapter check ``kind`` with one check: the message names the
    argument, lists the model's kinds and shows what was given."""
    with pytest.raises(ValueError) as info:
        model("nope", *sizes)
    assert str(info.value) == f"kind must be one of {model.KINDS}, got 'nope'"
