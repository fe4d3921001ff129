"""Chapter 14's in-context regression layers on fresh seeds.

    python experiments/ch14_icl_fresh_seeds.py 10 20     # seeds 10-19 and 20-29, seconds each

The chapter trains ten linear self-attention layers (initial weights from seeds 0-9, prompts
from stream 100) and asserts that each lands within 20% of one gradient step. This script runs
the chapter's own cells (read from the notebook, so they cannot drift apart) with the initial
weights drawn from seeds ``OFFSET + 0-9`` and the training prompts from stream ``100 + OFFSET``,
so the claim is checked on layers and data the chapter was not written against. It prints the
chapter's summary lines and fails if any of the chapter's assertions fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "book" / "ch14_linear_attention.ipynb"


def cell(cells: list, marker: str) -> str:
    """The source of the one code cell that contains ``marker``."""
    found = ["".join(c["source"]) for c in cells
             if c["cell_type"] == "code" and marker in "".join(c["source"])]
    assert len(found) == 1, (marker, len(found))
    return found[0]


def main(offsets: list[int]) -> None:
    torch.set_num_threads(1)
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    for offset in offsets:
        print(f"initial weights from seeds {offset}-{offset + 9}, prompts from stream "
              f"{100 + offset}")
        scope = {"torch": torch, "plt": plt}
        exec(cell(cells, "def lsa_prediction"), scope)
        train = cell(cells, "opt = torch.optim.Adam(W")
        fresh = (train.replace("manual_seed(m))", f"manual_seed(m + {offset}))")
                 .replace("manual_seed(100)", f"manual_seed({100 + offset})"))
        assert fresh != train
        exec(fresh, scope)
        exec(cell(cells, "Gamma = ").replace("plt.show()", "plt.close()"), scope)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [10, 20])
