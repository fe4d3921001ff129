"""The experiments' runner (experiments/runner.py) on a local Ray cluster of 2 workers.

* every converted experiment's smoke grid gives the same rows on Ray as in-process
  (``--sequential``), timings aside;
* the committed tables are derived from the committed results byte for byte;
* a run that raises is recorded with its error and the sweep goes on;
* a runner killed mid-sweep loses no finished run, and a rerun completes the rest;
* Ray is started and stopped cleanly: no process of its session is left behind.

One cluster serves the whole module (starting Ray takes seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from experiments import runner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONVERTED = [n for n in runner.EXPERIMENTS if runner.is_experiment(runner.load(n))]


def session_processes(session_dir: str) -> list[int]:
    """The processes whose command line names the Ray session (raylet, GCS, workers)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if session_dir.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def cluster():
    runner.start_ray(2, None, "cpu")
    session = ray._private.worker._global_node.get_session_dir_path()
    assert ray.cluster_resources()["CPU"] == 2
    assert session_processes(session), "the cluster's processes are not where we look"
    yield
    ray.shutdown()
    deadline = time.time() + 30
    while session_processes(session) and time.time() < deadline:
        time.sleep(0.5)
    assert session_processes(session) == [], "Ray left processes behind"


def strip(record: dict, module) -> dict:
    """A row without its timings (``TIMING_KEYS``, or the experiment's own ``same_rows``)."""
    row = {k: v for k, v in record["row"].items() if k not in module.TIMING_KEYS}
    if hasattr(module, "same_rows"):  # rows with timings deeper inside
        return _Same(row, module)
    return row


class _Same:
    def __init__(self, row, module):
        self.row, self.module = row, module

    def __eq__(self, other):
        return self.module.same_rows(self.row, other.row)

    def __repr__(self):
        return repr(self.row)


@pytest.mark.parametrize("name", CONVERTED)
def test_smoke_on_ray_equals_sequential(name, cluster, tmp_path):
    module = runner.load(name)
    seq, par = tmp_path / "sequential.jsonl", tmp_path / "ray.jsonl"
    runner.execute(name, smoke=True, sequential=True, out=seq, log=lambda *a: None)
    counts = runner.execute(name, smoke=True, workers=2, out=par, log=lambda *a: None)
    assert counts["failed"] == 0 and counts["done"] == len(module.grid(smoke=True)) > 0
    a = {runner.key(r["config"]): strip(r, module) for r in runner.read_results(seq)}
    b = {runner.key(r["config"]): strip(r, module) for r in runner.read_results(par)}
    assert a == b
    assert {r["host"] for r in runner.read_results(par)}  # made by Ray's workers
    module.table(runner.latest_rows(runner.read_results(par)))  # the table builds from them


@pytest.mark.parametrize("name", [n for n in CONVERTED if runner.load(n).TABLE])
def test_committed_table_derived_exactly(name):
    module = runner.load(name)
    text = runner.dump_table(module, runner.build_table(name))
    assert text == Path(module.TABLE).read_text(encoding="utf-8")


def test_failing_run_recorded_on_ray(cluster, tmp_path):
    out = tmp_path / "selftest.jsonl"
    counts = runner.execute("selftest", workers=2, out=out, log=lambda *a: None)
    assert counts == {"planned": 6, "skipped": 0, "done": 5, "failed": 1}
    records = runner.read_results(out)
    failed = [r for r in records if "error" in r]
    assert [r["config"]["i"] for r in failed] == [3]
    assert failed[0]["error"] == "ValueError: run 3 fails on purpose"
    # a rerun skips the 5 rows and tries the failed run again
    counts = runner.execute("selftest", sequential=True, out=out, log=lambda *a: None)
    assert counts == {"planned": 6, "skipped": 5, "done": 0, "failed": 1}


def test_kill_and_resume(tmp_path):
    out = tmp_path / "selftest.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SELFTEST_SLEEP": "1.0"}
    cmd = [sys.executable, "-m", "experiments", "run", "selftest",
           "--seeds", *map(str, range(4, 16)), "--sequential", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while len(runner.read_results(out)) < 3 and time.time() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    before = runner.read_results(out)
    assert 3 <= len(before) < 12, "the runner was not killed mid-sweep"
    env["SELFTEST_SLEEP"] = "0"
    subprocess.run(cmd, cwd=ROOT, env=env, check=False, capture_output=True)
    after = runner.read_results(out)
    assert after[:len(before)] == before  # nothing finished was lost or made again
    keys = [runner.key(r["config"]) for r in after]
    assert len(keys) == len(set(keys)) == 12


def test_results_file_survives_a_cut_line(tmp_path):
    out = tmp_path / "r.jsonl"
    runner.append_result(out, {"experiment": "x", "config": {"a": 1}, "row": {}})
    with open(out, "a") as f:
        f.write('{"experiment": "x", "config": {"a"')  # a kill in the middle of a write
    assert len(runner.read_results(out)) == 1
    runner.append_result(out, {"experiment": "x", "config": {"a": 2}, "row": {}})
    assert [r["config"]["a"] for r in runner.read_results(out)] == [1, 2]
