r"""Attention over point clouds: a generated data set, neighbourhoods, vector self-attention.

A point cloud (点云) is a *set* of points in space: no order, a varying number of points.
Self-attention without positions is a set function (book chapter 16), so it reads one as it is.
This module holds what chapter 16 trains:

- :func:`make_point_clouds`: 3-D shapes of five families with random rotation, size, number of
  points and noise, generated from a seed (no download);
- :func:`random_rotations`: rotation matrices drawn uniformly;
- :func:`knn_indices`: each point's ``k`` nearest neighbours among the valid points;
- :class:`VectorSelfAttention`: the vector self-attention of Point Transformer (Zhao et al.
  2021): the query and the key are *subtracted*, and each pair gets a vector of weights, one per
  channel, instead of one number;
- :class:`PointCloudClassifier`: the chapter's three models, one class: a shared MLP with
  max-pooling and no attention (PointNet / DeepSets), scalar dot-product self-attention, and
  vector self-attention over neighbourhoods.

Shape legend: ``B`` clouds, ``N`` points per cloud (padded to the largest), ``k`` neighbours,
``d`` features. Padding: a cloud of ``n < N`` points has ``valid_lens = n``; its points
``n, ..., N - 1`` are zeros and are never read.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import torch
from torch import Tensor, nn

from ._checks import check_choice, check_local_inputs, check_positive_ints, check_set_lens
from .masking import valid_lens_to_mask
from .transformer import TransformerEncoderBlock

__all__ = ["SHAPES", "PointClouds", "make_point_clouds", "random_rotations", "knn_indices",
           "VectorSelfAttention", "UniformNeighbourPooling", "EdgeConv", "PointCloudClassifier"]

#: The shape families of :func:`make_point_clouds`, in label order.
SHAPES = ("sphere", "cube", "cylinder", "cone", "torus")


class PointClouds(NamedTuple):
    """A batch of padded point clouds.

    Attributes:
        points: ``(B, N, 3)`` float32; rows at and after ``valid_lens[b]`` are zeros.
        valid_lens: ``(B,)`` int64, the number of points of each cloud.
        labels: ``(B,)`` int64, the index of each cloud's family in :data:`SHAPES`.
    """

    points: Tensor
    valid_lens: Tensor
    labels: Tensor


def random_rotations(n: int, *, generator: Optional[torch.Generator] = None) -> Tensor:
    """``n`` rotation matrices drawn uniformly from SO(3).

    The QR decomposition of a matrix of standard normal numbers, with the signs of ``R``'s
    diagonal moved into ``Q`` and one column flipped where the determinant is -1.

    Returns:
        ``(n, 3, 3)`` float32, each orthogonal with determinant +1.

    Raises:
        ValueError: ``n`` not a positive integer.

    Source: Mezzadri (2007), "How to generate random matrices from the classical compact
    groups", section 5.
    """
    check_positive_ints(n=n)
    A = torch.randn(n, 3, 3, generator=generator, dtype=torch.float64)
    Q, R = torch.linalg.qr(A)
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[:, None, :]
    flip = torch.linalg.det(Q) < 0
    Q[flip, :, 0] = -Q[flip, :, 0]
    return Q.float()


def _sample_shape(family: str, n: int, g: torch.Generator) -> Tensor:
    """``n`` points on the surface of one shape of ``family``, before rotation: ``(n, 3)``."""
    u = torch.rand(n, generator=g, dtype=torch.float64)
    v = torch.rand(n, generator=g, dtype=torch.float64)
    shape = torch.rand(2, generator=g, dtype=torch.float64)  # the family's free proportions
    if family == "sphere":
        z = 2 * u - 1  # uniform on the sphere: z uniform, angle uniform
        r = torch.sqrt(1 - z**2)
        phi = 2 * math.pi * v
        pts = torch.stack([r * phi.cos(), r * phi.sin(), z], dim=1)
    elif family == "cube":
        face = torch.randint(0, 6, (n,), generator=g)
        a, b = 2 * u - 1, 2 * v - 1
        pts = torch.empty(n, 3, dtype=torch.float64)
        axis, sign = face // 2, (face % 2) * 2.0 - 1
        for ax in range(3):
            on = axis == ax
            others = [c for c in range(3) if c != ax]
            pts[on, ax] = sign[on].double()
            pts[on, others[0]] = a[on]
            pts[on, others[1]] = b[on]
    elif family == "cylinder":  # the side wall, height 1 to 2.5 times the radius
        h = 1.0 + 1.5 * shape[0]
        phi = 2 * math.pi * u
        pts = torch.stack([phi.cos(), phi.sin(), h * (v - 0.5)], dim=1)
    elif family == "cone":  # the side wall, apex up; uniform in area: radius ~ sqrt
        h = 1.0 + 1.5 * shape[0]
        s = torch.sqrt(u)  # distance from the apex, as a fraction of the slant
        phi = 2 * math.pi * v
        pts = torch.stack([s * phi.cos(), s * phi.sin(), h * (0.5 - s)], dim=1)
    elif family == "torus":  # tube radius 0.2 to 0.5 of the ring's
        R, r = 1.0, 0.2 + 0.3 * shape[0]
        theta, phi = 2 * math.pi * u, 2 * math.pi * v
        pts = torch.stack([(R + r * phi.cos()) * theta.cos(), (R + r * phi.cos()) * theta.sin(),
                           r * phi.sin()], dim=1)
    else:  # pragma: no cover - guarded by make_point_clouds
        raise ValueError(family)
    pts = pts - pts.mean(dim=0)
    # centred, inside the unit ball; one point is the centre itself (radius 0: no 0 / 0)
    return pts / pts.norm(dim=1).max().clamp_min(torch.finfo(pts.dtype).tiny)


def make_point_clouds(num_clouds: int, *, min_points: int = 64, max_points: int = 128,
                      noise: float = 0.02, rotate: bool = True, outliers: int = 0,
                      seed: int = 0, shapes: Sequence[str] = SHAPES) -> PointClouds:
    """Point clouds sampled from the surfaces of shapes of :data:`SHAPES`, from one seed.

    Each cloud: a family drawn uniformly; the shape's free proportions drawn (a cylinder's or
    cone's height, a torus's tube); ``n`` points drawn uniformly in ``[min_points,
    max_points]`` and placed on the surface, centred and scaled into the unit ball; a random
    scale in ``[0.7, 1.3]``; Gaussian noise of standard deviation ``noise``; a uniformly random
    rotation (``rotate=True``) or none; ``outliers`` of the points replaced by points uniform
    in the cube ``[-1, 1]^3``. The same arguments always give the same clouds.

    Args:
        num_clouds: B, a positive integer.
        min_points, max_points: keyword-only; the range of points per cloud, ``1 <=
            min_points <= max_points`` (a cloud of one point is that point at the centre,
            before the noise and the outliers).
        noise: keyword-only; the standard deviation of the noise, ``>= 0``.
        rotate: keyword-only; rotate every cloud at random.
        outliers: keyword-only; points of each cloud replaced by uniform clutter,
            ``0 <= outliers <= min_points``.
        seed: keyword-only; the seed of the generator.
        shapes: keyword-only; the families to draw from (labels index :data:`SHAPES`).

    Returns:
        :class:`PointClouds`: points ``(B, max_points, 3)`` float32 (zeros after each cloud's
        ``valid_lens``), valid_lens ``(B,)``, labels ``(B,)``.

    Raises:
        ValueError: a count that is not a positive integer, an empty or reversed range,
            ``noise < 0``, ``outliers`` out of range, or an unknown family.

    Example:
        >>> clouds = make_point_clouds(4, min_points=8, max_points=16, seed=0)
        >>> clouds.points.shape, clouds.valid_lens.shape, clouds.labels.shape
        (torch.Size([4, 16, 3]), torch.Size([4]), torch.Size([4]))

    Source: book chapter 16; the families follow the kind of shapes of ModelNet (Wu et al. 2015),
    generated here instead of downloaded.
    """
    check_positive_ints(num_clouds=num_clouds, min_points=min_points, max_points=max_points)
    if min_points > max_points:
        raise ValueError(f"min_points ({min_points}) must be <= max_points ({max_points})")
    if not isinstance(noise, (int, float)) or not noise >= 0:
        raise ValueError(f"noise must be a number >= 0, got {noise!r}")
    if not isinstance(outliers, int) or not 0 <= outliers <= min_points:
        raise ValueError(f"outliers must be an integer in [0, min_points={min_points}], "
                         f"got {outliers!r}")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        raise ValueError(f"shapes must be a non-empty subset of {SHAPES}, got {list(shapes)!r}")
    g = torch.Generator().manual_seed(seed)
    families = [SHAPES.index(s) for s in shapes]
    points = torch.zeros(num_clouds, max_points, 3)
    valid_lens = torch.empty(num_clouds, dtype=torch.long)
    labels = torch.empty(num_clouds, dtype=torch.long)
    rotations = random_rotations(num_clouds, generator=g).double()
    for b in range(num_clouds):
        label = families[int(torch.randint(len(families), (1,), generator=g))]
        n = int(torch.randint(min_points, max_points + 1, (1,), generator=g))
        pts = _sample_shape(SHAPES[label], n, g)
        pts = pts * (0.7 + 0.6 * torch.rand(1, generator=g, dtype=torch.float64))
        pts = pts + noise * torch.randn(n, 3, generator=g, dtype=torch.float64)
        if rotate:
            pts = pts @ rotations[b].T
        if outliers:
            which = torch.randperm(n, generator=g)[:outliers]
            pts[which] = 2 * torch.rand(outliers, 3, generator=g, dtype=torch.float64) - 1
        points[b, :n] = pts.float()
        valid_lens[b], labels[b] = n, label
    return PointClouds(points, valid_lens, labels)


def knn_indices(points: Tensor, k: int, valid_lens: Optional[Tensor] = None) -> Tensor:
    r"""The indices of each point's ``k`` nearest points (itself first), among the valid ones.

    Exact: the squared distances are summed from the coordinate differences,
    :math:`\sum_c (p_{ic} - p_{jc})^2`, not from :math:`|p_i|^2 + |p_j|^2 - 2 p_i \cdot p_j`
    (``torch.cdist``'s matrix-product form above 25 points, which cancels catastrophically
    for a cloud far from the origin: at an offset of 1,000 most neighbours come out wrong in
    float32). Half-precision points are compared in float32. ``O(B N^2 c)`` memory.

    Args:
        points: ``(B, N, c)`` float coordinates (float16, bfloat16, float32 or float64).
        k: the neighbourhood size, ``1 <= k <= min(valid_lens)`` (``<= N`` without them).
        valid_lens: ``None`` or ``(B,)`` integers in ``[k, N]``; points at or after
            ``valid_lens[b]`` are never anyone's neighbour (their own rows are meaningless).

    Returns:
        ``(B, N, k)`` int64; ``[b, i]`` lists the neighbours of point ``i`` from nearest to
        farthest: the point itself first (also when another point sits at the same place),
        then equal distances in the order of their indices (a stable sort), on any device.

    Raises:
        ValueError: ``points`` not a 3-D float tensor, ``k`` out of range, ``valid_lens`` of the
            wrong shape or below ``k``.

    Example:
        >>> p = torch.tensor([[[0.0], [1.0], [3.0]]])
        >>> knn_indices(p, 2)[0].tolist()
        [[0, 1], [1, 0], [2, 1]]
        >>> knn_indices(torch.zeros(1, 4, 3), 4)[0, 2].tolist()  # four copies of one point
        [2, 0, 1, 3]

    Source: the k-nearest-neighbour neighbourhoods of Zhao et al. (2021), section 3.2.
    """
    if not isinstance(points, Tensor) or points.dim() != 3 or not points.is_floating_point():
        raise ValueError(f"points must be a float tensor of shape (B, N, c), got "
                         f"{getattr(points, 'shape', type(points).__name__)}")
    B, N, _ = points.shape
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= N:
        raise ValueError(f"k must be an integer in [1, N={N}], got {k!r}")
    P = points.to(torch.promote_types(points.dtype, torch.float32))  # (B, N, c)
    dist = (P[:, :, None, :] - P[:, None, :, :]).square().sum(dim=-1)  # (B, N, N) squared
    # the point itself first: below every squared distance, even a duplicate's 0
    dist = dist.masked_fill(torch.eye(N, dtype=torch.bool, device=points.device), -1.0)
    if valid_lens is not None:
        valid_lens = check_set_lens(valid_lens, B, N)
        if bool((valid_lens < k).any()):
            raise ValueError(f"every cloud needs at least k={k} points, but valid_lens has "
                             f"{int(valid_lens.min())}")
        keep = valid_lens_to_mask(valid_lens.to(points.device), N, N)  # (B, 1, N)
        dist = dist.masked_fill(~keep, float("inf"))  # padding: nobody's neighbour
    return dist.sort(dim=-1, stable=True).indices[..., :k]  # (B, N, k)


def _gather(X: Tensor, index: Tensor) -> Tensor:
    """Rows of ``X`` ``(B, N, d)`` at ``index`` ``(B, N, k)``: ``(B, N, k, d)``."""
    B, N, k = index.shape
    flat = index.reshape(B, N * k, 1).expand(-1, -1, X.shape[-1])  # (B, N*k, d)
    return X.gather(1, flat).view(B, N, k, X.shape[-1])  # (B, N, k, d)


class VectorSelfAttention(nn.Module):
    r"""Vector self-attention over each point's ``k`` nearest neighbours (Point Transformer).

    .. math::
        \mathbf y_i = \sum_{j \in \mathcal N(i)} \rho\big(\gamma(\varphi(\mathbf x_i)
        - \psi(\mathbf x_j) + \boldsymbol\delta_{ij})\big) \odot
        \big(\alpha(\mathbf x_j) + \boldsymbol\delta_{ij}\big),
        \qquad \boldsymbol\delta_{ij} = \theta(\mathbf p_i - \mathbf p_j)

    :math:`\varphi, \psi, \alpha` are linear maps (query, key, value), :math:`\gamma` and the
    position encoding :math:`\theta` small MLPs, and :math:`\rho` a softmax over the ``k``
    neighbours **for each channel separately**: a pair ``(i, j)`` gets ``d`` weights, not one.
    Scalar dot-product attention is the special case of one weight shared by every channel.

    Args:
        num_hiddens: d, the feature size of inputs and outputs.
        k: the neighbourhood size (the point itself included).

    Shapes (``forward``):
        X ``(B, N, d)`` float features; positions ``(B, N, 3)`` float coordinates;
        ``valid_lens`` ``None`` or ``(B,)`` (padding points are never neighbours);
        ``neighbours`` (keyword-only) ``None`` or ``(B, N, k)`` indices from
        :func:`knn_indices`, to reuse them across layers. Returns ``(B, N, d)``.

    Attributes:
        attention_weights: ``(B, N, k, d)`` weights of the last call (each ``[b, i, :, c]``
            sums to 1), detached. neighbours: ``(B, N, k)`` the neighbourhoods used.

    Raises:
        ValueError: as :func:`knn_indices`, and features of the wrong size.

    Example:
        >>> layer = VectorSelfAttention(num_hiddens=8, k=4)
        >>> X, P = torch.randn(2, 10, 8), torch.randn(2, 10, 3)
        >>> layer(X, P).shape, layer.attention_weights.shape
        (torch.Size([2, 10, 8]), torch.Size([2, 10, 4, 8]))

    Source: Zhao et al. (2021), "Point Transformer", equations (3) and (4); the note's
    "vector self-attention" (book chapters 5 and 16).
    """

    def __init__(self, num_hiddens: int, k: int) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, k=k)
        self.num_hiddens, self.k = num_hiddens, k
        d = num_hiddens
        self.W_q = nn.Linear(d, d)  # phi
        self.W_k = nn.Linear(d, d)  # psi
        self.W_v = nn.Linear(d, d)  # alpha
        self.position_mlp = nn.Sequential(nn.Linear(3, d), nn.ReLU(), nn.Linear(d, d))  # theta
        self.weight_mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))  # gamma
        self.attention_weights: Optional[Tensor] = None
        self.neighbours: Optional[Tensor] = None

    def forward(self, X: Tensor, positions: Tensor, valid_lens: Optional[Tensor] = None, *,
                neighbours: Optional[Tensor] = None) -> Tensor:
        """Vector attention of every point over its neighbours: ``X`` ``(B, N, d)``,
        ``positions`` ``(B, N, 3)`` -> ``(B, N, d)``; see the class docstring."""
        neighbours = _local_neighbours(X, positions, valid_lens, neighbours, self.num_hiddens,
                                       self.k)  # (B, N, k)
        # 1. relative positions and their encoding delta_ij = theta(p_i - p_j)
        rel = positions[:, :, None, :] - _gather(positions, neighbours)  # (B, N, k, 3)
        delta = self.position_mlp(rel)  # (B, N, k, d)
        # 2. the relation is a subtraction, mapped to one weight per channel
        q = self.W_q(X)[:, :, None, :]  # (B, N, 1, d)
        k = _gather(self.W_k(X), neighbours)  # (B, N, k, d)
        v = _gather(self.W_v(X), neighbours)  # (B, N, k, d)
        scores = self.weight_mlp(q - k + delta)  # (B, N, k, d)
        # 3. normalize over the neighbours, channel by channel, and pool
        weights = torch.softmax(scores, dim=2)  # (B, N, k, d)
        self.attention_weights, self.neighbours = weights.detach(), neighbours
        return (weights * (v + delta)).sum(dim=2)  # (B, N, d)


class UniformNeighbourPooling(nn.Module):
    r"""The vector layer with its attention taken out: uniform weights over the same neighbours.

    .. math::
        \mathbf y_i = \frac1k \sum_{j \in \mathcal N(i)}
        \big(\alpha(\mathbf x_j) + \boldsymbol\delta_{ij}\big),
        \qquad \boldsymbol\delta_{ij} = \theta(\mathbf p_i - \mathbf p_j)

    :class:`VectorSelfAttention` with every weight fixed to ``1 / k``: the same ``k`` nearest
    neighbours, the same values and the same relative-position encoding, but no query, no key
    and no scoring MLP. Chapter 16's ablation: what the vector model gains from *locality*
    (neighbourhoods and relative positions) without attention.

    Args:
        num_hiddens: d, the feature size of inputs and outputs.
        k: the neighbourhood size (the point itself included).

    Shapes (``forward``): as :class:`VectorSelfAttention`: X ``(B, N, d)``, positions
    ``(B, N, 3)``, ``valid_lens`` ``None`` or ``(B,)``, ``neighbours`` (keyword-only) ``None``
    or ``(B, N, k)``. Returns ``(B, N, d)``.

    Raises:
        ValueError: as :class:`VectorSelfAttention`.

    Example:
        >>> layer = UniformNeighbourPooling(num_hiddens=8, k=4)
        >>> layer(torch.randn(2, 10, 8), torch.randn(2, 10, 3)).shape
        torch.Size([2, 10, 8])

    Source: Zhao et al. (2021), "Point Transformer", equation (3) with :math:`\rho` replaced by
    the constant ``1 / k``; book chapter 16.
    """

    def __init__(self, num_hiddens: int, k: int) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, k=k)
        self.num_hiddens, self.k = num_hiddens, k
        d = num_hiddens
        self.W_v = nn.Linear(d, d)  # alpha
        self.position_mlp = nn.Sequential(nn.Linear(3, d), nn.ReLU(), nn.Linear(d, d))  # theta

    def forward(self, X: Tensor, positions: Tensor, valid_lens: Optional[Tensor] = None, *,
                neighbours: Optional[Tensor] = None) -> Tensor:
        """The mean over each point's neighbours: ``X`` ``(B, N, d)``, ``positions``
        ``(B, N, 3)`` -> ``(B, N, d)``; see the class docstring."""
        neighbours = _local_neighbours(X, positions, valid_lens, neighbours, self.num_hiddens,
                                         self.k)
        rel = positions[:, :, None, :] - _gather(positions, neighbours)  # (B, N, k, 3)
        delta = self.position_mlp(rel)  # (B, N, k, d)
        v = _gather(self.W_v(X), neighbours)  # (B, N, k, d)
        return (v + delta).mean(dim=2)  # (B, N, d): every neighbour weighs 1 / k


class EdgeConv(nn.Module):
    r"""EdgeConv of DGCNN: an MLP on every edge, max over each point's neighbours.

    .. math::
        \mathbf y_i = \max_{j \in \mathcal N(i)}
        h_\Theta\big([\mathbf x_i,\ \mathbf x_j - \mathbf x_i,\ \mathbf p_j - \mathbf p_i]\big)

    :math:`h_\Theta` is a two-layer MLP (``2d + 3 -> d -> d``) and the max is taken channel by
    channel. A standard local point-cloud model with no attention: the neighbours are combined
    by a max, not by weights. Two choices differ from DGCNN and are the chapter's, to compare
    like with like: the neighbourhoods are the ``k`` nearest points in *space*, computed once
    and shared by every layer (DGCNN recomputes them in feature space at each layer, and
    its ablation also reports the fixed graph), and the edge feature carries the relative
    position ``p_j - p_i`` that the vector layer encodes.

    Args:
        num_hiddens: d, the feature size of inputs and outputs.
        k: the neighbourhood size (the point itself included).

    Shapes (``forward``): as :class:`VectorSelfAttention`. Returns ``(B, N, d)``.

    Raises:
        ValueError: as :class:`VectorSelfAttention`.

    Example:
        >>> layer = EdgeConv(num_hiddens=8, k=4)
        >>> layer(torch.randn(2, 10, 8), torch.randn(2, 10, 3)).shape
        torch.Size([2, 10, 8])

    Source: Wang et al. (2019), "Dynamic Graph CNN for Learning on Point Clouds", equations
    (7) and (8) (the asymmetric edge function and max aggregation).
    """

    def __init__(self, num_hiddens: int, k: int) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, k=k)
        self.num_hiddens, self.k = num_hiddens, k
        d = num_hiddens
        self.edge_mlp = nn.Sequential(nn.Linear(2 * d + 3, d), nn.GELU(), nn.Linear(d, d))

    def forward(self, X: Tensor, positions: Tensor, valid_lens: Optional[Tensor] = None, *,
                neighbours: Optional[Tensor] = None) -> Tensor:
        """The max over each point's edges: ``X`` ``(B, N, d)``, ``positions`` ``(B, N, 3)``
        -> ``(B, N, d)``; see the class docstring."""
        neighbours = _local_neighbours(X, positions, valid_lens, neighbours, self.num_hiddens,
                                         self.k)
        xi = X[:, :, None, :].expand(-1, -1, self.k, -1)  # (B, N, k, d)
        xj = _gather(X, neighbours)  # (B, N, k, d)
        rel = _gather(positions, neighbours) - positions[:, :, None, :]  # (B, N, k, 3)
        edges = self.edge_mlp(torch.cat([xi, xj - xi, rel], dim=-1))  # (B, N, k, d)
        return edges.amax(dim=2)  # (B, N, d)


def _local_neighbours(X: Tensor, positions: Tensor, valid_lens: Optional[Tensor],
                      neighbours: Optional[Tensor], d: int, k: int) -> Tensor:
    """The neighbourhood layers' inputs checked; returns ``neighbours`` ``(B, N, k)``, computed
    from the positions when not given."""
    check_local_inputs(X, positions, neighbours, d, k)
    return knn_indices(positions, k, valid_lens) if neighbours is None else neighbours


class PointCloudClassifier(nn.Module):
    """Chapter 16's point-cloud classifiers: no attention, scalar attention, vector attention.

    Every variant embeds each point's coordinates with the same two-layer MLP (3 -> d), mixes
    the points with ``num_layers`` layers, max-pools over the valid points and classifies with
    a linear layer:

    - ``"pointnet"``: no mixing at all, a shared MLP per layer (PointNet without its input
      transform, Qi et al. 2017; a DeepSets network with max-pooling, Zaheer et al. 2017);
    - ``"scalar"``: chapter 8's pre-norm encoder block with ``num_heads`` heads over all the
      points (scalar dot-product self-attention, no positions: it reads a set);
    - ``"vector"``: :class:`VectorSelfAttention` over ``k`` nearest neighbours, with a
      residual connection, a LayerNorm and a position-wise MLP, as a pre-norm block;
    - ``"scalar_knn"``: the ``"scalar"`` model with each point's attention masked to its ``k``
      nearest neighbours (an ablation: the neighbourhoods of ``"vector"`` without its
      per-channel weights and relative-position encoding);
    - ``"uniform"``: the ``"vector"`` model with :class:`UniformNeighbourPooling` in place of
      its attention (the same neighbours and relative positions, every weight ``1 / k``);
    - ``"edgeconv"``: the ``"vector"`` model with DGCNN's :class:`EdgeConv` (max over the same
      neighbours) in place of its attention: a standard local model without attention.

    Args:
        kind: one of :attr:`KINDS`.
        num_classes: the number of labels.
        num_hiddens: d. num_layers: mixing layers. num_heads: heads of the scalar models.
        k: neighbours of the local kinds (all but ``"pointnet"`` and ``"scalar"``).

    Shapes (``forward``):
        points ``(B, N, 3)``, ``valid_lens`` ``None`` or ``(B,)``. Returns logits
        ``(B, num_classes)``.

    Raises:
        ValueError: an unknown ``kind``, sizes that are not positive integers.

    Example:
        >>> clouds = make_point_clouds(3, min_points=16, max_points=20, seed=1)
        >>> for kind in ("pointnet", "scalar", "vector"):
        ...     model = PointCloudClassifier(kind, num_classes=5, num_hiddens=16, k=8)
        ...     print(kind, tuple(model(clouds.points, clouds.valid_lens).shape))
        pointnet (3, 5)
        scalar (3, 5)
        vector (3, 5)

    Source: book chapter 16.
    """

    KINDS = ("pointnet", "scalar", "vector", "scalar_knn", "uniform", "edgeconv")
    #: the layer that mixes each point with its neighbours, for the kinds built as ``"vector"``
    LOCAL_LAYERS = {"vector": VectorSelfAttention, "uniform": UniformNeighbourPooling,
                    "edgeconv": EdgeConv}

    def __init__(self, kind: str, num_classes: int, *, num_hiddens: int = 32,
                 num_layers: int = 2, num_heads: int = 4, k: int = 16) -> None:
        super().__init__()
        check_choice("kind", kind, self.KINDS)
        check_positive_ints(num_classes=num_classes, num_hiddens=num_hiddens,
                            num_layers=num_layers, num_heads=num_heads, k=k)
        self.kind, d = kind, num_hiddens
        self.embed = nn.Sequential(nn.Linear(3, d), nn.ReLU(), nn.Linear(d, d))
        if kind == "pointnet":
            self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d),
                                                      nn.GELU(), nn.Linear(2 * d, d))
                                        for _ in range(num_layers))
        elif kind in ("scalar", "scalar_knn"):
            self.k = k
            self.layers = nn.ModuleList(
                TransformerEncoderBlock(d, num_heads, 2 * d, 0.0, norm_first=True,
                                        activation="gelu") for _ in range(num_layers))
        else:
            self.k = k
            self.norms1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(num_layers))
            self.layers = nn.ModuleList(self.LOCAL_LAYERS[kind](d, k) for _ in range(num_layers))
            self.norms2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(num_layers))
            self.ffns = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(),
                                                    nn.Linear(2 * d, d))
                                      for _ in range(num_layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, num_classes)

    def forward(self, points: Tensor, valid_lens: Optional[Tensor] = None) -> Tensor:
        """Logits ``(B, num_classes)`` of clouds ``(B, N, 3)``; see the class docstring."""
        if not isinstance(points, Tensor) or points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must have shape (B, N, 3), got "
                             f"{getattr(points, 'shape', type(points).__name__)}")
        B, N, _ = points.shape
        if valid_lens is not None:
            valid_lens = check_set_lens(valid_lens, B, N)
        H = self.embed(points)  # (B, N, d)
        if self.kind == "pointnet":
            for layer in self.layers:
                H = H + layer(H)  # each point alone
        elif self.kind == "scalar":
            for layer in self.layers:
                H = layer(H, valid_lens)  # every point attends to every valid point
        elif self.kind == "scalar_knn":
            neighbours = knn_indices(points, self.k, valid_lens)  # (B, N, k)
            mask = torch.zeros(B, N, N, dtype=torch.bool, device=points.device)
            mask.scatter_(2, neighbours, True)  # (B, N, N): True = one of my k neighbours
            for layer in self.layers:
                H = layer(H, attn_mask=mask)  # each point attends to its neighbours only
        else:
            neighbours = knn_indices(points, self.k, valid_lens)  # (B, N, k)
            for norm1, attn, norm2, ffn in zip(self.norms1, self.layers, self.norms2, self.ffns):
                H = H + attn(norm1(H), points, valid_lens, neighbours=neighbours)
                H = H + ffn(norm2(H))
        H = self.norm(H)
        if valid_lens is not None:
            pad = ~valid_lens_to_mask(valid_lens.to(H.device), 1, N)[:, 0, :, None]  # (B, N, 1)
            H = H.masked_fill(pad, float("-inf"))
        return self.head(H.amax(dim=1))  # (B, num_classes): max over the valid points
