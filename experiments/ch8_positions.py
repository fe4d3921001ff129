"""Chapter 8's position experiment over seeds: which encoding learns the previous-token task,
and which extrapolates beyond the training length.

    python -m experiments run ch8_positions                # about 4 minutes of one CPU core
    python -m experiments run ch8_positions --seeds 13 14  # fresh seeds, both settings
    python -m experiments table ch8_positions --out book/data/ch8_positions.json

``table`` writes ``book/data/ch8_positions.json``. The model, task, training and test are those
of the chapter's cells (section "Positions, settled by experiment"); the steps are the library's loop,
``d2lattn.fit``, which takes the same steps as the chapter's own loop, bit for bit. The chapter
re-runs seed 0 of the "base" setting live and checks it against this table.

Settings:
    base: the chapter's model (d = 32, 2 heads, 1 block), 200 Adam steps, seeds 0..7.
    big:  4x the steps (800) and a bigger model (d = 64, 2 heads, 2 blocks), seeds 0..4, to
          check that the failure to extrapolate is a limit and not slow learning.
Each entry is the test accuracy at lengths 16 (the training length), 32 and 64. The book's
table holds these seeds and fresh ones added after the prose was written (base 8..12, big
5..9).
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from d2lattn import (LearnedPositionalEmbedding, PositionalEncoding,  # noqa: E402
                     TransformerEncoderBlock, fit)

torch.set_num_threads(1)  # tiny models: one thread is fastest
OUT = pathlib.Path(__file__).resolve().parent.parent / "book" / "data" / "ch8_positions.json"
ENCODINGS = ["none", "sinusoidal", "learned", "rotary"]
LENGTHS = [16, 32, 64]
SETTINGS = {
    "base": dict(num_hiddens=32, num_layers=1, steps=200, seeds=list(range(8))),
    "big": dict(num_hiddens=64, num_layers=2, steps=800, seeds=list(range(5))),
}


class TinyTransformer(nn.Module):  # the chapter's class (KV cache path left out)
    def __init__(self, vocab_size, num_hiddens=32, num_heads=2, num_layers=1,
                 positions="rotary", causal=True, max_len=128):
        super().__init__()
        self.positions, self.causal = positions, causal
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        table = {"sinusoidal": PositionalEncoding, "learned": LearnedPositionalEmbedding}
        if positions in table:
            self.pos = table[positions](num_hiddens, max_len=max_len)
        self.blocks = nn.ModuleList(
            TransformerEncoderBlock(num_hiddens, num_heads, 2 * num_hiddens, norm_first=True,
                                    rotary=positions == "rotary") for _ in range(num_layers))
        self.norm = nn.LayerNorm(num_hiddens)
        self.head = nn.Linear(num_hiddens, vocab_size)

    def forward(self, tokens):
        X = self.embedding(tokens)
        if self.positions in ("sinusoidal", "learned"):
            X = X + self.pos.P[:tokens.shape[1]]
        for block in self.blocks:
            X = block(X, is_causal=self.causal)
        return self.head(self.norm(X))


def train_lm(model, make_batch, steps, lr=3e-3, seed=0):
    """The chapter's recipe: Adam on batches of 64 from ``make_batch``."""
    generator = torch.Generator().manual_seed(seed)

    def batch_loss():
        inputs, targets = make_batch(64, generator)
        return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

    fit(model, torch.optim.Adam(model.parameters(), lr=lr), batch_loss, steps=steps)
    return model


def previous_token_batch(batch_size, generator, length=16):
    tokens = torch.randint(1, 10, (batch_size, length), generator=generator)
    targets = torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), tokens[:, :-1]], dim=1)
    return tokens, targets


@torch.no_grad()
def previous_token_accuracy(model, length, seed=123):
    tokens, targets = previous_token_batch(512, torch.Generator().manual_seed(seed), length)
    return (model(tokens).argmax(-1)[:, 1:] == targets[:, 1:]).float().mean().item()


def order_blind_optimum(length, seed=123):
    """Best accuracy of any rule that sees a token and the multiset of the sequence only."""
    tokens, _ = previous_token_batch(512, torch.Generator().manual_seed(seed), length)
    counts = F.one_hot(tokens, 10).sum(dim=1, keepdim=True)  # (B, 1, 10)
    others = counts - F.one_hot(tokens, 10)  # (B, T, 10): the multiset without the token
    return (others.max(dim=-1).values[:, 1:] / (length - 1)).float().mean().item()


SMOKE = dict(num_hiddens=16, num_layers=1, steps=3, seeds=[0])
TABLE = OUT
VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ()


def grid(seeds=None, smoke=False) -> list[dict]:
    """One run per setting, seed and encoding (``smoke``: one seed of a 3-step model)."""
    settings = {"smoke": SMOKE} if smoke else SETTINGS
    return [{"setting": name, **{k: v for k, v in s.items() if k != "seeds"},
             "seed": seed, "encoding": positions}
            for name, s in settings.items() for seed in (seeds or s["seeds"])
            for positions in ENCODINGS]


def cpu_seconds(config: dict) -> float:
    return 0.012 * config["steps"] * config["num_layers"]  # about 4 minutes for the grid


def run(config: dict) -> dict:
    """Train one encoding on one seed; its accuracy at each of ``LENGTHS``."""
    torch.manual_seed(config["seed"])
    model = TinyTransformer(10, num_hiddens=config["num_hiddens"],
                            num_layers=config["num_layers"], positions=config["encoding"],
                            causal=False, max_len=64)
    train_lm(model, previous_token_batch, steps=config["steps"], seed=config["seed"])
    return {"accuracy": [round(previous_token_accuracy(model, t), 4) for t in LENGTHS]}


def table(records: list[dict]) -> dict:
    """The chapter's table: per setting, its seeds and each encoding's accuracies by seed."""
    out = {"lengths": LENGTHS, "encodings": ENCODINGS,
           "order_blind_optimum": [round(order_blind_optimum(t), 4) for t in LENGTHS],
           "settings": {}}
    for r in sorted(records, key=lambda r: (r["config"]["setting"] not in SETTINGS,
                                           list(SETTINGS).index(r["config"]["setting"])
                                           if r["config"]["setting"] in SETTINGS else 0,
                                           r["config"]["seed"])):
        c = r["config"]
        entry = out["settings"].setdefault(c["setting"], {
            "num_hiddens": c["num_hiddens"], "num_layers": c["num_layers"],
            "steps": c["steps"], "seeds": [], "accuracy": {e: {} for e in ENCODINGS}})
        if c["seed"] not in entry["seeds"]:
            entry["seeds"].append(c["seed"])
        entry["accuracy"][c["encoding"]][str(c["seed"])] = r["row"]["accuracy"]
    for entry in out["settings"].values():  # a seed is listed once every encoding has it
        entry["seeds"] = [s for s in entry["seeds"]
                          if all(str(s) in entry["accuracy"][e] for e in ENCODINGS)]
    return out


if __name__ == "__main__":  # the same as: python -m experiments run ch8_positions ...
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch8_positions")
