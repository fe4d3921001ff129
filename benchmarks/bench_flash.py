"""Speed and memory of d2lattn.flash_attention against PyTorch, on the CPU in float32.

    python benchmarks/bench_flash.py [--rounds 7] [--threads 2] [--block-size 256] [--sweep]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_flash.py   # on a shared, loaded machine

Shapes: B = 1, h = 8 heads, d = 64, self-attention of length T. Reported (goals in brackets):

1. Forward time of ``flash_attention`` / ``F.scaled_dot_product_attention`` (PyTorch's fused
   FlashAttention CPU kernel) at T = 1024, 4096, 8192             [ratio <= 1.5 at T = 4096]
   and ``flash_attention`` / ``DotProductAttention`` (materialises the weights)
                                                                   [< 1 from T = 1024 on]
2. Causal: ``flash_attention(is_causal=True)`` / ``flash_attention`` at T = 4096, the gain
   from skipping the tiles above the diagonal                      [<= 0.6]
3. Peak extra memory of one forward call at T = 8192, measured in a fresh subprocess per
   function as the growth of the peak resident set size (``ru_maxrss``) over the inputs
                          [flash_attention <= 64 MiB; DotProductAttention >= 2 GiB]

Timings are interleaved (flash, SDPA, DotProductAttention, flash, ...) so that a slow spell of
a shared machine hits all alike; we report the median over rounds. ``--sweep`` also times
block sizes 64 ... 2048 at T = 4096 (the cache cliff of chapter 9). The script exits with
status 1 if a goal is missed. Speed is measured here, never in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# On a machine shared with other work, run with OMP_WAIT_POLICY=PASSIVE in the environment: by
# default idle OpenMP threads spin, and when a core is taken by another process every one of the
# thousands of small parallel regions of a Python-level loop waits for a descheduled thread
# (flash_attention measured 25x slower that way, one fused kernel barely notices). Passive
# waiting costs a little on a quiet machine, so it is not the default here.
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from d2lattn import DotProductAttention, flash_attention  # noqa: E402

if __package__:  # imported as benchmarks.bench_flash
    from ._timing import interleaved_medians  # noqa: E402
else:  # run as a script: python benchmarks/bench_flash.py
    from _timing import interleaved_medians  # noqa: E402

B, H, D = 1, 8, 64
MiB = 2 ** 20


def inputs(T: int):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, T, D, generator=g) for _ in range(3))  # (B, h, T, d)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset the peak resident set size (VmHWM) to the current one; return the current one.

    ``ru_maxrss`` cannot be reset and a child process started by ``subprocess`` inherits its
    parent's, so we use Linux's ``/proc/self/clear_refs`` (value 5 resets VmHWM) instead.
    """
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    return _status_bytes("VmHWM")


def measure_memory(name: str, T: int, block_size: int) -> int:
    """Run in a fresh process: growth of the peak RSS during one forward call, in bytes."""
    q, k, v = inputs(T)
    calls = {
        "flash": lambda: flash_attention(q, k, v, block_size=block_size),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "dot": lambda: DotProductAttention()(q, k, v),
    }
    small = tuple(t[..., :64, :] for t in (q, k, v))  # load the kernels on a tiny problem
    flash_attention(*small), F.scaled_dot_product_attention(*small), DotProductAttention()(*small)
    with torch.no_grad():
        before = reset_peak_rss()
        out = calls[name]()
        after = peak_rss_bytes()
    del out
    return after - before


