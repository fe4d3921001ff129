"""Chapter 16's comparisons over seeds: point clouds, sets and graphs.

    python experiments/ch16_sweep.py                         # seeds 0-4, every task
    python experiments/ch16_sweep.py --seeds 5 6 7 8 9       # fresh seeds, added to the table
    python experiments/ch16_sweep.py --tasks graphs          # one task

Writes ``book/data/ch16_sweep.json`` (rows of the seeds run are replaced, others kept; a row
already there is skipped, so an interrupted sweep resumes) and, for seed 0, the point-cloud
models' weights ``book/data/ch16_pointcloud_<kind>.pt`` (float32, a few hundred KB in all),
which the chapter loads. One thread; the CPU time of every run is recorded.

* ``pointclouds``: :class:`d2lattn.PointCloudClassifier` of each kind (no attention, scalar,
  vector, the ablation scalar over neighbours, and the two local models without attention:
  ``"uniform"``, the vector model with uniform weights over the same neighbours, and
  ``"edgeconv"``, DGCNN's EdgeConv over them) trained on 2,000 generated clouds (32 to 64 points, five families, random rotation,
  scale and noise; seed 0 of the data, the same for every model seed) for ``PC_STEPS`` steps;
  the baseline without attention also for 4x the steps. Test accuracy on 500 clouds of data
  seed 1, and on four variations the models never saw (``ROBUSTNESS``); rows written since the
  locality ablation also carry the accuracy on the validation set (500 clouds of data seed 2)
  and the per-cloud test verdicts (``test_correct``, a string of 0/1). ``--kinds`` runs a
  subset of the kinds.
* ``baseline``: the model without attention tuned as hard as the others were not: for seed 0,
  widths ``BASELINE_WIDTHS`` x learning rates ``BASELINE_LRS`` at 4x the steps, chosen on a
  validation set (500 clouds of data seed 2, never the test set); then the chosen width and rate
  for every seed of ``--seeds`` (rows with ``num_hiddens`` and ``lr``).
* ``sets``: :class:`d2lattn.SetRegressor` of each kind (DeepSets, SAB, ISAB) regressing the
  largest distance between the points of a set (8 to 32 points in the square [-1, 1]^2; the model
  predicts the diameter standardised by the training set's mean and standard deviation), for
  ``SET_STEPS`` steps (DeepSets also 4x); test mean absolute error on 1,000 sets.
* ``graphs``: :class:`d2lattn.GraphNodeClassifier` of each kind (MLP, GCN, GAT, Transformer)
  on a stochastic block model of 300 nodes (3 communities; a new graph per seed), 10 labelled
  nodes per community, 200 epochs; accuracy on the 200 nodes outside the first 100 of a
  seeded permutation.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from d2lattn.graphs import GraphNodeClassifier, make_block_graph, train_node_classifier  # noqa: E402
from d2lattn.pointcloud import SHAPES, PointCloudClassifier, make_point_clouds  # noqa: E402
from d2lattn.sets import SetRegressor, make_diameter_sets, train_set_model  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "book" / "data"
TABLE = DATA / "ch16_sweep.json"

PC_DATA = dict(min_points=32, max_points=64, noise=0.02)
PC_MODEL = dict(num_hiddens=32, num_layers=2, num_heads=4, k=12)
PC_STEPS, PC_BATCH, PC_LR = 1200, 32, 3e-3
#: name -> the changes to PC_DATA of a test set the models never trained on
ROBUSTNESS = {
    "fewer points (16-24)": dict(min_points=16, max_points=24),
    "more points (128-192)": dict(min_points=128, max_points=192),
    "5 outliers": dict(outliers=5),
    "3x the noise": dict(noise=0.06),
}
SET_DATA = dict(min_size=8, max_size=32)
SET_MODEL = dict(num_hiddens=32, num_heads=4, num_layers=2, num_inducing=8)
SET_STEPS, SET_BATCH, SET_LR = 1000, 64, 2e-3
GRAPH = dict(num_nodes=300, num_blocks=3, p_in=0.05, p_out=0.005, feature_noise=2.0)
GRAPH_LABELS_PER_CLASS, GRAPH_EPOCHS = 10, 200
BASELINE_WIDTHS, BASELINE_LRS = (32, 64, 128), (1e-3, 3e-3, 1e-2)
CURVE_STEPS = 50  # the first training losses recorded in full, for the chapter's live check


def point_cloud_data():
    train = make_point_clouds(2000, seed=0, **PC_DATA)
    test = {"test": make_point_clouds(500, seed=1, **PC_DATA)}
    for name, change in ROBUSTNESS.items():
        test[name] = make_point_clouds(500, seed=1, **{**PC_DATA, **change})
    return train, test, make_point_clouds(500, seed=2, **PC_DATA)  # the last: validation


@torch.no_grad()
def accuracy(model, clouds) -> float:
    logits = model(clouds.points, clouds.valid_lens)
    return float((logits.argmax(-1) == clouds.labels).float().mean())


def run_point_clouds(kind: str, seed: int, steps: int, data, *,
                     num_hiddens: int | None = None, lr: float | None = None,
                     validation=None) -> dict:
    train, tests, validation = data if len(data) == 3 else (*data, validation)
    torch.manual_seed(seed)
    config = {**PC_MODEL, "num_hiddens": num_hiddens or PC_MODEL["num_hiddens"]}
    model = PointCloudClassifier(kind, len(SHAPES), **config)
    start = time.process_time()
    losses = train_set_model(model, train.points, train.valid_lens, train.labels, steps=steps,
                             batch_size=PC_BATCH, lr=lr or PC_LR, seed=seed)
    cpu = time.process_time() - start
    row = {"task": "pointclouds", "kind": kind, "seed": seed, "steps": steps,
           "parameters": sum(p.numel() for p in model.parameters()),
           "cpu_seconds": round(cpu, 1), "first_losses": [round(x, 4) for x in
                                                           losses[:CURVE_STEPS]],
           "final_loss": round(sum(losses[-50:]) / 50, 4),
           "accuracy": {name: round(accuracy(model, c), 4) for name, c in tests.items()}}
    if num_hiddens is not None:  # a tuned-baseline row
        row.update(num_hiddens=num_hiddens, lr=lr)
        if validation is not None:
            row["validation_accuracy"] = round(accuracy(model, validation), 4)
        return row
    if validation is not None:
        row["validation_accuracy"] = round(accuracy(model, validation), 4)
        with torch.no_grad():
            test = tests["test"]
            correct = (model(test.points, test.valid_lens).argmax(-1) == test.labels).tolist()
        row["test_correct"] = "".join("1" if c else "0" for c in correct)
    if seed == 0 and steps == PC_STEPS:
        torch.save(model.state_dict(), DATA / f"ch16_pointcloud_{kind}.pt")
    return row


def run_sets(kind: str, seed: int, steps: int, data) -> dict:
    (P, lens, y), (Pt, lt, yt) = data
    mean, std = y.mean(), y.std()  # the model predicts standardised diameters
    torch.manual_seed(seed)
    model = SetRegressor(kind, 2, **SET_MODEL)
    start = time.process_time()
    losses = train_set_model(model, P, lens, (y - mean) / std, steps=steps,
                             batch_size=SET_BATCH, lr=SET_LR, seed=seed, loss="mse")
    cpu = time.process_time() - start
    with torch.no_grad():
        mae = float((model(Pt, lt) * std + mean - yt).abs().mean())
    return {"task": "sets", "kind": kind, "seed": seed, "steps": steps,
            "parameters": sum(p.numel() for p in model.parameters()),
            "cpu_seconds": round(cpu, 1),
            "first_losses": [round(x, 5) for x in losses[:CURVE_STEPS]],
            "test_mae": round(mae, 5), "mean_predictor_mae": round(float(
                (yt - y.mean()).abs().mean()), 5)}


def graph_split(seed: int):
    X, A, y = make_block_graph(seed=seed, **GRAPH)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    train = torch.cat([perm[y[perm] == c][:GRAPH_LABELS_PER_CLASS]
                       for c in range(GRAPH["num_blocks"])])
    test = perm[100:]
    test = test[~torch.isin(test, train)]
    return X, A, y, train, test


def run_graphs(kind: str, seed: int) -> dict:
    X, A, y, train, test = graph_split(seed)
    torch.manual_seed(seed)
    model = GraphNodeClassifier(kind, X.shape[1], GRAPH["num_blocks"])
    start = time.process_time()
    losses = train_node_classifier(model, X, A, y, train, steps=GRAPH_EPOCHS)
    cpu = time.process_time() - start
    with torch.no_grad():
        acc = float((model(X, A).argmax(-1)[test] == y[test]).float().mean())
    return {"task": "graphs", "kind": kind, "seed": seed, "steps": GRAPH_EPOCHS,
            "cpu_seconds": round(cpu, 1), "final_loss": round(losses[-1], 4),
            "accuracy": round(acc, 4), "edges": int(A.sum()) // 2, "test_nodes": len(test)}


def key(r: dict) -> tuple:
    return (r["task"], r["kind"], r["seed"], r["steps"], r.get("num_hiddens"), r.get("lr"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--tasks", nargs="+", default=["graphs", "sets", "pointclouds",
                                                       "baseline"],
                        choices=["graphs", "sets", "pointclouds", "baseline"])
    parser.add_argument("--kinds", nargs="+", default=list(PointCloudClassifier.KINDS),
                        choices=PointCloudClassifier.KINDS,
                        help="the point-cloud kinds to run (default: all)")
    parser.add_argument("--table", type=Path, default=TABLE,
                        help="where to write (default: the chapter's table); a separate file "
                             "lets two processes run at once, merged with --merge")
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="add the rows of these tables to --table and exit")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table_path = args.table
    table = json.loads(table_path.read_text()) if table_path.exists() else {"rows": []}
    if args.merge:
        merged = {key(r): r for r in table["rows"]}
        for path in args.merge:
            merged.update({key(r): r for r in json.loads(path.read_text())["rows"]})
        table["rows"] = sorted(merged.values(),
                               key=lambda r: (r["task"], r["kind"], r["steps"], r["seed"],
                                              r.get("num_hiddens") or 0, r.get("lr") or 0))
        table_path.write_text(json.dumps(table, indent=1) + "\n")
        return
    table.update({"pointclouds": {"data": PC_DATA, "model": PC_MODEL, "steps": PC_STEPS,
                                  "batch_size": PC_BATCH, "lr": PC_LR,
                                  "robustness": ROBUSTNESS, "shapes": list(SHAPES)},
                  "sets": {"data": SET_DATA, "model": SET_MODEL, "steps": SET_STEPS,
                           "batch_size": SET_BATCH, "lr": SET_LR},
                  "graphs": {"graph": GRAPH, "labels_per_class": GRAPH_LABELS_PER_CLASS,
                             "epochs": GRAPH_EPOCHS},
                  "baseline": {"widths": BASELINE_WIDTHS, "lrs": BASELINE_LRS,
                               "steps": 4 * PC_STEPS, "validation": "500 clouds, data seed 2"},
                  "torch": torch.__version__})
    done = {key(r) for r in table["rows"]}

    def save(row):
        table["rows"].append(row)
        done.add(key(row))
        table["rows"].sort(key=lambda r: (r["task"], r["kind"], r["steps"], r["seed"],
                                          r.get("num_hiddens") or 0, r.get("lr") or 0))
        table_path.write_text(json.dumps(table, indent=1) + "\n")
        print({k: v for k, v in row.items() if k not in ("first_losses", "test_correct")},
              flush=True)

    jobs = []
    for seed in args.seeds:
        if "graphs" in args.tasks:
            jobs += [("graphs", k, seed, GRAPH_EPOCHS) for k in GraphNodeClassifier.KINDS]
        if "sets" in args.tasks:
            jobs += [("sets", k, seed, SET_STEPS) for k in SetRegressor.KINDS]
            jobs += [("sets", "deepsets", seed, 4 * SET_STEPS)]
        if "pointclouds" in args.tasks:
            jobs += [("pointclouds", k, seed, PC_STEPS) for k in args.kinds]
            if "pointnet" in args.kinds:
                jobs += [("pointclouds", "pointnet", seed, 4 * PC_STEPS)]
    order = {"graphs": 0, "sets": 1, "pointclouds": 2}
    jobs.sort(key=lambda j: (order[j[0]], args.seeds.index(j[2])))  # seeds in the order given
    pc_data = set_data = None
    for task, kind, seed, steps in jobs:
        if (task, kind, seed, steps, None, None) in done:
            continue
        if task == "graphs":
            save(run_graphs(kind, seed))
        elif task == "sets":
            if set_data is None:
                set_data = (make_diameter_sets(4000, seed=0, **SET_DATA),
                            make_diameter_sets(1000, seed=1, **SET_DATA))
            save(run_sets(kind, seed, steps, set_data))
        else:
            if pc_data is None:
                pc_data = point_cloud_data()
            save(run_point_clouds(kind, seed, steps, pc_data))
    if "baseline" in args.tasks:
        pc_data = pc_data or point_cloud_data()
        validation = pc_data[2]
        for width in BASELINE_WIDTHS:
            for lr in BASELINE_LRS:
                if ("baseline", "pointnet", 0, 4 * PC_STEPS, width, lr) not in done:
                    save({**run_point_clouds("pointnet", 0, 4 * PC_STEPS, pc_data[:2],
                                             num_hiddens=width, lr=lr, validation=validation),
                          "task": "baseline"})
        probes = [r for r in table["rows"] if r["task"] == "baseline" and r["seed"] == 0]
        best = max(probes, key=lambda r: r["validation_accuracy"])
        for seed in args.seeds:
            if ("baseline", "pointnet", seed, 4 * PC_STEPS, best["num_hiddens"],
                    best["lr"]) not in done:
                save({**run_point_clouds("pointnet", seed, 4 * PC_STEPS, pc_data[:2],
                                         num_hiddens=best["num_hiddens"], lr=best["lr"],
                                         validation=validation), "task": "baseline"})


if __name__ == "__main__":
    main()
