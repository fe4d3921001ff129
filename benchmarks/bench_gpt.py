"""Speed of chapter 12's GPT on the CPU: a training step against PyTorch's own layers, and
generation with and without the KV cache.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_gpt.py [--rounds 7] [--threads 1]

Reported (goals in brackets):

1. One training step (forward, backward, AdamW update) of the chapter's Shakespeare GPT
   (4 layers, d = 128, 4 heads, FFN 512, context 128, batch 16) built from d2lattn's blocks,
   divided by the same step of the same model built from ``nn.TransformerEncoderLayer``
   (pre-norm, GELU, ``batch_first``) with a causal mask                        [<= 1.2]
   Both use learned positions, the only kind ``nn.TransformerEncoderLayer`` can host; the
   reference's weights are copied into ours and the logits checked equal before timing.
   The chapter's rotary model is timed too, against the same reference (for information:
   rotary positions cost work that the reference does not do).
2. Generation of 256 new tokens from a one-token prompt, greedy, with the KV cache and
   without (every step recomputes the whole context), by the same model with a context of
   512 (untrained: the weights do not change the work)          [cache faster; ratio printed]

Timings are interleaved (ours, reference, ours, ...) so that a slow spell of a shared machine
hits all alike; we report the median over rounds of the process's CPU time (with one thread,
the work itself; with more, all threads' time, spinning included). On a loaded machine the
times are still inflated (shared caches, frequency), the ratios less so. The script exits with status 1 if a goal is missed.
Speed is measured here, never in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Dict

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from d2lattn.gpt import GPT, GPTConfig  # noqa: E402
from d2lattn.transformer import TransformerEncoderBlock  # noqa: E402

if __package__:  # imported as benchmarks.bench_gpt
    from ._timing import interleaved_medians  # noqa: E402
else:  # run as a script: python benchmarks/bench_gpt.py
    from _timing import interleaved_medians  # noqa: E402

CONFIG = dict(vocab_size=65, block_size=128, num_hiddens=128, num_heads=4, num_layers=4,
              ffn_num_hiddens=512)  # the chapter's Shakespeare model
BATCH = 16


class TorchGPT(nn.Module):
    """The same GPT from ``nn.TransformerEncoderLayer``: learned positions, pre-norm blocks
    under a causal mask, a final LayerNorm and a read-out tied to the embedding."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(c.vocab_size, c.num_hiddens)
        self.positions = nn.Embedding(c.block_size, c.num_hiddens)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(c.num_hiddens, c.num_heads, c.ffn_num_hiddens, 0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(c.num_layers))
        self.norm = nn.LayerNorm(c.num_hiddens)
        self.head = nn.Linear(c.num_hiddens, c.vocab_size, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        X = self.embedding(tokens) + self.positions(torch.arange(T))  # (B, T, d)
        mask = nn.Transformer.generate_square_subsequent_mask(T)  # (T, T), -inf above
        for block in self.blocks:
            X = block(X, src_mask=mask, is_causal=True)  # (B, T, d)
        return self.head(self.norm(X))  # (B, T, V)


def ours_from(ref: TorchGPT, config: GPTConfig) -> GPT:
    """d2lattn's GPT (learned positions) with the reference's weights."""
    model = GPT(config)
    model.embedding.weight.data.copy_(ref.embedding.weight.data)
    model.positions.weight.data.copy_(ref.positions.weight.data)
    for ours, theirs in zip(model.blocks, ref.blocks):
        ours.load_state_dict(TransformerEncoderBlock.from_torch(theirs).state_dict())
    model.norm.load_state_dict(ref.norm.state_dict())
    return model


def training_step(model: nn.Module, X: torch.Tensor, Y: torch.Tensor) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        loss = F.cross_entropy(model(X).flatten(0, 1), Y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def cpu_medians(fns: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, float]:
    """Median CPU seconds per call of each function, timed in alternation after one warm-up.

    CPU time of this process (``time.process_time``): with one thread it is what the work
    costs, and other programs on the machine inflate it much less than wall-clock time.
    """
    return interleaved_medians(fns, rounds, clock=time.process_time)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    # 1. a training step, ours against nn.TransformerEncoderLayer
    learned = GPTConfig(**CONFIG, positions="learned")
    ref = TorchGPT(learned)
    ours = ours_from(ref, learned)
    rotary = GPT(GPTConfig(**CONFIG))
    g = torch.Generator().manual_seed(0)
    X = torch.randint(0, CONFIG["vocab_size"], (BATCH, CONFIG["block_size"]), generator=g)
    Y = torch.randint(0, CONFIG["vocab_size"], (BATCH, CONFIG["block_size"]), generator=g)
    with torch.no_grad():
        ref.eval(), ours.eval()
        same = torch.allclose(ours(X), ref(X), rtol=1e-4, atol=1e-5)
    ref.train(), ours.train(), rotary.train()
    step = cpu_medians({"d2lattn (learned positions)": training_step(ours, X, Y),
                        "nn.TransformerEncoderLayer": training_step(ref, X, Y),
                        "d2lattn (rotary, the chapter's)": training_step(rotary, X, Y)},
                       args.rounds)
    ratio = step["d2lattn (learned positions)"] / step["nn.TransformerEncoderLayer"]
    ratio_rotary = step["d2lattn (rotary, the chapter's)"] / step["nn.TransformerEncoderLayer"]

    # 2. generation with and without the cache
    n = args.new_tokens
    long = GPT(GPTConfig(**{**CONFIG, "block_size": 2 * n})).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        same_tokens = torch.equal(long.generate(prompt, 32, greedy=True, use_cache=True),
                                  long.generate(prompt, 32, greedy=True, use_cache=False))
    gen = cpu_medians(
        {"with cache": lambda: long.generate(prompt, n, greedy=True, use_cache=True),
         "without cache": lambda: long.generate(prompt, n, greedy=True, use_cache=False)},
        max(1, args.rounds // 3))
    speedup = gen["without cache"] / gen["with cache"]

    report = {"threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
              "train_step_seconds": {k: round(v, 4) for k, v in step.items()},
              "train_step_ratio_learned": round(ratio, 3),
              "train_step_ratio_rotary": round(ratio_rotary, 3),
              "same_logits_as_reference": same,
              f"generate_{n}_seconds": {k: round(v, 3) for k, v in gen.items()},
              "cache_speedup": round(speedup, 2), "same_tokens_with_and_without_cache": same_tokens}
    print(json.dumps(report, indent=1))
    goals = {"same logits as the reference": same,
             "training step <= 1.2 x nn.TransformerEncoderLayer": ratio <= 1.2,
             "the cache gives the same tokens": same_tokens,
             "generation faster with the cache": speedup > 1}
    for goal, met in goals.items():
        print(f"{'met ' if met else 'MISSED'} {goal}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
