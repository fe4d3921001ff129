"""Chapter 12's n-gram baselines: plain and modified Kneser-Ney at orders 1-8 on both corpora,
chosen on a validation split and scored once on the held-out tenth; and the per-window losses
of the shipped GPT checkpoints beside them, for paired bootstrap intervals.

    python experiments/ch12_ngram.py          # both corpora and the checkpoints, a few CPU-minutes

**Validation split.** The held-out tenth (``load_split``) is never used to choose. The
validation text is carved from the *training* text: for the play, the last tenth of the
training text (the play's ninth tenth, a contiguous block, as the held-out tenth is); for the
poems, every ninth training poem (a tenth of the corpus). The n-grams are fitted on the rest
(the "fit" text) and scored on the validation text; the order and smoothing with the lowest
validation bits are chosen. Then every model is refitted on the whole training text and scored
once on the held-out tenth. Leak check: the poems were deduplicated before any split (exact
repeats and poems sharing half their half-lines, ``d2lattn.text.distinct_poems``); the script
counts validation poems found in the fit text, and, for the play, validation lines of 30 or
more characters found verbatim in the fit text (repeated stage directions and formulae).

**Checkpoints.** ``ch12_gpt_{corpus}.pt`` (the four-minute models, seed 0) and
``ch12_scaling_best.pt`` (the 1.8M model, 2,400 steps, seed 2) are scored on the whole held-out
text by window start (``held_out_losses``) and by sliding windows
(``sliding_window_losses``); the table keeps each window's mean bits (one block of
``block_size`` characters per window, characters ``1 + w T .. (w + 1) T`` of the held-out
text) and the chosen n-gram's, the plain 6-gram's and MKN-7's on the same blocks.

Writes ``book/data/ch12_ngram.json``. ``ngram_table()`` and ``checkpoint_windows()`` compute
the two parts; ``main()`` writes them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from d2lattn.gpt import GPT, GPTConfig, held_out_losses, sliding_window_losses
from d2lattn.ngram import KneserNeyLM, ModifiedKneserNeyLM
from d2lattn.text import CharTokenizer, load_split

DATA = Path(__file__).resolve().parent.parent / "book" / "data"
OUT = DATA / "ch12_ngram.json"
MAX_ORDER = 8
SMOOTHINGS = {"kn": KneserNeyLM, "mkn": ModifiedKneserNeyLM}
CHECKPOINTS = {"shakespeare": ["ch12_gpt_shakespeare.pt", "ch12_scaling_best.pt"],
               "tang": ["ch12_gpt_tang.pt"]}


def validation_split(name: str) -> dict:
    """The fit and validation texts carved from the training text, with the leak counts."""
    split = load_split(name)
    if name == "shakespeare":
        cut = int(0.9 * len(split.train))
        fit, valid = split.train[:cut], split.train[cut:]
        fit_lines = set(fit.splitlines())
        long_lines = {l for l in valid.splitlines() if len(l) >= 30}
        leaks = {"validation_lines_30_plus": len(long_lines),
                 "of_them_in_fit_text": sum(l in fit_lines for l in long_lines)}
    else:
        fit_p = [p for i, p in enumerate(split.train_poems) if i % 9 != 8]
        val_p = [p for i, p in enumerate(split.train_poems) if i % 9 == 8]
        fit, valid = "\n".join(fit_p) + "\n", "\n".join(val_p) + "\n"
        fit_set = set(fit_p)
        leaks = {"validation_poems": len(val_p), "fit_poems": len(fit_p),
                 "validation_poems_in_fit": sum(p in fit_set for p in val_p),
                 "held_out_poems_in_train": sum(p in set(split.train_poems)
                                                for p in split.held_out_poems)}
    return {"split": split, "fit": fit, "valid": valid, "leaks": leaks}


def ngram_table(corpora=("shakespeare", "tang"), max_order: int = MAX_ORDER) -> dict:
    """Validation and held-out bits per character, both smoothings, orders 1..max_order."""
    table = {}
    for name in corpora:
        start = time.process_time()
        v = validation_split(name)
        split = v["split"]
        row = {"validation": {}, "held_out": {}, "leaks": v["leaks"],
               "characters": {"fit": len(v["fit"]), "validation": len(v["valid"]) - 1,
                              "train": len(split.train),
                              "held_out": len(split.held_out) - 1}}
        for smoothing, cls in SMOOTHINGS.items():
            for part, train, scored in (("validation", v["fit"], v["valid"]),
                                        ("held_out", split.train, split.held_out)):
                lm = cls(train, max_order, vocab=split.text)
                bits = {}
                for n in range(1, max_order + 1):
                    b = lm.bits(scored, order=n)
                    bits[str(n)] = round(sum(b) / len(b), 4)
                row[part][smoothing] = bits
                print(f"{name} {smoothing} {part}: "
                      + " ".join(f"{n}:{b:.4f}" for n, b in bits.items()), flush=True)
        choices = [(row["validation"][s][n], s, int(n)) for s in SMOOTHINGS
                   for n in row["validation"][s]]
        _, s, n = min(choices)
        row["chosen_on_validation"] = {"smoothing": s, "order": n}
        row["cpu_seconds"] = round(time.process_time() - start, 1)
        table[name] = row
    return table


def _blocks(x: torch.Tensor, T: int, W: int) -> list:
    return [round(v, 5) for v in x[:W * T].view(W, T).double().mean(1).tolist()]


def checkpoint_windows(chosen: dict) -> dict:
    """Per-window bits of the shipped checkpoints and of n-grams on the same characters."""
    out = {}
    for name, files in CHECKPOINTS.items():
        split = load_split(name)
        ids = CharTokenizer(split.text).encode(split.held_out)
        start = time.process_time()
        ngrams = {}
        for label, cls, n in (("chosen", SMOOTHINGS[chosen[name]["smoothing"]],
                               chosen[name]["order"]),
                              ("kn6", KneserNeyLM, 6), ("mkn7", ModifiedKneserNeyLM, 7)):
            lm = cls(split.train, n, vocab=split.text)
            ngrams[label] = torch.tensor(lm.bits(split.held_out, order=n), dtype=torch.float64)
        row = {"models": {}}
        for f in files:
            ckpt = torch.load(DATA / f, weights_only=True)
            model = GPT(GPTConfig(**ckpt["config"]))
            model.load_state_dict({k: v.float() for k, v in ckpt["state_dict"].items()})
            model.eval()
            T = model.config.block_size
            with torch.no_grad():
                ws = held_out_losses(model, ids).reshape(-1)
                sl = sliding_window_losses(model, ids)
            W = ws.numel() // T
            Ws = sl.numel() // T
            row["models"][f] = {
                "block_size": T, "run": ckpt.get("run", {}).get("size", "four-minute"),
                "window_start": _blocks(ws, T, W), "sliding": _blocks(sl, T, Ws),
                "ngrams_window_start": {k: _blocks(v, T, W) for k, v in ngrams.items()},
                "ngrams_sliding": {k: _blocks(v, T, Ws) for k, v in ngrams.items()},
                "window_start_mean": round(ws.mean().item(), 4),
                "sliding_mean": round(sl.mean().item(), 4)}
            print(f"{name} {f}: window start {ws.mean():.4f}, sliding {sl.mean():.4f}; "
                  + ", ".join(f"{k} {v[:W * T].mean():.4f}" for k, v in ngrams.items()),
                  flush=True)
        row["chosen"] = chosen[name]
        row["cpu_seconds"] = round(time.process_time() - start, 1)
        out[name] = row
    return out


def main() -> None:
    torch.set_num_threads(1)
    corpora = ngram_table()
    chosen = {k: v["chosen_on_validation"] for k, v in corpora.items()}
    windows = checkpoint_windows(chosen)
    table = {"max_order": MAX_ORDER, "smoothings": list(SMOOTHINGS), "corpora": corpora,
             "checkpoints": windows, "torch": torch.__version__}
    OUT.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