def memory_in_subprocess(name: str, T: int, block_size: int, threads: int) -> int:
    cmd = [sys.executable, __file__, "--memory-child", name, "--T", str(T),
           "--block-size", str(block_size), "--threads", str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["bytes"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--block-size", type=int, default=256, help="flash_attention's tiles")
    parser.add_argument("--sweep", action="store_true", help="also time block sizes at T=4096")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--T", type=int, default=8192, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bs = args.block_size

    if args.memory_child:
        print(json.dumps({"bytes": measure_memory(args.memory_child, args.T, bs)}))
        return 0

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 CPU, "
          f"B={B}, h={H}, d={D}, block_size={bs}, median of {args.rounds} interleaved rounds, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    ok = True
    attn = DotProductAttention()
    ratios = {}
    with torch.no_grad():
        print("\n1. forward time")
        for T in (1024, 4096, 8192):
            q, k, v = inputs(T)
            torch.testing.assert_close(flash_attention(q, k, v, block_size=bs),
                                       F.scaled_dot_product_attention(q, k, v),
                                       rtol=1e-4, atol=1e-5)
            fns = {"flash": lambda: flash_attention(q, k, v, block_size=bs),
                   "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
                   "dot": lambda: attn(q, k, v)}
            rounds = args.rounds if T < 8192 else max(3, args.rounds // 2)
            t = interleaved_medians(fns, rounds)
            ratios[T] = t["flash"] / t["sdpa"]
            vs_dot = t["flash"] / t["dot"]
            met = "met" if ratios[T] <= 1.5 else "MISSED"
            goal = f"  (goal <= 1.5: {met})" if T == 4096 else ""
            print(f"   T={T:5d}  flash {t['flash'] * 1e3:8.1f} ms  SDPA {t['sdpa'] * 1e3:8.1f} ms  "
                  f"DotProductAttention {t['dot'] * 1e3:8.1f} ms  "
                  f"flash/SDPA {ratios[T]:.2f}{goal}  flash/Dot {vs_dot:.2f}"
                  f"  ({'faster' if vs_dot < 1 else 'NOT faster'})")
            ok &= vs_dot < 1
            if T == 4096:
                ok &= ratios[T] <= 1.5
            del q, k, v, fns
        attn.attention_weights = None  # free the last (B, h, T, T) weights

        print("\n2. causal block skipping, T=4096")
        q, k, v = inputs(4096)
        t = interleaved_medians({"full": lambda: flash_attention(q, k, v, block_size=bs),
                                 "causal": lambda: flash_attention(q, k, v, is_causal=True,
                                                                   block_size=bs)},
                                args.rounds)
        causal = t["causal"] / t["full"]
        ok &= causal <= 0.6
        print(f"   non-causal {t['full'] * 1e3:8.1f} ms  causal {t['causal'] * 1e3:8.1f} ms  "
              f"causal/non-causal {causal:.2f}  "
              f"(goal <= 0.6: {'met' if causal <= 0.6 else 'MISSED'})")

        if args.sweep:
            print("\n   block-size sweep, T=4096 (non-causal)")
            sizes = (64, 128, 256, 512, 1024, 2048)
            fns = {s: (lambda s=s: flash_attention(q, k, v, block_size=s)) for s in sizes}
            fns["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v)
            t = interleaved_medians(fns, max(3, args.rounds // 2))
            for s in sizes:
                tile = H * s * s * 4 / MiB
                print(f"   block {s:5d}: {t[s] * 1e3:8.1f} ms  flash/SDPA {t[s] / t['sdpa']:.2f}"
                      f"  (one tile of scores for 8 heads: {tile:g} MiB)")
        del q, k, v

    print("\n3. peak extra memory of one forward call, T=8192 (fresh subprocess each)")
    mem = {name: memory_in_subprocess(name, 8192, bs, args.threads)
           for name in ("flash", "sdpa", "dot")}
    inputs_mib = 3 * B * H * 8192 * D * 4 / MiB
    print(f"   (the inputs, {inputs_mib:.0f} MiB, and the {inputs_mib / 3:.0f} MiB output are "
          f"counted as follows: inputs excluded, output included)")
    flash_ok, dot_ok = mem["flash"] <= 64 * MiB, mem["dot"] >= 2 * 1024 * MiB
    ok &= flash_ok and dot_ok
    print(f"   flash_attention      {mem['flash'] / MiB:8.1f} MiB  "
          f"(goal <= 64 MiB: {'met' if flash_ok else 'MISSED'})")
    print(f"   DotProductAttention  {mem['dot'] / MiB:8.1f} MiB  "
          f"(goal >= 2 GiB: {'met' if dot_ok else 'MISSED'})")
    print(f"   SDPA (fused)         {mem['sdpa'] / MiB:8.1f} MiB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
