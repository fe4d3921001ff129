"""Speed of d2lattn's attention against PyTorch's own, on the CPU in float32.

    python benchmarks/bench_attention.py [--rounds 41] [--threads N] [--default-malloc]

Two comparisons, each reported as the ratio of medians (ours / PyTorch's; lower is better):

1. ``DotProductAttention`` (B=8, Q=K=512, d=64, 1-D valid_lens) against
   ``F.scaled_dot_product_attention`` forced to its math backend, which, like ours, materialises
   the (B, Q, K) weights. PyTorch gets its boolean mask built in advance; ours builds it from
   ``valid_lens`` inside the call. Goal: ratio <= 1.2.
2. ``MultiHeadAttention`` (B=8, T=256, num_hiddens=256, 8 heads, self-attention) against
   ``nn.MultiheadAttention(batch_first=True)`` called with ``need_weights=True,
   average_attn_weights=False``, so that both return per-head weights. Goal: ratio <= 1.2.

Timings are interleaved (ours, theirs, ours, theirs, ...) so that a slow spell of a shared
machine hits both sides alike; each round times a few calls and we take the median over rounds.

On glibc (Linux) the script first fixes malloc's mmap and trim thresholds. With the defaults,
whether a call finds its multi-megabyte buffers already mapped depends on the heap's history:
we counted from 0 to about 2,700 minor page faults per call (about 2 ms) for either side,
depending only on the order in which the two were run. Fixed thresholds make that 0 for both, so
the ratio compares the computations. ``--default-malloc`` keeps glibc's defaults.
The script exits with status 1 if a ratio misses its goal.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import sys
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from d2lattn import DotProductAttention, MultiHeadAttention, valid_lens_to_mask

if __package__:  # imported as benchmarks.bench_attention
    from ._timing import interleaved_medians
else:  # run as a script: python benchmarks/bench_attention.py
    from _timing import interleaved_medians

GOAL = 1.2


def fix_malloc_thresholds() -> bool:
    """Keep freed buffers of up to 32 MiB in the heap (glibc only); True if it was done."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
                    and libc.mallopt(M_TRIM_THRESHOLD, 2**30))
    except (AttributeError, OSError):  # not glibc
        return False


def bench_dot_product(rounds: int) -> Tuple[float, float]:
    torch.manual_seed(0)
    B, Q, K, d = 8, 512, 512, 64
    queries, keys, values = torch.randn(B, Q, d), torch.randn(B, K, d), torch.randn(B, K, d)
    valid_lens = torch.randint(K // 2, K + 1, (B,))
    ours = DotProductAttention().eval()
    mask = valid_lens_to_mask(valid_lens, Q, K)  # (B, 1, K), built once, outside the timing

    def run_ours():
        return ours(queries, keys, values, valid_lens)

    def run_torch():
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)

    with torch.no_grad():
        torch.testing.assert_close(run_ours(), run_torch(), rtol=1e-4, atol=1e-5)
        t = interleaved_medians({"ours": run_ours, "torch": run_torch}, rounds, calls=3,
                                warmup=3)
    return t["ours"], t["torch"]


def bench_multihead(rounds: int) -> Tuple[float, float]:
    torch.manual_seed(0)
    B, T, num_hiddens, num_heads = 8, 256, 256, 8
    X = torch.randn(B, T, num_hiddens)
    ours = MultiHeadAttention(num_hiddens, num_heads, bias=True).eval()
    ref = nn.MultiheadAttention(num_hiddens, num_heads, bias=True, batch_first=True).eval()
    with torch.no_grad():  # same weights, so that both compute the same thing
        ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        ref.out_proj.weight.copy_(ours.W_o.weight)
        ref.out_proj.bias.copy_(ours.W_o.bias)

    def run_ours():
        return ours(X, X, X), ours.attention_weights

    def run_torch():
        return ref(X, X, X, need_weights=True, average_attn_weights=False)

    with torch.no_grad():
        (a, wa), (b, wb) = run_ours(), run_torch()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(wa, wb, rtol=1e-4, atol=1e-5)
        t = interleaved_medians({"ours": run_ours, "torch": run_torch}, rounds, calls=3,
                                warmup=3)
    return t["ours"], t["torch"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=41, help="interleaved rounds (median over them)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="keep glibc's malloc thresholds (see above)")
    args = parser.parse_args()
    fixed = False if args.default_malloc else fix_malloc_thresholds()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 CPU, "
          f"median of {args.rounds} interleaved rounds, "
          f"malloc thresholds {'fixed' if fixed else 'default'}")
    ok = True
    for name, bench in (("DotProductAttention vs SDPA (math backend)", bench_dot_product),
                        ("MultiHeadAttention vs nn.MultiheadAttention", bench_multihead)):
        ours, theirs = bench(args.rounds)
        ratio = ours / theirs
        ok &= ratio <= GOAL
        print(f"{name:45s} ours {ours * 1e3:7.2f} ms  torch {theirs * 1e3:7.2f} ms  "
              f"ratio {ratio:.3f}  (goal <= {GOAL}: {'met' if ratio <= GOAL else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
