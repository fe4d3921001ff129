"""The runner behind ``python -m experiments``: every sweep of the book as Ray tasks.

An experiment is a module of this package that declares

* ``grid(seeds=None, smoke=False) -> list[dict]``: its runs, each a small JSON-able config
  (model, size, seed, budget, ...); ``seeds`` replaces the default seeds, ``smoke`` gives a few
  runs with tiny budgets that finish in seconds; a grid that also takes ``where`` (the
  ``--where`` filter) may offer runs outside its default grid when asked for them;
* ``run(config) -> dict``: one run, with nothing global (it seeds what it draws);
* ``table(records) -> dict``: the chapter's table, derived from the results (each record has
  the run's ``config`` and ``row``, in the order of the results file);
* ``TABLE``: the chapter's table in ``book/data``; ``INDENT``: how that file is indented;
* ``cpu_seconds(config) -> float``: an estimate of one run's CPU time (one thread);
* ``TIMING_KEYS``: the keys of a row that measure time (left out when two rows are compared);
* optionally ``covered(config, rows) -> bool``: whether the rows made already hold what the
  run would make (chapter 7: a budget curve whose checkpoints other runs evaluated);
* optionally ``same_rows(a, b) -> bool``: two rows equal but for their timings;
* ``VERSION``: the code version of its rows, bumped when a change alters what a run computes.

Results live in ``experiments/results/NAME.jsonl``, one JSON object per line::

    {"experiment": NAME, "config": {...}, "code": VERSION, "commit": ..., "row": {...},
     "cpu_seconds": ..., "wall_seconds": ..., "finished": ..., "host": ..., "device": ...,
     "torch": ...}

or, for a run that raised, ``"error": "ValueError: ..."`` instead of ``row``. A line is
appended (and flushed to disk) the moment its run finishes; a rerun skips every config that
already has a row made by the same code version, so an interrupted sweep resumes where it
stopped and loses at most the runs that were in flight. The code version is the module's
``VERSION``, which whoever changes what a run computes bumps (then every run is made again);
each record also names the git commit of the checkout that made it (``commit``; rows converted
from the tables committed before this runner name the last commit of their table). The table
takes, for each config, its last row in the file.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

#: the experiments, in the book's order (module names in this package)
EXPERIMENTS = ["ch7_bottleneck", "ch8_positions", "ch8_rnn_vs_transformer", "ch10_sweep",
               "ch11_induction_sweep", "ch12_gpt", "ch12_mlm", "ch12_tang_seeds",
               "ch12_lr_sweep", "ch12_ngram", "ch12_scaling", "gpt_variants",
               "ch14_icl_fresh_seeds", "ch16_sweep", "ch17_sparse"]


def load(name: str) -> ModuleType:
    """The experiment module ``name`` (a name of this package, or a dotted module path)."""
    return importlib.import_module(name if "." in name else f"experiments.{name}")


def is_experiment(module: ModuleType) -> bool:
    return all(hasattr(module, f) for f in ("grid", "run", "table"))


def key(config: dict) -> str:
    """The canonical text of a config: equal configs give equal keys."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def code_version(module: ModuleType) -> str:
    """The experiment's ``VERSION`` (bumped by whoever changes what a run computes), else the
    first 12 hex digits of the SHA-256 of the module's source file."""
    if hasattr(module, "VERSION"):
        return str(module.VERSION)
    return hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()[:12]


def git_commit() -> str:
    """The checkout's commit, with ``+`` when it has uncommitted changes (provenance only)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True).stdout.strip()
        return head + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def results_path(name: str) -> Path:
    return RESULTS / f"{name.rsplit('.', 1)[-1]}.jsonl"


def read_results(path: Path) -> list[dict]:
    """The records of a results file; a last line cut short by a kill is ignored."""
    if not path.exists():
        return []
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON") from None
    return records


def append_result(path: Path, record: dict) -> None:
    """Append one record as a line, flushed to disk before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell():  # a last line cut short by a kill: drop it
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.seek(0)
                f.truncate(f.read().rfind(b"\n") + 1)
        f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def latest_rows(records: list[dict], name: str | None = None) -> list[dict]:
    """For each config, its last successful record, in the order the configs first appear."""
    last: dict[str, dict] = {}
    for r in records:
        if "row" in r and (name is None or r["experiment"] == name):
            k = key(r["config"])
            last.pop(k, None)  # keep the order of the last row
            last[k] = r
    # order: the position of each config's last record
    return list(last.values())


