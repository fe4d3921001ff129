"""Shared pytest set-up.

* Names available to the docstring examples in d2lattn.
* Each chapter's execution time under strict nbval, printed at the end of every run. A test run
  never modifies the checkout: the times are recorded in ``book/data/chapter_times.csv`` (the
  table of the book's execution report, a tracked file) only when the environment variable
  ``D2LATTN_RECORD_TIMES`` is ``1`` (``.ci/run`` sets it; a maintainer sets it to refresh the
  committed table). They go to the column ``quiet`` for an ordinary run, ``under load`` when
  ``D2LATTN_LOAD`` names the number of competing busy loops (``.ci/under-load`` sets it). A
  chapter's time is recorded only when all of its cells passed.
"""

from __future__ import annotations

import csv
import datetime
import os
from collections import defaultdict
from pathlib import Path

import pytest
import torch

TIMES_CSV = Path(__file__).parent / "book" / "data" / "chapter_times.csv"
#: Set to 1 to record the chapters' times in TIMES_CSV (tracked: a plain test run leaves it alone).
RECORD_VARIABLE = "D2LATTN_RECORD_TIMES"
FIELDS = ["chapter", "quiet (s)", "quiet: measured", "under load (s)", "under load: measured"]

_seconds: dict[str, float] = defaultdict(float)
_failed: set[str] = set()


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    import d2lattn

    doctest_namespace["torch"] = torch
    doctest_namespace.update({name: getattr(d2lattn, name) for name in d2lattn.__all__})
    torch.set_printoptions(precision=4)


def _notebook(nodeid: str) -> str | None:
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") else None


def pytest_runtest_logreport(report):
    notebook = _notebook(report.nodeid)
    if notebook is None:
        return
    _seconds[notebook] += report.duration  # setup (the kernel's start), call and teardown
    if report.failed:
        _failed.add(notebook)


def _record(times: dict[str, float]) -> None:
    load = os.environ.get("D2LATTN_LOAD", "").strip()
    column = "under load" if load not in ("", "0") else "quiet"
    where = f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs"
    if column == "under load":
        where += f", {load} busy loops"
    rows: dict[str, dict[str, str]] = {}
    if TIMES_CSV.exists():
        with TIMES_CSV.open(newline="") as f:
            rows = {row["chapter"]: row for row in csv.DictReader(f)}
    for notebook, seconds in times.items():
        chapter = Path(notebook).stem
        row = rows.setdefault(chapter, {field: "" for field in FIELDS} | {"chapter": chapter})
        row[f"{column} (s)"] = f"{seconds:.1f}"
        row[f"{column}: measured"] = where
    TIMES_CSV.parent.mkdir(parents=True, exist_ok=True)
    with TIMES_CSV.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        for chapter in sorted(rows, key=_chapter_order):
            writer.writerow(rows[chapter])


def _chapter_order(name: str) -> tuple[int, str]:
    digits = "".join(ch for ch in name.split("_", 1)[0] if ch.isdigit())
    return (int(digits) if digits else 10_000, name)


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    passed = {nb: s for nb, s in _seconds.items() if nb not in _failed and "/ch" in f"/{nb}"}
    terminalreporter.section("chapter execution times (strict nbval)")
    for notebook in sorted(_seconds, key=lambda nb: _chapter_order(Path(nb).stem)):
        status = "FAILED" if notebook in _failed else "passed"
        terminalreporter.write_line(f"{_seconds[notebook]:7.1f} s  {status}  {notebook}")
    where = TIMES_CSV.relative_to(Path(__file__).parent)
    if passed and os.environ.get(RECORD_VARIABLE, "").strip() == "1":
        _record(passed)
        terminalreporter.write_line(f"recorded in {where}")
    elif passed:
        terminalreporter.write_line(f"not recorded in {where} (set {RECORD_VARIABLE}=1 to record)")
