"""Chapter 10's comparisons over seeds: a small ViT against baselines, and its explanations.

Reproduces the table that book/ch10_vision_transformer.ipynb loads, with one command from the
repository root:

    python -m experiments run ch10_sweep                  # seeds 0-9
    python -m experiments run ch10_sweep --seeds 15 16    # fresh seeds, added to the results
    python -m experiments table ch10_sweep --out book/data/ch10_sweep.json

For each seed (by default 0..9: 0..4, the seeds the chapter was written from, and 5..9, fresh
seeds run after it; --seeds runs others) it trains every model of the chapter with the
chapter's recipe on the same stratified split of scikit-learn's digits, and records test
accuracy (also on the test digits shifted one pixel right), parameter count and training CPU
seconds. For the main ViT it also
records the mean Spearman rank correlation, over the test images, between the occlusion map
and three candidate explanations (ink per patch, attention rollout, raw last-layer attention of
the class token), the same over inked patches only and for other rollout residual weights, the
cosine similarities of the learned position embeddings (neighbours, distant patches, corners),
and, per head, how often the class token's top patch is the head's usual one. The chapter
re-runs seed 0 live and checks it against this table. About 40 CPU-seconds per seed on one
thread; each run (a model and a seed) is independent of the others; everything but the CPU seconds is reproduced exactly on the same machine and
torch version.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep (set before torch)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from scipy.stats import rankdata  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from torch import nn  # noqa: E402

from d2lattn.training import fit  # noqa: E402
from d2lattn.vision import (VisionTransformer, attention_rollout, occlusion_map,  # noqa: E402
                            patchify)

torch.set_num_threads(1)  # tiny models: one thread is fastest (as in the chapter)
SEEDS = range(10)  # the committed table; add fresh seeds with --seeds
OUT = Path(__file__).resolve().parents[1] / "book" / "data" / "ch10_sweep.json"


# ---- the chapter's code, copied verbatim (the chapter checks seed 0 against this table) ----
def load_digit_split():
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    # images: (1797, 1, 8, 8)
    labels = torch.tensor(digits.target)  # (1797,) digits 0..9
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=0.2,
                                           stratify=digits.target, random_state=0)
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]


def make_vit(patch_size=2, pool="cls", positions=True, num_hiddens=32):
    return VisionTransformer(image_size=8, patch_size=patch_size, num_classes=10,
                             num_hiddens=num_hiddens, num_heads=4, num_layers=2,
                             ffn_num_hiddens=2 * num_hiddens, pool=pool,
                             positions=positions)


def make_model(name):
    if name == "logistic":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    return {"vit": lambda: make_vit(),
            "vit, mean pooling": lambda: make_vit(pool="mean"),
            "vit, no positions": lambda: make_vit(positions=False),
            "vit, 4x4 patches": lambda: make_vit(patch_size=4)}[name]()


def train(model, X, y, epochs=20, batch_size=64, lr=3e-3, seed=0):
    """AdamW with a one-cycle learning-rate schedule; returns the model in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    steps_per_epoch = (len(y) + batch_size - 1) // batch_size
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, pct_start=0.1,
                                                   total_steps=epochs * steps_per_epoch)
    batches = []

    def batch_loss():  # every epoch visits the examples once, in a fresh order
        if not batches:
            batches.extend(torch.randperm(len(y), generator=generator).split(batch_size)[::-1])
        batch = batches.pop()
        return F.cross_entropy(model(X[batch]), y[batch])

    fit(model, optimizer, batch_loss, steps=epochs * steps_per_epoch, scheduler=schedule)
    return model


@torch.no_grad()
def accuracy(model, X, y):
    return (model(X).argmax(dim=-1) == y).float().mean().item()


