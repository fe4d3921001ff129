"""Chapter 11's multi-seed sweep: induction heads in attention-only Transformers.

Reproduces the table that ``book/ch11_induction_heads.ipynb`` reads:

    python -m experiments run ch11_induction_sweep          # about 2 CPU minutes per seed
    python -m experiments run ch11_induction_sweep --seeds 15 16   # fresh seeds
    python -m experiments table ch11_induction_sweep --out book/data/ch11_induction_sweep.json

``table`` writes ``book/data/ch11_induction_sweep.json``. For each seed (by default 0..9: 0..4, the
seeds the chapter was written from, and 5..9, fresh seeds run after it; ``--seeds`` runs
others) it trains

- the two-layer, two-head, attention-only model of the chapter (600 Adam steps) and records
  its held-out accuracy, the head scores every 10 steps, the phase-change step, single-head
  and whole-layer ablations (zero and mean) and the generalisation tests;
  It also reads the circuit off the weights: for each layer-2 head, the share of training
  tokens that its OV circuit W_U W_O W_V W_E ranks first among the logits when the head attends
  to them (copying), and the share of query tokens whose K-composition QK circuit (through the
  layer-1 heads' OV) ranks the key written with the same token first; and where the layer-2
  heads' queries put their weight in the second and third repetitions (p - 1 and 2p - 1 back).
- a one-layer model with the same budget (same width, heads and steps), with its loss curve;
- a bigger one-layer model with 4x the steps (d = 128, 4 heads, 2400 steps).

The tests include sequences that start with 8 non-recurring "distractor" tokens, on which the
shortcut "predict the least recently seen token" fails while induction still works.

Each run (a model and a seed) is independent of the others.
Every run uses ``torch.set_num_threads(1)``; results depend on the seed and, in their last
bits, on the CPU, which is why the chapter compares its live run with a tolerance.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from d2lattn.circuits import (AttentionOnlyTransformer, head_means,  # noqa: E402
                              induction_accuracy, k_composition_circuit, ov_circuit,
                              prefix_matching_score, previous_token_score, repeated_sequences,
                              train_induction)

# The setting of the chapter (keep in sync with the notebook's CONFIG cell)
VOCAB_SIZE = 32  # token ids 0..31
TRAIN_VOCAB = list(range(24))  # training never shows tokens 24..31
HELD_OUT_VOCAB = list(range(24, 32))
SEQ_LEN, PERIODS = 32, (6, 16)
STEPS, LR, BATCH = 600, 1e-3, 64
EVAL_EVERY = 10
TEST_SEED = 1000  # the held-out batch
SEEDS = list(range(10))  # the committed table; add fresh seeds with --seeds


def test_sets() -> Dict[str, torch.Tensor]:
    """The evaluation batches, each (512, T): in distribution and the generalisation tests."""
    def batch(seq_len, vocab, periods, distractors=0):
        g = torch.Generator().manual_seed(TEST_SEED)
        return repeated_sequences(512, seq_len, vocab, periods, distractors=distractors,
                                  generator=g)[0]

    return {
        "train setting": batch(SEQ_LEN, TRAIN_VOCAB, PERIODS),
        "periods 2-5": batch(SEQ_LEN, TRAIN_VOCAB, (2, 5)),
        "periods 17-24": batch(SEQ_LEN, TRAIN_VOCAB, (17, 24)),
        "unseen tokens 24-31": batch(SEQ_LEN, HELD_OUT_VOCAB, (4, 8)),
        "length 64": batch(64, TRAIN_VOCAB, PERIODS),
        "8 distractors first": batch(SEQ_LEN, TRAIN_VOCAB, (6, 12), distractors=8),
    }


@torch.no_grad()
def accuracy_split(model, tokens: torch.Tensor, split: int) -> List[float]:
    """Accuracy on the determined positions before and from position ``split``."""
    from d2lattn.circuits import determined_positions

    right = model(tokens)[:, :-1].argmax(-1) == tokens[:, 1:]  # (B, T - 1)
    mask = determined_positions(tokens)[:, :-1]
    early, late = mask.clone(), mask.clone()
    early[:, split:] = False
    late[:, :split] = False
    return [right[early].float().mean().item(), right[late].float().mean().item()]


@torch.no_grad()
def lookback_weights(weights: torch.Tensor, period: torch.Tensor) -> Dict[str, List[float]]:
    """Per head, the mean weight that queries of the 2nd and 3rd repetitions put p - 1 and
    2p - 1 places back (on the key after the latest, and after the first, earlier copy).

    weights: (B, h, T, T) of one layer; period: (B,). Returns lists of h floats. (The same
    function as the chapter's.)"""
    B, h, T, _ = weights.shape
    t, p = torch.arange(T), period[:, None]  # (T,), (B, 1)
    out = {}
    for name, rows, back in [("2nd repetition, p - 1 back", (t >= p) & (t < 2 * p), p - 1),
                             ("3rd repetition, p - 1 back", t >= 2 * p, p - 1),
                             ("3rd repetition, 2p - 1 back", t >= 2 * p, 2 * p - 1)]:
        key = (t - back).clamp(min=0)  # (B, T)
        w = weights.gather(-1, key[:, None, :, None].expand(B, h, T, 1))[..., 0]  # (B, h, T)
        out[name] = w.transpose(0, 1)[:, rows].mean(dim=-1).tolist()  # (h,)
    return out


def diagonal_first(M: torch.Tensor, dim: int) -> float:
    """Share of the training tokens j whose own entry is the largest along ``dim`` of M[:, j]
    (dim 0: the column of logits, copying) or M[j, :] (dim 1: the row of keys)."""
    tokens = torch.tensor(TRAIN_VOCAB)
    if dim == 0:
        top = M[:, tokens].argmax(dim=0)  # (n,) among all V logits
    else:
        top = tokens[M[tokens][:, tokens].argmax(dim=1)]  # (n,) among the training tokens
    return (top == tokens).float().mean().item()


def circuit_scores(model) -> dict:
    """Copying (OV) and K-composition (QK) scores of the layer-2 heads, read off the weights."""
    h = model.blocks[1].num_heads
    return {"ov copying, layer 2": [diagonal_first(ov_circuit(model, 1, k), 0) for k in range(h)],
            "ov copying, layer 1": [diagonal_first(ov_circuit(model, 0, k), 0) for k in range(h)],
            "k-composition, layer 2 via both layer-1 heads":
                [diagonal_first(k_composition_circuit(model, k), 1) for k in range(h)],
            "k-composition, layer 2 via layer-1 head m": [
                [diagonal_first(k_composition_circuit(model, k, source_heads=[m]), 1)
                 for m in range(model.blocks[0].num_heads)] for k in range(h)]}


def train_two_layer(seed: int, steps: int = STEPS) -> dict:
    """The chapter's model for one seed; the chapter repeats this for seed 0."""
    tests = test_sets()
    held_out = tests["train setting"]
    torch.manual_seed(seed)
    model = AttentionOnlyTransformer(VOCAB_SIZE, num_hiddens=64, num_heads=2, num_layers=2)
    history = {"step": [], "accuracy": [], "previous_token": [], "prefix_matching": []}

    @torch.no_grad()
    def record(step, model, loss=None):
        if step % EVAL_EVERY:
            return
        model.eval()
        history["step"].append(step)
        history["accuracy"].append(induction_accuracy(model, held_out))
        weights = [block.attention_weights for block in model.blocks]  # (B, h, T, T) each
        history["previous_token"].append([previous_token_score(w).tolist() for w in weights])
        history["prefix_matching"].append(
            [prefix_matching_score(w, held_out).tolist() for w in weights])
        model.train()

    record(0, model)  # the untrained model
    losses = train_induction(model, steps=steps, vocab=TRAIN_VOCAB, seq_len=SEQ_LEN,
                             periods=PERIODS, batch_size=BATCH, lr=LR, seed=seed,
                             callback=record)
    phase = next((s for s, a in zip(history["step"], history["accuracy"]) if a >= 0.5), None)
    means = head_means(model, held_out)  # (L, h, T, d)
    base = induction_accuracy(model, held_out)
    L, h = len(model.blocks), model.blocks[0].num_heads
    ablation = {}
    for kind in ("zero", "mean"):
        def value(l, k):
            return 0.0 if kind == "zero" else means[l, k]

        ablation[kind] = {
            "heads": [[induction_accuracy(model, held_out, ablate={(l, k): value(l, k)})
                       for k in range(h)] for l in range(L)],
            "layers": [induction_accuracy(model, held_out,
                                          ablate={(l, k): value(l, k) for k in range(h)})
                       for l in range(L)],
        }
    generalisation = {name: induction_accuracy(model, tokens) for name, tokens in tests.items()}
    period = repeated_sequences(512, SEQ_LEN, TRAIN_VOCAB, PERIODS,
                                generator=torch.Generator().manual_seed(TEST_SEED))[1]  # (B,)
    induction_accuracy(model, held_out)  # fills attention_weights
    lookback = lookback_weights(model.blocks[1].attention_weights, period)
    circuits = circuit_scores(model)
    torch.manual_seed(seed)  # the same initialisation, untrained: the chance level of the scores
    circuits_at_init = circuit_scores(
        AttentionOnlyTransformer(VOCAB_SIZE, num_hiddens=64, num_heads=2, num_layers=2))
    generalisation["length 64, positions < 32"], generalisation["length 64, positions >= 32"] = \
        accuracy_split(model, tests["length 64"], 32)
    return {"seed": seed, "losses": losses, "history": history,
            "phase_step": phase, "accuracy": base, "ablation": ablation,
            "generalisation": generalisation, "lookback_layer_2": lookback,
            "circuits": circuits, "circuits_at_init": circuits_at_init}


def train_one_layer(seed: int, num_hiddens: int, num_heads: int, steps: int,
                    curve: bool) -> dict:
    tests = test_sets()
    torch.manual_seed(seed)
    model = AttentionOnlyTransformer(VOCAB_SIZE, num_hiddens=num_hiddens, num_heads=num_heads,
                                     num_layers=1)
    losses = train_induction(model, steps=steps, vocab=TRAIN_VOCAB, seq_len=SEQ_LEN,
                             periods=PERIODS, batch_size=BATCH, lr=LR, seed=seed)
    held_out = tests["train setting"]
    accuracy = induction_accuracy(model, held_out)  # fills attention_weights
    weights = model.blocks[0].attention_weights  # (B, h, T, T)
    return {"seed": seed, "num_hiddens": num_hiddens, "num_heads": num_heads, "steps": steps,
            "accuracy": accuracy, "final_loss": sum(losses[-50:]) / 50,
            **({"losses": losses} if curve else {}),
            "previous_token": previous_token_score(weights).tolist(),
            "prefix_matching": prefix_matching_score(weights, held_out).tolist(),
            "generalisation": {name: induction_accuracy(model, tokens)
                               for name, tokens in tests.items()}}


def _rounded(obj):
    """Floats to 4 decimals (the table is compared with a tolerance, not bit for bit)."""
    if isinstance(obj, float):
        return round(obj, 4)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


MODELS = {"two_layer": lambda seed, steps: train_two_layer(seed, steps),
          "one_layer": lambda seed, steps: train_one_layer(seed, 64, 2, steps, True),
          "one_layer_big": lambda seed, steps: train_one_layer(seed, 128, 4, 4 * steps, False)}
VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ()
TABLE = Path(__file__).resolve().parents[1] / "book" / "data" / "ch11_induction_sweep.json"
INDENT = None


def grid(seeds=None, smoke=False) -> list[dict]:
    """Each seed's three models (``smoke``: seed 0, 10 steps)."""
    if smoke:
        return [{"model": name, "seed": 0, "steps": 10} for name in MODELS]
    return [{"model": name, "seed": seed} for seed in (seeds if seeds is not None else SEEDS)
            for name in MODELS]


def cpu_seconds(config: dict) -> float:
    # about 2 CPU-minutes a seed
    per_step = {"two_layer": 0.1, "one_layer": 0.025, "one_layer_big": 0.019}[config["model"]]
    return per_step * config.get("steps", STEPS) * (4 if config["model"] == "one_layer_big" else 1)


def run(config: dict) -> dict:
    """Train one model on one seed: the record the chapter's table keeps of it."""
    torch.set_num_threads(1)
    return _rounded(MODELS[config["model"]](config["seed"], config.get("steps", STEPS)))


def table(records: list[dict]) -> dict:
    """The chapter's table: the settings, and each model's runs sorted by seed."""
    from experiments import runner
    out = {"config": {"vocab_size": VOCAB_SIZE, "train_vocab": TRAIN_VOCAB, "seq_len": SEQ_LEN,
                      "periods": PERIODS, "steps": STEPS, "lr": LR, "batch_size": BATCH,
                      "eval_every": EVAL_EVERY, "test_seed": TEST_SEED,
                      "torch": runner.torch_version(records)}}
    for name in MODELS:
        out[name] = sorted((r["row"] for r in records if r["config"]["model"] == name),
                           key=lambda row: row["seed"])
    return _rounded(out)


def dump(table: dict) -> str:
    return json.dumps(table, separators=(",", ":")) + "\n"


if __name__ == "__main__":  # the same as: python -m experiments run ch11_induction_sweep ...
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch11_induction_sweep")
