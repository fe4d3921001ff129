"""Chapter 7's bottleneck sweep: exact match against the number of dates on a line.

Sources hold 1 to 4 CLDR dates in mixed locales and formats (``d2lattn.make_multi_date_examples``);
the target is the list of ISO dates. Per seed: a GRU encoder-decoder without attention (the
decoder sees only the encoder's last state) against the same model with 4-head attention, at
the chapter's budget (400 steps) and at 4x that budget, the model without attention also at 2x
and 8x (one run evaluated at every budget on its way; the book's table adds 16x and 32x on
seeds 5 to 9, see ``experiments/tables/README.md``) and with a state twice as large
(H = 128); and, at the chapter's budget, the two placements of the query with the same
attention layer: after the decoder's step ("multi-head", "dot") or before it, as Bahdanau et
al. ("bahdanau" with 4 heads, "bahdanau-dot" with the scaled dot product). Writes
``book/data/ch7_bottleneck.json``, which chapter 7 reads, adding to the runs already in it.
About 260 s of single-thread CPU per seed on an idle machine (several times that on a busy
one).

Run from the repository root (one thread per process)::

    OMP_WAIT_POLICY=PASSIVE nice -n 5 python experiments/ch7_bottleneck.py --seeds 0 1 2 3 4

``--seeds`` picks the seeds of the plan (the book's table: seeds 0 to 4 from the first writing,
and what could be added of seeds 5 to 9); ``--runs kind:hidden:steps[/steps...]:seed,...``
runs a list instead (the partial tables in ``experiments/tables`` were made so, and
``--merge`` adds them to the book's table); ``--state-dir`` saves each run's final state, so
that a later call with a larger budget continues it instead of starting again; ``--jobs 2``
runs two processes. Bahdanau's placement with four heads is the slowest run, its decoder
stepping one character at a time through the projections: about 150 s of CPU on a busy
machine, about five times the same layer placed after the step."""

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


def run_one(kind, hidden, steps, seed, cfg=CONFIG, data=None):
    """One configuration trained for ``steps`` steps with ``train_seq2seq``: one record."""
    train, test, src, tgt = data or _data(cfg)
    X, X_lens = src.encode_batch([ex.source for ex in train])
    Y, Y_lens = tgt.encode_batch([ex.target for ex in train], eos=True)
    model = build(kind, hidden, cfg, len(src), len(tgt), seed)
    t0 = time.process_time()
    losses = train_seq2seq(model, X, X_lens, Y, Y_lens, steps=steps, batch_size=cfg["batch"],
                           lr=cfg["lr"], seed=seed, clip=cfg["max_grad_norm"])
    acc = exact_match_by_k(model, test, src, tgt, cfg)
    return dict(kind=kind, hidden=hidden, steps=steps, seed=seed, final_loss=losses[-1],
                exact_match=acc, cpu_s=time.process_time() - t0)


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


def plan(seeds, H, S):
    """The sweep, most important runs first: (kind, hidden, checkpoints, seed)."""
    runs = []
    for seed in seeds:  # the placement of the query, with the same attention layer
        runs += [("multi-head", H, [S, 4 * S], seed), ("bahdanau", H, [S], seed),
                 ("dot", H, [S], seed), ("bahdanau-dot", H, [S], seed)]
    runs += [("none", H, [S, 2 * S, 4 * S, 8 * S], seed) for seed in seeds]  # the budget curve
    runs += [("none", 2 * H, [S, 4 * S], seed) for seed in seeds]  # the larger state
    return runs


def _job(args):
    torch.set_num_threads(1)
    *job, state_dir = args
    return run_curve(*job, state_dir=state_dir)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    p.add_argument("--runs", default="",
                   help="kind:hidden:steps[/steps...]:seed,... instead of the plan")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--state-dir", default=None,
                   help="save the trained states here, to extend a budget curve later")
    p.add_argument("--out", default=str(ROOT / "book" / "data" / "ch7_bottleneck.json"))
    p.add_argument("--merge", nargs="+", default=None,
                   help="add the runs of these tables (same configuration) to --out; no training")
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = CONFIG
    H, S = cfg["hidden"], cfg["steps"]
    if a.merge:
        table = json.loads(Path(a.out).read_text())
        have = {(r["kind"], r["hidden"], r["steps"], r["seed"]) for r in table["runs"]}
        for name in a.merge:
            other = json.loads(Path(name).read_text())
            assert other["config"] == table["config"], f"{name}: another configuration"
            for r in other["runs"]:
                if (r["kind"], r["hidden"], r["steps"], r["seed"]) not in have:
                    have.add((r["kind"], r["hidden"], r["steps"], r["seed"]))
                    table["runs"].append(r)
        table["seeds"] = sorted({r["seed"] for r in table["runs"]})
        Path(a.out).write_text(json.dumps(table, indent=1) + "\n")
        print(f"table: {len(table['runs'])} records, seeds {table['seeds']}")
        return
    if a.runs:
        runs = []
        for r in a.runs.split(","):
            kind, hidden, steps, seed = r.split(":")
            runs.append((kind, int(hidden), [int(s) for s in steps.split("/")], int(seed)))
    else:
        runs = plan(a.seeds, H, S)
    table = dict(config=cfg, runs=[], checks=[])
    if Path(a.out).exists():  # add to the table: keep every run already in it
        table = json.loads(Path(a.out).read_text())
        assert table["config"] == cfg, "the table was made with another configuration"
        table.setdefault("checks", [])

    def key(r):
        return r["kind"], r["hidden"], r["steps"], r["seed"]

    have = {key(r): r for r in table["runs"]}
    runs = [r for r in runs if any((r[0], r[1], c, r[3]) not in have for c in r[2])]
    print(f"{len(runs)} training runs to do", flush=True)
    t0 = time.time()
    jobs = [(*r, a.state_dir) for r in runs]
    if a.jobs > 1:
        import multiprocessing as mp
        results = mp.get_context("fork").Pool(a.jobs).imap(_job, jobs)
    else:
        results = map(_job, jobs)
    for records in results:
        for r in records:
            if key(r) in have:  # the same model trained by a separate run: it must agree
                old = have[key(r)]
                same = old["exact_match"] == {str(k): v for k, v in r["exact_match"].items()}
                table["checks"].append(dict(kind=r["kind"], hidden=r["hidden"],
                                            steps=r["steps"], seed=r["seed"],
                                            same_exact_match=same))
                print("check", key(r), "same as the table:", same, flush=True)
            else:
                have[key(r)] = r
                table["runs"].append(r)
                print(json.dumps(r), flush=True)
        table["seeds"] = sorted({r["seed"] for r in table["runs"]})
        table["torch"] = torch.__version__
        Path(a.out).write_text(json.dumps(table, indent=1) + "\n")
    total_cpu = sum(r["cpu_s"] for r in table["runs"])
    print(f"table: {len(table['runs'])} records; wall {time.time() - t0:.0f} s "
          f"(records' CPU, curves counted at each checkpoint: {total_cpu:.0f} s)")


if __name__ == "__main__":
    main()