def spearman(a, b):
    """Spearman rank correlation of two 1-D arrays (ties get their average rank)."""
    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def explanation_scores(vit, X, y):
    """Per test image, four (N,) patch scores: occlusion, ink, rollout, attention."""
    with torch.no_grad():
        vit(X)
    weights = vit.attention_weights  # (L, B, h, T, T)
    return {"occlusion": occlusion_map(vit, X, y, patch_size=2),  # (B, N)
            "ink": patchify(X, 2).sum(dim=-1),  # (B, N)
            "rollout": attention_rollout(weights)[:, 0, 1:],  # (B, N): class token row
            "last-layer attention": weights[-1].mean(dim=1)[:, 0, 1:]}  # (B, N)


def mean_correlations(scores):
    occ = scores["occlusion"].numpy()
    return {name: float(np.nanmean([spearman(occ[b], s[b].numpy())
                                    for b in range(len(occ))]))
            for name, s in scores.items() if name != "occlusion"}


def neighbour_similarity(similarity, n=4):
    index = torch.arange(n * n)
    rows, cols = index // n, index % n  # grid coordinates of each patch
    grid_distance = ((rows[:, None] - rows).abs()
                     + (cols[:, None] - cols).abs())  # (N, N)
    return (similarity[grid_distance == 1].mean().item(),
            similarity[grid_distance >= 2].mean().item())


def corner_similarity(similarity, n=4):
    """Mean cosine similarity between the positions of the four corner patches."""
    corners = torch.tensor([0, n - 1, n * (n - 1), n * n - 1])
    block = similarity[corners][:, corners]  # (4, 4)
    return block[~torch.eye(4, dtype=torch.bool)].mean().item()


def shift_right(images, pixels=1):
    return F.pad(images, (pixels, 0))[..., :images.shape[-1]]  # blanks enter at left


def inked_correlations(scores):
    """Mean Spearman correlation with occlusion over the patches that hold some ink."""
    occ, inked = scores["occlusion"].numpy(), (scores["ink"] > 0).numpy()
    return {name: float(np.nanmean([spearman(occ[b][inked[b]], s[b].numpy()[inked[b]])
                                    for b in range(len(occ))]))
            for name, s in scores.items() if name != "occlusion"}


def rollout_correlations(vit, X, y, alphas=(0.0, 0.5, 0.9)):
    scores = explanation_scores(vit, X, y)
    with torch.no_grad():
        vit(X)  # occlusion_map ran the model last: the weights of the unmasked images
    weights = vit.attention_weights  # (L, B, h, T, T)
    occ = scores["occlusion"].numpy()
    out = {}
    for alpha in alphas:
        R = attention_rollout(weights, alpha)[:, 0, 1:].numpy()  # (B, N)
        out[alpha] = float(np.nanmean([spearman(occ[b], R[b])
                                       for b in range(len(occ))]))
    return out
# ---- end of the chapter's code ----


def top_patch_share(weights):
    """Per block and head, the share of images whose class token's largest weight falls on the
    head's most common top patch (1.0: the head always looks at the same place)."""
    top = weights[:, :, :, 0, 1:].argmax(dim=-1)  # (L, B, h): top patch per image
    most_common = top.mode(dim=1).values  # (L, h)
    return (top == most_common[:, None]).float().mean(dim=1)  # (L, h)


MODELS = ["vit", "vit, mean pooling", "vit, no positions", "vit, 4x4 patches", "cnn", "mlp",
          "logistic"]


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ("cpu_seconds",)
TABLE = OUT
NAMES = MODELS + ["vit, no positions, 4x steps, d=64"]


def grid(seeds=None, smoke=False) -> list[dict]:
    """Every model on every seed (``smoke``: the ViT and the logistic model, one epoch)."""
    if smoke:
        return [{"model": name, "seed": 0, "epochs": 1} for name in ("vit", "logistic")]
    return [{"model": name, "seed": seed} for name in NAMES
            for seed in (seeds if seeds is not None else SEEDS)]


