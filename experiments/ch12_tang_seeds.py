"""Chapter 12's poem model over seeds: what the chapter shows for seed 0, measured on every seed.

    python experiments/ch12_gpt.py --corpus tang --seeds 0 1 2 ... 9   # the checkpoints first
    python -m experiments run ch12_tang_seeds                          # about 1 CPU-minute a seed
    python -m experiments table ch12_tang_seeds --out book/data/ch12_tang_seeds.json

For every Tang checkpoint in ``book/data`` (seed 0: ``ch12_gpt_tang.pt``; seed k:
``ch12_gpt_tang_seed<k>.pt``, which ``ch12_gpt.py`` writes and the repository does not keep)
it measures, as the chapter's cells do for seed 0: the held-out loss by position in the window
(in bins of 8 characters); the decoding table (valid form, distinct 2-grams, copied half-lines,
24 prompts, sampling seeds 0-4; greedy once), with the length of the greedy poems; and the
weight each head puts on the key six positions back, on 64 held-out eight-line poems, split
by where the query stands in its couplet. A run whose checkpoint is missing is recorded as
failed. ``table`` writes ``book/data/ch12_tang_seeds.json``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2lattn.gpt import GPT, GPTConfig  # noqa: E402
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

DATA = ROOT / "book" / "data"
TABLE = DATA / "ch12_tang_seeds.json"
HALF_LINE = re.compile(r"([^，。？！；\n]{5})([，。？！；])")
DECODERS = {"greedy": dict(greedy=True), "temperature 1.0": dict(temperature=1.0),
            "top-k 20": dict(top_k=20), "top-p 0.9": dict(top_p=0.9)}


def valid_poem(text):
    parts = HALF_LINE.findall(text)
    if "".join(a + b for a, b in parts) != text or len(parts) not in (4, 8):
        return False
    return all(mark == "，" if i % 2 == 0 else mark in "。？！"
               for i, (_, mark) in enumerate(parts))


def load(path):
    ckpt = torch.load(path, weights_only=True)
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict({k: v.float() for k, v in ckpt["state_dict"].items()})
    return model.eval()


def measure(model, tok, tang, train_half_lines, n_prompts=24, new_tokens=50, n_poems=64):
    def copied_share(poems):
        lines = [a for poem in poems for a, _ in HALF_LINE.findall(poem)]
        return sum(line in train_half_lines for line in lines) / max(1, len(lines))

    def distinct(texts, n=2):
        grams = [t[i:i + n] for t in texts for i in range(len(t) - n + 1)]
        return len(set(grams)) / max(1, len(grams))

    prompts = tok.encode("".join("\n" + p[0] for p in tang.held_out_poems[:n_prompts]))
    prompts = prompts.view(n_prompts, 2)
    decoding = {}
    for label, kw in DECODERS.items():
        rows = []
        for seed in ([0] if label == "greedy" else range(5)):
            out = model.generate(prompts, new_tokens,
                                 generator=torch.Generator().manual_seed(seed), **kw)
            texts = [tok.decode(row[1:]) for row in out]
            poems = [t.split("\n")[0] for t in texts]
            rows.append({"valid": sum(map(valid_poem, poems)) / len(poems),
                         "distinct": distinct(poems), "copied": copied_share(poems),
                         "lengths": [len(p) for p in poems],
                         "ends_with_newline": sum("\n" in t for t in texts)})
        decoding[label] = rows
    eight = [p for p in tang.held_out_poems if len(p) == 48][:n_poems]
    poem_ids = torch.stack([tok.encode("\n" + p) for p in eight])  # (64, 49)
    with torch.no_grad():
        model(poem_ids)
    weights = torch.stack([b.self_attention.attention_weights for b in model.blocks])
    T = poem_ids.shape[1]
    queries = torch.arange(7, T)
    back6 = weights[..., queries, queries - 6].mean(dim=(1, 3))  # (L, h)
    uniform = float((1.0 / (queries + 1).float()).mean())
    l, h = divmod(int(back6.argmax()), back6.shape[1])
    w = weights[l, :, h]  # (B, T, T)
    line = (queries - 1) // 6  # the query's half-line, 1..7
    second = line % 2 == 1  # the second line of a couplet
    six = w[:, queries, queries - 6].mean(0)  # (T - 7,)
    return {"decoding": decoding,
            "six_back": {"weights": [[round(float(x), 4) for x in row] for row in back6],
                         "uniform": round(uniform, 4), "best": [l, h],
                         "best_over_uniform": round(float(back6.max()) / uniform, 2),
                         "best_second_line": round(float(six[second].mean()), 4),
                         "best_first_line": round(float(six[~second].mean()), 4),
                         "best_by_place": [round(float(six[(queries - 1) % 6 == k].mean()), 4)
                                           for k in range(6)]}}


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ()
INDENT = None
ASCII = True


def grid(seeds=None, smoke=False) -> list[dict]:
    """One run per checkpoint seed (``smoke``: seed 0, 4 prompts, 8 new characters, 8 poems)."""
    if smoke:
        return [{"seed": 0, "prompts": 4, "new_tokens": 8, "poems": 8}]
    return [{"seed": seed} for seed in (seeds if seeds is not None else range(10))]


def cpu_seconds(config: dict) -> float:
    return 60.0 if "prompts" not in config else 3.0


def run(config: dict) -> dict:
    """Measure one seed's checkpoint (``ch12_gpt.py --corpus tang --seeds k`` writes it)."""
    torch.set_num_threads(1)
    seed = config["seed"]
    path = DATA / ("ch12_gpt_tang.pt" if seed == 0 else f"ch12_gpt_tang_seed{seed}.pt")
    if not path.exists():
        raise FileNotFoundError(f"{path.name}: train it first with "
                                f"python -m experiments run ch12_gpt --where corpus=tang")
    tang = load_split("tang")
    tok = CharTokenizer(tang.text)
    train_half_lines = {a for poem in tang.train_poems for a, _ in HALF_LINE.findall(poem)}
    run = json.loads(path.with_suffix(".json").read_text())
    by_pos = run["held_out_bits_by_position"]
    row = {"seed": seed, "held_out_bits": run["held_out_bits"],
           "by_position_bins_of_8": [round(sum(by_pos[i:i + 8]) / 8, 4)
                                     for i in range(0, len(by_pos), 8)]}
    row.update(measure(load(path), tok, tang, train_half_lines,
                       config.get("prompts", 24), config.get("new_tokens", 50),
                       config.get("poems", 64)))
    return row


def table(records: list[dict]) -> dict:
    """The chapter's table: a row per seed, sorted by seed."""
    return {"rows": sorted((r["row"] for r in records), key=lambda r: r["seed"])}


if __name__ == "__main__":  # the same as: python -m experiments run ch12_tang_seeds ...
    from experiments.runner import script
    script("ch12_tang_seeds")
