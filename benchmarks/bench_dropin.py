"""Measurements of d2lattn as a drop-in for PyTorch's attention: precision, memory, skipped tiles.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_dropin.py [--T 4096] [--threads 2]

1. 16-bit inputs. ``flash_attention`` computes bfloat16/float16 tiles in float32 and rounds
   once; we report its error against a float64 reference, next to the error of
   ``F.scaled_dot_product_attention`` in the same dtype, for the output and the three gradients
   (B = 1, h = 2, d = 64, causal, self-attention of length T)          [ratio <= 1 expected]
2. Grouped-query attention: bytes autograd saves for the backward pass (measured with
   ``torch.autograd.graph.saved_tensors_hooks``, distinct storages) by ``flash_attention``
   with ``enable_gqa=True`` against the same call with the keys and values repeated to every
   query head (what ``GroupedQueryAttention`` did before), and by the whole layer for
   g = h, h/4, 1; then the bytes of a ``KVCache`` after decoding T tokens.
3. ``valid_lens``: row-tiles computed for a batch of one long and one short sequence, against
   the longest row for every row (before), and the forward time of both.

Timings are medians of interleaved repeats; the counts and bytes are exact.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from d2lattn.flash import _Tiling, flash_attention
from d2lattn.multihead import GroupedQueryAttention
from d2lattn.transformer import KVCache

if __package__:  # imported as benchmarks.bench_dropin (tests/test_dropin_flash.py does)
    from ._timing import interleaved_medians
else:  # run as a script: python benchmarks/bench_dropin.py
    from _timing import interleaved_medians

MiB = 2 ** 20


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def precision(T: int) -> None:
    print(f"\n1. 16-bit inputs, T={T}, B=1, h=2, d=64, causal: max |error| against float64")
    q64, k64, v64 = (randn(1, 2, T, 64, seed=s).requires_grad_() for s in range(3))
    d_out = randn(1, 2, T, 64, seed=7)
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), d_out)
    ref = ref.detach()
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64))
        rows = {}
        for name, fn in (("flash_attention", lambda: flash_attention(q, k, v, is_causal=True)),
                         ("SDPA", lambda: F.scaled_dot_product_attention(q, k, v,
                                                                         is_causal=True))):
            out = fn()
            grads = torch.autograd.grad(out, (q, k, v), d_out.to(dtype))
            rows[name] = [(out.double() - ref).abs().max().item()] + [
                (g.double() - r).abs().max().item() for g, r in zip(grads, ref_grads)]
        print(f"   {str(dtype):15s} {'output':>10s} {'dq':>10s} {'dk':>10s} {'dv':>10s}")
        for name, errs in rows.items():
            print(f"   {name:15s} " + " ".join(f"{e:10.2e}" for e in errs))
        ratios = [a / b for a, b in zip(rows["flash_attention"], rows["SDPA"])]
        print(f"   {'ratio':15s} " + " ".join(f"{r:10.2f}" for r in ratios))


def saved_bytes(fn) -> int:
    """Bytes autograd saves for the backward pass while ``fn`` runs (distinct storages); the
    tests (tests/test_dropin_flash.py) use this function too."""
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def gqa_memory(T: int) -> None:
    B, h, d, num_hiddens = 1, 8, 64, 512
    print(f"\n2. grouped-query attention, B={B}, h={h}, d_h={d}, T={T}, float32")
    for g in (h, h // 4, 1):
        q = randn(B, h, T, d, dtype=torch.float32).requires_grad_()
        k, v = (randn(B, g, T, d, seed=s, dtype=torch.float32).requires_grad_() for s in (1, 2))
        r = h // g
        grouped = saved_bytes(lambda: flash_attention(q, k, v, is_causal=True, enable_gqa=True))
        repeated = saved_bytes(lambda: flash_attention(q, k.repeat_interleave(r, 1),
                                                       v.repeat_interleave(r, 1),
                                                       is_causal=True))
        layer = GroupedQueryAttention(num_hiddens, h, g)
        X = randn(B, T, num_hiddens, dtype=torch.float32)
        whole = saved_bytes(lambda: layer(X, X, X, is_causal=True))
        print(f"   g={g}: attention saves {grouped / MiB:6.2f} MiB (with repeated K/V: "
              f"{repeated / MiB:6.2f} MiB, saving {(repeated - grouped) / MiB:6.2f} MiB); "
              f"the whole layer saves {whole / MiB:6.2f} MiB")
        cache = KVCache()
        with torch.no_grad():
            layer(X[:, :T - 1], X[:, :T - 1], X[:, :T - 1], is_causal=True, kv_cache=cache)
            layer(X[:, T - 1:], X[:, T - 1:], X[:, T - 1:], kv_cache=cache)
        assert cache.nbytes == layer.kv_cache_bytes(B, T)
        print(f"        KV cache after {T} tokens: {cache.nbytes / MiB:6.2f} MiB "
              f"(= kv_cache_bytes; multi-head: {cache.nbytes * r / MiB:6.2f} MiB)")


def valid_lens_tiles(T: int, rounds: int) -> None:
    bs, h = 256, 8
    print(f"\n3. valid_lens tile skipping, B=2, h={h}, T={T}, block {bs}, lengths "
          f"[{T}, {T // 8}]")
    q, k, v = (randn(2, h, T, 64, seed=s, dtype=torch.float32) for s in range(3))
    lens = torch.tensor([T, T // 8])
    counted = []
    blocks = _Tiling.blocks

    def counting(self, qs, qe):
        for item in blocks(self, qs, qe):
            counted.append(item[3])
            yield item

    _Tiling.blocks = counting
    with torch.no_grad():
        flash_attention(q, k, v, valid_lens=lens)
    _Tiling.blocks = blocks
    per_row = sum(counted)
    before = 2 * h * (T // bs) ** 2  # every row computed the longest row's tiles
    print(f"   row-tiles computed: {per_row} (before: {before}, {per_row / before:.2f}x)")
    fns = {"[T, T/8]": lambda: flash_attention(q, k, v, valid_lens=lens),
           "[T, T]": lambda: flash_attention(q, k, v, valid_lens=torch.tensor([T, T]))}
    with torch.no_grad():
        t = interleaved_medians(fns, rounds)
    print(f"   forward time: lengths [T, T/8] {t['[T, T/8]'] * 1e3:7.1f} ms, [T, T] "
          f"{t['[T, T]'] * 1e3:7.1f} ms, ratio {t['[T, T/8]'] / t['[T, T]']:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    precision(args.T)
    gqa_memory(args.T)
    valid_lens_tiles(args.T, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
