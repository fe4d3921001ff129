"""Chapter 12's Shakespeare GPT with other attention layers, at the same size, budget and split.

    python -m experiments run gpt_variants --seeds 0 1 2 3 4    # every variant, 3-7 CPU-min a run
    python -m experiments run gpt_variants --where variant=mla --seeds 5
    python -m experiments table gpt_variants --out book/data/gpt_variants.json

Every run uses chapter 12's Shakespeare recipe (``experiments/ch12_gpt.py``: 4 layers, d = 128,
4 heads, a 128-character window, 600 AdamW steps of 16 windows, warm-up 50) and the same
seeded batches; only the attention layer, and with it the positions, changes:

``softmax``          chapter 12's model: softmax attention with rotary positions;
``softmax-learned``  softmax attention with a learned position table, the fair baseline for
                     the recurrent cores, which cannot rotate their keys (chapter 14);
``linear``           causal linear attention with elu + 1 features (Katharopoulos et al. 2020)
                     in every layer, learned positions;
``delta``            the delta rule (Schlag et al. 2021) without the gate in every layer,
                     learned positions: what the gate adds (chapter 14);
``gated_delta``      the gated delta rule (Yang et al. 2025) in every layer, learned positions;
``hybrid``           the gated delta rule in layers 1-3 and softmax attention in layer 4,
                     learned positions: one softmax layer in four, the ratio of Qwen3-Next;
``mla``              multi-head latent attention (DeepSeek-V2; chapter 15) with rotary keys,
                     d_c = 4 d_h = 128 and d^R = d_h / 2 = 16: it caches 144 numbers per token
                     and layer where multi-head attention caches 256.

``table`` writes one record per run (variant, seed, held-out bits per character over the
whole held-out split and by position in the window, the training loss of every step, parameters, cache numbers
per token and layer, CPU seconds) to
``book/data/gpt_variants.json``, in the order the runs finished. The table's ``torch`` is the
version of its first run; the results file names each run's. Chapters 14 and 15
read the table.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2lattn.gpt import GPT, GPTConfig, held_out_losses, train_lm  # noqa: E402
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

OUT = ROOT / "book" / "data" / "gpt_variants.json"
# chapter 12's Shakespeare recipe (experiments/ch12_gpt.py)
CONFIG = dict(block_size=128, num_hiddens=128, num_heads=4, num_layers=4, ffn_num_hiddens=512)
STEPS, BATCH, LR, WARMUP = 600, 16, 2e-3, 50
VARIANTS = ["softmax", "softmax-learned", "linear", "delta", "gated_delta", "hybrid", "mla"]


# each variant's attention, one name for every layer or one per layer (GPTConfig.attention)
ATTENTION = {"softmax": "softmax", "softmax-learned": "softmax", "linear": "linear",
             "delta": "delta", "gated_delta": "gated_delta",
             "hybrid": ("gated_delta",) * (CONFIG["num_layers"] - 1) + ("softmax",),
             "mla": "mla"}


def build(variant: str, vocab_size: int, seed: int) -> GPT:
    """The model of one variant, seeded: GPT builds each layer's attention and initialises
    every weight as chapter 12's model (MLA: d_c = 4 d_h, d^R = d_h / 2)."""
    d_h = CONFIG["num_hiddens"] // CONFIG["num_heads"]
    mla = dict(latent_size=4 * d_h, rope_head_size=d_h // 2) if variant == "mla" else {}
    config = GPTConfig(vocab_size=vocab_size,
                       positions="rotary" if variant in ("softmax", "mla") else "learned",
                       attention=ATTENTION[variant], **mla, **CONFIG)
    torch.manual_seed(seed)
    return GPT(config)


def cache_per_token(variant: str) -> str:
    d, h, L = CONFIG["num_hiddens"], CONFIG["num_heads"], CONFIG["num_layers"]
    d_h = d // h
    kv = 2 * d  # keys and values of every head
    state = h * d_h * (d_h + 1)  # a fixed state per layer (with the normaliser)
    return {"softmax": f"{kv} per token and layer",
            "softmax-learned": f"{kv} per token and layer",
            "linear": f"fixed {state} per layer",
            "delta": f"fixed {state} per layer",
            "gated_delta": f"fixed {state} per layer",
            "hybrid": f"{kv} per token in 1 of {L} layers, fixed {state} in the others",
            "mla": f"{4 * d_h + d_h // 2} per token and layer"}[variant]


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ("cpu_seconds",)
TABLE = OUT


def grid(seeds=None, smoke=False) -> list[dict]:
    """Seed by seed, every variant (``smoke``: two variants, 2 steps, 4 held-out windows)."""
    if smoke:
        return [{"variant": v, "seed": 0, "steps": 2, "max_windows": 4}
                for v in ("softmax", "gated_delta")]
    return [{"variant": v, "seed": seed} for seed in (seeds or [0, 1, 2, 3, 4])
            for v in VARIANTS]


def cpu_seconds(config: dict) -> float:
    # CPU seconds of the committed runs, by variant
    seconds = {"softmax": 155, "softmax-learned": 187, "linear": 327, "delta": 407,
               "gated_delta": 421, "hybrid": 402, "mla": 392}[config["variant"]]
    return seconds * config.get("steps", STEPS) / STEPS


def run(config: dict) -> dict:
    """Train one variant on one seed; held-out bits, the loss curve, the cache it needs."""
    variant, seed = config["variant"], config["seed"]
    split = load_split("shakespeare")
    tok = CharTokenizer(split.text)
    train, held_out = tok.encode(split.train), tok.encode(split.held_out)
    model = build(variant, len(tok), seed)
    start = time.process_time()
    losses = train_lm(model, train, steps=config.get("steps", STEPS), batch_size=BATCH, lr=LR,
                      warmup=WARMUP, seed=seed)
    cpu = time.process_time() - start
    bits = held_out_losses(model, held_out, max_windows=config.get("max_windows"))  # (W, T)
    return {"variant": variant, "seed": seed, "parameters": model.num_parameters(),
            "held_out_bits": round(bits.mean().item(), 4),
            "held_out_bits_by_position": [round(x, 4) for x in bits.mean(0).tolist()],
            "train_loss": [round(x, 4) for x in losses],  # nats, one per step
            "cache": cache_per_token(variant), "cpu_seconds": round(cpu, 1)}


def table(records: list[dict]) -> dict:
    """The chapters' table: the recipe and every run, in the order the runs finished."""
    from experiments import runner
    return {"recipe": dict(corpus="shakespeare", config=CONFIG, steps=STEPS, batch_size=BATCH,
                           lr=LR, warmup=WARMUP),
            "torch": runner.torch_version(records[:1]), "runs": [r["row"] for r in records]}


if __name__ == "__main__":  # the same as: python -m experiments run gpt_variants ...
    from experiments.runner import script
    script("gpt_variants")
