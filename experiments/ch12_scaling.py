"""Chapter 12, when attention wins: held-out loss against compute for GPTs of five sizes.

    python experiments/ch12_scaling.py                     # the whole sweep, seed 0, resumable
    python experiments/ch12_scaling.py --phase probe       # only the learning-rate probe
    python experiments/ch12_scaling.py --seeds 1 2 --sizes 0.8M --steps 600 1200
    python experiments/ch12_scaling.py --device cuda       # the same runs on a GPU
    python experiments/ch12_scaling.py --sizes 3.0M --table big.json   # a second process
    python experiments/ch12_scaling.py --merge big.json                # ... merged after

Chapter 12's GPT (character-level, context 128, batches of 16 windows, AdamW with a linear
warm-up over 50 steps and a cosine decay to a tenth, gradients clipped at 1) is trained on tiny
Shakespeare at five sizes (``SIZES``: 0.1 M to 3 M parameters outside the embeddings) and
five budgets (``STEPS``: 150 to 2,400 optimizer steps, each run with its own cosine schedule,
so every point of the sweep is a finished run, as in Hoffmann et al. 2022, not a point in the
middle of a longer one). Two phases:

* ``probe``: for each size, a short run (``PROBE_STEPS``) at each learning rate of ``LRS``
  (and twice the highest while the highest is best, up to ``MAX_LR``; half the lowest while
  the lowest is best, down to ``MIN_LR``), seed 0; the best one (lowest held-out bits) is that
  size's learning rate in the sweep.
* ``sweep``: every size x budget at its probed learning rate, for each ``--seeds``.
* ``test``: the crossover predicted from the small runs, then tested. The frontier of the
  sweep runs below ``FIT_BELOW`` FLOPs (held-out bits averaged over the seeds each has; a run
  is on the frontier if no cheaper run is lower) is fitted with ``L(C) = E + A (C/1e12)^-g``;
  the compute ``C*`` at which the fit reaches the 6-gram's bits is the prediction, written to
  the table once (``"prediction"``) and never refitted. The test trains the largest size on
  that frontier for the steps that spend ``C*`` (same learning rate), for each ``--seeds``.

Compute is counted as ``6 N D`` floating-point operations (Kaplan et al. 2020, section 2.1):
``N`` the parameters outside the embeddings and the position table, ``D`` the characters the
model was trained to predict (steps x batch x context). The CPU time of each run is recorded
too (``time.process_time``, whatever the machine; the table names the torch that ran it).

Held-out text: the last tenth of the play (``load_split("shakespeare")``), scored two ways,
both over the whole of it:

* ``window_start_bits``: consecutive windows of 128 characters, the chapter's figure: the
  prediction at window position ``t`` sees ``t + 1`` characters, so a window's first
  predictions have almost no context;
* ``sliding_bits``: windows that advance by half a context, each character scored once, from
  a window in which it has at least 64 characters before it (the first 64 of the text aside;
  ``d2lattn.sliding_window_losses``).

During a run, ``EVALS_PER_RUN`` evaluations on the first ``EVAL_WINDOWS`` windows record the
curve. Results go to ``book/data/ch12_scaling.json`` (chapter 12 reads it), one row per
(phase, size, lr, steps, seed); a run already in the table is skipped, so an interrupted sweep
resumes where it stopped. Runs go from the cheapest to the most expensive.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from d2lattn.gpt import (GPT, GPTConfig, held_out_losses, sliding_window_losses,  # noqa: E402
                         train_lm)
from d2lattn.scaling import (PowerLawFit, compute_frontier, fit_frontier,  # noqa: E402
                             training_flops)
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

TABLE = Path(__file__).resolve().parents[1] / "book" / "data" / "ch12_scaling.json"

#: name -> (num_layers, num_hiddens, num_heads); the feed-forward layer is 4x wider, as in the
#: chapter's model (which is "0.8M"). Names give the parameters outside the embeddings.
SIZES = {
    "0.1M": (2, 64, 4),
    "0.3M": (3, 96, 4),
    "0.8M": (4, 128, 4),
    "1.8M": (4, 192, 6),
    "3.0M": (5, 224, 7),
}
STEPS = [150, 300, 600, 1200, 2400]
BATCH_SIZE, BLOCK_SIZE, WARMUP = 16, 128, 50
LRS = [2e-3, 5e-3, 1e-2]
MAX_LR = 0.04  # the probe doubles past LRS while the best rate is the highest tried
MIN_LR = 2.5e-4  # ... and halves below LRS while the best rate is the lowest tried
PROBE_STEPS = 300
EVALS_PER_RUN = 6
EVAL_WINDOWS = 32
DROPOUT = 0.1  # the rate of the dropout phase
FIT_BELOW = 1.2e13  # the prediction sees only runs cheaper than this
NGRAM_JSON = Path(__file__).resolve().parents[1] / "book" / "data" / "ch12_ngram.json"


def make_config(size: str, vocab_size: int, dropout: float = 0.0) -> GPTConfig:
    layers, d, heads = SIZES[size]
    return GPTConfig(vocab_size=vocab_size, block_size=BLOCK_SIZE, num_hiddens=d,
                     num_heads=heads, num_layers=layers, ffn_num_hiddens=4 * d,
                     dropout=dropout)


def load_table() -> dict:
    if TABLE.exists():
        return json.loads(TABLE.read_text())
    return {"description": __doc__.split("\n")[0], "sizes": SIZES, "steps": STEPS,
            "batch_size": BATCH_SIZE, "block_size": BLOCK_SIZE, "warmup": WARMUP, "lrs": LRS,
            "probe_steps": PROBE_STEPS, "runs": []}


def save_table(table: dict) -> None:
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    table["runs"].sort(key=lambda r: (r["phase"], r["flops"], r["lr"], r["seed"]))
    tmp = TABLE.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(TABLE)


def key(run: dict) -> tuple:
    return (run["phase"], run["size"], run["lr"], run["steps"], run["seed"])


def frontier_fit(runs: list, metric: str = "window_start_bits",
                 below: float = FIT_BELOW) -> dict:
    """The frontier of the sweep runs cheaper than ``below`` (bits averaged over the seeds each
    (size, steps) has) and its power law, ``d2lattn.fit_frontier``."""
    groups: dict = {}
    for r in runs:
        if r["phase"] == "sweep" and r["flops"] < below:
            groups.setdefault((r["size"], r["steps"]), []).append(r)
    points = [(g[0]["flops"], sum(r[metric] for r in g) / len(g), size, steps, len(g))
              for (size, steps), g in sorted(groups.items())]
    frontier = [points[i] for i in compute_frontier([p[0] for p in points],
                                                    [p[1] for p in points])]
    fit = fit_frontier([p[0] for p in frontier], [p[1] for p in frontier])
    return {"metric": metric, "below": below, "E": fit.E, "A": fit.A, "g": fit.g,
            "scale": fit.scale,
            "frontier": [{"flops": p[0], "bits": round(p[1], 4), "size": p[2], "steps": p[3],
                          "seeds": p[4]} for p in frontier]}


def train_one(phase: str, size: str, lr: float, steps: int, seed: int, device: str,
              data: dict, checkpoint_dir: Path | None = None) -> dict:
    tok, train, held_out = data["tok"], data["train"], data["held_out"]
    torch.manual_seed(seed)
    dropout = DROPOUT if phase == "dropout" else 0.0
    model = GPT(make_config(size, len(tok), dropout)).to(device)
    N = model.num_parameters(non_embedding=True)  # N of 6ND
    every = max(1, steps // EVALS_PER_RUN)
    curve = []

    def record(step, model, loss):
        if step % every == 0 or step == steps:
            bits = held_out_losses(model, held_out, max_windows=EVAL_WINDOWS).mean().item()
            curve.append([step, round(bits, 4)])

    start = time.process_time()
    losses = train_lm(model, train, steps=steps, batch_size=BATCH_SIZE, lr=lr, warmup=WARMUP,
                      seed=seed, callback=record)
    cpu = time.process_time() - start
    D = steps * BATCH_SIZE * BLOCK_SIZE
    window_start = held_out_losses(model, held_out)  # (W, T) bits
    row = {
        "phase": phase, "size": size, "lr": lr, "steps": steps, "seed": seed,
        "dropout": dropout,
        "parameters": model.num_parameters(), "non_embedding_parameters": N,
        "characters": D, "flops": int(training_flops(N, D)), "passes": round(D / train.numel(), 3),
        "cpu_seconds": round(cpu, 1), "device": device, "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
        "final_train_loss_nats": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "held_out_curve": curve,
        "window_start_bits": round(window_start.mean().item(), 4),
        "window_start_bits_by_position": [round(x, 3) for x in window_start.mean(0).tolist()],
        "sliding_bits": round(sliding_window_losses(model, held_out).mean().item(), 4),
    }
    if checkpoint_dir is not None:  # float16 weights with their config, as chapter 12 ships
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.half() if v.is_floating_point() else v
                 for k, v in model.state_dict().items()}
        torch.save({"config": vars(model.config), "state_dict": state, "run": row},
                   checkpoint_dir / f"ch12_scaling_{size}_{steps}_seed{seed}.pt")
    return row


def main() -> None:
    global TABLE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase", choices=["probe", "sweep", "both", "test", "dropout"],
                        default="both")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--steps", type=int, nargs="+", default=STEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--max-flops", type=float, default=None,
                        help="skip sweep runs above this compute (6ND)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="save each trained model here (float16 weights and config)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", type=Path, default=TABLE,
                        help="where to write (default: the chapter's table); a separate file "
                             "lets two processes run at once, merged with --merge")
    parser.add_argument("--merge", type=Path, nargs="+",
                        help="add the runs of these tables to --table and exit")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    TABLE = args.table
    if args.merge:
        table = load_table()
        done = {key(r) for r in table["runs"]}
        for path in args.merge:
            other = json.loads(path.read_text())
            if "prediction" in other:
                table.setdefault("prediction", other["prediction"])
            for row in other["runs"]:
                if key(row) not in done:
                    table["runs"].append(row)
                    done.add(key(row))
        save_table(table)
        print(f"{TABLE.name}: {len(table['runs'])} runs")
        return

    split = load_split("shakespeare")
    tok = CharTokenizer(split.text)
    data = {"tok": tok, "train": tok.encode(split.train), "held_out": tok.encode(split.held_out)}
    table = load_table()
    done = {key(r) for r in table["runs"]}

    def flops_of(size, steps):
        layers, d, _ = SIZES[size]
        return 6 * 12 * layers * d * d * steps * BATCH_SIZE * BLOCK_SIZE  # approximate order

    def run(phase, size, lr, steps, seed):
        k = (phase, size, lr, steps, seed)
        if k in done:
            return
        row = train_one(phase, size, lr, steps, seed, args.device, data, args.checkpoint_dir)
        table["runs"].append(row)
        done.add(k)
        save_table(table)
        print(f"{phase} {size} lr {lr:g} steps {steps} seed {seed}: "
              f"{row['window_start_bits']:.3f} bits (sliding {row['sliding_bits']:.3f}), "
              f"{row['flops']:.2e} FLOPs, {row['cpu_seconds']:.0f} CPU-s", flush=True)

    if args.phase in ("probe", "both"):
        for size in sorted(args.sizes, key=lambda s: flops_of(s, PROBE_STEPS)):
            for lr in LRS:
                run("probe", size, lr, PROBE_STEPS, 0)
            while True:  # the best rate at an edge of the grid: try one step beyond it
                probes = [r for r in table["runs"] if r["phase"] == "probe" and r["size"] == size]
                best = min(probes, key=lambda r: r["window_start_bits"])["lr"]
                top = max(r["lr"] for r in probes)
                bottom = min(r["lr"] for r in probes)
                if best == top and top < MAX_LR:
                    run("probe", size, 2 * top, PROBE_STEPS, 0)
                elif best == bottom and bottom > MIN_LR:
                    run("probe", size, bottom / 2, PROBE_STEPS, 0)
                else:
                    break
    if args.phase in ("sweep", "both"):
        best_lr = {}
        for size in args.sizes:
            probes = [r for r in table["runs"] if r["phase"] == "probe" and r["size"] == size]
            if not probes:
                raise SystemExit(f"no probe for {size}: run --phase probe first")
            best_lr[size] = min(probes, key=lambda r: r["window_start_bits"])["lr"]
        jobs = [(flops_of(s, n), s, n, seed) for s in args.sizes for n in args.steps
                for seed in args.seeds]
        for flops, size, steps, seed in sorted(jobs):
            if args.max_flops is not None and flops > args.max_flops:
                continue
            run("sweep", size, best_lr[size], steps, seed)
    if args.phase == "dropout":  # the sweep's recipe with dropout DROPOUT, same rates
        for size in args.sizes:
            lr = min((r for r in table["runs"] if r["phase"] == "probe" and r["size"] == size),
                     key=lambda r: r["window_start_bits"])["lr"]
            for steps in args.steps:
                for seed in args.seeds:
                    run("dropout", size, lr, steps, seed)
    if args.phase == "test":
        if "prediction" not in table:
            ngram = json.loads(NGRAM_JSON.read_text())["corpora"]["shakespeare"]
            target = min(ngram["bits"].values())
            fit = frontier_fit(table["runs"])
            C = PowerLawFit(fit["E"], fit["A"], fit["g"], fit["scale"]).crossover(target)
            size = max(fit["frontier"], key=lambda p: p["flops"])["size"]
            N = next(r["non_embedding_parameters"] for r in table["runs"] if r["size"] == size)
            steps = round(C / (6 * N * BATCH_SIZE * BLOCK_SIZE))
            table["prediction"] = {
                "fit": fit, "ngram_bits": target, "crossover_flops": C, "size": size,
                "steps": steps, "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "sweep_runs_seen": sum(r["phase"] == "sweep" for r in table["runs"])}
            save_table(table)
        pred = table["prediction"]
        print(f"prediction: the GPT reaches the 6-gram's {pred['ngram_bits']} bits at "
              f"{pred['crossover_flops']:.3g} FLOPs; test: {pred['size']} for {pred['steps']} steps",
              flush=True)
        lr = min((r for r in table["runs"] if r["phase"] == "probe" and r["size"] == pred["size"]),
                 key=lambda r: r["window_start_bits"])["lr"]
        for seed in args.seeds:
            run("test", pred["size"], lr, pred["steps"], seed)


if __name__ == "__main__":
    main()
