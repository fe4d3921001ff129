"""Chapter 12's n-gram baselines: plain and modified Kneser-Ney at orders 1-8 on both corpora,
chosen on a validation split and scored once on the held-out tenth; and the per-window losses
of the shipped GPT checkpoints beside them, for paired bootstrap intervals.

    python -m experiments run ch12_ngram      # both corpora and the checkpoints, ~7 CPU-minutes
    python -m experiments table ch12_ngram --out book/data/ch12_ngram.json

Four runs: for each corpus, the n-grams (``"part": "ngrams"``: both smoothings, orders 1 to
``MAX_ORDER``, chosen on validation) and the checkpoints (``"part": "checkpoints"``: the
shipped models' per-window bits beside the chosen n-gram's, at the smoothing and order of
``CHOSEN``). ``table`` derives the choice from the n-gram rows and refuses a table whose
checkpoint runs used another one (then set ``CHOSEN`` and run them again).

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

``table`` writes ``book/data/ch12_ngram.json``. ``ngram_row()`` and ``checkpoint_row()``
compute the two parts of one corpus; ``run()`` calls one of them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from d2lattn.gpt import GPT, GPTConfig, held_out_losses, sliding_window_losses
from d2lattn.ngram import KneserNeyLM, ModifiedKneserNeyLM
from d2lattn.text import CharTokenizer, load_split

DATA = Path(__file__).resolve().parent.parent / "book" / "data"
TABLE = DATA / "ch12_ngram.json"
MAX_ORDER = 8
SMOOTHINGS = {"kn": KneserNeyLM, "mkn": ModifiedKneserNeyLM}
CHECKPOINTS = {"shakespeare": ["ch12_gpt_shakespeare.pt", "ch12_scaling_best.pt"],
               "tang": ["ch12_gpt_tang.pt"]}
#: the smoothing and order chosen on validation (``table`` checks it against the n-gram rows)
CHOSEN = {"shakespeare": {"smoothing": "mkn", "order": 7},
          "tang": {"smoothing": "mkn", "order": 6}}


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


def ngram_row(name: str, max_order: int = MAX_ORDER, chars: int | None = None) -> dict:
    """One corpus: validation and held-out bits per character, both smoothings, orders
    1..max_order, and the choice on validation (``chars``: only the first characters of each
    text, for a smoke run)."""
    start = time.process_time()
    v = validation_split(name)
    split = v["split"]
    cut = (lambda text: text[:chars]) if chars else (lambda text: text)
    row = {"validation": {}, "held_out": {}, "leaks": v["leaks"],
           "characters": {"fit": len(cut(v["fit"])), "validation": len(cut(v["valid"])) - 1,
                          "train": len(cut(split.train)),
                          "held_out": len(cut(split.held_out)) - 1}}
    for smoothing, cls in SMOOTHINGS.items():
        for part, train, scored in (("validation", v["fit"], v["valid"]),
                                    ("held_out", split.train, split.held_out)):
            lm = cls(cut(train), max_order, vocab=split.text)
            bits = {}
            for n in range(1, max_order + 1):
                b = lm.bits(cut(scored), order=n)
                bits[str(n)] = round(sum(b) / len(b), 4)
            row[part][smoothing] = bits
    choices = [(row["validation"][s][n], s, int(n)) for s in SMOOTHINGS
               for n in row["validation"][s]]
    _, s, n = min(choices)
    row["chosen_on_validation"] = {"smoothing": s, "order": n}
    row["cpu_seconds"] = round(time.process_time() - start, 1)
    return row


def window_means(bits: torch.Tensor, T: int, W: int | None = None) -> list:
    """Per-character bits ``(N,)`` -> the mean of each of the first ``W`` blocks of ``T``
    (default: every complete block), 5 decimals: the table's per-window figures, which
    ``experiments/ch12_scaling.py`` records for its runs on the same blocks."""
    W = bits.numel() // T if W is None else W
    return [round(v, 5) for v in bits[:W * T].view(W, T).double().mean(1).tolist()]


def checkpoint_row(name: str, chosen: dict, chars: int | None = None) -> dict:
    """One corpus: per-window bits of its shipped checkpoints and of n-grams on the same
    characters (``chosen``: the n-gram's smoothing and order; ``chars``: only the first
    characters of the training and held-out texts, for a smoke run)."""
    split = load_split(name)
    train, held_out = (split.train[:chars], split.held_out[:chars]) if chars else (
        split.train, split.held_out)
    ids = CharTokenizer(split.text).encode(held_out)
    start = time.process_time()
    ngrams = {}
    for label, cls, n in (("chosen", SMOOTHINGS[chosen["smoothing"]], chosen["order"]),
                          ("kn6", KneserNeyLM, 6), ("mkn7", ModifiedKneserNeyLM, 7)):
        lm = cls(train, n, vocab=split.text)
        ngrams[label] = torch.tensor(lm.bits(held_out, order=n), dtype=torch.float64)
    row = {"models": {}}
    for f in CHECKPOINTS[name]:
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
            "window_start": window_means(ws, T, W), "sliding": window_means(sl, T, Ws),
            "ngrams_window_start": {k: window_means(v, T, W) for k, v in ngrams.items()},
            "ngrams_sliding": {k: window_means(v, T, Ws) for k, v in ngrams.items()},
            "window_start_mean": round(ws.mean().item(), 4),
            "sliding_mean": round(sl.mean().item(), 4)}
    row["chosen"] = dict(chosen)
    row["cpu_seconds"] = round(time.process_time() - start, 1)
    return row


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ("cpu_seconds",)


def grid(seeds=None, smoke=False) -> list[dict]:
    """Per corpus, the n-gram run and the checkpoint run (no seeds: both are deterministic;
    ``smoke``: the first 3,000 characters of each text: the play's n-grams up to order 3, the
    poem model's checkpoint beside a bigram)."""
    if smoke:
        return [{"part": "ngrams", "corpus": "shakespeare", "max_order": 3, "chars": 3000},
            {"part": "checkpoints", "corpus": "tang", "smoothing": "kn", "order": 2,
             "chars": 3000}]
    return [{"part": "ngrams", "corpus": name, "max_order": MAX_ORDER} for name in CHECKPOINTS] + [
        {"part": "checkpoints", "corpus": name, **CHOSEN[name]} for name in CHECKPOINTS]


def cpu_seconds(config: dict) -> float:
    """The committed runs' CPU time (a smoke run: about a second)."""
    if config.get("chars"):
        return 1.0
    return {("ngrams", "shakespeare"): 89.8, ("ngrams", "tang"): 164.6,
            ("checkpoints", "shakespeare"): 82.0,
            ("checkpoints", "tang"): 91.3}[config["part"], config["corpus"]]


def run(config: dict) -> dict:
    """One corpus's n-grams, or its checkpoints beside the chosen n-gram."""
    if config["part"] == "ngrams":
        return ngram_row(config["corpus"], config["max_order"], config.get("chars"))
    return checkpoint_row(config["corpus"], {"smoothing": config["smoothing"],
                                             "order": config["order"]}, config.get("chars"))


def table(records: list[dict]) -> dict:
    """The chapter's table: each corpus's n-grams and its checkpoints' windows. Refuses
    checkpoint rows whose n-gram is not the one its corpus's n-gram row chooses."""
    from experiments import runner
    rows = {(r["config"]["part"], r["config"]["corpus"]): r["row"] for r in records}
    corpora = {n: rows["ngrams", n] for n in CHECKPOINTS if ("ngrams", n) in rows}
    windows = {n: rows["checkpoints", n] for n in CHECKPOINTS if ("checkpoints", n) in rows}
    for name, row in windows.items():
        if name in corpora and row["chosen"] != corpora[name]["chosen_on_validation"]:
            raise ValueError(f"{name}: validation chooses "
                             f"{corpora[name]['chosen_on_validation']}, the checkpoint run "
                             f"used {row['chosen']}: set CHOSEN and run it again")
    return {"max_order": MAX_ORDER, "smoothings": list(SMOOTHINGS), "corpora": corpora,
            "checkpoints": windows, "torch": runner.torch_version(records, torch.__version__)}


if __name__ == "__main__":  # the same as: python -m experiments run ch12_ngram ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch12_ngram")
