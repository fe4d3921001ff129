r"""Attention over graphs: a graph attention layer is a masked softmax over the edges.

In a graph attention network (GAT, Veličković et al. 2018) every node is a query, its
neighbours are its keys, and the adjacency matrix is the mask: chapter 3's
:func:`~d2lattn.masked_softmax` with ``mask = adjacency``. A Transformer without a mask is the
same layer on the complete graph. Beside it, the graph convolution of Kipf and Welling (2017),
whose weights over the neighbours are fixed by the degrees instead of computed from the
features (:func:`normalized_adjacency`).

Shape legend: ``N`` nodes, ``F`` input features, ``h`` heads, ``F'`` output features per head;
an optional leading batch axis ``B`` (graphs of the same size).
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (check_adjacency, check_choice, check_dropout, check_edge_index,
                      check_positive_ints)
from .masking import masked_softmax
from .transformer import TransformerEncoderBlock
from .training import Callback, fit

__all__ = ["GraphAttention", "GraphNodeClassifier", "add_self_loops", "make_block_graph",
           "normalized_adjacency", "sparse_to_edge_index", "train_node_classifier"]


def add_self_loops(adjacency: Tensor) -> Tensor:
    """The adjacency with every node its own neighbour: ``adjacency | I``.

    Args:
        adjacency: ``(N, N)`` or ``(B, N, N)`` bool, ``[i, j]`` True where ``j`` is a neighbour
            of ``i``; never modified.

    Returns:
        bool tensor of the same shape with a True diagonal.

    Raises:
        ValueError: ``adjacency`` not a square bool tensor.

    Example:
        >>> add_self_loops(torch.tensor([[False, True], [True, False]])).int()
        tensor([[1, 1],
                [1, 1]], dtype=torch.int32)

    Source: Veličković et al. (2018), section 2.1 (a node's neighbourhood includes itself).
    """
    N = adjacency.shape[-1] if isinstance(adjacency, Tensor) and adjacency.dim() >= 2 else -1
    check_adjacency(adjacency, N)
    return adjacency | torch.eye(N, dtype=torch.bool, device=adjacency.device)


def normalized_adjacency(adjacency: Tensor, *, dtype: torch.dtype = torch.float32) -> Tensor:
    r"""The graph convolution's fixed weights, :math:`\hat D^{-1/2} (A + I) \hat D^{-1/2}`.

    Node ``i`` averages its neighbours (itself included) with weight
    :math:`1 / \sqrt{\hat d_i \hat d_j}`, where :math:`\hat d` counts neighbours with the
    self-loop: fixed by the graph, the same for every feature vector.

    Args:
        adjacency: ``(N, N)`` or ``(B, N, N)`` bool, symmetric (an undirected graph).
        dtype: keyword-only; the floating dtype of the result (the GCN passes its features'
            dtype, so a float64 model gets float64 weights).

    Returns:
        a tensor of the same shape, of ``dtype``, on ``adjacency``'s device.

    Raises:
        ValueError: ``adjacency`` not a square bool tensor, or not symmetric; ``dtype`` not a
            floating dtype.

    Example:
        >>> A = torch.tensor([[False, True], [True, False]])
        >>> normalized_adjacency(A)
        tensor([[0.5000, 0.5000],
                [0.5000, 0.5000]])

    Source: Kipf and Welling (2017), "Semi-Supervised Classification with Graph Convolutional
    Networks", equation (2).
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
    A = add_self_loops(adjacency)
    if not torch.equal(A, A.transpose(-1, -2)):
        raise ValueError("adjacency must be symmetric (an undirected graph)")
    A = A.to(dtype)
    inv_sqrt = A.sum(dim=-1).rsqrt()  # (..., N): every degree >= 1 with the self-loop
    return inv_sqrt[..., :, None] * A * inv_sqrt[..., None, :]


class GraphAttention(nn.Module):
    r"""A graph attention layer (GAT): additive attention over each node's neighbours.

    .. math::
        e_{ij} = \mathrm{LeakyReLU}\big(\mathbf a^\top [\mathbf W \mathbf h_i \,\|\,
        \mathbf W \mathbf h_j]\big), \qquad
        \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal N(i)}(e_{ij}), \qquad
        \mathbf h'_i = \sum_{j \in \mathcal N(i)} \alpha_{ij} \mathbf W \mathbf h_j

    per head. Splitting :math:`\mathbf a = [\mathbf a_1; \mathbf a_2]` makes the score a sum,
    :math:`\mathbf a_1^\top \mathbf W \mathbf h_i + \mathbf a_2^\top \mathbf W \mathbf h_j`, so
    all ``N x N`` scores come from two matrix-vector products, and the restriction to
    :math:`\mathcal N(i)` is :func:`~d2lattn.masked_softmax` with the adjacency as the mask. A
    node with no neighbour gets zero weights (the book's empty-row rule), so pass
    ``self_loops=True`` (the default, as in the paper) unless you mean it.

    Args:
        in_features: F. out_features: F', per head. num_heads: h.
        concat: keyword-only; True concatenates the heads (output ``h F'``), False averages
            them (output ``F'``, the paper's output layer).
        negative_slope: keyword-only; LeakyReLU's slope (0.2 in the paper).
        dropout: keyword-only; dropout on the attention weights, in ``[0, 1)``.
        self_loops: keyword-only; add ``i -> i`` to every node's neighbourhood.

    Shapes (``forward``):
        X ``(N, F)`` or ``(B, N, F)`` float; adjacency ``(N, N)`` or ``(B, N, N)`` bool,
        ``[i, j]`` True where node ``i`` may attend to node ``j``. Returns ``(N, h F')`` or
        ``(N, F')`` (with the batch axis if given). No activation is applied. Or, for a
        large graph, ``edge_index`` ``(2, E)`` (sources, targets) in place of the adjacency:
        the same layer in ``O(E)`` memory (see :meth:`forward`).

    Attributes:
        attention_weights: ``(..., h, N, N)`` the last call's weights, detached, before
            dropout; zero wherever the mask is False.

    Raises:
        ValueError: sizes that are not positive integers, a bad ``dropout``; ``X`` not float
            with ``F`` features; ``adjacency`` not bool ``(N, N)`` or ``(B, N, N)``.

    Example:
        >>> gat = GraphAttention(in_features=4, out_features=3, num_heads=2)
        >>> A = torch.tensor([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=torch.bool)
        >>> gat(torch.randn(3, 4), A).shape, gat.attention_weights.shape
        (torch.Size([3, 6]), torch.Size([2, 3, 3]))
        >>> bool((gat.attention_weights[:, 0, 2] == 0).all())  # 0 and 2 are not neighbours
        True

    Source: Veličković et al. (2018), "Graph Attention Networks", equations (1)-(5).
    """

    def __init__(self, in_features: int, out_features: int, num_heads: int = 1, *,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 self_loops: bool = True) -> None:
        super().__init__()
        check_positive_ints(in_features=in_features, out_features=out_features,
                            num_heads=num_heads)
        check_dropout(dropout)
        self.in_features, self.out_features, self.num_heads = in_features, out_features, num_heads
        self.concat, self.negative_slope, self.self_loops = concat, negative_slope, self_loops
        self.W = nn.Linear(in_features, num_heads * out_features, bias=False)
        self.a_query = nn.Parameter(torch.empty(num_heads, out_features))  # a_1, per head
        self.a_key = nn.Parameter(torch.empty(num_heads, out_features))  # a_2, per head
        nn.init.xavier_uniform_(self.a_query)
        nn.init.xavier_uniform_(self.a_key)
        self.dropout = nn.Dropout(dropout)
        self.attention_weights: Optional[Tensor] = None
        self.attention_edges: Optional[Tensor] = None  # the edge list of the last edge call

    def forward(self, X: Tensor, adjacency: Optional[Tensor] = None, *,
                edge_index: Optional[Tensor] = None) -> Tensor:
        """Attention of every node over its neighbours, given as a dense ``adjacency`` or as
        an edge list ``edge_index`` (exactly one).

        Args:
            X: ``(N, F)`` or ``(B, N, F)`` float node features.
            adjacency: ``(N, N)`` or ``(B, N, N)`` bool, ``[i, j]`` True where node ``i``
                attends to node ``j``; an ``(N, N)`` adjacency serves every graph of a batch.
                A sparse ``(N, N)`` bool tensor is read as its edge list (its True entries).
            edge_index: keyword-only; ``(2, E)`` integers, column ``(j, i)`` an edge from
                source ``j`` to target ``i`` (node ``i`` attends to node ``j``, PyTorch
                Geometric's convention), for ``X`` of shape ``(N, F)``. Memory is ``O(E h F')``
                instead of the dense form's ``O(h N^2)``. A repeated edge counts once per copy.

        Returns:
            ``(N, h F')`` or ``(N, F')`` (with the batch axis if given).

        Raises:
            ValueError: ``X`` not float ``(N, F)`` / ``(B, N, F)``; neither or both of
                ``adjacency`` and ``edge_index``; a batch of adjacencies ``(B, N, N)`` with
                features ``(N, F)`` or with another ``B``; a sparse adjacency with a batch axis;
                ``edge_index`` not integers ``(2, E)`` in ``[0, N)``, or with batched ``X``.
        """
        if (not isinstance(X, Tensor) or not X.is_floating_point() or X.dim() not in (2, 3)
                or X.shape[-1] != self.in_features):
            raise ValueError(f"X must be a float tensor of shape (N, {self.in_features}) or "
                             f"(B, N, {self.in_features}), got "
                             f"{getattr(X, 'shape', type(X).__name__)}")
        if (adjacency is None) == (edge_index is None):
            raise ValueError("give exactly one of adjacency (N, N) and edge_index (2, E)")
        N = X.shape[-2]
        if isinstance(adjacency, Tensor) and adjacency.layout != torch.strided \
                and adjacency.dim() == 2 and adjacency.dtype == torch.bool:
            edge_index, adjacency = sparse_to_edge_index(adjacency), None
        if edge_index is not None:
            if X.dim() != 2:
                raise ValueError(f"edge_index takes features X of shape (N, F), got "
                                 f"{tuple(X.shape)}: put the graphs of a batch side by side "
                                 "as one graph of their nodes")
            return self._forward_edges(X, check_edge_index(edge_index, N))
        adjacency = check_adjacency(adjacency, N)
        if adjacency.dim() == 3 and (X.dim() == 2 or adjacency.shape[0] != X.shape[0]):
            raise ValueError(f"adjacency of shape {tuple(adjacency.shape)} (B, N, N) needs "
                             f"features X of shape ({adjacency.shape[0]}, N, F), got "
                             f"{tuple(X.shape)}; one graph's features need an (N, N) adjacency")
        if self.self_loops:
            adjacency = add_self_loops(adjacency)
        h, Fo = self.num_heads, self.out_features
        # 1. project, and split into heads
        WH = self.W(X).unflatten(-1, (h, Fo)).transpose(-3, -2)  # (..., h, N, F')
        # 2. score every pair: a_1 . W h_i + a_2 . W h_j, then LeakyReLU
        e_query = (WH * self.a_query[:, None, :]).sum(-1)  # (..., h, N)
        e_key = (WH * self.a_key[:, None, :]).sum(-1)  # (..., h, N)
        scores = F.leaky_relu(e_query[..., :, None] + e_key[..., None, :],
                              self.negative_slope)  # (..., h, N, N)
        # 3. normalize over the neighbours only: the adjacency is the mask
        mask = adjacency.to(X.device)[..., None, :, :]  # (..., 1, N, N), broadcast over heads
        weights = masked_softmax(scores, mask=mask)  # (..., h, N, N)
        self.attention_weights = weights.detach()
        # 4. pool the neighbours' projected features; concatenate or average the heads
        out = self.dropout(weights) @ WH  # (..., h, N, F')
        if self.concat:
            return out.transpose(-3, -2).flatten(-2)  # (..., N, h F')
        return out.mean(dim=-3)  # (..., N, F')

    def _forward_edges(self, X: Tensor, edge_index: Tensor) -> Tensor:
        """The same layer on an edge list: a softmax over each node's incoming edges with
        scatter reductions (``scatter_reduce`` for the maximum, ``index_add_`` for the sums).
        ``attention_weights`` becomes ``(h, E')``, one weight per edge of
        ``attention_edges`` ``(2, E')`` (the edges used, self-loops included)."""
        N, h, Fo = X.shape[0], self.num_heads, self.out_features
        edge_index = edge_index.to(device=X.device, dtype=torch.long)
        if self.self_loops:  # i -> i once for every node, as adjacency | I in the dense form
            loops = torch.arange(N, device=X.device).expand(2, N)
            edge_index = torch.cat([edge_index[:, edge_index[0] != edge_index[1]], loops], 1)
        src, dst = edge_index[0], edge_index[1]  # (E,) each: j -> i
        E = src.shape[0]
        # 1. project, and split into heads
        WH = self.W(X).view(N, h, Fo)  # (N, h, F')
        # 2. score every edge: a_1 . W h_i (target) + a_2 . W h_j (source), then LeakyReLU
        e_query = (WH * self.a_query).sum(-1)  # (N, h)
        e_key = (WH * self.a_key).sum(-1)  # (N, h)
        acc = torch.float32 if X.dtype in (torch.float16, torch.bfloat16) else X.dtype
        scores = F.leaky_relu(e_query[dst] + e_key[src], self.negative_slope).to(acc)  # (E, h)
        # 3. softmax over each target's incoming edges: subtract the target's maximum (a
        #    constant per row, so no gradient needs to flow through it), exponentiate, divide
        #    by the target's sum. A node without incoming edges gets no weight at all.
        index = dst[:, None].expand(E, h)  # (E, h)
        row_max = torch.full((N, h), float("-inf"), dtype=acc, device=X.device).scatter_reduce(
            0, index, scores.detach(), reduce="amax", include_self=True)  # (N, h)
        p = (scores - row_max[dst]).exp()  # (E, h)
        row_sum = torch.zeros(N, h, dtype=acc, device=X.device).index_add_(0, dst, p)  # (N, h)
        weights = p / row_sum[dst]  # (E, h); row_sum[dst] >= 1 (the maximum's own term)
        self.attention_weights = weights.detach().to(X.dtype).T  # (h, E)
        self.attention_edges = edge_index
        # 4. pool: each edge sends alpha_ij W h_j to its target
        messages = self.dropout(weights).to(X.dtype)[..., None] * WH[src]  # (E, h, F')
        out = torch.zeros(N, h, Fo, dtype=X.dtype, device=X.device).index_add_(
            0, dst, messages)  # (N, h, F')
        if self.concat:
            return out.flatten(-2)  # (N, h F')
        return out.mean(dim=-2)  # (N, F')


def sparse_to_edge_index(adjacency: Tensor) -> Tensor:
    """The edges of a sparse bool adjacency ``(N, N)`` (``[i, j]`` True: ``i`` attends to
    ``j``) as ``edge_index`` ``(2, E)`` int64, row 0 the sources ``j``, row 1 the targets ``i``.

    Example:
        >>> A = torch.tensor([[False, True], [False, False]]).to_sparse()
        >>> sparse_to_edge_index(A)
        tensor([[1],
                [0]])

    Source: the edge-list convention of PyTorch Geometric (Fey and Lenssen 2019), messages
    flowing from ``edge_index[0]`` to ``edge_index[1]``.
    """
    if adjacency.layout != torch.sparse_coo:
        adjacency = adjacency.to_sparse_coo()
    adjacency = adjacency.coalesce()
    targets, sources = adjacency.indices()[:, adjacency.values()]  # only the True entries
    return torch.stack([sources, targets])


def make_block_graph(num_nodes: int = 300, num_blocks: int = 3, *, p_in: float = 0.05,
                     p_out: float = 0.005, feature_noise: float = 2.0, num_features: int = 8,
                     seed: int = 0) -> tuple:
    """A stochastic block model: communities, an undirected graph, and noisy node features.

    Node ``i`` belongs to community ``i % num_blocks``. Two nodes are joined with probability
    ``p_in`` in the same community and ``p_out`` across (no self-loops). A node's features are
    its community's mean vector (drawn once, standard normal) plus Gaussian noise of standard
    deviation ``feature_noise``: alone they classify a node poorly, and its neighbours, mostly
    of its own community, hold the rest of the evidence.

    Args:
        num_nodes: N. num_blocks: the number of communities, ``<= N``.
        p_in, p_out: keyword-only; edge probabilities in ``[0, 1]``.
        feature_noise: keyword-only, ``>= 0``. num_features: keyword-only, F.
        seed: keyword-only; the generator's seed.

    Returns:
        ``(features, adjacency, labels)``: ``(N, F)`` float32, ``(N, N)`` bool symmetric with
        a False diagonal, ``(N,)`` int64.

    Raises:
        ValueError: sizes that are not positive integers, probabilities out of ``[0, 1]``,
            ``feature_noise < 0``, more blocks than nodes.

    Example:
        >>> X, A, y = make_block_graph(30, 3, seed=0)
        >>> X.shape, A.shape, bool((A == A.T).all()), bool(A.diagonal().any())
        (torch.Size([30, 8]), torch.Size([30, 30]), True, False)

    Source: Holland, Laskey and Leinhardt (1983), stochastic blockmodels; book chapter 16.
    """
    check_positive_ints(num_nodes=num_nodes, num_blocks=num_blocks, num_features=num_features)
    if num_blocks > num_nodes:
        raise ValueError(f"num_blocks ({num_blocks}) must be <= num_nodes ({num_nodes})")
    for name, p in (("p_in", p_in), ("p_out", p_out)):
        if not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    if not isinstance(feature_noise, (int, float)) or not feature_noise >= 0:
        raise ValueError(f"feature_noise must be a number >= 0, got {feature_noise!r}")
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_nodes) % num_blocks
    same = labels[:, None] == labels[None, :]
    prob = torch.where(same, torch.tensor(float(p_in)), torch.tensor(float(p_out)))
    upper = torch.rand(num_nodes, num_nodes, generator=g) < prob
    upper = upper.triu(diagonal=1)
    adjacency = upper | upper.T
    means = torch.randn(num_blocks, num_features, generator=g)
    features = means[labels] + feature_noise * torch.randn(num_nodes, num_features, generator=g)
    return features, adjacency, labels


