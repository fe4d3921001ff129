"""Graph attention at scale: GraphAttention on an edge list against its dense masked form.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_gat_edges.py [--nodes 20000] [--edges 100000]

A random directed graph of ``--nodes`` nodes and ``--edges`` distinct edges (self-loops added
by the layer), features F = 16, h = 8 heads of F' = 8 (a GAT hidden layer as in Veličković et
al. 2018, table 2). Reported, for one forward and backward pass:

1. the edge-list form at full size: CPU time (median of interleaved rounds) and the peak
   memory it adds (the rise of the process's peak resident size, measured in a fresh
   process), beside the bytes of its largest tensor, the (E, h, F') messages;
2. both forms at ``--small-nodes`` nodes with the same mean degree, where the dense one runs:
   time and peak memory of each, the outputs checked equal, and the dense form's measured
   peak beside a lower bound: (h, N, N) float32 scores and weights (two such tensors, kept
   for the backward pass) and an (N, N) bool mask;
3. the dense form's memory at full size, *estimated*, not run (it would not fit in this
   machine's memory): the lower bound, and the peak measured at ``--small-nodes`` scaled by
   (N / n)^2 (every large tensor of the dense form is (h, N, N) or (N, N)).

Memory is the rise of the peak resident size (VmHWM, reset first) in a subprocess per case, so one case's peak does
not hide another's. Speed and memory are measured here, never in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleaved_medians  # noqa: E402

from d2lattn import GraphAttention  # noqa: E402

F_IN, F_OUT, HEADS = 16, 8, 8


def make_case(N: int, E: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(N * N, generator=g)[:E] if N * N < 2 ** 24 else torch.unique(
        torch.randint(0, N * N, (int(E * 1.01) + 16,), generator=g))[:E]
    sources, targets = flat // N, flat % N
    edge_index = torch.stack([sources, targets])  # (2, E)
    torch.manual_seed(seed)
    gat = GraphAttention(F_IN, F_OUT, HEADS)
    X = torch.randn(N, F_IN, generator=g)
    return gat, X, edge_index


def dense_adjacency(edge_index: torch.Tensor, N: int) -> torch.Tensor:
    A = torch.zeros(N, N, dtype=torch.bool)
    A[edge_index[1], edge_index[0]] = True  # [i, j]: target i attends to source j
    return A


def step(gat, X, **graph):
    out = gat(X, **graph)
    out.sum().backward()
    return out


def dense_estimate(N: int) -> int:
    return 2 * HEADS * N * N * 4 + N * N  # scores and weights (float32), the bool mask


def measure_peak(form: str, N: int, E: int) -> dict:
    """In this (fresh) process: build the case, then one forward and backward pass."""
    gat, X, edge_index = make_case(N, E)
    graph = ({"edge_index": edge_index} if form == "edges"
             else {"adjacency": dense_adjacency(edge_index, N)})
    before = _reset_peak()
    start = time.process_time()
    step(gat, X, **graph)
    seconds = time.process_time() - start
    return {"peak_added_bytes": _peak() - before, "first_call_cpu_s": seconds}


def _peak() -> int:
    """The process's peak resident bytes (Linux: VmHWM; elsewhere ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024



def _reset_peak() -> int:
    """Reset the peak to the current size where Linux allows it (a forked child inherits its
    parent's peak otherwise); return the peak after the reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _peak()


def in_subprocess(form: str, N: int, E: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--peak", form, str(N), str(E)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--edges", type=int, default=100000)
    parser.add_argument("--small-nodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peak", nargs=3, metavar=("FORM", "N", "E"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.peak:
        print(json.dumps(measure_peak(args.peak[0], int(args.peak[1]), int(args.peak[2]))))
        return 0

    N, E = args.nodes, args.edges
    gib = 2 ** 30
    print(f"torch {torch.__version__}, {args.threads} thread(s), float32 CPU; F = {F_IN}, "
          f"h = {HEADS}, F' = {F_OUT}; forward + backward")
    gat, X, edge_index = make_case(N, E)
    t = interleaved_medians({"edges": lambda: step(gat, X, edge_index=edge_index)},
                            args.rounds, clock=time.process_time)["edges"]
    peak = in_subprocess("edges", N, E)
    messages = (E + N) * HEADS * F_OUT * 4
    print(f"edge list, N = {N}, E = {E} (+{N} self-loops): {t * 1e3:.0f} ms CPU, peak memory "
          f"added {peak['peak_added_bytes'] / 2 ** 20:.0f} MiB (messages (E, h, F'): "
          f"{messages / 2 ** 20:.1f} MiB)")
    n = args.small_nodes
    e = E * n // N  # the same mean degree
    gat, X, edge_index = make_case(n, e)
    A = dense_adjacency(edge_index, n)
    torch.testing.assert_close(gat(X, edge_index=edge_index), gat(X, A), rtol=1e-5, atol=1e-6)
    times = interleaved_medians({"edges": lambda: step(gat, X, edge_index=edge_index),
                                 "dense": lambda: step(gat, X, adjacency=A)},
                                args.rounds, clock=time.process_time)
    peaks = {form: in_subprocess(form, n, e) for form in ("edges", "dense")}
    print(f"both forms, N = {n}, E = {e} (outputs equal): edge list {times['edges'] * 1e3:.1f} "
          f"ms, {peaks['edges']['peak_added_bytes'] / 2 ** 20:.0f} MiB; dense "
          f"{times['dense'] * 1e3:.1f} ms, {peaks['dense']['peak_added_bytes'] / 2 ** 20:.0f} "
          f"MiB (lower bound {dense_estimate(n) / 2 ** 20:.0f} MiB)")
    scaled = peaks["dense"]["peak_added_bytes"] * (N / n) ** 2
    print(f"dense form, N = {N}: not run; estimated >= {dense_estimate(N) / gib:.1f} GiB "
          f"(two (h, N, N) float32 tensors of {HEADS * N * N * 4 / gib:.1f} GiB, and the "
          f"(N, N) mask of {N * N / gib:.2f} GiB); the peak measured at N = {n} scaled by "
          f"(N / {n})^2: {scaled / gib:.0f} GiB")

    return 0


if __name__ == "__main__":
    sys.exit(main())
