"""Chapter 7's bottleneck sweep: exact match against the number of dates on a line.

Sources hold 1 to 4 CLDR dates in mixed locales and formats (``d2lattn.make_multi_date_examples``);
the target is the list of ISO dates. Per seed: a GRU encoder-decoder without attention (the
decoder sees only the encoder's last state) against the same model with 4-head attention, at
the chapter's budget (400 steps) and at 4x that budget, the model without attention also at 2x
and 8x (one run evaluated at every budget on its way; the book's table adds 16x and 32x on
seeds 5 to 9, see ``experiments/tables/README.md``) and with a state twice as large
(H = 128); and, at the chapter's budget, the two placements of the query with the same
attention layer: after the decoder's step ("multi-head", "dot") or before it, as Bahdanau et
al. ("bahdanau" with 4 heads, "bahdanau-dot" with the scaled dot product). ``table`` writes
``book/data/ch7_bottleneck.json``, which chapter 7 reads.
About 260 s of single-thread CPU per seed on an idle machine (several times that on a busy
one).

Run from the repository root::

    python -m experiments run ch7_bottleneck --seeds 0 1 2 3 4
    python -m experiments run ch7_bottleneck --seeds 5 --where kind=none
    python -m experiments table ch7_bottleneck --out book/data/ch7_bottleneck.json

Each run trains one configuration and evaluates it at each of its checkpoints (a budget
curve); a run whose checkpoints are all in the results already, from earlier runs, is skipped.
``run_curve`` can continue a curve from states saved in a folder, as the book's 16x and 32x
runs did (``experiments/tables/README.md``); the runner trains each curve from the start.
Bahdanau's placement with four heads is the slowest run, its decoder stepping one character
at a time through the projections: about 150 s of CPU on a busy
machine, about five times the same layer placed after the step."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2lattn import (DATE_FORMATS, AdditiveAttention, AttentionDecoder,  # noqa: E402
                     BahdanauDecoder, CharVocab, DotProductAttention, EncoderDecoder,
                     MultiHeadAttention, Seq2SeqDecoder, Seq2SeqEncoder, greedy_decode,
                     make_multi_date_examples, train_seq2seq)

#: The task and the chapter's budget; the chapter imports nothing from here, it repeats these.
CONFIG = dict(num_dates=[1, 2, 3, 4], formats=["long", "medium", "short"], n_train=12000,
              n_test_per_k=200, embed=32, hidden=64, batch=64, lr=0.01, steps=400,
              max_grad_norm=1.0)
SEEDS = [0, 1, 2, 3, 4]


def make_data(cfg):
    formats = cfg.get("formats", DATE_FORMATS)
    train = make_multi_date_examples(cfg["n_train"], cfg["num_dates"], formats=formats, seed=100)
    seen = {ex.source for ex in train}
    test = []
    for k in cfg["num_dates"]:
        pool = make_multi_date_examples(2 * cfg["n_test_per_k"], [k], formats=formats,
                                        seed=200 + k)
        test += [ex for ex in pool if ex.source not in seen][:cfg["n_test_per_k"]]
    src = CharVocab([ex.source for ex in train])
    tgt = CharVocab([ex.target for ex in train])
    return train, test, src, tgt


def build(kind, hidden, cfg, n_src, n_tgt, seed):
    """The model of one configuration. The two placements of the query come with the same
    attention layer each: "multi-head" (query after the step, Luong) and "bahdanau" (query
    before it) both use 4-head attention; "dot" and "bahdanau-dot" both the scaled dot
    product."""
    torch.manual_seed(seed)
    enc = Seq2SeqEncoder(n_src, cfg["embed"], hidden)

    def multi_head():
        return MultiHeadAttention(hidden, num_heads=4, query_size=hidden, key_size=hidden,
                                  value_size=hidden)

    if kind == "none":
        dec = Seq2SeqDecoder(n_tgt, cfg["embed"], hidden)
    elif kind == "additive":
        dec = AttentionDecoder(n_tgt, cfg["embed"], hidden, AdditiveAttention(hidden, hidden, 32))
    elif kind == "dot":
        dec = AttentionDecoder(n_tgt, cfg["embed"], hidden, DotProductAttention())
    elif kind == "bahdanau-dot":
        dec = BahdanauDecoder(n_tgt, cfg["embed"], hidden, DotProductAttention())
    elif kind == "bahdanau":
        dec = BahdanauDecoder(n_tgt, cfg["embed"], hidden, multi_head())
    elif kind == "multi-head":
        dec = AttentionDecoder(n_tgt, cfg["embed"], hidden, multi_head())
    else:
        raise ValueError(kind)
    return EncoderDecoder(enc, dec)


def exact_match_by_k(model, test, src, tgt, cfg):
    model.eval()
    out = {}
    for k in cfg["num_dates"]:
        exs = [ex for ex in test if ex.num_dates == k]
        X, X_lens = src.encode_batch([ex.source for ex in exs])
        Y, _ = greedy_decode(model, X, X_lens, max_len=11 * k + 1)
        out[k] = sum(tgt.decode(y) == ex.target for y, ex in zip(Y, exs)) / len(exs)
    model.train()
    return out


_DATA = {}


def _data(cfg):
    key = json.dumps(cfg, sort_keys=True)
    if key not in _DATA:
        _DATA[key] = make_data(cfg)
    return _DATA[key]


def run_curve(kind, hidden, checkpoints, seed, cfg=CONFIG, state_dir=None):
    """One training run evaluated at several budgets: one record per checkpoint.

    The loop is the library's (``d2lattn.fit``) with ``train_seq2seq``'s batches and Adam,
    step for step, so the record at ``c`` steps is the model that ``run_one(kind, hidden, c,
    seed)`` trains; the sweep checks this wherever both are in the table. What is this
    script's own: the optimizer and the batch order live across checkpoints, and with
    ``state_dir`` they are saved with the model at the last checkpoint, so that a later call
    with larger checkpoints continues from the largest saved one."""
    from d2lattn import fit, length_batches, seq2seq_loss

    train, test, src, tgt = _data(cfg)
    X, X_lens = src.encode_batch([ex.source for ex in train])
    Y, Y_lens = tgt.encode_batch([ex.target for ex in train], eos=True)
    model = build(kind, hidden, cfg, len(src), len(tgt), seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    g = torch.Generator().manual_seed(seed)
    batches, step, cpu, loss = [], 0, 0.0, None
    name = f"{kind}_{hidden}_{seed}"
    if state_dir:
        saved = sorted((int(f.stem.rsplit("_", 1)[1]), f)
                       for f in Path(state_dir).glob(f"{name}_*.pt"))
        saved = [(s, f) for s, f in saved if s < max(checkpoints)]
        if saved:
            step, f = saved[-1]
            state = torch.load(f, weights_only=False)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            g.set_state(state["generator"])
            batches, cpu, loss = state["batches"], state["cpu_s"], state["loss"]
    def batch_loss():  # train_seq2seq's batches
        nonlocal batches
        if not batches:
            batches = length_batches(X_lens.tolist(), cfg["batch"], generator=g)
        idx = batches.pop()
        T, U = int(X_lens[idx].max()), int(Y_lens[idx].max())
        return seq2seq_loss(model, X[idx, :T], X_lens[idx], Y[idx, :U], Y_lens[idx])

    records = []
    for c in sorted(checkpoints):
        if c <= step:
            continue
        t0 = time.process_time()
        loss = fit(model, optimizer, batch_loss, steps=c - step, clip=cfg["max_grad_norm"])[-1]
        step = c
        acc = exact_match_by_k(model, test, src, tgt, cfg)
        cpu += time.process_time() - t0
        records.append(dict(kind=kind, hidden=hidden, steps=c, seed=seed, final_loss=loss,
                            exact_match=acc, cpu_s=cpu, run=f"curve to {max(checkpoints)}"))
    if state_dir:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                        generator=g.get_state(), batches=batches, cpu_s=cpu, loss=loss),
                   Path(state_dir) / f"{name}_{step}.pt")
    return records


VERSION = 1  # bump when a change alters what a run computes: every run is made again
TIMING_KEYS = ()  # the records' cpu_s: see same_rows
TABLE = ROOT / "book" / "data" / "ch7_bottleneck.json"
SMOKE = dict(n_train=256, n_test_per_k=4, embed=8)


def grid(seeds=None, smoke=False) -> list[dict]:
    """The sweep, most important runs first: each a training run evaluated at its checkpoints
    (``smoke``: two kinds, a tiny model, 2 and 3 steps, 256 training lines)."""
    if smoke:
        return [{"kind": k, "hidden": 16, "checkpoints": [2, 3], "seed": 0, "smoke": True}
                for k in ("none", "bahdanau")]
    H, S = CONFIG["hidden"], CONFIG["steps"]
    seeds = seeds if seeds is not None else SEEDS
    runs = []
    for seed in seeds:  # the placement of the query, with the same attention layer
        runs += [("multi-head", H, [S, 4 * S], seed), ("bahdanau", H, [S], seed),
                 ("dot", H, [S], seed), ("bahdanau-dot", H, [S], seed)]
    runs += [("none", H, [S, 2 * S, 4 * S, 8 * S], seed) for seed in seeds]  # the budget curve
    runs += [("none", 2 * H, [S, 4 * S], seed) for seed in seeds]  # the larger state
    return [{"kind": k, "hidden": h, "checkpoints": c, "seed": s} for k, h, c, s in runs]


def cpu_seconds(config: dict) -> float:
    # CPU seconds a step, from the committed runs (Bahdanau's with 4 heads: the docstring's)
    per_step = {"none": 0.026, "multi-head": 0.034, "dot": 0.026, "bahdanau-dot": 0.049,
                "bahdanau": 0.3}.get(config["kind"], 0.04)
    return per_step * max(config["checkpoints"]) * (1.9 if config["hidden"] > 64 else 1)


def covered(config: dict, rows: list[dict]) -> bool:
    """Whether every checkpoint of a run is in the results already (made by another run)."""
    have = {_key(r) for row in rows for r in row.get("records", [row])}
    return all((config["kind"], config["hidden"], c, config["seed"]) in have
               for c in config["checkpoints"])


def run(config: dict) -> dict:
    """One training run, evaluated at each checkpoint: its records."""
    torch.set_num_threads(1)
    cfg = {**CONFIG, **SMOKE} if config.get("smoke") else CONFIG
    records = run_curve(config["kind"], config["hidden"], config["checkpoints"], config["seed"],
                        cfg)
    return {"records": [{**r, "exact_match": {str(k): v for k, v in r["exact_match"].items()}}
                        for r in records]}


def same_rows(a: dict, b: dict) -> bool:
    """Two rows agree but for the CPU seconds."""
    def strip(row):
        return [{k: v for k, v in r.items() if k != "cpu_s"} for r in row["records"]]
    return strip(a) == strip(b)


def _key(r):
    return r["kind"], r["hidden"], r["steps"], r["seed"]


def table(records: list[dict]) -> dict:
    """The chapter's table: every evaluated checkpoint once (the first made), in the order
    the results were written."""
    from experiments import runner
    fields, records = runner.header(records)
    runs, have = [], set()
    for rec in records:
        for r in rec["row"].get("records", [rec["row"]]):
            if _key(r) not in have:
                have.add(_key(r))
                runs.append(r)
    return {"config": CONFIG, "seeds": sorted({r["seed"] for r in runs}), **fields,
            "torch": runner.torch_version(records), "runs": runs, "checks": []}


if __name__ == "__main__":  # the same as: python -m experiments run ch7_bottleneck ...
    from experiments.runner import script
    script("ch7_bottleneck")
