"""Chapter 12, training that does not blow up: a learning-rate sweep with and without warm-up
and gradient clipping, over seeds.

    python -m experiments run ch12_lr_sweep                   # seeds 0-4, ~2 CPU-minutes
    python -m experiments run ch12_lr_sweep --seeds 5 6 7 8 9 # fresh seeds
    python -m experiments run ch12_lr_sweep --where recipe=neither   # one recipe
    python -m experiments table ch12_lr_sweep --out book/data/ch12_lr_sweep.json

A small GPT (2 layers, d = 64, 2 heads, context 64) is trained on tiny Shakespeare for 80
steps of 16 windows with AdamW and a cosine decay, at each peak learning rate of ``LRS`` and
with each recipe of ``RECIPES``: both safeguards (a linear warm-up over 10 steps and gradients
clipped to norm 1), neither (the learning rate starts at its peak; no clipping), or one of the
two. For every run the table records the training
loss of each step (bits per character; a non-finite loss ends the run), and three summaries:

* ``final``: the mean loss of the last 20 steps;
* ``spike``: the largest rise of the loss above its lowest value so far (bits);
* ``failed``: the loss became non-finite, or the final loss is no better than the unigram
  model's (the entropy of the training text's character frequencies, 4.8 bits): the model
  learned nothing beyond how common each character is.

``table`` writes ``book/data/ch12_lr_sweep.json``: every run, by seed, learning rate and recipe.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from d2lattn.gpt import GPT, GPTConfig, train_lm  # noqa: E402
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).resolve().parent.parent / "book" / "data" / "ch12_lr_sweep.json"
CONFIG = dict(block_size=64, num_hiddens=64, num_heads=2, num_layers=2, ffn_num_hiddens=256)
STEPS, BATCH, WARMUP = 80, 16, 10
LRS = [1e-2, 1e-1, 3e-1]
RECIPES = {"warm-up and clipping": dict(warmup=WARMUP, clip=1.0),
           "neither": dict(warmup=0, clip=None),
           "warm-up only": dict(warmup=WARMUP, clip=None),
           "clipping only": dict(warmup=0, clip=1.0)}


def unigram_bits(train: torch.Tensor, V: int) -> float:
    """The entropy of the character frequencies of the training text, in bits."""
    p = torch.bincount(train, minlength=V).double() / train.numel()
    p = p[p > 0]
    return float(-(p * p.log2()).sum())


def summarize(bits: list[float], unigram: float, steps: int = STEPS) -> dict:
    finite = all(math.isfinite(b) for b in bits) and len(bits) == steps
    last = bits[-20:]
    final = sum(last) / len(last) if finite else None
    low, spike = float("inf"), 0.0
    for b in bits:
        if math.isfinite(b):
            spike, low = max(spike, b - low), min(low, b)
    return {"final": None if final is None else round(final, 4), "spike": round(spike, 4),
            "failed": not finite or final >= unigram}


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ()
INDENT = None


def grid(seeds=None, smoke=False) -> list[dict]:
    """Each seed, peak learning rate and recipe (``smoke``: 3 steps, two recipes)."""
    if smoke:
        return [{"seed": 0, "lr": LRS[0], "recipe": r, "steps": 3} for r in list(RECIPES)[:2]]
    return [{"seed": seed, "lr": lr, "recipe": recipe, "steps": STEPS}
            for seed in (seeds or [0, 1, 2, 3, 4]) for lr in LRS for recipe in RECIPES]


def cpu_seconds(config: dict) -> float:
    return 0.022 * config["steps"]  # about 2 CPU-minutes for the 60 runs of 5 seeds


def data():
    split = load_split("shakespeare")
    tok = CharTokenizer(split.text)
    return tok, tok.encode(split.train)


def run(config: dict) -> dict:
    """One training run; its loss curve and summaries."""
    tok, train = data()
    kw = RECIPES[config["recipe"]]
    seed, steps = config["seed"], config["steps"]
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=len(tok), **CONFIG))
    nats = train_lm(model, train, steps=steps, batch_size=BATCH, lr=config["lr"], seed=seed,
                    **kw)
    bits = [x / math.log(2) for x in nats]
    return {"seed": seed, "lr": config["lr"], "recipe": config["recipe"],
            **summarize(bits, unigram_bits(train, len(tok)), steps),
            "loss_bits": [round(b, 3) if math.isfinite(b) else None for b in bits]}


def table(records: list[dict]) -> dict:
    """The chapter's table: every run, sorted by seed, learning rate and recipe."""
    from experiments import runner
    fields, records = runner.header(records)
    tok, train = data()
    runs = [r["row"] for r in records]
    runs.sort(key=lambda r: (r["seed"], LRS.index(r["lr"]), list(RECIPES).index(r["recipe"])))
    return {"runs": runs, "config": CONFIG, "steps": STEPS, "batch_size": BATCH,
            "warmup": WARMUP, "lrs": LRS,
            "recipes": [r for r in RECIPES if any(run["recipe"] == r for run in runs)],
            "uniform_bits": round(math.log2(len(tok)), 4),
            "torch": runner.torch_version(records),
            "cpu_seconds_last_invocation": fields.get(
                "cpu_seconds_last_invocation",
                round(sum(r.get("cpu_seconds", 0) for r in records), 1)),
            "unigram_bits": round(unigram_bits(train, len(tok)), 4)}


if __name__ == "__main__":  # the same as: python -m experiments run ch12_lr_sweep ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch12_lr_sweep")
