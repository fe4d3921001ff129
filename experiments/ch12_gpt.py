"""Chapter 12's models: a small GPT trained on tiny Shakespeare and on Tang poems.

    python -m experiments run ch12_gpt                   # both corpora, seed 0, CPU, ~8 CPU-minutes
    python -m experiments run ch12_gpt --where corpus=tang --seeds 1 2 --device cuda
    python -m experiments table ch12_gpt --out book/data/ch12_gpt_seeds.json

writes, per corpus, ``book/data/ch12_gpt_<corpus>.pt`` (the weights in float16, with their
config) and ``book/data/ch12_gpt_<corpus>.json`` (the recipe, the training loss of every step,
the held-out loss at a few steps, the held-out bits per character over the whole held-out split
and by position in the context window, the CPU time). The chapter loads both, retrains the
first steps live and checks them against the curve stored here.

The budget is about four CPU-minutes per corpus on one thread (the recipes' ``steps``; a
config may give ``steps`` and ``batch_size``); ``--device cuda`` runs it on a GPU (the windows
are drawn on the CPU from the same seed, so the batches are the same). ``--seeds 0 1 2`` trains
one model per seed (files of seeds other than 0 get the suffix ``_seed<k>`` and are not
committed; on a cluster they stay on the machine that trained them). ``table`` writes
``book/data/ch12_gpt_seeds.json``, the table of held-out bits per seed that the chapter
compares with the n-gram models.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from d2lattn.gpt import GPT, GPTConfig, held_out_losses, train_lm  # noqa: E402
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "book" / "data"
SEEDS = OUT / "ch12_gpt_seeds.json"  # one row per corpus and seed: the comparisons over seeds

# The chapter's recipes (keep in sync with the notebook's RECIPES cell)
RECIPES = {
    "shakespeare": dict(config=dict(block_size=128, num_hiddens=128, num_heads=4, num_layers=4,
                                    ffn_num_hiddens=512),
                        steps=600, batch_size=16, lr=2e-3, warmup=50),
    "tang": dict(config=dict(block_size=64, num_hiddens=128, num_heads=4, num_layers=4,
                             ffn_num_hiddens=512),
                 steps=600, batch_size=16, lr=2e-3, warmup=50),
}
EVAL_EVERY = 100  # held-out loss on the first EVAL_WINDOWS windows, every EVAL_EVERY steps
EVAL_WINDOWS = 32


def build(corpus: str, seed: int):
    """The tokenizer, the token streams and a freshly initialised model (seeded)."""
    split = load_split(corpus)
    tok = CharTokenizer(split.text)
    config = GPTConfig(vocab_size=len(tok), **RECIPES[corpus]["config"])
    torch.manual_seed(seed)
    return tok, tok.encode(split.train), tok.encode(split.held_out), GPT(config)


def train(corpus: str, seed: int, device: str, steps: int, batch_size: int,
          max_windows: int | None = None) -> dict:
    """Train one model; write its checkpoint and record (unless ``max_windows`` limits the
    held-out evaluation: a smoke run writes nothing)."""
    recipe = RECIPES[corpus]
    tok, train, held_out, model = build(corpus, seed)
    model.to(device)
    evals = []

    def record(step, model, loss):
        if step % EVAL_EVERY == 0 or step == steps:
            bits = held_out_losses(model, held_out, max_windows=EVAL_WINDOWS).mean().item()
            evals.append([step, round(bits, 4)])

    start = time.process_time()
    losses = train_lm(model, train, steps=steps, batch_size=batch_size, lr=recipe["lr"],
                      warmup=recipe["warmup"], seed=seed, callback=record)
    cpu_train = time.process_time() - start
    bits = held_out_losses(model, held_out, max_windows=max_windows)  # (W, T) bits
    suffix = "" if seed == 0 else f"_seed{seed}"
    half = {}  # float16 copies; the tied embedding and read-out share one (saved once)
    state = {k: half.setdefault(v.data_ptr(), v.to("cpu", torch.float16))
             for k, v in model.state_dict().items()}
    if max_windows is None:
        torch.save({"config": vars(model.config), "state_dict": state},
                   OUT / f"ch12_gpt_{corpus}{suffix}.pt")
    # the float16 weights are what the chapter loads: report their held-out loss too
    model16 = GPT(model.config)
    model16.load_state_dict({k: v.float() for k, v in state.items()})
    model16.to(device)
    bits16 = held_out_losses(model16, held_out, max_windows=max_windows)
    result = {
        "corpus": corpus, "seed": seed, "device": device, "config": vars(model.config),
        "parameters": model.num_parameters(), "steps": steps, "batch_size": batch_size,
        "lr": recipe["lr"], "warmup": recipe["warmup"], "tokens_seen": steps * batch_size
        * model.config.block_size, "cpu_seconds_training": round(cpu_train, 1),
        "train_loss": [round(x, 4) for x in losses], "held_out_evals": evals,
        "held_out_bits": round(bits.mean().item(), 4),
        "held_out_bits_float16": round(bits16.mean().item(), 4),
        "held_out_bits_by_position": [round(x, 4) for x in bits16.mean(0).tolist()],
        "held_out_predictions": bits.numel(),
        "torch": torch.__version__,
    }
    if max_windows is None:
        (OUT / f"ch12_gpt_{corpus}{suffix}.json").write_text(json.dumps(result) + "\n")
    return result


KEYS = ("corpus", "seed", "device", "steps", "batch_size", "parameters",
        "cpu_seconds_training", "held_out_bits", "held_out_bits_float16", "torch")
VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ("cpu_seconds_training",)
TABLE = SEEDS


def grid(seeds=None, smoke=False) -> list[dict]:
    """Both corpora, each seed (``smoke``: 2 steps of 2 windows, 4 held-out windows)."""
    if smoke:
        return [{"corpus": c, "seed": 0, "steps": 2, "batch_size": 2, "max_windows": 4}
                for c in RECIPES]
    return [{"corpus": c, "seed": seed} for c in RECIPES for seed in (seeds or [0])]


def cpu_seconds(config: dict) -> float:
    seconds = {"shakespeare": 250, "tang": 130}[config["corpus"]]  # the committed seed 0's
    return seconds * config.get("steps", 600) / 600


def run(config: dict) -> dict:
    """One model of one corpus and seed: its record (``book/data/ch12_gpt_<corpus>.json``;
    seeds other than 0 with the suffix ``_seed<k>``), its checkpoint written beside it."""
    from experiments.runner import device
    corpus = config["corpus"]
    return train(corpus, config["seed"], device(),
                 config.get("steps", RECIPES[corpus]["steps"]),
                 config.get("batch_size", RECIPES[corpus]["batch_size"]),
                 config.get("max_windows"))


def table(records: list[dict]) -> dict:
    """The table of seeds: one row per corpus and seed, the record's main figures."""
    rows = [{k: r["row"][k] for k in KEYS} for r in records]
    return {"rows": sorted(rows, key=lambda r: (r["corpus"], r["seed"]))}


if __name__ == "__main__":  # the same as: python -m experiments run ch12_gpt ...
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch12_gpt")