def header(records: list[dict]) -> tuple[dict, list[dict]]:
    """Split off the fields of a committed table that no run gives (a legacy record whose
    config is ``{"legacy table fields": true}``, see legacy.py) from the runs' records."""
    fields, runs = {}, []
    for r in records:
        if r["config"] == {"legacy table fields": True}:
            fields.update(r["row"])
        else:
            runs.append(r)
    return fields, runs


def torch_version(records: list[dict], default: str | None = None) -> str | None:
    """The torch version of the records' runs (the last one's, if they differ)."""
    versions = [r["torch"] for r in records if r.get("torch")]
    return versions[-1] if versions else default


def build_table(name: str, path: Path | None = None) -> dict:
    module = load(name)
    short = name.rsplit(".", 1)[-1]
    return module.table(latest_rows(read_results(path or results_path(short)), short))


def dump_table(module: ModuleType, table: dict) -> str:
    if hasattr(module, "dump"):
        return module.dump(table)
    indent = getattr(module, "INDENT", 1)
    return json.dumps(table, indent=indent, ensure_ascii=getattr(module, "ASCII", True)) + "\n"


def run_one(name: str, config: dict, threads: int = 1, device: str = "cpu") -> dict:
    """One run, in this process: ``{"row": ...}`` or ``{"error": ...}``, with its times."""
    import torch
    torch.set_num_threads(threads)
    module = load(name)
    os.environ["EXPERIMENTS_DEVICE"] = device  # read by run() through device()
    wall, cpu = time.perf_counter(), time.process_time()
    out: dict = {}
    try:
        out["row"] = module.run(config)
    except Exception as e:  # recorded, and the sweep goes on
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc(limit=-4)
    out["cpu_seconds"] = round(time.process_time() - cpu, 2)
    out["wall_seconds"] = round(time.perf_counter() - wall, 2)
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["host"] = socket.gethostname()
    out["device"] = device
    out["torch"] = torch.__version__
    return out


def device() -> str:
    """The device the runner was asked for (``--device``): "cpu" unless told otherwise."""
    return os.environ.get("EXPERIMENTS_DEVICE", "cpu")


