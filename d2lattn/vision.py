"""Attention over image patches: a small Vision Transformer and tools to look inside it.

An image is cut into non-overlapping ``p x p`` patches, each patch is flattened and projected
to a token, and a stack of Transformer encoder blocks attends over the tokens (Dosovitskiy et
al., 2021). Shape legend used throughout: ``B`` images, ``C`` channels, ``H x W`` pixels,
``p`` the patch size, ``N = (H / p) (W / p)`` patches, ``T`` tokens (``N``, plus one with a
class token), ``d = num_hiddens``, ``h`` heads, ``L`` layers.

- :func:`patchify`: images to flattened patches, in row-major order of the patch grid;
- :class:`PatchEmbedding`: one linear layer on the patches (a convolution with stride ``p``);
- :class:`VisionTransformer`: patch embedding, class token or mean pooling, learned positions,
  pre-norm :class:`~d2lattn.transformer.TransformerEncoderBlock` s, a linear head;
- :func:`attention_rollout`: attention traced through the layers (Abnar & Zuidema, 2020);
- :func:`occlusion_map`: how much the true-class probability drops when a patch is masked.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_dropout,
    check_images,
    check_positive_ints,
)

from .transformer import TransformerEncoderBlock

__all__ = ["PatchEmbedding", "VisionTransformer", "attention_rollout", "occlusion_map",
           "patchify"]


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into non-overlapping square patches and flatten each patch.

    Patches come in row-major order of the patch grid (left to right, then top to bottom),
    and each is flattened in the order ``(C, p, p)``, the layout of a ``Conv2d`` kernel.

    Args:
        images: ``(B, C, H, W)`` float; ``H`` and ``W`` multiples of ``patch_size``.
        patch_size: p, a positive integer.

    Returns:
        ``(B, N, C * p * p)`` with ``N = (H / p) * (W / p)``; a new tensor.

    Raises:
        ValueError: if ``patch_size`` is not a positive integer, or ``images`` is not a
            ``(B, C, H, W)`` float tensor whose sides ``patch_size`` divides.

    Example:
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> patchify(x, 2)
        tensor([[[ 0.,  1.,  4.,  5.],
                 [ 2.,  3.,  6.,  7.],
                 [ 8.,  9., 12., 13.],
                 [10., 11., 14., 15.]]])

    Source: Dosovitskiy et al. (2021), section 3.1 (the patches x_p of equation 1).
    """
    check_positive_ints(patch_size=patch_size)
    check_images(images, patch_size)
    B, C, H, W = images.shape
    p = patch_size
    X = images.reshape(B, C, H // p, p, W // p, p)  # (B, C, H/p, p, W/p, p)
    X = X.permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return X.reshape(B, (H // p) * (W // p), C * p * p)  # (B, N, C p p)


class PatchEmbedding(nn.Module):
    r"""Project each flattened ``p x p`` patch to a ``num_hiddens``-vector: one linear layer.

    .. math:: \mathbf z_i = \mathbf E\, \mathbf x_p^{(i)} + \mathbf b, \qquad
              \mathbf E \in \mathbb R^{d \times C p^2}

    The same matrix is applied to every patch, so this is a convolution with kernel size and
    stride ``p``: ``nn.Conv2d(C, d, p, stride=p)`` with weight ``E.view(d, C, p, p)`` gives the
    same numbers (the tests check it).

    Args:
        in_channels: C.
        patch_size: p.
        num_hiddens: d, the token size.

    Parameters:
        proj: ``nn.Linear(C * p * p, num_hiddens)``.

    Shapes (``forward``):
        images ``(B, C, H, W)`` float, sides multiples of ``p``; returns ``(B, N, d)``.

    Raises:
        ValueError: a size that is not a positive integer; in ``forward``, images of the wrong
            shape (see :func:`patchify`) or channel count.

    Example:
        >>> embed = PatchEmbedding(in_channels=1, patch_size=4, num_hiddens=32)
        >>> embed(torch.zeros(5, 1, 8, 8)).shape
        torch.Size([5, 4, 32])

    Source: Dosovitskiy et al. (2021), equation (1) and the "hybrid architecture" remark of
    section 3.1 (a patch projection is a convolution).
    """

    def __init__(self, in_channels: int, patch_size: int, num_hiddens: int) -> None:
        super().__init__()
        check_positive_ints(in_channels=in_channels, patch_size=patch_size,
                            num_hiddens=num_hiddens)
        self.in_channels = in_channels
        self.patch_size = patch_size
        self.proj = nn.Linear(in_channels * patch_size * patch_size, num_hiddens)

    def forward(self, images: Tensor) -> Tensor:
        """Token vectors ``(B, N, d)`` of images ``(B, C, H, W)``."""
        check_images(images, self.patch_size, self.in_channels)
        return self.proj(patchify(images, self.patch_size))  # (B, N, d)


class VisionTransformer(nn.Module):
    r"""A small Vision Transformer (ViT) classifier built from d2lattn's encoder blocks.

    .. math::
        Z_0 = [\mathbf x_{\text{class}};\ \mathbf E \mathbf x_p^{(1)}; \dots;
        \mathbf E \mathbf x_p^{(N)}] + \mathbf E_{\text{pos}}, \quad
        Z_\ell = \mathrm{Block}_\ell(Z_{\ell-1}), \quad
        \hat y = W_{\text{head}}\, \mathrm{LN}(z_L^{0})

    (with ``pool="mean"`` there is no class token and ``z_L^0`` becomes the mean of the
    ``N`` outputs; with ``positions=False`` there is no ``E_pos``, and the model sees a bag of
    patches).

    Args:
        image_size: side of the square input images, a multiple of ``patch_size``.
        patch_size: p.
        num_classes: number of output logits.
        num_hiddens: d.
        num_heads: h; must divide ``num_hiddens``.
        num_layers: L, the number of encoder blocks.
        ffn_num_hiddens: hidden size of each block's feed-forward network.
        in_channels: C (1 for grey images).
        dropout: the blocks' dropout, in ``[0, 1)``.
        pool: keyword-only; ``"cls"`` reads the class token (ViT), ``"mean"`` averages the
            patch tokens.
        positions: keyword-only; add learned position embeddings (one per token).

    Parameters and submodules:
        patch_embedding: :class:`PatchEmbedding`.
        cls_token: ``(1, 1, d)``, only with ``pool="cls"``, initialised to zeros.
        pos_embedding: ``(1, T, d)``, only with ``positions=True``, normal with std 0.02.
        blocks: ``L`` pre-norm :class:`~d2lattn.transformer.TransformerEncoderBlock` s.
        norm: the final ``nn.LayerNorm(d)``; head: ``nn.Linear(d, num_classes)``.

    Shapes (``forward``):
        images ``(B, C, image_size, image_size)`` float; returns logits ``(B, num_classes)``.

    Attributes:
        num_patches: N; num_tokens: T (N + 1 with a class token).
        attention_weights: ``(L, B, h, T, T)``, every block's weights from the last call.

    Raises:
        ValueError: bad constructor arguments (sizes, ``pool``, ``positions``, an image size
            that the patch size does not divide); in ``forward``, images of the wrong shape.

    Example:
        >>> vit = VisionTransformer(image_size=8, patch_size=2, num_classes=10, num_hiddens=16,
        ...                         num_heads=2, num_layers=3, ffn_num_hiddens=32)
        >>> vit(torch.zeros(4, 1, 8, 8)).shape, vit.attention_weights.shape
        (torch.Size([4, 10]), torch.Size([3, 4, 2, 17, 17]))

    Source: Dosovitskiy et al. (2021), section 3.1, equations (1)-(4); the blocks are pre-norm
    (their equations 2 and 3).
    """

    def __init__(self, image_size: int, patch_size: int, num_classes: int, num_hiddens: int,
                 num_heads: int, num_layers: int, ffn_num_hiddens: int, in_channels: int = 1,
                 dropout: float = 0.0, *, pool: str = "cls", positions: bool = True) -> None:
        super().__init__()
        check_positive_ints(image_size=image_size, patch_size=patch_size,
                            num_classes=num_classes, num_layers=num_layers)
        check_dropout(dropout)
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be a multiple of patch_size "
                             f"({patch_size})")
        if pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {pool!r}")
        if not isinstance(positions, bool):
            raise ValueError(f"positions must be a bool, got {positions!r}")
        self.image_size, self.pool = image_size, pool
        self.num_patches = (image_size // patch_size) ** 2
        self.num_tokens = self.num_patches + (pool == "cls")
        self.patch_embedding = PatchEmbedding(in_channels, patch_size, num_hiddens)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, num_hiddens)) if pool == "cls" else None
        self.pos_embedding = (nn.Parameter(0.02 * torch.randn(1, self.num_tokens, num_hiddens))
                              if positions else None)
        self.blocks = nn.ModuleList(
            TransformerEncoderBlock(num_hiddens, num_heads, ffn_num_hiddens, dropout,
                                    norm_first=True) for _ in range(num_layers))
        self.norm = nn.LayerNorm(num_hiddens)
        self.head = nn.Linear(num_hiddens, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(B, num_classes)`` of images ``(B, C, image_size, image_size)``."""
        check_images(images, self.patch_embedding.patch_size,
                      self.patch_embedding.in_channels)
        if images.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(f"images must be {self.image_size} x {self.image_size}, got "
                             f"{tuple(images.shape[-2:])}")
        # 1. patches -> tokens
        X = self.patch_embedding(images)  # (B, N, d)
        if self.cls_token is not None:  # 2. a learned token in front of the patches
            X = torch.cat([self.cls_token.expand(X.shape[0], -1, -1), X], dim=1)  # (B, T, d)
        if self.pos_embedding is not None:  # 3. where each token comes from
            X = X + self.pos_embedding  # (B, T, d)
        for block in self.blocks:  # 4. attend
            X = block(X)  # (B, T, d)
        # 5. one vector per image, then the classifier
        pooled = X[:, 0] if self.pool == "cls" else X.mean(dim=1)  # (B, d)
        return self.head(self.norm(pooled))  # (B, num_classes)

    @property
    def attention_weights(self) -> Tensor:
        """``(L, B, h, T, T)``: every block's attention weights from the last call."""
        weights: List[Optional[Tensor]] = [b.self_attention.attention_weights
                                           for b in self.blocks]
        if any(w is None for w in weights):
            raise ValueError("no attention weights yet: call the model on a batch first")
        return torch.stack(weights)  # type: ignore[arg-type]


def attention_rollout(attention_weights: Tensor, residual_weight: float = 0.5) -> Tensor:
    r"""Attention rollout: how much each output token draws on each input token, through all
    layers, if attention were the only way information moved.

    The weights of each layer are averaged over the heads, the residual connection is
    modelled by mixing in the identity, and the layers are chained by matrix products:

    .. math::
        \tilde A_\ell = (1 - \alpha)\, \bar A_\ell + \alpha I, \qquad
        R = \tilde A_L \tilde A_{L-1} \cdots \tilde A_1

    with :math:`\bar A_\ell` the head average of layer :math:`\ell` and
    :math:`\alpha` = ``residual_weight`` (0.5 in the paper). Each :math:`\tilde A_\ell` has
    rows that sum to 1, so :math:`R` does too.

    Args:
        attention_weights: ``(L, B, h, T, T)`` float, layer 1 first (for example
            :attr:`VisionTransformer.attention_weights`); rows should sum to 1.
        residual_weight: alpha in ``[0, 1]``.

    Returns:
        ``(B, T, T)``: row ``i`` is the share of input token ``j`` in output token ``i``. For a
        ViT, row 0 (the class token), columns ``1:``, is the map over the patches.

    Raises:
        ValueError: if ``attention_weights`` is not a ``(L, B, h, T, T)`` float tensor or
            ``residual_weight`` is outside ``[0, 1]``.

    Example:
        >>> A = torch.tensor([[[[[1.0, 0.0], [1.0, 0.0]]]], [[[[0.0, 1.0], [0.0, 1.0]]]]])
        >>> attention_rollout(A)[0]  # layer 2 after layer 1
        tensor([[0.7500, 0.2500],
                [0.5000, 0.5000]])

    Source: Abnar & Zuidema (2020), "Quantifying Attention Flow in Transformers", section 3
    (attention rollout).
    """
    if not isinstance(attention_weights, Tensor) or not attention_weights.is_floating_point() \
            or attention_weights.dim() != 5 \
            or attention_weights.shape[-1] != attention_weights.shape[-2]:
        got = (tuple(attention_weights.shape) if isinstance(attention_weights, Tensor)
               else type(attention_weights).__name__)
        raise ValueError(f"attention_weights must be a float tensor of shape (L, B, h, T, T), "
                         f"got {got}")
    if isinstance(residual_weight, bool) or not isinstance(residual_weight, (int, float)) \
            or not 0.0 <= residual_weight <= 1.0:
        raise ValueError(f"residual_weight must lie in [0, 1], got {residual_weight!r}")
    A = attention_weights.mean(dim=2)  # (L, B, T, T): average the heads
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    A = (1.0 - residual_weight) * A + residual_weight * eye  # (L, B, T, T)
    rollout = A[0]  # (B, T, T)
    for layer in A[1:]:
        rollout = layer @ rollout  # (B, T, T): the later layer acts on the earlier result
    return rollout


@torch.no_grad()
def occlusion_map(model: nn.Module, images: Tensor, labels: Tensor, patch_size: int,
                  fill: float = 0.0) -> Tensor:
    """The drop in the probability of the true class when each patch is masked.

    For every image and every ``p x p`` patch, the patch is set to ``fill`` and the model's
    softmax probability of ``labels`` is compared with the unmasked one. A large drop means
    the model needed that patch; a patch that already equals ``fill`` everywhere gives 0.

    Args:
        model: maps ``(B, C, H, W)`` images to ``(B, num_classes)`` logits; run as it is
            (call ``model.eval()`` first if it has dropout).
        images: ``(B, C, H, W)`` float; sides multiples of ``patch_size``.
        labels: ``(B,)`` integers, the classes whose probability is tracked.
        patch_size: p.
        fill: the value written into a masked patch (0 = background for the digits).

    Returns:
        ``(B, N)`` float: probability without masking minus probability with patch ``i``
        masked, patches in the row-major order of :func:`patchify`. ``images`` is not
        modified.

    Raises:
        ValueError: bad ``images`` or ``patch_size``, or ``labels`` not ``(B,)`` integers.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> occlusion_map(model, torch.zeros(2, 1, 4, 4), torch.tensor([0, 2]), 2)
        tensor([[0., 0., 0., 0.],
                [0., 0., 0., 0.]])

    Source: Zeiler & Fergus (2014), "Visualizing and Understanding Convolutional Networks",
    section 4.2 (occlusion sensitivity).
    """
    check_positive_ints(patch_size=patch_size)
    check_images(images, patch_size)
    B, C, H, W = images.shape
    if not isinstance(labels, Tensor) or labels.shape != (B,) or labels.is_floating_point() \
            or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor of shape (B,) = ({B},)")
    p = patch_size
    rows, cols = H // p, W // p
    base = F.softmax(model(images), dim=-1).gather(1, labels[:, None])  # (B, 1)
    drops = torch.empty(B, rows * cols, dtype=images.dtype, device=images.device)
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        masked = images.clone()  # a copy: the caller's images stay as they are
        masked[:, :, r * p:(r + 1) * p, c * p:(c + 1) * p] = fill
        prob = F.softmax(model(masked), dim=-1).gather(1, labels[:, None])  # (B, 1)
        drops[:, i] = (base - prob)[:, 0]
    return drops  # (B, N)
