"""What choosing costs: block-sparse attention (d2lattn.sparse) against full attention, CPU.

    python benchmarks/bench_sparse.py [--lengths 1024 2048 4096 8192 16384] [--rounds 3]
        [--block-size 64] [--top-k 8] [--threads 1] [--out table.json]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_sparse.py   # on a shared, loaded machine

Causal self-attention, B = 1, h = 4 heads, d = 64, float32, of length T. For each T, side by
side (one process, timings interleaved, medians of CPU time over rounds):

- ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True)``, PyTorch's fused kernel;
- ``flash``: the book's ``flash_attention(is_causal=True)`` (chapter 9);
- ``moba``: MoBA's gate (``moba_select``, top-k blocks of S keys by the mean key) and
  ``block_sparse_attention`` over its selection, gathered 256 queries at a time;
- ``moba-gate``: the gate alone, what choosing costs before any attention;
- ``reference``: ``block_sparse_attention_reference``, every score then a mask (up to 4,096).

Scores computed are counted exactly (``keys_read`` against ``T (T + 1) / 2`` per head), and the
peak memory of one call of each is measured in a fresh subprocess as the growth of the peak
resident set size over the inputs. Where the gather's overhead eats the saving, the table shows
it: the gathered form does k S scores per query in Python-level tensor operations, the fused
kernel T / 2 in one. Speed is measured here, never in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from d2lattn import flash_attention
from d2lattn.sparse import (block_sparse_attention, block_sparse_attention_reference, keys_read,
                            moba_select)

if __package__:  # imported as benchmarks.bench_sparse
    from ._timing import interleaved_medians
else:  # run as a script
    from _timing import interleaved_medians

B, H, D = 1, 4, 64
MiB = 2 ** 20
QUERY_CHUNK = 256


def inputs(T: int):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, T, D, generator=g) for _ in range(3))  # (B, h, T, d)


def functions(T: int, block_size: int, top_k: int):
    q, k, v = inputs(T)
    selection = moba_select(q, k, block_size=block_size, top_k=top_k)
    fns = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "flash": lambda: flash_attention(q, k, v, is_causal=True),
        "moba": lambda: block_sparse_attention(
            q, k, v, moba_select(q, k, block_size=block_size, top_k=top_k),
            block_size=block_size, causal=True, query_chunk=QUERY_CHUNK),
        "moba-gate": lambda: moba_select(q, k, block_size=block_size, top_k=top_k),
    }
    if T <= 4096:
        fns["reference"] = lambda: block_sparse_attention_reference(
            q, k, v, selection, block_size=block_size, causal=True)
    return fns, selection


def peak_extra_mib(name: str, T: int, block_size: int, top_k: int) -> float:
    """Run one call of ``name`` in a fresh interpreter: the growth of its peak resident set
    (VmHWM, reset just before the call) over the inputs, in MiB."""
    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "import bench_sparse as b, bench_flash as f\n"
        f"small, _ = b.functions(256, {block_size}, {top_k})\n"
        f"fns, _ = b.functions({T}, {block_size}, {top_k})\n"
        "with torch.no_grad():\n"
        f"    small[{name!r}]()\n"
        "    before = f.reset_peak_rss()\n"
        f"    out = fns[{name!r}]()\n"
        "    print(f.peak_rss_bytes() - before)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / MiB


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true", help="skip the subprocess memory runs")
    parser.add_argument("--out", help="write the table as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"B={B} h={H} d={D} float32, causal; S={args.block_size}, top-k={args.top_k} "
          f"({args.block_size * args.top_k} keys per query at most); CPU seconds per call")
    for T in args.lengths:
        fns, selection = functions(T, args.block_size, args.top_k)
        with torch.no_grad():
            times = interleaved_medians(fns, args.rounds, clock=time.process_time)
        read = keys_read(selection, T, block_size=args.block_size, causal=True)
        full = B * H * T * (T + 1) // 2
        row = {"T": T, "cpu_s": times, "scores_sparse": read, "scores_full": full,
               "score_fraction": read / full}
        if not args.no_memory:
            row["peak_mib"] = {name: peak_extra_mib(name, T, args.block_size, args.top_k)
                               for name in fns}
        rows.append(row)
        print(f"T={T:6d}  " + "  ".join(f"{n} {t:.4f}" for n, t in times.items())
              + f"  scores {read / full:.3f} of full"
              + ("" if args.no_memory else "  peak MiB " + " ".join(
                  f"{n} {m:.0f}" for n, m in row["peak_mib"].items())), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"B": B, "h": H, "d": D, "block_size": args.block_size, "top_k": args.top_k,
                       "threads": args.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
