"""d2lattn.vision: patches, patch embedding = strided convolution, the ViT, rollout, occlusion."""

import pytest
import torch
from torch import nn

from d2lattn.vision import (PatchEmbedding, VisionTransformer, attention_rollout, occlusion_map,
                            patchify)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def small_vit(**kwargs):
    torch.manual_seed(0)
    args = dict(image_size=8, patch_size=2, num_classes=10, num_hiddens=16, num_heads=2,
                num_layers=3, ffn_num_hiddens=32)
    args.update(kwargs)
    return VisionTransformer(**args).double().eval()


@pytest.mark.parametrize("C,H,W,p", [(1, 8, 8, 2), (1, 8, 8, 4), (3, 6, 9, 3), (2, 4, 4, 1)])
def test_patch_embedding_equals_strided_convolution(C, H, W, p):
    torch.manual_seed(0)
    embed = PatchEmbedding(C, p, 12).double()
    conv = nn.Conv2d(C, 12, kernel_size=p, stride=p).double()
    with torch.no_grad():
        conv.weight.copy_(embed.proj.weight.view(12, C, p, p))
        conv.bias.copy_(embed.proj.bias)
    images = randn(3, C, H, W)
    expected = conv(images).flatten(2).transpose(1, 2)  # (B, N, d), row-major patch grid
    torch.testing.assert_close(embed(images), expected, rtol=1e-12, atol=1e-12)


def test_patchify_order_and_no_write():
    images = randn(2, 3, 4, 6)
    before = images.clone()
    patches = patchify(images, 2)  # (2, 6, 12)
    assert patches.shape == (2, 6, 12)
    # patch 4 is grid row 1, column 1: pixels rows 2..3, columns 2..3, flattened (C, p, p)
    torch.testing.assert_close(patches[:, 4], images[:, :, 2:4, 2:4].reshape(2, 12))
    assert torch.equal(images, before)


def test_rollout_rows_sum_to_one():
    vit = small_vit()
    vit(randn(5, 1, 8, 8))
    weights = vit.attention_weights
    assert weights.shape == (3, 5, 2, 17, 17)
    for alpha in (0.0, 0.3, 0.5, 1.0):
        rollout = attention_rollout(weights, alpha)
        assert rollout.shape == (5, 17, 17)
        assert (rollout >= 0).all()
        torch.testing.assert_close(rollout.sum(-1), torch.ones(5, 17, dtype=torch.float64))
    torch.testing.assert_close(attention_rollout(weights, 1.0),
                               torch.eye(17, dtype=torch.float64).expand(5, 17, 17))


def test_rollout_hand_computed():
    # layer 1: every token reads token 0; layer 2: every token reads token 1 (one head each)
    A1 = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    A2 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    weights = torch.stack([A1, A2])[:, None, None]  # (L=2, B=1, h=1, 2, 2)
    # with the residual: A1~ = [[1, 0], [.5, .5]], A2~ = [[.5, .5], [0, 1]]; R = A2~ @ A1~
    expected = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    torch.testing.assert_close(attention_rollout(weights)[0], expected)
    # without the residual the product is plain: A2 @ A1 = [[1, 0], [1, 0]]
    torch.testing.assert_close(attention_rollout(weights, 0.0)[0], A2 @ A1)


def test_rollout_averages_heads():
    heads = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])  # (h=2, 2, 2)
    weights = heads[None, None]  # (1, 1, 2, 2, 2)
    torch.testing.assert_close(attention_rollout(weights, 0.0)[0], torch.full((2, 2), 0.5))


def test_vit_variants_shapes_and_bag_of_patches():
    images = randn(4, 1, 8, 8)
    for pool, positions, tokens in (("cls", True, 17), ("mean", True, 16), ("cls", False, 17)):
        vit = small_vit(pool=pool, positions=positions)
        assert vit(images).shape == (4, 10)
        assert vit.num_tokens == tokens and vit.attention_weights.shape[-1] == tokens
    # without positions the ViT cannot tell where a patch was: shuffling the patches
    # (here: swapping two 2x2 blocks of pixels) leaves the logits unchanged
    vit = small_vit(positions=False)
    swapped = images.clone()
    swapped[:, :, 0:2, 0:2], swapped[:, :, 6:8, 4:6] = images[:, :, 6:8, 4:6], images[:, :, 0:2, 0:2]
    torch.testing.assert_close(vit(swapped), vit(images), rtol=1e-10, atol=1e-10)
    vit = small_vit()
    assert (vit(swapped) - vit(images)).abs().max() > 1e-6


def test_occlusion_map():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3)).double()
    images = randn(2, 1, 8, 8)
    images[:, :, :2, :2] = 0.0  # patch 0 is already blank: masking it changes nothing
    before = images.clone()
    labels = torch.tensor([0, 2])
    drops = occlusion_map(model, images, labels, patch_size=2)
    assert drops.shape == (2, 16) and torch.equal(images, before)
    assert (drops[:, 0] == 0).all()
    masked = images.clone()
    masked[:, :, 2:4, 4:6] = 0.0  # patch 6: grid row 1, column 2
    p = lambda x: model(x).softmax(-1)[torch.arange(2), labels]  # noqa: E731
    torch.testing.assert_close(drops[:, 6], p(images) - p(masked))


@pytest.mark.parametrize("call,name", [
    (lambda: patchify(torch.zeros(1, 1, 8, 8), 3), "images"),
    (lambda: patchify(torch.zeros(8, 8), 2), "images"),
    (lambda: patchify(torch.zeros(1, 1, 8, 8, dtype=torch.long), 2), "images"),
    (lambda: patchify(torch.zeros(1, 1, 8, 8), 0), "patch_size"),
    (lambda: PatchEmbedding(1, 2, 0), "num_hiddens"),
    (lambda: PatchEmbedding(1, 2, 8)(torch.zeros(1, 3, 8, 8)), "in_channels"),
    (lambda: VisionTransformer(8, 3, 10, 16, 2, 1, 32), "image_size"),
    (lambda: VisionTransformer(8, 2, 10, 16, 2, 1, 32, pool="max"), "pool"),
    (lambda: VisionTransformer(8, 2, 10, 16, 2, 1, 32, positions=1), "positions"),
    (lambda: VisionTransformer(8, 2, 10, 16, 3, 1, 32), "num_heads"),
    (lambda: VisionTransformer(8, 2, 10, 16, 2, 0, 32), "num_layers"),
    (lambda: VisionTransformer(8, 2, 10, 16, 2, 1, 32, dropout=1.0), "dropout"),
    (lambda: VisionTransformer(8, 2, 10, 16, 2, 1, 32)(torch.zeros(1, 1, 4, 4)), "images"),
    (lambda: VisionTransformer(8, 2, 10, 16, 2, 1, 32).attention_weights, "attention weights"),
    (lambda: attention_rollout(torch.ones(2, 1, 3, 3)), "attention_weights"),
    (lambda: attention_rollout(torch.ones(2, 1, 1, 3, 4)), "attention_weights"),
    (lambda: attention_rollout(torch.ones(2, 1, 1, 3, 3), 1.5), "residual_weight"),
    (lambda: occlusion_map(nn.Flatten(), torch.zeros(2, 1, 4, 4), torch.zeros(3).long(), 2),
     "labels"),
    (lambda: occlusion_map(nn.Flatten(), torch.zeros(2, 1, 4, 4), torch.zeros(2), 2), "labels"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
