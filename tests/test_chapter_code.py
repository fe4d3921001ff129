"""The chapters' code fits the page: no line of a code cell is longer than 88 characters.

At desktop width the book's code blocks show about 90 characters before they scroll sideways,
and a line that scrolls hides its end, where the shape comments are (``# (B, Q, K)``). A
comment that does not fit goes on its own line above the code.

The chapters are listed explicitly: a chapter joins ``CHECKED`` once its code fits. Those not
yet listed are reported by ``test_unchecked_chapters_are_known`` so that none is forgotten.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINE = 88

#: Chapters whose code cells are checked.
CHECKED = [
    "ch1_attention_cues",
    "ch2_kernel_regression",
    "ch3_masked_softmax",
    "ch4_scoring_functions",
    "ch5_self_attention",
    "ch6_positional_encoding",
    "ch7_seq2seq_attention",
    "ch8_transformer",
    "ch9_efficient_attention",
    "ch10_vision_transformer",
    "ch11_induction_heads",
    "ch12_gpt",
    "ch13_diagnostics",
    "ch14_linear_attention",
    "ch15_serving",
    "ch16_beyond_sequences",
    "ch17_sparse_attention",
]
#: Chapters still to be brought under MAX_LINE (then moved to CHECKED).
NOT_YET = [
]


def long_lines(chapter: str) -> list[str]:
    """``cell N, line M: (length) text`` for each code line over MAX_LINE characters."""
    notebook = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    found = []
    for n, cell in enumerate(notebook["cells"], start=1):
        if cell["cell_type"] != "code":
            continue
        for m, line in enumerate("".join(cell["source"]).splitlines(), start=1):
            if len(line) > MAX_LINE:
                found.append(f"cell {n}, line {m}: ({len(line)}) {line.strip()[:60]}")
    return found


@pytest.mark.parametrize("chapter", CHECKED)
def test_code_lines_fit(chapter):
    assert long_lines(chapter) == [], f"{chapter}: lines over {MAX_LINE} characters"


def test_unchecked_chapters_are_known():
    chapters = sorted(p.stem for p in (ROOT / "book").glob("ch*.ipynb"))
    assert sorted(CHECKED + NOT_YET) == chapters, "list every chapter in CHECKED or NOT_YET"
