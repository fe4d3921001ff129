"""Chapter 12, when attention wins: held-out loss against compute for GPTs of five sizes.

    python -m experiments run ch12_scaling                     # the book's 100 runs, ~5 CPU-hours
    python -m experiments run ch12_scaling --where phase=probe # only the learning-rate probe
    python -m experiments run ch12_scaling --where phase=sweep size=0.8M --seeds 3 4
    python -m experiments run ch12_scaling --where phase=dropout   # the dropout phase (not run)
    python -m experiments run ch12_scaling --where phase=mkn_test  # the MKN-7 crossover, tested
    python -m experiments run ch12_scaling --device cuda       # the same runs on a GPU
    python -m experiments table ch12_scaling --out book/data/ch12_scaling.json

Chapter 12's GPT (character-level, context 128, batches of 16 windows, AdamW with a linear
warm-up over 50 steps and a cosine decay to a tenth, gradients clipped at 1) is trained on tiny
Shakespeare at five sizes (``SIZES``: 0.1 M to 3 M parameters outside the embeddings) and
five budgets (``STEPS``: 150 to 2,400 optimizer steps, each run with its own cosine schedule,
so every point of the sweep is a finished run, as in Hoffmann et al. 2022, not a point in the
middle of a longer one). The grid is four phases, each a product of its own (a config:
``phase``, ``size``, ``lr``, ``steps``, ``seed``):

* ``probe``: for each size, a short run (``PROBE_STEPS``) at each learning rate of
  ``PROBE_LRS[size]``, seed 0: those of ``LRS``, and twice the highest while the highest was
  best, up to ``MAX_LR``; half the lowest while the lowest was best, down to ``MIN_LR``. The
  best one (lowest held-out bits) is that size's learning rate, ``LR[size]``. ``table``
  refuses a finished probe whose best rate is at an edge it may still extend (then add the
  rate it names to ``PROBE_LRS``), and runs of the other phases at another rate than the
  probe's (then set ``LR``).
* ``sweep``: every size x budget at its rate, seeds 0-2 (``SWEEP_SEEDS``; the book's table has
  one seed for 1.8M and 3.0M at 600 and 1,200 steps, far from the frontier, and six for the
  chapter's 0.8M at 2,400); ``--seeds`` gives every size x budget those seeds.
* ``test``: the crossover predicted from the small runs, then tested. The frontier of the
  sweep runs below ``FIT_BELOW`` FLOPs (held-out bits averaged over the seeds each has; a run
  is on the frontier if no cheaper run is lower) is fitted with ``L(C) = E + A (C/1e12)^-g``;
  the compute ``C*`` at which the fit reaches the 6-gram's bits is the prediction, made once
  and never refitted: the book's (made from the first 61 sweep runs) is kept with the results
  as a field of the committed table. The test trains the largest size on that frontier for the
  steps that spend ``C*`` (``PREDICTION``; same learning rate), seeds 1-10 (``TEST_SEEDS``).
  Without a stored prediction, ``table`` fits the sweep rows there are, and refuses test runs
  of another size or budget than it predicts (then set ``PREDICTION`` and run them again).
* ``mkn_test``: the crossover with modified Kneser-Ney's 7-gram, tested. Chapter 12 fits the
  frontier of every run (sweep and test, compute counting the attention scores too) and
  predicts that by window start it crosses MKN-7 at 9.7e13 FLOPs (``MKN_PREDICTION``, the
  chapter's figure as it prints it, made before these runs). The largest size trained for the
  steps that spend it, seeds never run at that size and budget (``MKN_TEST_SEEDS``). Not in
  the default grid: ``--where phase=mkn_test`` asks for it.
* ``dropout``: the sweep's recipe with dropout ``DROPOUT`` in every block, at the sweep's
  rates, seed 0, for what dropout does once the text repeats. Not in the default grid (the
  book has no such runs yet): ``--where phase=dropout`` asks for it.

With ``CH12_SCALING_CHECKPOINTS=DIR`` in the environment, every run also saves its model there
(float16 weights, config and row, as chapter 12 ships; on a cluster, on the worker's disk):
``book/data/ch12_scaling_best.pt`` is the sweep's run of 1.8M, 2,400 steps, seed 2, saved so.

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
curve. ``table`` writes ``book/data/ch12_scaling.json`` (chapter 12 reads it), one row per
(phase, size, lr, steps, seed), sorted by phase, compute, rate and seed.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from d2lattn.gpt import (GPT, GPTConfig, held_out_losses, sliding_window_losses,  # noqa: E402
                         train_lm)
from d2lattn.scaling import (PowerLawFit, compute_frontier, fit_frontier,  # noqa: E402
                             training_flops)
from d2lattn.text import CharTokenizer, load_split  # noqa: E402

if not __package__:  # run as a script: the repository root, for the experiments package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.ch12_ngram import window_means  # noqa: E402  (the n-gram table's blocks)

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
    sliding = sliding_window_losses(model, held_out)  # (characters,) bits
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
        "sliding_bits": round(sliding.mean().item(), 4),
        # each window's mean, on the blocks of ch12_ngram's table: a paired bootstrap
        # against an n-gram's bits on the same characters (runs before these fields lack them)
        "window_start_bits_by_window": window_means(window_start.reshape(-1), BLOCK_SIZE),
        "sliding_bits_by_window": window_means(sliding, BLOCK_SIZE),
    }
    if checkpoint_dir is not None:  # float16 weights with their config, as chapter 12 ships
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.half() if v.is_floating_point() else v
                 for k, v in model.state_dict().items()}
        torch.save({"config": vars(model.config), "state_dict": state, "run": row},
                   checkpoint_dir / f"ch12_scaling_{size}_{steps}_seed{seed}.pt")
    return row


#: the probe's rates per size: LRS, extended at the edge that won (see the docstring)
PROBE_LRS = {"0.1M": [2e-3, 5e-3, 1e-2, 2e-2, 4e-2], "0.3M": [2e-3, 5e-3, 1e-2, 2e-2],
             "0.8M": [2e-3, 5e-3, 1e-2], "1.8M": [1e-3, 2e-3, 5e-3, 1e-2],
             "3.0M": [1e-3, 2e-3, 5e-3, 1e-2]}
LR = {"0.1M": 2e-2, "0.3M": 1e-2, "0.8M": 5e-3, "1.8M": 2e-3, "3.0M": 2e-3}  # the probe's
SWEEP_SEEDS = {"default": [0, 1, 2], ("1.8M", 600): [0], ("1.8M", 1200): [0],
               ("3.0M", 600): [0], ("3.0M", 1200): [0], ("0.8M", 2400): [0, 1, 2, 3, 4, 5]}
PREDICTION = {"size": "0.3M", "steps": 3290}  # the book's prediction (see the docstring)
TEST_SEEDS = list(range(1, 11))
#: chapter 12's MKN-7 crossover by window start (its fit to every run, attention counted):
#: 3.0M for the steps whose 6 N D plus attention scores make 9.7e13 FLOPs
MKN_PREDICTION = {"size": "3.0M", "flops": 9.7e13, "steps": 2491}
MKN_TEST_SEEDS = [101, 102, 103, 104, 105]
DROPOUT_SEEDS = [0]
#: CPU-seconds a training step, one thread (the committed runs of 2,400 steps)
STEP_SECONDS = {"0.1M": 0.042, "0.3M": 0.091, "0.8M": 0.172, "1.8M": 0.308, "3.0M": 0.455}
VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ("cpu_seconds",)


def grid(seeds=None, smoke=False, where=None) -> list[dict]:
    """The probe, the sweep and the test (``seeds``: these seeds for the sweep and the test;
    the probe is seed 0's); the dropout phase only when ``where`` asks for it
    (``phase=dropout``). ``smoke``: one run of each phase, 3 steps of the smallest size,
    scored on the first 4,096 held-out characters."""
    def config(phase, size, steps, seed, lr=None):
        return {"phase": phase, "size": size, "lr": lr or LR[size], "steps": steps,
                "seed": seed}
    if smoke:
        return [{**c, "held_out_chars": 4096} for c in (
            config("probe", "0.1M", 3, 0, 1e-2), config("sweep", "0.1M", 3, 0),
            config("test", "0.1M", 4, 1), config("dropout", "0.1M", 3, 0))]
    runs = [config("probe", size, PROBE_STEPS, 0, lr)
            for size in SIZES for lr in PROBE_LRS[size]]
    runs += [config("sweep", size, steps, seed) for size in SIZES for steps in STEPS
             for seed in seeds or SWEEP_SEEDS.get((size, steps), SWEEP_SEEDS["default"])]
    runs += [config("test", PREDICTION["size"], PREDICTION["steps"], seed)
             for seed in seeds or TEST_SEEDS]
    if where and str(where.get("phase")) == "mkn_test":
        runs += [config("mkn_test", MKN_PREDICTION["size"], MKN_PREDICTION["steps"], seed)
                 for seed in seeds or MKN_TEST_SEEDS]
    if where and str(where.get("phase")) == "dropout":
        runs += [config("dropout", size, steps, seed) for size in SIZES for steps in STEPS
                 for seed in seeds or DROPOUT_SEEDS]
    return runs


def cpu_seconds(config: dict) -> float:
    return STEP_SECONDS[config["size"]] * config["steps"]


@functools.lru_cache(maxsize=1)  # the same text for every run of a worker
def data() -> dict:
    split = load_split("shakespeare")
    tok = CharTokenizer(split.text)
    return {"tok": tok, "train": tok.encode(split.train), "held_out": tok.encode(split.held_out)}


def run(config: dict) -> dict:
    """One training run and its held-out bits."""
    from experiments.runner import device
    folder = os.environ.get("CH12_SCALING_CHECKPOINTS")
    text = data()
    if config.get("held_out_chars"):  # a smoke run
        text = {**text, "held_out": text["held_out"][:config["held_out_chars"]]}
    return train_one(config["phase"], config["size"], config["lr"], config["steps"],
                     config["seed"], device(), text, Path(folder) if folder else None)


def probe_choice(runs: list) -> dict:
    """For each size whose probe (``PROBE_LRS`` at ``PROBE_STEPS``) is complete, its best
    rate; raises if that rate is at an edge the probe may still extend."""
    chosen = {}
    for size, lrs in PROBE_LRS.items():
        probes = [r for r in runs if r["phase"] == "probe" and r["size"] == size
                  and r["steps"] == PROBE_STEPS]
        if {r["lr"] for r in probes} < set(lrs) or not probes:
            continue
        best = min(probes, key=lambda r: r["window_start_bits"])["lr"]
        top, bottom = max(r["lr"] for r in probes), min(r["lr"] for r in probes)
        if best == top and top < MAX_LR:
            raise ValueError(f"{size}: the best rate is the highest probed: add {2 * top:g} "
                             "to PROBE_LRS and run it")
        if best == bottom and bottom > MIN_LR:
            raise ValueError(f"{size}: the best rate is the lowest probed: add {bottom / 2:g} "
                             "to PROBE_LRS and run it")
        chosen[size] = best
    return chosen


def predict(runs: list) -> dict | None:
    """The crossover predicted from the sweep runs (None with fewer than 3 frontier points)."""
    groups = {(r["size"], r["steps"]) for r in runs
              if r["phase"] == "sweep" and r["flops"] < FIT_BELOW}
    if len(groups) < 3:
        return None
    ngram = json.loads(NGRAM_JSON.read_text())["corpora"]["shakespeare"]
    target = min(ngram["held_out"]["kn"].values())  # the 6-gram's, as the book's prediction
    fit = frontier_fit(runs)
    C = PowerLawFit(fit["E"], fit["A"], fit["g"], fit["scale"]).crossover(target)
    size = max(fit["frontier"], key=lambda p: p["flops"])["size"]
    N = next(r["non_embedding_parameters"] for r in runs if r["size"] == size)
    steps = round(C / (6 * N * BATCH_SIZE * BLOCK_SIZE))
    return {"fit": fit, "ngram_bits": target, "crossover_flops": C, "size": size,
            "steps": steps, "sweep_runs_seen": sum(r["phase"] == "sweep" for r in runs)}


def table(records: list[dict]) -> dict:
    """The chapter's table: every run, sorted by phase, compute, rate and seed, and the
    prediction. Refuses runs at another rate than the probe chose, and test runs of another
    size or budget than the prediction's."""
    from experiments import runner
    fields, records = runner.header(records)
    runs = sorted((r["row"] for r in records),
                  key=lambda r: (r["phase"], r["flops"], r["lr"], r["seed"]))
    chosen = probe_choice(runs)
    for r in runs:
        if r["phase"] != "probe" and r["size"] in chosen and r["lr"] != chosen[r["size"]]:
            raise ValueError(f"the probe chooses {chosen[r['size']]:g} for {r['size']}, a "
                             f"{r['phase']} run used {r['lr']:g}: set LR and run it again")
    prediction = fields.pop("prediction", None) or predict(runs)
    tests = {(r["size"], r["steps"]) for r in runs if r["phase"] == "test"}
    if prediction and tests - {(prediction["size"], prediction["steps"])}:
        raise ValueError(f"the prediction is {prediction['size']} for {prediction['steps']} "
                         f"steps, the test runs are {sorted(tests)}: set PREDICTION")
    return {"description": __doc__.split("\n")[0], "sizes": SIZES, "steps": STEPS,
            "batch_size": BATCH_SIZE, "block_size": BLOCK_SIZE, "warmup": WARMUP, "lrs": LRS,
            "probe_steps": PROBE_STEPS, "runs": runs,
            **({"prediction": prediction} if prediction else {}), **fields}


if __name__ == "__main__":  # the same as: python -m experiments run ch12_scaling ...
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.runner import script
    script("ch12_scaling")
