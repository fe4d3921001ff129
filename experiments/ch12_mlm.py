"""Chapter 12, masked vs causal: the GPT's blocks trained as a BERT-style masked language model.

    python -m experiments run ch12_mlm                   # Shakespeare, seed 0, CPU, ~4 CPU-minutes
    python -m experiments run ch12_mlm --seeds 1 2 --device cuda
    python -m experiments table ch12_mlm --out book/data/ch12_mlm.json

The model is the chapter's Shakespeare GPT with one change, ``causal=False`` (every position
attends to every other), and one more token in its vocabulary, the mask. It is trained with the
same recipe, steps, batches and seed as ``experiments/ch12_gpt.py`` (the windows are drawn from
the same generator), on the 15% masking of Devlin et al. (2019). Then both models are scored on
the held-out text at two jobs:

* **fill in a blank**: 15% of the positions blanked (the same blanks for both); the masked
  model sees both sides of each blank, the GPT only its left (``d2lattn.gpt.fill_in_losses``);
* **write left to right**: predict the token at position ``t`` from the ``t`` tokens before it,
  at ``t = 8, 16, ..., 120`` of every window; the GPT as it always does, the masked model
  given the prefix followed by one mask token.

The run of seed 0 writes ``book/data/ch12_mlm_shakespeare.pt`` (float16 weights and config;
on a cluster, on the machine that ran it); ``table`` writes
``book/data/ch12_mlm.json`` (one row per seed: held-out bits per character of both models at
both jobs, CPU time; a row merged from another machine or torch version names its torch).
Seeds other than 0 need the GPT checkpoint of that seed (``experiments/ch12_gpt.py --seeds k``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from d2lattn.gpt import GPT, GPTConfig, fill_in_losses, train_lm  # noqa: E402
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "data"
TABLE = OUT / "ch12_mlm.json"
CORPUS = "shakespeare"
POSITIONS = list(range(8, 128, 8))  # where "write left to right" is scored


def load(path: Path) -> GPT:
    ckpt = torch.load(path, weights_only=True)
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict({k: v.float() for k, v in ckpt["state_dict"].items()})
    return model.eval()


@torch.no_grad()
def left_to_right_bits(model: GPT, data: torch.Tensor, mask_id: int,
                       max_windows: int | None = None) -> float:
    """Held-out bits of predicting token t from tokens < t, at the POSITIONS of each window."""
    T = model.config.block_size
    W = data.numel() // T if max_windows is None else min(max_windows, data.numel() // T)
    windows = data[: W * T].view(W, T)  # (W, T)
    nats = []
    for t in POSITIONS:
        if model.config.causal:
            logits = model(windows[:, :t])[:, -1]  # (W, V): after t tokens
        else:
            x = torch.cat([windows[:, :t], torch.full((W, 1), mask_id)], dim=1)  # (W, t + 1)
            logits = model(x)[:, -1]  # (W, V): at the mask
        nats.append(F.cross_entropy(logits, windows[:, t], reduction="none"))
    return torch.cat(nats).mean().item() / math.log(2)


def run(config: dict) -> dict:
    """Train the masked model of one seed and score it and the GPT of that seed."""
    from experiments.runner import device as runner_device
    device, seed = runner_device(), config["seed"]
    windows = config.get("max_windows")  # smoke: a few held-out windows
    gpt_json = json.loads((OUT / f"ch12_gpt_{CORPUS}{'' if seed == 0 else f'_seed{seed}'}.json")
                          .read_text())
    split = load_split(CORPUS)
    tok = CharTokenizer(split.text)
    V = len(tok)
    mask_id = V  # one more token: the mask
    train, held_out = tok.encode(split.train), tok.encode(split.held_out)
    gpt_config = GPTConfig(**{**gpt_json["config"], "vocab_size": V + 1, "causal": False})
    torch.manual_seed(seed)
    mlm = GPT(gpt_config).to(device)
    start = time.process_time()
    steps = config.get("steps", gpt_json["steps"])
    losses = train_lm(mlm, train, steps=steps, batch_size=gpt_json["batch_size"],
                      lr=gpt_json["lr"], warmup=gpt_json["warmup"], seed=seed, mask_id=mask_id)
    cpu = time.process_time() - start
    half = {}
    state = {k: half.setdefault(v.data_ptr(), v.to("cpu", torch.float16))
             for k, v in mlm.state_dict().items()}
    if seed == 0 and "steps" not in config:  # the chapter's checkpoint
        torch.save({"config": vars(gpt_config), "state_dict": state},
                   OUT / f"ch12_mlm_{CORPUS}.pt")
    mlm = GPT(gpt_config)  # score the float16 weights, as the chapter loads them
    mlm.load_state_dict({k: v.float() for k, v in state.items()})
    mlm.eval()
    gpt = load(OUT / f"ch12_gpt_{CORPUS}{'' if seed == 0 else f'_seed{seed}'}.pt")
    def bits(losses):
        return round(losses.mean().item(), 4)

    row = {
        "seed": seed, "device": device, "steps": steps,
        "cpu_seconds_training": round(cpu, 1),
        "train_loss_last_50": round(sum(losses[-50:]) / len(losses[-50:]) / math.log(2), 4),
        "fill_in_bits": {
            "masked": bits(fill_in_losses(mlm, held_out, mask_id=mask_id, max_windows=windows)),
            "causal": bits(fill_in_losses(gpt, held_out, max_windows=windows))},
        "left_to_right_bits": {
            "masked": round(left_to_right_bits(mlm, held_out, mask_id, windows), 4),
            "causal": round(left_to_right_bits(gpt, held_out, mask_id, windows), 4)},
    }
    return row


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ("cpu_seconds_training",)


def grid(seeds=None, smoke=False) -> list[dict]:
    """One run per seed (``smoke``: seed 0, 2 steps, scored on 4 held-out windows)."""
    if smoke:
        return [{"seed": 0, "steps": 2, "max_windows": 4}]
    return [{"seed": seed} for seed in (seeds or [0])]


def cpu_seconds(config: dict) -> float:
    return 250.0 if "steps" not in config else 10.0  # 101-249 s for the committed rows


def table(records: list[dict]) -> dict:
    """The chapter's table: a row per seed, sorted by seed."""
    from experiments import runner
    rows = sorted((r["row"] for r in records), key=lambda r: r["seed"])
    return {"rows": rows, "corpus": CORPUS, "mask_rate": 0.15,
            "positions_left_to_right": POSITIONS, "torch": runner.torch_version(records)}


if __name__ == "__main__":  # the same as: python -m experiments run ch12_mlm ...
    sys.path.insert(0, str(ROOT))
    from experiments.runner import script
    script("ch12_mlm")
