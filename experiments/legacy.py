"""Once: the tables committed before the runner, cut into the runner's rows.

    python -m experiments.legacy NAME ...   # writes experiments/results/NAME.jsonl

Each function takes a chapter's committed table and returns its runs as (config, row) pairs, in
the order that makes the experiment's ``table`` give the committed table back, byte for byte
(``python -m experiments table NAME --check``). The rows carry the experiment's ``VERSION`` (so
that ``run`` skips them) and, as ``commit``, the last commit that changed the table. Kept as
the record of how the results files began; the runner never calls it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from experiments import runner


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


def gpt_variants(t):
    for r in t["runs"]:
        yield {"variant": r["variant"], "seed": r["seed"]}, r


def ch10_sweep(t):
    for name, m in t["models"].items():
        for i, seed in enumerate(t["seeds"]):
            row = {"params": m["params"], "cpu_seconds": m["cpu_seconds"][i],
                   "accuracy": m["accuracy"][i],
                   "accuracy, shifted 1 pixel right": m["accuracy, shifted 1 pixel right"][i]}
            if name == "vit":
                for part in ("explanations", "vit extras"):
                    row[part] = {k: v[i] for k, v in t[part].items()}
            yield {"model": name, "seed": seed}, row


def ch11_induction_sweep(t):
    for name in ("two_layer", "one_layer", "one_layer_big"):
        for r in t[name]:
            yield {"model": name, "seed": r["seed"]}, r


def ch7_bottleneck(t):
    yield {"legacy table fields": True}, {"complete": t["complete"]}
    for r in t["runs"]:  # one row per evaluated checkpoint, as the table keeps them
        yield {"kind": r["kind"], "hidden": r["hidden"], "checkpoints": [r["steps"]],
               "seed": r["seed"], **({"run": r["run"]} if "run" in r else {})}, r


def ch12_gpt(t):
    for r in t["rows"]:
        yield {"corpus": r["corpus"], "seed": r["seed"]}, r


def ch8_rnn_vs_transformer(t):
    from experiments import ch8_rnn_vs_transformer as ch8
    for key, values in t["validation_exact_match"].items():
        kind, lr = key.split()
        for seed, value in zip(t["tune_seeds"], values):
            yield ({"stage": "validation", "kind": kind, "lr": float(lr), "seed": seed,
                    "steps": t["steps"]}, {"exact_match": value})
    for kind, steps, positions in ch8.TESTS:
        name = ch8._name(kind, steps, positions)
        for seed, value in zip(t["test_seeds"][name], t["test_exact_match"][name]):
            yield ({"stage": "test", "kind": kind, "lr": t["chosen_rates"][kind], "seed": seed,
                    "steps": steps, "positions": positions}, {"exact_match": value})
    for key, losses in t["loss_curves"].items():
        kind, steps, _, seed = key.split()
        yield ({"stage": "curve", "kind": kind, "lr": t["chosen_rates"][kind],
                "seed": int(seed), "steps": int(steps)}, {"losses": losses})


def ch12_ngram(t):
    assert t["max_order"] == 8 and t["smoothings"] == ["kn", "mkn"]
    for name, row in t["corpora"].items():
        yield {"part": "ngrams", "corpus": name, "max_order": t["max_order"]}, row
    for name, row in t["checkpoints"].items():
        yield {"part": "checkpoints", "corpus": name, **row["chosen"]}, row


def ch16_sweep(t):
    # the table's "locality" entry describes a task the script had for a few minutes (its
    # runs became the point-cloud kinds "uniform" and "edgeconv"); no row has it
    yield {"legacy table fields": True}, {"locality": t["locality"]}
    for r in t["rows"]:
        config = {k: r[k] for k in ("task", "kind", "seed", "steps")}
        if r["task"] == "baseline":
            config.update(num_hiddens=r["num_hiddens"], lr=r["lr"])
        yield config, r


def ch12_scaling(t):
    from experiments import ch12_scaling as m
    assert (t["sizes"], t["steps"], t["lrs"], t["probe_steps"]) == (
        {k: list(v) for k, v in m.SIZES.items()}, m.STEPS, m.LRS, m.PROBE_STEPS)
    # the prediction was made once, from the sweep runs of its time: kept, never refitted
    yield {"legacy table fields": True}, {"prediction": t["prediction"]}
    for r in t["runs"]:
        yield {k: r[k] for k in ("phase", "size", "lr", "steps", "seed")}, r


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
                                    "torch": table.get("torch")
                                    or table.get("config", {}).get("torch")})


if __name__ == "__main__":
    for name in sys.argv[1:]:
        convert(name)