def _ray_task(name: str, config: dict, threads: int, device: str) -> dict:
    return run_one(name, config, threads, device)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fixed_agent_ports() -> None:
    """Give the local node's agents their ports up front, and tell the raylet at once.

    Otherwise the raylet waits at most 15 s for the agents (Python processes) to report the
    ports they chose, and aborts the start on a loaded machine (ray-project/ray#65983). The
    agents bind the same ports when they are up, and write the same port files again."""
    from ray import _raylet
    from ray._private import parameter, services
    if getattr(services.start_raylet, "_fixed_ports", False):
        return
    init, start_raylet = parameter.RayParams.__init__, services.start_raylet
    names = {"metrics_agent_port": _raylet.METRICS_AGENT_PORT_NAME,
             "dashboard_agent_listen_port": _raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME,
             "runtime_env_agent_port": _raylet.RUNTIME_ENV_AGENT_PORT_NAME,
             "metrics_export_port": _raylet.METRICS_EXPORT_PORT_NAME}

    def params(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for name in names:
            if not getattr(self, name, None):
                setattr(self, name, _free_port())

    def raylet(*args, **kwargs):
        bound = inspect.signature(start_raylet).bind(*args, **kwargs).arguments
        for name, port_name in names.items():
            if bound.get(name):
                _raylet.persist_port(bound["session_dir"], bound["node_id"], port_name,
                                     bound[name])
        return start_raylet(*args, **kwargs)

    raylet._fixed_ports = True
    parameter.RayParams.__init__, services.start_raylet = params, raylet


def start_ray(workers: int, address: str | None, device: str):
    """An embedded local cluster of ``workers`` CPUs, or the cluster at ``address``."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ["OMP_NUM_THREADS"] = "1"  # the workers start with one thread each
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    import ray
    kw = dict(include_dashboard=False, log_to_driver=True, logging_level="WARNING")
    if address:  # a real cluster: ship this checkout (code and book/data) to every worker
        ray.init(address=address, runtime_env={
            "working_dir": str(ROOT),
            "excludes": [".git/", "_build/", "locale/", "experiments/results/",
                         "book/*.ipynb", "tests/", "__pycache__/"],
            "env_vars": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}}, **kw)
    else:
        _fixed_agent_ports()
        ray.init(num_cpus=workers, **kw)  # Ray finds the local GPUs itself
    return ray


def execute(name: str, *, seeds=None, smoke=False, workers=None, address=None,
            device="cpu", gpus_per_run=1.0, sequential=False, out: Path | None = None,
            threads=1, where: dict | None = None, log=print) -> dict:
    """Run every config of the grid that has no row from this code version yet.

    Returns counts: ``{"planned", "skipped", "done", "failed"}``."""
    module = load(name)
    short = name.rsplit(".", 1)[-1]
    out = Path(out) if out else results_path(short)
    code, commit = code_version(module), git_commit()
    # a grid may take ``where`` to offer runs outside its default grid (ch12_scaling's dropout)
    offers = "where" in inspect.signature(module.grid).parameters
    configs = [c for c in module.grid(seeds=seeds, smoke=smoke,
                                      **({"where": where} if offers else {}))
               if all(str(c.get(k)) == str(v) for k, v in (where or {}).items())]
    done = [r for r in read_results(out)
            if "row" in r and r.get("code") == code and r["experiment"] == short]
    done_keys = {key(r["config"]) for r in done}
    covered = getattr(module, "covered", lambda config, rows: False)
    todo = [c for c in configs
            if key(c) not in done_keys and not covered(c, [r["row"] for r in done])]
    counts = {"planned": len(configs), "skipped": len(configs) - len(todo), "done": 0,
              "failed": 0}
    log(f"{short}: {len(configs)} runs, {counts['skipped']} already in {out.name}, "
        f"{len(todo)} to run ({'sequential' if sequential else 'Ray'})")

    def record(config, result):
        rec = {"experiment": short, "config": config, "code": code, "commit": commit, **result}
        if "error" in rec:
            counts["failed"] += 1
            log(f"  FAILED {key(config)}: {rec['error']}")
        else:
            counts["done"] += 1
            log(f"  done {key(config)} ({rec['cpu_seconds']} CPU s)")
        append_result(out, rec)

    if sequential or not todo:
        for config in todo:
            record(config, run_one(module.__name__, config, threads, device))
        return counts
    import ray
    own = not ray.is_initialized()  # a cluster this process already joined is reused
    if own:
        start_ray(workers or os.cpu_count() or 1, address, device)
    previous = signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        task = ray.remote(_ray_task).options(
            num_cpus=threads, num_gpus=gpus_per_run if device != "cpu" else 0, max_retries=0)
        pending = {task.remote(module.__name__, c, threads, device): c for c in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                config = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as e:  # the worker died (killed, out of memory)
                    result = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
                record(config, result)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if own:
            ray.shutdown()
    return counts


def script(name: str) -> None:
    """``python experiments/NAME.py ARGS`` is ``python -m experiments run NAME ARGS``."""
    sys.path.insert(0, str(ROOT))
    from experiments.__main__ import main
    sys.exit(main(["run", name, *sys.argv[1:]]))