class GraphNodeClassifier(nn.Module):
    """Chapter 16's node classifiers: two layers that read no graph, a fixed or an attentive one.

    - ``"mlp"``: each node alone (no graph);
    - ``"gcn"``: two graph convolutions, ``A_norm X W + b`` (Kipf and Welling 2017, equation
      (9): the bias added after the propagation): fixed weights;
    - ``"gat"``: two :class:`GraphAttention` layers over the edges (the first with
      ``num_heads`` heads concatenated, the output layer averaging one head); dropout on the
      features only, not the paper's dropout on the attention weights;
    - ``"transformer"``: no graph at all: a linear embedding and chapter 8's pre-norm encoder
      block (scaled dot-product attention, ``num_heads`` heads, no positions, no mask), every
      node attending to every node, then a linear read-out.

    ELU between the layers, dropout on the input features and between the layers.

    Args:
        kind: one of the four names. in_features: F. num_classes: C.
        num_hiddens, num_heads, dropout: keyword-only.

    Shapes (``forward``):
        X ``(N, F)`` float, adjacency ``(N, N)`` bool. Returns logits ``(N, C)``.

    Raises:
        ValueError: an unknown ``kind``, sizes that are not positive integers, bad inputs.

    Example:
        >>> X, A, y = make_block_graph(30, 3)
        >>> [tuple(GraphNodeClassifier(k, 8, 3)(X, A).shape) for k in ("mlp", "gcn", "gat")]
        [(30, 3), (30, 3), (30, 3)]

    Source: Veličković et al. (2018), section 3.3 (the transductive model); Kipf and Welling
    (2017), equation (9).
    """

    KINDS = ("mlp", "gcn", "gat", "transformer")

    def __init__(self, kind: str, in_features: int, num_classes: int, *, num_hiddens: int = 8,
                 num_heads: int = 4, dropout: float = 0.5) -> None:
        super().__init__()
        check_choice("kind", kind, self.KINDS)
        check_positive_ints(in_features=in_features, num_classes=num_classes,
                            num_hiddens=num_hiddens, num_heads=num_heads)
        check_dropout(dropout)
        self.kind = kind
        self.dropout = nn.Dropout(dropout)
        d = num_hiddens * num_heads
        if kind in ("mlp", "gcn"):
            self.layer1 = nn.Linear(in_features, d)
            self.layer2 = nn.Linear(d, num_classes)
        elif kind == "transformer":
            self.layer1 = nn.Linear(in_features, d)
            self.block = TransformerEncoderBlock(d, num_heads, 2 * d, 0.0, norm_first=True,
                                                 activation="gelu")
            self.layer2 = nn.Linear(d, num_classes)
        else:
            self.layer1 = GraphAttention(in_features, num_hiddens, num_heads)
            self.layer2 = GraphAttention(num_hiddens * num_heads, num_classes, 1, concat=False)

    def forward(self, X: Tensor, adjacency: Tensor) -> Tensor:
        """Logits ``(N, C)``; see the class docstring."""
        N = X.shape[-2] if isinstance(X, Tensor) and X.dim() >= 2 else -1
        adjacency = check_adjacency(adjacency, N)
        H = self.dropout(X)
        if self.kind == "mlp":
            return self.layer2(self.dropout(F.elu(self.layer1(H))))
        if self.kind == "gcn":
            A = normalized_adjacency(adjacency, dtype=X.dtype).to(X.device)  # (N, N) fixed
            H = F.elu(self._propagate(A, H, self.layer1))  # (N, d)
            return self._propagate(A, self.dropout(H), self.layer2)  # (N, C)
        if self.kind == "transformer":
            H = self.block(self.layer1(H)[None])[0]  # (N, d): one sequence of N nodes
            return self.layer2(self.dropout(H))
        H = F.elu(self.layer1(H, adjacency))
        return self.layer2(self.dropout(H), adjacency)


    @staticmethod
    def _propagate(A: Tensor, H: Tensor, linear: nn.Linear) -> Tensor:
        """One graph convolution, ``A (H W^T) + b``: the bias after the propagation."""
        return A @ F.linear(H, linear.weight) + linear.bias  # (N, out)


