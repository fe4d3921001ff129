r"""Attention over sets: the Set Transformer's blocks (Lee et al. 2019).

A set has no order. Self-attention without positions is permutation-*equivariant* (permute the
inputs and the outputs are permuted the same way), and pooling by attention with learned
queries is permutation-*invariant* (the output does not move at all), so together they make
set functions (book chapter 16). The three blocks of the Set Transformer, built on
:class:`~d2lattn.MultiHeadAttention`:

- :class:`MultiheadAttentionBlock` (MAB): queries from one set attend to another, with residual
  connections, LayerNorm and a feed-forward network;
- :class:`InducedSetAttentionBlock` (ISAB): ``m`` learned *inducing points* attend to the
  ``n`` elements, and the elements attend back to those ``m`` summaries: :math:`O(nm)` instead
  of the :math:`O(n^2)` of self-attention over the set;
- :class:`PoolingByMultiheadAttention` (PMA): ``s`` learned *seed vectors* attend to the set,
  ``s`` outputs whatever the size of the set.

Shape legend: ``B`` sets, ``n`` elements per set (padded; ``valid_lens`` gives the real sizes),
``m`` inducing points, ``s`` seeds, ``d`` features.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (ValidLens, check_choice, check_hidden_states, check_positive_ints,
                      check_set_lens)
from .multihead import MultiHeadAttention
from .training import Callback, fit

__all__ = ["MultiheadAttentionBlock", "InducedSetAttentionBlock", "PoolingByMultiheadAttention",
           "SetRegressor", "make_diameter_sets", "train_set_model"]


class MultiheadAttentionBlock(nn.Module):
    r"""The Set Transformer's MAB: the rows of ``X`` attend to the rows of ``Y``.

    .. math::
        \mathrm{MAB}(X, Y) = \mathrm{LN}(H + \mathrm{rFF}(H)), \qquad
        H = \mathrm{LN}(X + \mathrm{MultiHead}(X, Y, Y))

    ``rFF`` is a two-layer network applied to each row (ReLU). ``MAB(X, X)`` is the set
    attention block (SAB), self-attention over the set.

    Args:
        num_hiddens: d, the feature size of ``X``, ``Y`` and the output.
        num_heads: h, a divisor of ``d``.
        ffn_num_hiddens: keyword-only; the hidden size of ``rFF`` (default ``2 d``).

    Shapes (``forward``):
        X ``(B, q, d)`` float, Y ``(B, n, d)`` float; ``valid_lens`` ``None`` or ``(B,)``
        integers in ``[0, n]``: the rows of ``Y`` each set really has. Returns ``(B, q, d)``.

    Attributes:
        attention: the :class:`~d2lattn.MultiHeadAttention`; its ``attention_weights``
            ``(B, h, q, n)`` are the last call's.

    Raises:
        ValueError: sizes that are not positive integers, ``h`` not dividing ``d``; inputs of
            the wrong shape (from the attention).

    Example:
        >>> mab = MultiheadAttentionBlock(num_hiddens=8, num_heads=2)
        >>> mab(torch.randn(2, 3, 8), torch.randn(2, 5, 8)).shape
        torch.Size([2, 3, 8])

    Source: Lee et al. (2019), "Set Transformer", equations (6)-(7).
    """

    def __init__(self, num_hiddens: int, num_heads: int, *,
                 ffn_num_hiddens: Optional[int] = None) -> None:
        super().__init__()
        ffn = 2 * num_hiddens if ffn_num_hiddens is None else ffn_num_hiddens
        check_positive_ints(num_hiddens=num_hiddens, num_heads=num_heads, ffn_num_hiddens=ffn)
        self.num_hiddens = num_hiddens
        self.attention = MultiHeadAttention(num_hiddens, num_heads, bias=True)
        self.norm1 = nn.LayerNorm(num_hiddens)
        self.ffn = nn.Sequential(nn.Linear(num_hiddens, ffn), nn.ReLU(),
                                 nn.Linear(ffn, num_hiddens))
        self.norm2 = nn.LayerNorm(num_hiddens)

    def forward(self, X: Tensor, Y: Tensor, valid_lens: Optional[ValidLens] = None) -> Tensor:
        """``MAB(X, Y)``: ``(B, q, d)``; see the class docstring."""
        check_hidden_states(X, self.num_hiddens)
        check_hidden_states(Y, self.num_hiddens, name="Y")
        H = self.norm1(X + self.attention(X, Y, Y, valid_lens))  # (B, q, d)
        return self.norm2(H + self.ffn(H))  # (B, q, d)


class InducedSetAttentionBlock(nn.Module):
    r"""The Set Transformer's ISAB: self-attention over a set through ``m`` inducing points.

    .. math::
        \mathrm{ISAB}_m(X) = \mathrm{MAB}(X, H), \qquad H = \mathrm{MAB}(I, X),

    with :math:`I \in \mathbb R^{m \times d}` learned. The ``m`` inducing points first summarise
    the ``n`` elements, then every element reads the summaries: two attentions of ``n m``
    scores each instead of ``n^2``. The output is permutation-equivariant in the elements.

    Args:
        num_hiddens: d. num_heads: h. num_inducing: m, the number of inducing points.
        ffn_num_hiddens: keyword-only; as in :class:`MultiheadAttentionBlock`.

    Shapes (``forward``):
        X ``(B, n, d)`` float; ``valid_lens`` ``None`` or ``(B,)`` (padding elements are not
        summarised; their own output rows are meaningless). Returns ``(B, n, d)``.

    Raises:
        ValueError: as :class:`MultiheadAttentionBlock`; ``num_inducing`` not positive.

    Example:
        >>> isab = InducedSetAttentionBlock(num_hiddens=8, num_heads=2, num_inducing=4)
        >>> isab(torch.randn(2, 100, 8)).shape, isab.mab1.attention.attention_weights.shape
        (torch.Size([2, 100, 8]), torch.Size([2, 2, 4, 100]))

    Source: Lee et al. (2019), "Set Transformer", equations (9)-(10).
    """

    def __init__(self, num_hiddens: int, num_heads: int, num_inducing: int, *,
                 ffn_num_hiddens: Optional[int] = None) -> None:
        super().__init__()
        check_positive_ints(num_inducing=num_inducing)
        self.inducing_points = nn.Parameter(torch.empty(1, num_inducing, num_hiddens))
        nn.init.xavier_uniform_(self.inducing_points)
        self.mab1 = MultiheadAttentionBlock(num_hiddens, num_heads,
                                            ffn_num_hiddens=ffn_num_hiddens)
        self.mab2 = MultiheadAttentionBlock(num_hiddens, num_heads,
                                            ffn_num_hiddens=ffn_num_hiddens)

    def forward(self, X: Tensor, valid_lens: Optional[ValidLens] = None) -> Tensor:
        """``ISAB_m(X)``: ``(B, n, d)``; see the class docstring."""
        check_hidden_states(X, self.mab1.num_hiddens)
        I = self.inducing_points.expand(X.shape[0], -1, -1)  # (B, m, d)
        H = self.mab1(I, X, valid_lens)  # (B, m, d): the inducing points read the set
        return self.mab2(X, H)  # (B, n, d): every element reads the m summaries


class PoolingByMultiheadAttention(nn.Module):
    r"""The Set Transformer's PMA: ``s`` learned seed vectors attend to the set.

    .. math:: \mathrm{PMA}_s(Z) = \mathrm{MAB}(S, \mathrm{rFF}(Z)),

    with :math:`S \in \mathbb R^{s \times d}` learned. The output does not depend on the order
    of the elements (permutation-*invariant*), and has ``s`` rows whatever their number.

    Args:
        num_hiddens: d. num_heads: h. num_seeds: s.
        ffn_num_hiddens: keyword-only; as in :class:`MultiheadAttentionBlock`.

    Shapes (``forward``):
        Z ``(B, n, d)`` float; ``valid_lens`` ``None`` or ``(B,)``. Returns ``(B, s, d)``.

    Raises:
        ValueError: as :class:`MultiheadAttentionBlock`; ``num_seeds`` not positive.

    Example:
        >>> pma = PoolingByMultiheadAttention(num_hiddens=8, num_heads=2, num_seeds=1)
        >>> Z = torch.randn(2, 7, 8)
        >>> torch.allclose(pma(Z), pma(Z[:, torch.randperm(7)]), atol=1e-6)
        True

    Source: Lee et al. (2019), "Set Transformer", equation (11).
    """

    def __init__(self, num_hiddens: int, num_heads: int, num_seeds: int, *,
                 ffn_num_hiddens: Optional[int] = None) -> None:
        super().__init__()
        check_positive_ints(num_seeds=num_seeds)
        ffn = 2 * num_hiddens if ffn_num_hiddens is None else ffn_num_hiddens
        self.seeds = nn.Parameter(torch.empty(1, num_seeds, num_hiddens))
        nn.init.xavier_uniform_(self.seeds)
        self.rff = nn.Sequential(nn.Linear(num_hiddens, ffn), nn.ReLU(),
                                 nn.Linear(ffn, num_hiddens))
        self.mab = MultiheadAttentionBlock(num_hiddens, num_heads,
                                           ffn_num_hiddens=ffn_num_hiddens)

    def forward(self, Z: Tensor, valid_lens: Optional[ValidLens] = None) -> Tensor:
        """``PMA_s(Z)``: ``(B, s, d)``; see the class docstring."""
        check_hidden_states(Z, self.mab.num_hiddens, name="Z")
        S = self.seeds.expand(Z.shape[0], -1, -1)  # (B, s, d)
        return self.mab(S, self.rff(Z), valid_lens)  # (B, s, d)


def make_diameter_sets(num_sets: int, *, min_size: int = 8, max_size: int = 32,
                       seed: int = 0) -> tuple:
    """Sets of points in the plane, and the largest distance between two points of each.

    The target depends on *pairs* of elements: no single point knows it. Points are uniform in
    the square ``[-1, 1]^2`` (centred, as a network's inputs should be); sizes uniform in
    ``[min_size, max_size]``; padding rows are zeros.

    Args:
        num_sets: B. min_size, max_size: keyword-only, ``2 <= min_size <= max_size``.
        seed: keyword-only; the generator's seed.

    Returns:
        ``(points, valid_lens, diameters)``: ``(B, max_size, 2)`` float32, ``(B,)`` int64,
        ``(B,)`` float32.

    Raises:
        ValueError: a count that is not a positive integer, ``min_size < 2`` or a reversed range.

    Example:
        >>> P, lens, diam = make_diameter_sets(3, min_size=2, max_size=2)
        >>> torch.allclose(diam, (P[:, 0] - P[:, 1]).norm(dim=-1))
        True

    Source: book chapter 16 (a set task whose answer depends on interactions).
    """
    check_positive_ints(num_sets=num_sets, min_size=min_size, max_size=max_size)
    if not 2 <= min_size <= max_size:
        raise ValueError(f"need 2 <= min_size <= max_size, got {min_size} and {max_size}")
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_size, max_size + 1, (num_sets,), generator=g)
    P = 2 * torch.rand(num_sets, max_size, 2, generator=g) - 1
    keep = torch.arange(max_size)[None, :] < lens[:, None]  # (B, n)
    P = P * keep[..., None]
    pair = keep[:, :, None] & keep[:, None, :]  # (B, n, n)
    dist = torch.cdist(P.double(), P.double()).masked_fill(~pair, 0.0)
    return P, lens, dist.flatten(1).amax(dim=1).float()


class SetRegressor(nn.Module):
    """Chapter 16's set models: DeepSets, or a Set Transformer with SAB or ISAB blocks.

    - ``"deepsets"``: :math:`\\rho(\\sum_i \\phi(x_i))` with MLPs :math:`\\phi, \\rho` (Zaheer et
      al. 2017): each element is encoded alone, then summed;
    - ``"sab"``: ``num_layers`` set attention blocks (``MAB(X, X)``), then PMA with one seed;
    - ``"isab"``: the same with ISAB blocks of ``num_inducing`` points.

    Args:
        kind: ``"deepsets"``, ``"sab"`` or ``"isab"``. in_features: the size of an element.
        num_hiddens, num_heads, num_layers, num_inducing: keyword-only sizes.

    Shapes (``forward``):
        X ``(B, n, in_features)``, ``valid_lens`` ``None`` or an integer tensor ``(B,)`` in
        ``[1, n]`` (no empty set). Returns ``(B,)``.

    Raises:
        ValueError: an unknown ``kind`` or sizes that are not positive integers; in
            ``forward``, ``X`` not a float ``(B, n, in_features)`` tensor, ``valid_lens``
            not an integer tensor ``(B,)`` in ``[1, n]`` (one check for the three kinds).

    Example:
        >>> P, lens, _ = make_diameter_sets(4)
        >>> [tuple(SetRegressor(k, 2)(P, lens).shape) for k in ("deepsets", "sab", "isab")]
        [(4,), (4,), (4,)]

    Source: Zaheer et al. (2017), equation (4); Lee et al. (2019), section 3.
    """

    KINDS = ("deepsets", "sab", "isab")

    def __init__(self, kind: str, in_features: int, *, num_hiddens: int = 64,
                 num_heads: int = 4, num_layers: int = 2, num_inducing: int = 8) -> None:
        super().__init__()
        check_choice("kind", kind, self.KINDS)
        check_positive_ints(in_features=in_features, num_hiddens=num_hiddens,
                            num_heads=num_heads, num_layers=num_layers,
                            num_inducing=num_inducing)
        self.kind, d = kind, num_hiddens
        self.embed = nn.Sequential(nn.Linear(in_features, d), nn.ReLU(), nn.Linear(d, d))
        if kind == "deepsets":
            self.phi = nn.Sequential(nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        elif kind == "sab":
            self.blocks = nn.ModuleList(MultiheadAttentionBlock(d, num_heads)
                                        for _ in range(num_layers))
        else:
            self.blocks = nn.ModuleList(InducedSetAttentionBlock(d, num_heads, num_inducing)
                                        for _ in range(num_layers))
        if kind != "deepsets":
            self.pool = PoolingByMultiheadAttention(d, num_heads, num_seeds=1)
        self.rho = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 1))

    def forward(self, X: Tensor, valid_lens: Optional[Tensor] = None) -> Tensor:
        """One number per set, ``(B,)``; see the class docstring."""
        if not isinstance(X, Tensor) or X.dim() != 3 or not X.is_floating_point():
            raise ValueError(f"X must be a float tensor of shape (B, n, in_features), got "
                             f"{getattr(X, 'shape', type(X).__name__)}")
        if valid_lens is not None:  # the same rule for every kind
            valid_lens = check_set_lens(valid_lens, X.shape[0], X.shape[1])
        H = self.embed(X)  # (B, n, d)
        if self.kind == "deepsets":
            H = self.phi(H)  # (B, n, d): each element alone
            if valid_lens is not None:
                keep = torch.arange(H.shape[1], device=H.device)[None, :] < \
                    valid_lens.to(H.device)[:, None]  # (B, n)
                H = H * keep[..., None]
            return self.rho(H.sum(dim=1)).squeeze(-1)  # (B,)
        for block in self.blocks:
            H = block(H, H, valid_lens) if self.kind == "sab" else block(H, valid_lens)
        return self.rho(self.pool(H, valid_lens)[:, 0]).squeeze(-1)  # (B,)


def train_set_model(model: nn.Module, X: Tensor, valid_lens: Tensor, targets: Tensor, *,
                    steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
                    stop_after: Optional[int] = None, clip: Optional[float] = None,
                    callback: Optional[Callback] = None,
                    loss: str = "cross_entropy") -> List[float]:
    """Train a model of padded sets, ``model(X, valid_lens)``, on random batches.

    AdamW (weight decay 0.01) with a one-cycle learning rate (peak ``lr``); batches drawn with
    replacement by a generator seeded with ``seed``, so the same seed and initial weights give
    the same run. Used by chapter 16 for point clouds (``loss="cross_entropy"``, integer labels)
    and set regression (``loss="mse"``, float targets). The loop and its arguments follow the
    library's training convention (:mod:`d2lattn.training`).

    Args:
        model: maps ``(b, n, c)`` elements and ``(b,)`` sizes to ``(b, C)`` logits or ``(b,)``.
        X: ``(S, n, c)`` padded sets. valid_lens: ``(S,)`` sizes. targets: ``(S,)``.
        steps, batch_size, lr, seed: keyword-only, as above.
        stop_after: run only the first ``stop_after`` steps of the ``steps``-step schedule (to
            retrace the start of a longer run).
        clip: the largest global gradient norm (``None``: no clipping).
        callback: ``callback(step, model, loss)`` after each step, ``step`` from 1.
        loss: ``"cross_entropy"`` or ``"mse"``.

    Returns:
        the training loss of every step (before its update; fewer if a loss is not finite).
        Leaves the model in eval mode.

    Raises:
        ValueError: sizes that are not positive integers, an unknown ``loss``, inputs whose
            first axes differ.

    Source: book chapter 16; the one-cycle schedule of Smith & Topin (2019).
    """
    check_positive_ints(steps=steps, batch_size=batch_size)
    if loss not in ("cross_entropy", "mse"):
        raise ValueError(f"loss must be 'cross_entropy' or 'mse', got {loss!r}")
    if not (len(X) == len(valid_lens) == len(targets)):
        raise ValueError(f"X, valid_lens and targets must have the same first axis, got "
                         f"{len(X)}, {len(valid_lens)} and {len(targets)}")
    criterion = F.cross_entropy if loss == "cross_entropy" else F.mse_loss
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)

    def batch_loss() -> Tensor:
        idx = torch.randint(len(X), (batch_size,), generator=generator)
        return criterion(model(X[idx], valid_lens[idx]), targets[idx])

    return fit(model, opt, batch_loss, steps=steps, stop_after=stop_after, clip=clip,
               scheduler=schedule, callback=callback)
