"""Chapter 12's n-gram baselines: interpolated Kneser-Ney models of every order, on the GPT's split.

    python experiments/ch12_ngram.py          # both corpora, about half a CPU-minute

Fits ``d2lattn.ngram.KneserNeyLM`` on the training text of each corpus (``load_split``; the
vocabulary is the whole corpus's, as the GPT's) and scores the whole held-out text at every
order up to ``MAX_ORDER`` (each character given the text before it, so the first characters
of the held-out text have a shorter history). Writes ``book/data/ch12_ngram.json``: the
held-out bits per character by corpus and order, the best order, the CPU time. Chapter 12
reads the table and refits one low order live to check it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from d2lattn.ngram import KneserNeyLM
from d2lattn.text import load_split

OUT = Path(__file__).resolve().parent.parent / "book" / "data" / "ch12_ngram.json"
MAX_ORDER = {"shakespeare": 8, "tang": 7}


def main() -> None:
    table = {"max_order": MAX_ORDER, "corpora": {}}
    for name, max_order in MAX_ORDER.items():
        start = time.process_time()
        split = load_split(name)
        lm = KneserNeyLM(split.train, max_order, vocab=split.text)
        bits = {}
        for n in range(1, max_order + 1):
            b = lm.bits(split.held_out, order=n)
            bits[str(n)] = round(sum(b) / len(b), 4)
            print(f"{name} order {n}: {bits[str(n)]:.4f} bits/char", flush=True)
        best = min(bits, key=bits.get)
        table["corpora"][name] = {"bits": bits, "best_order": int(best),
                                  "held_out_characters": len(split.held_out) - 1,
                                  "cpu_seconds": round(time.process_time() - start, 1)}
    OUT.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