def train_node_classifier(model: nn.Module, X: Tensor, adjacency: Tensor, labels: Tensor,
                          train_nodes: Tensor, *, steps: int = 200, lr: float = 5e-3,
                          stop_after: Optional[int] = None, clip: Optional[float] = None,
                          callback: Optional[Callback] = None,
                          weight_decay: float = 5e-4) -> List[float]:
    """Semi-supervised node classification: the loss on ``train_nodes`` only, full batch.

    Adam with weight decay, as in Kipf and Welling (2017) and Veličković et al. (2018); the
    whole graph goes through the model at every step (one step is one epoch), the labels of
    the other nodes unused. The loop and its arguments follow the library's training
    convention (:mod:`d2lattn.training`); nothing is drawn, so there is no ``seed`` and no
    ``batch_size`` (dropout draws from the global generator, ``torch.manual_seed``).

    Args:
        model: ``model(X, adjacency)`` gives ``(N, C)`` logits. X ``(N, F)``; adjacency
            ``(N, N)`` bool; labels ``(N,)`` int64; train_nodes ``(n,)`` node indices.
        steps: full-batch Adam steps (keyword-only, as all below). lr: Adam's learning rate.
        stop_after: run only the first ``stop_after`` steps.
        clip: the largest global gradient norm (``None``: no clipping).
        callback: ``callback(step, model, loss)`` after each step, ``step`` from 1.
        weight_decay: Adam's (an L2 penalty on every parameter).

    Returns:
        the training loss of every step (fewer if a loss is not finite). Leaves the model in
        eval mode.

    Raises:
        ValueError: ``steps`` not a positive integer.

    Source: book chapter 16; Kipf and Welling (2017), section 3.1 (the loss over the labelled
    nodes).
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)

    def batch_loss() -> Tensor:
        return F.cross_entropy(model(X, adjacency)[train_nodes], labels[train_nodes])

    return fit(model, opt, batch_loss, steps=steps, stop_after=stop_after, clip=clip,
               callback=callback)
