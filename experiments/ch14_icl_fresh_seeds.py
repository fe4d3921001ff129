"""Chapter 14's in-context regression layers on fresh seeds.

    python -m experiments run ch14_icl_fresh_seeds --seeds 10 20   # seeds 10-19 and 20-29

The chapter trains ten linear self-attention layers (initial weights from seeds 0-9, prompts
from stream 100) and asserts that each lands within 20% of one gradient step. This script runs
the chapter's own cells (read from the notebook, so they cannot drift apart) with the initial
weights drawn from seeds ``OFFSET + 0-9`` and the training prompts from stream ``100 + OFFSET``,
so the claim is checked on layers and data the chapter was not written against (``--seeds``
gives the offsets; seconds each). A run's row keeps the chapter's summary lines it printed; a
run in which one of the chapter's assertions fails is recorded as failed. No table: the
chapter states the check, and the results file keeps what each run printed.
"""

from __future__ import annotations

import contextlib
import io
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


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ()
TABLE = None  # no table: the runs check the chapter's claims; the results file keeps them


def grid(seeds=None, smoke=False) -> list[dict]:
    """One run per offset of the seeds (``smoke``: offset 10 only; a run takes seconds)."""
    return [{"offset": o} for o in ([10] if smoke else (seeds or [10, 20]))]


def cpu_seconds(config: dict) -> float:
    return 10.0


def run(config: dict) -> dict:
    """The chapter's cells on fresh seeds; raises if one of the chapter's assertions fails."""
    torch.set_num_threads(1)
    offset = config["offset"]
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    scope = {"torch": torch, "plt": plt}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(cell(cells, "def lsa_prediction"), scope)
        train = cell(cells, "opt = torch.optim.Adam(W")
        fresh = (train.replace("manual_seed(m))", f"manual_seed(m + {offset}))")
                 .replace("manual_seed(100)", f"manual_seed({100 + offset})"))
        assert fresh != train
        exec(fresh, scope)
        exec(cell(cells, "Gamma = ").replace("plt.show()", "plt.close()"), scope)
    return {"initial_weights_seeds": [offset, offset + 9], "prompt_stream": 100 + offset,
            "printed": printed.getvalue().splitlines()}


def table(records: list[dict]) -> dict:
    """What each run printed, by offset (every run that has a row passed the assertions)."""
    return {"runs": sorted((r["row"] for r in records),
                           key=lambda r: r["initial_weights_seeds"][0])}


if __name__ == "__main__":  # the same as: python -m experiments run ch14_icl_fresh_seeds ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch14_icl_fresh_seeds")
