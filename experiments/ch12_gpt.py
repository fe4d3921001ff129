"""Chapter 12's models: a small GPT trained on tiny Shakespeare and on Tang poems.

    python experiments/ch12_gpt.py                    # both corpora, seed 0, CPU, ~8 CPU-minutes
    python experiments/ch12_gpt.py --corpus tang --steps 4000 --device cuda   # bigger, on a GPU

writes, per corpus, ``book/data/ch12_gpt_<corpus>.pt`` (the weights in float16, with their
config) and ``book/data/ch12_gpt_<corpus>.json`` (the recipe, the training loss of every step,
the held-out loss at a few steps, the held-out bits per character over the whole held-out split
and by position in the context window, the CPU time). The chapter loads both, retrains the
first steps live and checks them against the curve stored here.

The default budget is about four CPU-minutes per corpus on one thread (the ``STEPS`` below);
``--steps`` and ``--batch-size`` scale it, ``--device cuda`` runs it on a GPU (the windows are
drawn on the CPU from the same seed, so the batches are the same). ``--seeds 0 1 2`` trains one
model per seed (files of seeds other than 0 get the suffix ``_seed<k>`` and are not committed;
every run, seed 0 too, also adds its row to ``book/data/ch12_gpt_seeds.json``, the table of
held-out bits per seed that the chapter compares with the n-gram models).
"""

from __future__ import annotations

import argparse
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


def run(corpus: str, seed: int, device: str, steps: int, batch_size: int) -> dict:
    recipe = RECIPES[corpus]
    tok, train, held_out, model = build(corpus, seed)
    model.to(device)
    evals = []

    def record(step, model, loss):
        if step % EVAL_EVERY == 0 or step == steps:
            bits = held_out_losses(model, held_out, max_windows=EVAL_WINDOWS).mean().item()
            evals.append([step, round(bits, 4)])
            print(f"{corpus} seed {seed} step {step}: train loss {loss:.3f} nats, "
                  f"held-out {bits:.3f} bits/char", flush=True)

    start = time.process_time()
    losses = train_lm(model, train, steps=steps, batch_size=batch_size, lr=recipe["lr"],
                      warmup=recipe["warmup"], seed=seed, callback=record)
    cpu_train = time.process_time() - start
    bits = held_out_losses(model, held_out)  # (W, T) bits
    suffix = "" if seed == 0 else f"_seed{seed}"
    half = {}  # float16 copies; the tied embedding and read-out share one (saved once)
    state = {k: half.setdefault(v.data_ptr(), v.to("cpu", torch.float16))
             for k, v in model.state_dict().items()}
    torch.save({"config": vars(model.config), "state_dict": state},
               OUT / f"ch12_gpt_{corpus}{suffix}.pt")
    # the float16 weights are what the chapter loads: report their held-out loss too
    model16 = GPT(model.config)
    model16.load_state_dict({k: v.float() for k, v in state.items()})
    model16.to(device)
    bits16 = held_out_losses(model16, held_out)
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
    (OUT / f"ch12_gpt_{corpus}{suffix}.json").write_text(json.dumps(result) + "\n")
    record_seed(result)
    print(f"{corpus} seed {seed}: {result['held_out_bits']:.3f} bits/char held out "
          f"({result['held_out_bits_float16']:.3f} with float16 weights), "
          f"{cpu_train / 60:.1f} CPU-minutes", flush=True)
    return result


def record_seed(result: dict) -> None:
    """Adds (or replaces) the run's row in the table of seeds, ``ch12_gpt_seeds.json``."""
    keys = ("corpus", "seed", "device", "steps", "batch_size", "parameters",
            "cpu_seconds_training", "held_out_bits", "held_out_bits_float16", "torch")
    table = json.loads(SEEDS.read_text()) if SEEDS.exists() else {"rows": []}
    row = {k: result[k] for k in keys}
    table["rows"] = [r for r in table["rows"]
                     if (r["corpus"], r["seed"]) != (row["corpus"], row["seed"])] + [row]
    table["rows"].sort(key=lambda r: (r["corpus"], r["seed"]))
    SEEDS.write_text(json.dumps(table, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", choices=["shakespeare", "tang", "both"], default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    corpora = ["shakespeare", "tang"] if args.corpus == "both" else [args.corpus]
    for corpus in corpora:
        for seed in args.seeds:
            run(corpus, seed, args.device, args.steps or RECIPES[corpus]["steps"],
                args.batch_size or RECIPES[corpus]["batch_size"])


if __name__ == "__main__":
    main()
