"""Chapter 7's bottleneck sweep: exact match against the number of dates on a line.

Sources hold 1 to 4 CLDR dates in mixed locales and formats (``d2lattn.make_multi_date_examples``);
the target is the list of ISO dates. Over 5 seeds: a GRU encoder-decoder without attention (the
decoder sees only the encoder's last state) against the same model with 4-head attention, at the
chapter's budget (400 steps) and at 4x that budget; the model without attention with a state
twice as large (H = 128) at both budgets; and, at the chapter's budget, Bahdanau's placement
(``BahdanauDecoder``) and the scaled dot product. Writes ``book/data/ch7_bottleneck.json``, which
chapter 7 reads. About 1,200 s of single-thread CPU in all (20 minutes; 10 with ``--jobs 2`` on
two free cores).

Run from the repository root (one thread per process)::

    OMP_WAIT_POLICY=PASSIVE nice -n 5 python experiments/ch7_bottleneck.py --jobs 2

``--jobs 2`` runs two processes; ``--resume`` keeps the runs already in the table and adds the
missing ones; ``--pilot`` runs one seed of the chapter's budget.
"""

from __future__ import annotations

import argparse
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
    torch.manual_seed(seed)
    enc = Seq2SeqEncoder(n_src, cfg["embed"], hidden)
    if kind == "none":
        dec = Seq2SeqDecoder(n_tgt, cfg["embed"], hidden)
    elif kind == "additive":
        dec = AttentionDecoder(n_tgt, cfg["embed"], hidden, AdditiveAttention(hidden, hidden, 32))
    elif kind == "dot":
        dec = AttentionDecoder(n_tgt, cfg["embed"], hidden, DotProductAttention())
    elif kind == "bahdanau":
        dec = BahdanauDecoder(n_tgt, cfg["embed"], hidden, DotProductAttention())
    elif kind == "multi-head":
        dec = AttentionDecoder(n_tgt, cfg["embed"], hidden,
                               MultiHeadAttention(hidden, num_heads=4, query_size=hidden,
                                                  key_size=hidden, value_size=hidden))
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


def run_one(kind, hidden, steps, seed, cfg=CONFIG, data=None):
    key = json.dumps(cfg, sort_keys=True)
    if data is None and key not in _DATA:
        _DATA[key] = make_data(cfg)
    train, test, src, tgt = data or _DATA[key]
    X, X_lens = src.encode_batch([ex.source for ex in train])
    Y, Y_lens = tgt.encode_batch([ex.target for ex in train], eos=True)
    model = build(kind, hidden, cfg, len(src), len(tgt), seed)
    t0 = time.process_time()
    losses = train_seq2seq(model, X, X_lens, Y, Y_lens, steps=steps, batch_size=cfg["batch"],
                           lr=cfg["lr"], seed=seed, max_grad_norm=cfg["max_grad_norm"])
    acc = exact_match_by_k(model, test, src, tgt, cfg)
    return dict(kind=kind, hidden=hidden, steps=steps, seed=seed, final_loss=losses[-1],
                exact_match=acc, cpu_s=time.process_time() - t0)


def _job(args):
    torch.set_num_threads(1)
    return run_one(*args)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pilot", action="store_true")
    p.add_argument("--runs", default="", help="kind:hidden:steps:seed,... (implies --pilot)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--resume", action="store_true", help="skip the runs already in --out")
    p.add_argument("--set", default="", help="override CONFIG entries: key=value;...")
    p.add_argument("--out", default=str(ROOT / "book" / "data" / "ch7_bottleneck.json"))
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = CONFIG
    for item in filter(None, a.set.split(";")):
        key, value = item.split("=")
        cfg[key] = json.loads(value)
    H, S = cfg["hidden"], cfg["steps"]
    if a.runs:
        a.pilot = True
        runs = [(r.split(":")[0], *map(int, r.split(":")[1:])) for r in a.runs.split(",")]
    elif a.pilot:
        runs = [("none", H, S, 0), ("multi-head", H, S, 0)]
    else:  # the most important runs first
        runs = [(kind, H, S, seed) for seed in SEEDS for kind in ("none", "multi-head")]
        runs += [("none", H, 4 * S, seed) for seed in SEEDS]
        runs += [("multi-head", H, 4 * S, seed) for seed in SEEDS]
        runs += [("bahdanau", H, S, seed) for seed in SEEDS]
        runs += [("none", 2 * H, S, seed) for seed in SEEDS]
        runs += [("none", 2 * H, 4 * S, seed) for seed in SEEDS]
        runs += [("dot", H, S, seed) for seed in SEEDS]
    done = []
    if a.resume and Path(a.out).exists():  # keep the runs of an interrupted sweep
        old = json.loads(Path(a.out).read_text())
        if old["config"] == cfg:
            done = old["runs"]
            keys = {(r["kind"], r["hidden"], r["steps"], r["seed"]) for r in done}
            runs = [r for r in runs if tuple(r) not in keys]
    n_all = len(done) + len(runs)
    t0 = time.time()
    if a.jobs > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(a.jobs) as pool:
            results = list(done)
            for r in pool.imap(_job, runs):
                results.append(r)
                print(json.dumps(r), flush=True)
                save(a, cfg, results, done=len(results) == n_all)
    else:
        results = list(done)
        for r in runs:
            results.append(_job(r))
            print(json.dumps(results[-1]), flush=True)
            save(a, cfg, results, done=len(results) == n_all)
    total_cpu = sum(r["cpu_s"] for r in results)
    print(f"total training+evaluation CPU {total_cpu:.0f} s, wall {time.time() - t0:.0f} s")


def save(a, cfg, results, done):
    """Write the table after every run (a partial table says so)."""
    if a.pilot:
        return
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(dict(config=cfg, seeds=SEEDS, complete=done,
                                           torch=torch.__version__, runs=results),
                                      indent=1) + "\n")


if __name__ == "__main__":
    main()
