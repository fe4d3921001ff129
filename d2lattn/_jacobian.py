"""Exact tests of a model's Jacobian for :mod:`d2lattn.diagnostics` (private).

A model whose output at position t must not depend on its input at position s has
:math:`\\partial y_t / \\partial x_s = 0` *exactly*: not small, zero. A masked score is
``-inf`` (or a number so negative that its exponential underflows to 0), the softmax gives it
weight 0, and the chain rule multiplies every path through it by that 0. A leak of any size
(LayerScale at 1e-6, a soft mask ``scores + log(mask + 1e-7)``, outputs of size 1e-6, a leak
hidden beside a feature of size 1e8) leaves a gradient that is not 0, so this test needs no
tolerance: reduced matmul precision, TF32 or bfloat16 cannot make a zero non-zero, nor a
non-zero zero except by underflow.

How: one forward pass with gradients enabled, then one backward pass per question asked
(``torch.autograd.grad`` with ``retain_graph``). Each question weights the outputs it asks
about with random numbers (so that outputs which sum to a constant, such as probabilities,
cannot cancel) and reads the gradient at every input position. Float inputs are the leaves;
token ids have no gradient, so the output of every ``nn.Embedding`` the model calls with a
``(B, T)`` (or ``(T,)``) index is made a leaf instead (token, position and segment tables).

What it cannot see (the perturbation tests of :mod:`d2lattn.diagnostics` remain for these): a
dependence with a zero derivative at the given inputs (an argmax, a comparison, an integer
path, a ReLU that is off, NaN that appears only for other inputs), a model whose outputs carry
no gradient (integer outputs, ``detach``, its own ``no_grad``), token ids read without an
``nn.Embedding`` module.

Source: the gradient-based leak tests of pangolinn; book chapter "When attention goes wrong".
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn.modules.module import register_module_forward_hook

@contextlib.contextmanager
def _embedding_leaves(B: int, T: int) -> Iterator[List[Tuple[Tensor, bool]]]:
    """While active, the output of every ``nn.Embedding`` called with gradients enabled on a
    ``(B, T)``, ``(1, T)`` or ``(T,)`` index becomes a leaf tensor that requires a gradient.
    Yields the list of ``(leaf (B or 1, T, ...), shared)``; ``shared`` marks a table read
    the same for every sequence (positions), which says nothing about one sequence."""
    leaves: List[Tuple[Tensor, bool]] = []

    def hook(module: nn.Module, args: Any, out: Any) -> Optional[Tensor]:
        if not (isinstance(module, nn.Embedding) and torch.is_grad_enabled()
                and isinstance(out, Tensor) and out.is_floating_point()):
            return None
        if out.dim() >= 3 and out.shape[1] == T and out.shape[0] in (B, 1):
            leaf = out.detach().requires_grad_(True)
            leaves.append((leaf, out.shape[0] == 1 and B > 1))
            return leaf
        if out.dim() == 2 and out.shape[0] == T:  # positions: table[arange(T)]
            leaf = out.detach().requires_grad_(True)
            leaves.append((leaf.unsqueeze(0), True))
            return leaf
        return None

    handle = register_module_forward_hook(hook)
    try:
        yield leaves
    finally:
        handle.remove()


class Probe:
    """One forward pass with gradients to the inputs at every position.

    Args:
        call: ``call(x) -> Tensor``, the model on inputs ``x`` (the check's runner: generators
            reseeded, arguments copied, output selected).
        inputs: ``(B, T, ...)`` floats or ``(B, T)`` token ids.
        generator: draws the random weights of the outputs.

    Attributes:
        out: the outputs of the run with gradients enabled (``None`` if the run failed).
        why_not: ``None`` if gradients can be read, else the reason in words.
    """

    def __init__(self, call: Callable[[Tensor], Tensor], inputs: Tensor,
                 generator: torch.Generator) -> None:
        B, T = inputs.shape[:2]
        self.B, self.T = B, T
        self.why_not: Optional[str] = None
        self.backward_passes = 0
        with torch.enable_grad():
            if inputs.is_floating_point():
                x = inputs.detach().clone().requires_grad_(True)
                self.leaves: List[Tuple[Tensor, bool]] = [(x, False)]
                out = call(x)
            else:
                with _embedding_leaves(B, T) as leaves:
                    out = call(inputs)
                self.leaves = list(leaves)
        self.out = out
        if not self.leaves:
            self.why_not = ("the token ids reach the model through no nn.Embedding module, so "
                            "there is nothing to differentiate")
        elif not out.is_floating_point():
            self.why_not = f"the outputs are {out.dtype}, which carry no gradient"
        elif not out.requires_grad:
            self.why_not = ("the outputs carry no gradient (detached, or computed under the "
                            "model's own no_grad)")
        w = torch.randn(out.shape, generator=generator, device=generator.device,
                        dtype=torch.float64).to(out.device)
        finite = torch.isfinite(out.detach()) if out.is_floating_point() else None
        self.weights = (w.to(out.dtype) if finite is None
                        else torch.where(finite, w, torch.zeros_like(w)).to(out.dtype))

    @property
    def usable(self) -> bool:
        return self.why_not is None

    def influence(self, select: Tensor, *, per_sequence: bool = False) -> Tensor:
        """How much the selected outputs depend on the input at each position: the largest
        ``|gradient|`` of a random weighting of the outputs where ``select`` is True, at each
        input position, ``(B, T)`` float64 (``inf`` where it is NaN). Exactly 0 means no
        dependence (to first order). ``select``: bool, ``(B, T)`` (or ``(B,)`` for outputs
        without positions). ``per_sequence``: ignore the tables shared by all sequences
        (positions), which cannot tell one sequence's dependence from another's."""
        return self.influences(select)[1 if per_sequence else 0]

    def influences(self, select: Tensor) -> Tuple[Tensor, Tensor]:
        """:meth:`influence` with and without the shared tables, from one backward pass."""
        out = self.out
        sel = select.to(out.device)
        sel = sel.view(*sel.shape, *([1] * (out.dim() - sel.dim())))
        tensors = [leaf for leaf, _ in self.leaves]
        with torch.enable_grad():
            loss = (out * torch.where(sel, self.weights, torch.zeros_like(self.weights))).sum()
            grads = torch.autograd.grad(loss, tensors, retain_graph=True, allow_unused=True)
        self.backward_passes += 1
        every = torch.zeros(self.B, self.T, dtype=torch.float64, device=out.device)
        own = torch.zeros_like(every)
        for g, (_, shared) in zip(grads, self.leaves):
            if g is None:
                continue
            a = g.detach().double().abs()
            a = torch.where(torch.isnan(a), torch.full_like(a, float("inf")), a)
            a = a.flatten(2).amax(dim=2) if a.dim() >= 3 else a  # (B or 1, T)
            a = a.to(every.device).expand(self.B, self.T)
            every = torch.maximum(every, a)
            if not shared:
                own = torch.maximum(own, a)
        return every, own