def cpu_seconds(config: dict) -> float:
    # CPU seconds of the committed runs, by model (20 epochs; the d = 64 model 80)
    seconds = {"vit": 6.2, "vit, mean pooling": 5.6, "vit, no positions": 6.0,
               "vit, 4x4 patches": 4.5, "cnn": 3.6, "mlp": 0.5, "logistic": 0.3,
               "vit, no positions, 4x steps, d=64": 39.4}[config["model"]]
    epochs = 80 if config["model"].endswith("d=64") else 20
    return seconds * config.get("epochs", epochs) / epochs + (5 if config["model"] == "vit" else 0)


def run(config: dict) -> dict:
    """Train one model on one seed with the chapter's recipe; for the ViT, its explanations."""
    torch.set_num_threads(1)
    name, seed = config["model"], config["seed"]
    X_train, y_train, X_test, y_test = load_digit_split()
    torch.manual_seed(seed)
    if name.endswith("d=64"):
        model, epochs = make_vit(positions=False, num_hiddens=64), 80
    else:
        model, epochs = make_model(name), 20
    epochs = config.get("epochs", epochs)
    row = {"params": sum(p.numel() for p in model.parameters())}
    start = time.process_time()
    train(model, X_train, y_train, epochs=epochs, seed=seed)
    row["cpu_seconds"] = round(time.process_time() - start, 2)
    row["accuracy"] = round(accuracy(model, X_test, y_test), 4)
    row["accuracy, shifted 1 pixel right"] = round(
        accuracy(model, shift_right(X_test), y_test), 4)
    if name == "vit":
        scores = explanation_scores(model, X_test, y_test)
        row["explanations"] = {key: round(r, 4) for key, r in mean_correlations(scores).items()}
        extra = row["vit extras"] = {}
        for key, r in inked_correlations(scores).items():
            extra[f"inked patches only: {key}"] = round(r, 4)
        for alpha, r in rollout_correlations(model, X_test, y_test).items():
            extra[f"rollout, residual weight {alpha}"] = round(r, 4)
        pos = F.normalize(model.pos_embedding[0, 1:].detach(), dim=-1)  # (N, d)
        near, far = neighbour_similarity(pos @ pos.T)
        extra["position similarity, neighbours"] = round(near, 4)
        extra["position similarity, further apart"] = round(far, 4)
        extra["position similarity, corners"] = round(corner_similarity(pos @ pos.T), 4)
        with torch.no_grad():
            model(X_test)
        share = top_patch_share(model.attention_weights)  # (L, h)
        extra["top-patch share per head"] = [[round(x, 4) for x in r] for r in share.tolist()]
    return row


def table(records: list[dict]) -> dict:
    """The chapter's table: per model, its accuracies by seed (the seeds every model has)."""
    rows = {(r["config"]["model"], r["config"]["seed"]): r["row"] for r in records}
    names = [n for n in NAMES if any(m == n for m, _ in rows)]
    seeds = sorted({s for _, s in rows if all((n, s) in rows for n in names)})
    _, y_train, _, y_test = load_digit_split()
    out = {"split": {"train": len(y_train), "test": len(y_test)},
           "recipe": "AdamW lr 3e-3, one-cycle schedule, 20 epochs, batch 64, 1 thread",
           "seeds": seeds, "models": {}, "explanations": {}, "vit extras": {}}
    for name in names:
        runs = [rows[name, s] for s in seeds]
        out["models"][name] = {
            "accuracy": [r["accuracy"] for r in runs],
            "cpu_seconds": [r["cpu_seconds"] for r in runs],
            "params": runs[-1]["params"],
            "accuracy, shifted 1 pixel right": [r["accuracy, shifted 1 pixel right"]
                                                for r in runs]}
        if name == "vit":
            for part in ("explanations", "vit extras"):
                for key in runs[0][part]:
                    out[part][key] = [r[part][key] for r in runs]
    return out


if __name__ == "__main__":  # the same as: python -m experiments run ch10_sweep ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch10_sweep")
