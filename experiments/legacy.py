"""Once: the tables committed before the runner, cut into the runner's rows.

    python -m experiments.legacy NAME ...   # writes experiments/results/NAME.jsonl

Each function takes a chapter's committed table and returns its runs as (config, row) pairs, in
the order that makes the experiment's ``table`` give the committed table back, byte for byte
(``python -m experiments table NAME --check``). The rows carry the experiment's ``VERSION`` (so
that ``run`` skips them) and, as ``commit``, the last commit that changed the table. Kept as the record of how the
results files began; the runner never calls it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from experiments import runner


#: the torch version of tables that do not name it (that of the repository's other tables)
TORCH = {}


def ch8_positions(t):
    from experiments.ch8_positions import SETTINGS
    for name, entry in t["settings"].items():
        assert {k: entry[k] for k in ("num_hiddens", "num_layers", "steps")} == {
            k: SETTINGS[name][k] for k in ("num_hiddens", "num_layers", "steps")}
        for seed in entry["seeds"]:
            for e in t["encodings"]:
                yield ({"setting": name, "num_hiddens": entry["num_hiddens"],
                        "num_layers": entry["num_layers"], "steps": entry["steps"],
                        "seed": seed, "encoding": e},
                       {"accuracy": entry["accuracy"][e][str(seed)]})


def ch12_lr_sweep(t):
    yield {"legacy table fields": True}, {
        "cpu_seconds_last_invocation": t["cpu_seconds_last_invocation"]}
    for r in t["runs"]:
        yield {"seed": r["seed"], "lr": r["lr"], "recipe": r["recipe"], "steps": t["steps"]}, r


def ch12_mlm(t):
    for r in t["rows"]:
        yield {"seed": r["seed"]}, r


def ch12_tang_seeds(t):
    for r in t["rows"]:
        yield {"seed": r["seed"]}, r


def convert(name: str) -> None:
    module = runner.load(name)
    table = json.loads(module.TABLE.read_text(encoding="utf-8"))
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(module.TABLE)],
                            capture_output=True, text=True, cwd=runner.ROOT).stdout.strip()
    path = runner.results_path(name)
    path.unlink(missing_ok=True)
    for config, row in globals()[name](table):
        runner.append_result(path, {"experiment": name, "config": config,
                                    "code": runner.code_version(module), "commit": commit,
                                    "row": row,
                                    "torch": table.get("torch", TORCH.get(name))})


if __name__ == "__main__":
    for name in sys.argv[1:]:
        convert(name)
