"""The runner's own check (not a chapter's): cheap runs, one of which raises.

    python -m experiments run selftest --smoke     # 6 runs of 0.2 s; the run i = 3 fails

Used by tests/test_experiments_runner.py (kill-and-resume, a failing run recorded).
"""

from __future__ import annotations

import time
from pathlib import Path

VERSION = 1
TIMING_KEYS = ()
TABLE = Path(__file__).resolve().parent / "results" / "selftest.json"


def grid(seeds=None, smoke=False) -> list[dict]:
    return [{"i": i, "fail": i == 3} for i in (seeds if seeds is not None else range(6))]


def cpu_seconds(config: dict) -> float:
    return 0.2


def run(config: dict) -> dict:
    time.sleep(float(__import__("os").environ.get("SELFTEST_SLEEP", "0.2")))
    if config["fail"]:
        raise ValueError(f"run {config['i']} fails on purpose")
    return {"i": config["i"], "square": config["i"] ** 2}


def table(records: list[dict]) -> dict:
    return {"rows": sorted((r["row"] for r in records), key=lambda r: r["i"])}
