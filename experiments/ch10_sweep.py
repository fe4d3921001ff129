"""Chapter 10's comparisons over seeds: a small ViT against baselines, and its explanations.

Reproduces the table that book/ch10_vision_transformer.ipynb loads, with one command from the
repository root:

    python experiments/ch10_sweep.py            # writes book/data/ch10_sweep.json
    python experiments/ch10_sweep.py --seeds 5 6 --out fresh.json   # fresh seeds
    python experiments/ch10_sweep.py --merge book/data/ch10_sweep.json fresh.json --out all.json

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
thread; each seed's runs are independent of the others, so tables of disjoint seed sets can be
concatenated; everything but the CPU seconds is reproduced exactly on the same machine and
torch version.
"""

from __future__ import annotations

import argparse
import json
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


def merge_tables(tables: list) -> dict:
    """Concatenate tables of disjoint seeds (each seed's runs are independent of the others)."""
    merged = json.loads(json.dumps(tables[0]))
    for table in tables[1:]:
        if table["split"] != merged["split"] or table["recipe"] != merged["recipe"]:
            raise ValueError("tables made with different splits or recipes")
        if set(table["seeds"]) & set(merged["seeds"]):
            raise ValueError("tables share seeds")
        merged["seeds"] += table["seeds"]
        for name, row in table["models"].items():
            for key, value in row.items():
                if isinstance(value, list):
                    merged["models"][name][key] += value
        for part in ("explanations", "vit extras"):
            for key, value in table[part].items():
                merged[part][key] += value
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--merge", type=Path, nargs="+",
                        help="concatenate these tables (disjoint seeds) into --out; no training")
    args = parser.parse_args()
    if args.merge:
        table = merge_tables([json.loads(path.read_text()) for path in args.merge])
        args.out.write_text(json.dumps(table, indent=1) + "\n")
        print("wrote", args.out, "seeds", table["seeds"], file=sys.stderr)
        return
    seeds = args.seeds
    X_train, y_train, X_test, y_test = load_digit_split()
    table = {"split": {"train": len(y_train), "test": len(y_test)},
             "recipe": "AdamW lr 3e-3, one-cycle schedule, 20 epochs, batch 64, 1 thread",
             "seeds": list(seeds), "models": {}, "explanations": {}}
    names = MODELS + ["vit, no positions, 4x steps, d=64"]
    for name in names:
        row = {"accuracy": [], "cpu_seconds": []}
        for seed in seeds:
            torch.manual_seed(seed)
            if name.endswith("d=64"):
                model, epochs = make_vit(positions=False, num_hiddens=64), 80
            else:
                model, epochs = make_model(name), 20
            row["params"] = sum(p.numel() for p in model.parameters())
            start = time.process_time()
            train(model, X_train, y_train, epochs=epochs, seed=seed)
            row["cpu_seconds"].append(round(time.process_time() - start, 2))
            row["accuracy"].append(round(accuracy(model, X_test, y_test), 4))
            row.setdefault("accuracy, shifted 1 pixel right", []).append(
                round(accuracy(model, shift_right(X_test), y_test), 4))
            if name == "vit":
                scores = explanation_scores(model, X_test, y_test)
                extra = table.setdefault("vit extras", {})
                for key, r in mean_correlations(scores).items():
                    table["explanations"].setdefault(key, []).append(round(r, 4))
                for key, r in inked_correlations(scores).items():
                    extra.setdefault(f"inked patches only: {key}", []).append(round(r, 4))
                for alpha, r in rollout_correlations(model, X_test, y_test).items():
                    extra.setdefault(f"rollout, residual weight {alpha}", []).append(round(r, 4))
                pos = F.normalize(model.pos_embedding[0, 1:].detach(), dim=-1)  # (N, d)
                near, far = neighbour_similarity(pos @ pos.T)
                extra.setdefault("position similarity, neighbours", []).append(round(near, 4))
                extra.setdefault("position similarity, further apart", []).append(round(far, 4))
                extra.setdefault("position similarity, corners", []).append(
                    round(corner_similarity(pos @ pos.T), 4))
                with torch.no_grad():
                    model(X_test)
                share = top_patch_share(model.attention_weights)  # (L, h)
                extra.setdefault("top-patch share per head", []).append(
                    [[round(x, 4) for x in row] for row in share.tolist()])
        table["models"][name] = row
        print(f"{name:36s} {row['params']:6d} params  acc {row['accuracy']}  "
              f"cpu {row['cpu_seconds']}", flush=True)
    print("correlations with occlusion:", table["explanations"])
    print("vit extras:", table["vit extras"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print("wrote", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
