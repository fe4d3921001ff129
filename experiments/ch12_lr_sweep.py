"""Chapter 12, training that does not blow up: a learning-rate sweep with and without warm-up
and gradient clipping, over seeds.

    python experiments/ch12_lr_sweep.py                       # seeds 0-4, ~2 CPU-minutes
    python experiments/ch12_lr_sweep.py --seeds 5 6 7 8 9     # fresh seeds, added to the table

A small GPT (2 layers, d = 64, 2 heads, context 64) is trained on tiny Shakespeare for 80
steps of 16 windows with AdamW and a cosine decay, at each peak learning rate of ``LRS`` and
with each recipe of ``RECIPES``: both safeguards (a linear warm-up over 10 steps and gradients
clipped to norm 1), neither (the learning rate starts at its peak; no clipping), or one of the
two (``--recipes`` runs a subset). For every run the table records the training
loss of each step (bits per character; a non-finite loss ends the run), and three summaries:

* ``final``: the mean loss of the last 20 steps;
* ``spike``: the largest rise of the loss above its lowest value so far (bits);
* ``failed``: the loss became non-finite, or the final loss is no better than the unigram
  model's (the entropy of the training text's character frequencies, 4.8 bits): the model
  learned nothing beyond how common each character is.

Writes ``book/data/ch12_lr_sweep.json``; rows of the seeds and recipes run are replaced, others
kept.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from d2lattn.gpt import GPT, GPTConfig, train_lm  # noqa: E402
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

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


def summarize(bits: list[float], unigram: float) -> dict:
    finite = all(math.isfinite(b) for b in bits) and len(bits) == STEPS
    final = sum(bits[-20:]) / 20 if finite else None
    low, spike = float("inf"), 0.0
    for b in bits:
        if math.isfinite(b):
            spike, low = max(spike, b - low), min(low, b)
    return {"final": None if final is None else round(final, 4), "spike": round(spike, 4),
            "failed": not finite or final >= unigram}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", type=Path, default=TABLE, help="default: the chapter's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    split = load_split("shakespeare")
    tok = CharTokenizer(split.text)
    train = tok.encode(split.train)
    uniform = math.log2(len(tok))
    unigram = unigram_bits(train, len(tok))
    table = json.loads(args.table.read_text()) if args.table.exists() else {"runs": []}
    runs = [r for r in table["runs"]
            if r["seed"] not in args.seeds or r["recipe"] not in args.recipes]
    start = time.process_time()
    for seed in args.seeds:
        for lr in LRS:
            for recipe in args.recipes:
                kw = RECIPES[recipe]
                torch.manual_seed(seed)
                model = GPT(GPTConfig(vocab_size=len(tok), **CONFIG))
                nats = train_lm(model, train, steps=STEPS, batch_size=BATCH, lr=lr, seed=seed, **kw)
                bits = [x / math.log(2) for x in nats]
                row = {"seed": seed, "lr": lr, "recipe": recipe,
                       **summarize(bits, unigram),
                       "loss_bits": [round(b, 3) if math.isfinite(b) else None for b in bits]}
                runs.append(row)
                print(f"seed {seed} lr {lr:g} {recipe:22s}: final {row['final']}, spike "
                      f"{row['spike']:.2f}, failed {row['failed']}", flush=True)
    runs.sort(key=lambda r: (r["seed"], LRS.index(r["lr"]), list(RECIPES).index(r["recipe"])))
    table.update(config=CONFIG, steps=STEPS, batch_size=BATCH, warmup=WARMUP, lrs=LRS,
                 recipes=[r for r in RECIPES if any(run["recipe"] == r for run in runs)], uniform_bits=round(uniform, 4),
                 unigram_bits=round(unigram, 4), torch=torch.__version__,
                 runs=runs)
    table["cpu_seconds_last_invocation"] = round(time.process_time() - start, 1)
    args.table.write_text(json.dumps(table) + "\n")


if __name__ == "__main__":
    main()
