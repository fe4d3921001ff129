"""Checks that find the classic attention bugs in any model: a verdict you can print.

Each check takes a model (an ``nn.Module`` or any callable) and example inputs, runs the model
on the inputs and on a changed copy of them, and compares what must not move:

==================================  ==============================================================
``check_causal``                    the output at position t ignores the inputs after t
``check_padding``                   outputs at valid positions ignore what the padding holds
``check_permutation_equivariance``  permuting the input positions permutes the outputs alike
``check_kv_cache``                  decoding with a cache gives the outputs of recomputation
``check_finite``                    outputs and gradients are finite (fully masked rows, NaN)
``check_attention_weights``         weights are non-negative and sum to one over the keys
==================================  ==============================================================

Every check returns a :class:`CheckResult`: ``bool(result)`` is the verdict, ``result.message``
says what was changed, what moved, by how much and where (the first position that leaked, the
largest deviation).

How the checks keep out of the way (the same for all of them):

- **Deterministic.** By default every submodule is put in eval mode for the check (dropout off,
  BatchNorm on its running statistics), and PyTorch's global random generator is reseeded with
  ``seed`` before every call of the model, so a function that draws random numbers draws the
  same ones each time. ``mode="train"`` puts every submodule in training mode instead (to catch
  what only training does, such as BatchNorm's batch statistics), with the same reseeding, so
  dropout draws the same mask in every call. The changed inputs come from a separate generator
  seeded with ``seed``. The global generator's state is restored afterwards.
- **Nothing changes.** Parameters, buffers (BatchNorm's running statistics), gradients and the
  train/eval flag of every submodule are as the check found them; the caller's tensors are
  never written to (the check changes copies). The model runs under ``torch.no_grad()``
  (``check_finite`` computes gradients with ``torch.autograd.grad``, which accumulates nothing
  into ``.grad``).
- **Tolerance suited to the dtype.** Two outputs agree when they differ by at most
  ``rtol * max(1, max |output|)``, with ``rtol`` 1e-10 in float64, 1e-5 in float32, 2e-3 in
  float16 and 1.6e-2 in bfloat16 (the last two after torch.testing's defaults); ``tolerance=``
  sets an absolute tolerance instead. A leak in a model at initialisation moves outputs by
  a fair fraction of their size, far above these.

A plain function has no modules the check can see: pass the module it calls as ``module=`` to
have it held still in the same way (a bound method of a module is recognised by itself).

Source: the bugs readers report in the issue trackers of widely read attention code (causal
masks missing or off by one, padding leaking, heads split without a transpose, KV caches that
disagree with recomputation, NaN from fully masked rows); book chapter "When attention goes
wrong".
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ._checks import (check_diagnostic_inputs as _check_inputs,
                      check_diagnostic_model as _check_model,
                      check_diagnostic_options as _check_options,
                      check_diagnostic_time_axis as _check_time_axis,
                      check_diagnostic_valid_lens as _check_valid_lens,
                      check_diagnostic_vocab as _check_vocab, is_integer_dtype as _is_integer)

__all__ = [
    "CheckResult",
    "check_attention_weights",
    "check_causal",
    "check_finite",
    "check_kv_cache",
    "check_padding",
    "check_permutation_equivariance",
]

#: A model: an ``nn.Module`` or any callable returning a tensor (or a tuple whose first element
#: is the tensor, as ``(logits, loss)``).
Model = Callable[..., Any]

_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass(frozen=True)
class CheckResult:
    """The verdict of a check: ``bool(result)`` is ``result.passed``.

    Attributes:
        name: the check, e.g. ``"check_causal"``.
        passed: the verdict.
        message: one or two sentences: what was changed, what moved, by how much and where.
        max_deviation: the largest deviation measured (0.0 when nothing could move; ``nan``
            when the outputs were not finite).
        tolerance: the largest deviation allowed.
        first_position: the first position that failed (a leaking position, a step of the
            cache, a non-finite position), or ``None`` if none did.
        details: check-specific extras, e.g. ``"deviations"``, one number per position.

    Example:
        >>> result = check_causal(lambda x: x.cumsum(dim=1), torch.ones(1, 4, 2))
        >>> bool(result), result.first_position
        (True, None)
    """

    name: str
    passed: bool
    message: str
    max_deviation: float
    tolerance: float
    first_position: Optional[int] = None
    details: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"{self.name}: {'PASSED' if self.passed else 'FAILED'}. {self.message}"

    def __repr__(self) -> str:
        return f"<{self}>"


# --- helpers ----------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    """A deviation with two significant digits (never the last bits, which differ by CPU)."""
    if x == 0:
        return "0"
    if math.isnan(x):
        return "nan"
    return f"{x:.1e}"


def _spans(positions: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out: List[str] = []
    for p in positions:
        if out and int(out[-1].split("-")[-1]) == p - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{p}"
        else:
            out.append(str(p))
    return ", ".join(out)


def _positions(positions: Sequence[int]) -> str:
    """``[3]`` -> ``"position 3"``, ``[1, 2, 3]`` -> ``"positions 1-3"``."""
    return f"position {positions[0]}" if len(positions) == 1 else f"positions {_spans(positions)}"


def _find_module(model: Model, module: Optional[nn.Module]) -> Optional[nn.Module]:
    if module is not None:
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be an nn.Module or None, got {type(module).__name__}")
        return module
    if isinstance(model, nn.Module):
        return model
    owner = getattr(model, "__self__", None)  # a bound method such as model.generate
    return owner if isinstance(owner, nn.Module) else None


@contextlib.contextmanager
def _held_still(module: Optional[nn.Module], mode: str, device: torch.device) -> Iterator[None]:
    """Run a check with ``module`` in ``mode``, then put back its state exactly as it was."""
    flags: List[Tuple[nn.Module, bool]] = []
    saved: List[Tuple[Tensor, Tensor]] = []
    grads: List[Tuple[Tensor, Optional[Tensor]]] = []
    if module is not None:
        flags = [(m, m.training) for m in module.modules()]
        tensors = [t for _, t in module.named_parameters()] + [t for _, t in module.named_buffers()]
        saved = [(t, t.detach().clone()) for t in tensors]
        grads = [(p, None if p.grad is None else p.grad.detach().clone())
                 for p in module.parameters()]
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            if module is not None:
                module.train(mode == "train")
            yield
    finally:
        with torch.no_grad():
            for t, copy in saved:
                if not torch.equal(t, copy):
                    t.copy_(copy)
        for p, g in grads:
            if g is None:
                p.grad = None
            elif p.grad is None or not torch.equal(p.grad, g):
                p.grad = g
        for m, training in flags:
            m.training = training


def _runner(model: Model, seed: int, B: int) -> Callable[..., Tensor]:
    """Call the model with the generator reseeded; return its output tensor."""

    def run(*args: Any) -> Tensor:
        torch.manual_seed(seed)
        out = model(*args)
        if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
            out = out[0]  # (logits, loss) and the like: the first element
        if not isinstance(out, Tensor) or out.dim() < 1 or out.shape[0] != B:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"model must return a tensor of shape (B = {B}, ...), got {got}")
        return out

    return run


def _tolerance(reference: Tensor, tolerance: Optional[float]) -> float:
    if tolerance is not None:
        return float(tolerance)
    rtol = _RTOL.get(reference.dtype, 1e-5)  # an integer output: any change is a change
    scale = float(reference.detach().abs().max()) if reference.numel() else 0.0
    return rtol * max(1.0, scale)


def _perturbed(inputs: Tensor, where: Tensor, generator: torch.Generator,
               vocab_size: Optional[int]) -> Tensor:
    """A copy of ``inputs`` whose positions ``where`` (bool, (B, T)) hold other values."""
    where = where.to(inputs.device)
    if inputs.is_floating_point():
        scale = float(inputs.double().std()) if inputs.numel() > 1 else 0.0
        noise = torch.randn(inputs.shape, generator=generator, device=inputs.device,
                            dtype=torch.float64) * (scale if scale > 0 else 1.0)
        where = where.view(*where.shape, *([1] * (inputs.dim() - 2)))
        return torch.where(where, inputs + noise.to(inputs.dtype), inputs)
    V = vocab_size if vocab_size is not None else int(inputs.max()) + 1
    if V < 2:
        raise ValueError("token ids need a vocabulary of at least 2 to be changed: pass "
                         "vocab_size")
    shift = torch.randint(1, V, inputs.shape, generator=generator, device=inputs.device)
    return torch.where(where, (inputs + shift) % V, inputs)  # a different id at every such place


def _describe_run(inputs: Tensor, mode: str, seed: int) -> str:
    return f"{inputs.dtype} inputs, {mode} mode, generator seeded {seed}"


def _non_finite(out: Tensor) -> Optional[str]:
    """Where ``out`` (B, T, ...) or (B, ...) is not finite, in words; None if it all is."""
    bad = ~torch.isfinite(out)
    if not bool(bad.any()):
        return None
    b = int(bad.flatten(1).any(dim=1).nonzero()[0])
    if out.dim() >= 2:
        per_pos = bad[b].flatten(1).any(dim=1) if out.dim() >= 3 else bad[b]
        return f"sequence {b}, {_positions(per_pos.nonzero().flatten().tolist())}"
    return f"sequence {b}"


def _position_deviation(a: Tensor, b: Tensor) -> Tensor:
    """``max |a - b|`` over everything but the first two axes: ``(B, T)``, float64."""
    diff = (a.double() - b.double()).abs()
    return diff.flatten(2).amax(dim=2) if diff.dim() >= 3 else diff


def _not_finite_result(name: str, where: str, tol: float, what: str) -> CheckResult:
    return CheckResult(name, False, f"{what} are not finite ({where}), so nothing can be "
                       "compared; check_finite shows where the NaN comes from.",
                       float("nan"), tol)


# --- the checks -------------------------------------------------------------------------------

def _reference_run(run: Callable[..., Tensor], args: Tuple[Any, ...], B: int, T: int, name: str,
                   tolerance: Optional[float], what: str = "The outputs"
                   ) -> Tuple[Tensor, float, Optional[CheckResult]]:
    """The run the other runs are compared with: its outputs ``(B, T, ...)``, the tolerance, and
    the failed result to return when those outputs are not finite (``None`` when they are)."""
    reference = run(*args)
    _check_time_axis(reference, B, T, name)
    tol = _tolerance(reference, tolerance)
    where = _non_finite(reference)
    failed = None if where is None else _not_finite_result(name, where, tol, what)
    return reference, tol, failed


def check_causal(model: Model, inputs: Tensor, *, mode: str = "eval",
                 tolerance: Optional[float] = None, seed: int = 0,
                 vocab_size: Optional[int] = None,
                 module: Optional[nn.Module] = None) -> CheckResult:
    r"""Check that the output at every position t is unchanged when the inputs after t change.

    For each position :math:`t = 0, \dots, T-2` the check changes every input after t (random
    values for floats, other token ids for integers), runs the model, and compares the
    output at t with the output for the original inputs. A causal model (a decoder, a GPT)
    must pass; a model whose mask is missing, off by one or in the wrong corner, whose
    normalisation mixes positions, or whose convolution sees the future, fails, and the
    message names the first position that leaked and which later positions it reads.

    Args:
        model: ``model(inputs)`` maps ``inputs`` to ``(B, T, ...)`` outputs (a tuple's first
            element is used); an ``nn.Module`` or any callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` integer token ids, ``T >= 2``; never
            modified.
        mode: keyword-only; ``"eval"`` (default) or ``"train"``, the mode of every submodule
            during the check (see the module's notes; restored afterwards).
        tolerance: keyword-only; the largest absolute deviation that counts as "unchanged";
            default: relative to the dtype (1e-5 of the outputs' size in float32).
        seed: keyword-only; seeds the changed inputs and the global generator before each call.
        vocab_size: keyword-only; for token ids, changed ids are drawn from
            ``[0, vocab_size)`` (default: ``inputs.max() + 1``).
        module: keyword-only; the module to hold still when ``model`` is a plain function.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first leaking position,
        ``details["deviations"]`` the ``(T - 1,)`` largest change at each position t when the
        inputs after t changed, and ``details["reads"]`` the later positions that the first
        leaking position reads.

    Raises:
        ValueError: ``model`` not callable; ``inputs`` not ``(B, T, ...)`` float or integer
            with ``T >= 2``, or not finite; outputs not ``(B, T, ...)``; a bad option.

    Example:
        >>> check_causal(lambda x: x.cumsum(dim=1), torch.ones(2, 5, 3)).passed
        True
        >>> leaky = check_causal(lambda x: x + x.roll(-1, dims=1), torch.ones(2, 5, 3))
        >>> leaky.passed, leaky.first_position, leaky.details["reads"]
        (False, 0, [1])

    Source: Vaswani et al. (2017), section 3.2.3 (the decoder must not see later positions);
    book chapters 8 and "When attention goes wrong".
    """
    _check_model(model)
    inputs = _check_inputs(inputs, min_len=2)
    _check_options(mode, tolerance, seed)
    _check_vocab(inputs, vocab_size)
    B, T = inputs.shape[:2]
    name = "check_causal"
    generator = torch.Generator(device=inputs.device).manual_seed(seed)
    run = _runner(model, seed, B)
    positions = torch.arange(T, device=inputs.device)
    with _held_still(_find_module(model, module), mode, inputs.device), torch.no_grad():
        reference, tol, failed = _reference_run(run, (inputs,), B, T, name, tolerance)
        if failed is not None:
            return failed
        deviations = torch.zeros(T - 1, dtype=torch.float64)
        for t in range(T - 1):
            changed = _perturbed(inputs, (positions > t).expand(B, T), generator, vocab_size)
            dev = _position_deviation(run(changed), reference)[:, t]  # (B,)
            deviations[t] = float(dev.max())
        leaking = (deviations > tol).nonzero().flatten().tolist()
        reads: List[int] = []
        if leaking:
            p = leaking[0]
            for q in range(p + 1, T):  # which later positions does position p read?
                changed = _perturbed(inputs, (positions == q).expand(B, T), generator, vocab_size)
                if float(_position_deviation(run(changed), reference)[:, p].max()) > tol:
                    reads.append(q)
    largest = float(deviations.max())
    how = _describe_run(inputs, mode, seed)
    if not leaking:
        message = (f"For every position t of {T}, changing the inputs after t left the output "
                   f"at t unchanged (within the tolerance {_fmt(tol)}; {how}).")
        return CheckResult(name, True, message, largest, tol, None,
                           {"deviations": deviations, "reads": []})
    p = leaking[0]
    worst = int(deviations.argmax())
    message = (f"The output at position {p} changed by {_fmt(float(deviations[p]))} when the "
               f"inputs after it changed (tolerance {_fmt(tol)}): it reads "
               f"{_positions(reads) if reads else 'several later positions together'}. "
               f"{len(leaking)} of the first {T - 1} positions leak; the largest deviation is "
               f"{_fmt(largest)}, at position {worst} ({how}).")
    return CheckResult(name, False, message, largest, tol, p,
                       {"deviations": deviations, "reads": reads})


def check_padding(model: Model, inputs: Tensor, valid_lens: Union[Tensor, Sequence[int]], *,
                  mode: str = "eval", tolerance: Optional[float] = None, seed: int = 0,
                  vocab_size: Optional[int] = None, pooled: Optional[bool] = None,
                  module: Optional[nn.Module] = None) -> CheckResult:
    """Check that outputs at valid positions ignore what the padded positions contain.

    Sequence ``b`` is valid at positions ``0 .. valid_lens[b] - 1``; the rest is padding. The
    check fills the padding with other values (or other token ids), runs ``model(inputs,
    valid_lens)`` again, and compares the outputs at the valid positions (or, for a model that
    pools each sequence into one vector, the pooled outputs). Outputs *at* padded positions may
    change: nothing should read them. A model that masks the padding keys passes; one that
    forgets the mask, uses the wrong convention, or pools (averages) over the padding fails.

    Args:
        model: ``model(inputs, valid_lens)`` maps to ``(B, T, ...)`` outputs, or to ``(B, ...)``
            pooled outputs; an ``nn.Module`` or any callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids; never modified.
        valid_lens: ``(B,)`` integers in ``[0, T]`` (a list works too), at least one of them
            ``< T`` (otherwise there is no padding to change). The model gets a copy.
        mode, tolerance, seed, vocab_size, module: keyword-only; as in :func:`check_causal`.
        pooled: keyword-only; ``None`` (default) decides from the output: per position if it
            has shape ``(B, T, ...)`` with at least 3 axes, pooled otherwise. Pass True or False
            to decide yourself (say, for a ``(B, T)`` output, one number per position).

    Returns:
        :class:`CheckResult`; ``first_position`` is the first valid position that moved (in
        the first sequence where one did), ``details["deviations"]`` the ``(B, T)`` changes
        (``(B,)`` when pooled; padded positions hold 0) and ``details["sequence"]`` the
        sequence of the first failure.

    Raises:
        ValueError: bad ``model``, ``inputs`` or options as in :func:`check_causal`;
            ``valid_lens`` not ``(B,)`` integers in ``[0, T]`` or without padding; outputs of
            another batch size.

    Example:
        >>> mean_over_all = lambda x, lens: x.mean(dim=1)  # pools over the padding too
        >>> check_padding(mean_over_all, torch.ones(2, 4, 3), torch.tensor([4, 2])).passed
        False

    Source: the ``valid_lens`` masking of book chapter 3; the padding-mask questions of the
    Annotated Transformer's issue tracker (harvardnlp/annotated-transformer #37, #137).
    """
    _check_model(model)
    inputs = _check_inputs(inputs)
    _check_options(mode, tolerance, seed)
    _check_vocab(inputs, vocab_size)
    B, T = inputs.shape[:2]
    valid_lens = _check_valid_lens(valid_lens, B, T)
    if bool((valid_lens == T).all()):
        raise ValueError(f"valid_lens must leave some padding (an entry < T = {T}) for the "
                         "check to change, got all equal to T")
    if pooled is not None and not isinstance(pooled, bool):
        raise ValueError(f"pooled must be None, True or False, got {pooled!r}")
    name = "check_padding"
    generator = torch.Generator(device=inputs.device).manual_seed(seed)
    run = _runner(model, seed, B)
    lens = valid_lens.to(inputs.device)
    padding = torch.arange(T, device=inputs.device)[None, :] >= lens[:, None]  # (B, T)
    with _held_still(_find_module(model, module), mode, inputs.device), torch.no_grad():
        reference = run(inputs, valid_lens.clone())
        tol = _tolerance(reference, tolerance)
        per_position = (reference.dim() >= 3 and reference.shape[1] == T) if pooled is None \
            else not pooled
        if per_position:
            _check_time_axis(reference, B, T, "check_padding (pooled=False)")
        ref_valid = reference[~padding] if per_position else reference
        where = _non_finite(ref_valid[None] if per_position else ref_valid)
        if where is not None:
            return _not_finite_result(name, "at valid positions", tol, "The outputs")
        changed = _perturbed(inputs, padding, generator, vocab_size)
        out = run(changed, valid_lens.clone())
    how = _describe_run(inputs, mode, seed)
    num_padded = int((lens < T).sum())
    what = (f"Filling the padded positions ({num_padded} of {B} sequences have padding) with "
            "other values")
    if per_position:
        dev = _position_deviation(out, reference).masked_fill(padding.cpu(), 0.0)  # (B, T)
        unmoved = f"the outputs at all {int(lens.sum())} valid positions"
    else:
        diff = (out.double() - reference.double()).abs()
        dev = diff.flatten(1).amax(dim=1) if diff.dim() >= 2 else diff  # (B,)
        unmoved = "the pooled outputs"
    largest = float(dev.max())
    moved = dev > tol
    if not bool(moved.any()):
        message = (f"{what} left {unmoved} unchanged (within the tolerance {_fmt(tol)}; "
                   f"{how}).")
        return CheckResult(name, True, message, largest, tol, None, {"deviations": dev})
    if per_position:
        b = int(moved.any(dim=1).nonzero()[0])
        p = int(moved[b].nonzero()[0])
        wb, wp = divmod(int(dev.argmax()), T)
        message = (f"{what} moved the output at valid position {p} of sequence {b} (valid "
                   f"length {int(lens[b])}) by {_fmt(float(dev[b, p]))} (tolerance {_fmt(tol)}). "
                   f"{int(moved.sum())} of {int(lens.sum())} valid positions moved; the largest "
                   f"deviation is {_fmt(largest)}, at position {wp} of sequence {wb} ({how}).")
        return CheckResult(name, False, message, largest, tol, p,
                           {"deviations": dev, "sequence": b})
    b = int(moved.nonzero()[0])
    message = (f"{what} moved the pooled output of sequence {b} (valid length {int(lens[b])} "
               f"of {T}) by {_fmt(float(dev[b]))} (tolerance {_fmt(tol)}): the pooling reads "
               f"the padding. {int(moved.sum())} of {num_padded} padded sequences moved; the "
               f"largest deviation is {_fmt(largest)} ({how}).")
    return CheckResult(name, False, message, largest, tol, None, {"deviations": dev, "sequence": b})


def check_permutation_equivariance(model: Model, inputs: Tensor, *, mode: str = "eval",
                                   tolerance: Optional[float] = None, seed: int = 0,
                                   module: Optional[nn.Module] = None) -> CheckResult:
    """Check that permuting the input positions permutes the outputs in the same way.

    With a permutation ``perm`` of the T positions (drawn from a generator seeded with
    ``seed``, never the identity), the check compares ``model(inputs[:, perm])`` with
    ``model(inputs)[:, perm]``. Self-attention without positions and without a mask is
    permutation-equivariant (book chapter 5), so an encoder without positional information
    must pass. A model with positions, or a causal one, must *fail*: that is how it can tell
    order. A position-free model that fails mixes positions where it should not (for example
    heads split with ``view`` but no ``transpose``, which mixes positions into heads).

    Args:
        model: ``model(inputs)`` maps to ``(B, T, ...)`` outputs; an ``nn.Module`` or any
            callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids, ``T >= 2``; never modified.
        mode, tolerance, seed, module: keyword-only; as in :func:`check_causal`. In
            ``mode="train"`` a dropout mask is drawn for positions, not for inputs, so it does
            not move with the permutation: dropout makes this check fail in training mode.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first position of the permuted output
        that differs, ``details["permutation"]`` the permutation and ``details["deviations"]``
        the ``(T,)`` largest difference at each position.

    Raises:
        ValueError: as in :func:`check_causal`.

    Example:
        >>> x = torch.randn(2, 6, 4)
        >>> check_permutation_equivariance(lambda x: x.softmax(dim=-1), x).passed
        True
        >>> check_permutation_equivariance(lambda x: x.cumsum(dim=1), x).passed
        False

    Source: book chapter 5 (self-attention is permutation-equivariant; positions break it).
    """
    _check_model(model)
    inputs = _check_inputs(inputs, min_len=2)
    _check_options(mode, tolerance, seed)
    B, T = inputs.shape[:2]
    name = "check_permutation_equivariance"
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(T, generator=generator)
    if bool((perm == torch.arange(T)).all()):
        perm = perm.roll(1)
    run = _runner(model, seed, B)
    with _held_still(_find_module(model, module), mode, inputs.device), torch.no_grad():
        reference, tol, failed = _reference_run(run, (inputs,), B, T, name, tolerance)
        if failed is not None:
            return failed
        out = run(inputs[:, perm.to(inputs.device)])
    dev = _position_deviation(out, reference[:, perm.to(reference.device)]).amax(dim=0)  # (T,)
    largest = float(dev.max())
    differs = (dev > tol).nonzero().flatten().tolist()
    how = _describe_run(inputs, mode, seed)
    details = {"permutation": perm, "deviations": dev}
    if not differs:
        message = (f"Permuting the {T} positions permuted the outputs the same way (within the "
                   f"tolerance {_fmt(tol)}; {how}).")
        return CheckResult(name, True, message, largest, tol, None, details)
    p = differs[0]
    message = (f"Permuting the {T} positions did not permute the outputs: position {p} of the "
               f"permuted run (input position {int(perm[p])}) differs by {_fmt(float(dev[p]))} "
               f"(tolerance {_fmt(tol)}); {len(differs)} of {T} positions differ, the largest "
               f"by {_fmt(largest)}. Expected of a model with positions or a causal mask; a bug "
               f"in a model without them ({how}).")
    return CheckResult(name, False, message, largest, tol, p, details)


def check_kv_cache(model: Model, inputs: Tensor, new_cache: Callable[[], Any], *,
                   prompt_len: int = 1, mode: str = "eval", tolerance: Optional[float] = None,
                   seed: int = 0, module: Optional[nn.Module] = None) -> CheckResult:
    """Check that decoding with a KV cache gives the outputs of recomputing every prefix.

    The reference is one call without a cache, ``model(inputs, None)``. The cached run starts
    a fresh cache, ``cache = new_cache()``, feeds the first ``prompt_len`` positions at once,
    ``model(inputs[:, :prompt_len], cache)``, then one position at a time,
    ``model(inputs[:, t:t+1], cache)``, and concatenates the outputs along the positions. A
    correct cache gives the same ``(B, T, ...)`` outputs; a cache that forgets the position
    offset, a causal mask aligned to the wrong corner for the single new query, or keys
    appended twice, does not, and the message names the first step that differs.

    Args:
        model: ``model(chunk, cache)`` maps ``(B, T_chunk, ...)`` inputs to ``(B, T_chunk,
            ...)`` outputs, appending to ``cache``; ``model(inputs, None)`` runs without a
            cache (wrap your model in a function if its call looks different).
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids, ``T > prompt_len``; never modified.
        new_cache: a function of no arguments returning an empty cache (a ``KVCache``, a list
            of them, ...).
        prompt_len: keyword-only; the positions fed at once before decoding, ``1 <= prompt_len
            < T``.
        mode, tolerance, seed, module: keyword-only; as in :func:`check_causal`.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first position whose cached output
        differs, ``details["deviations"]`` the ``(T,)`` largest difference at each position.

    Raises:
        ValueError: as in :func:`check_causal`; ``new_cache`` not callable; ``prompt_len`` out
            of range; outputs of the cached calls not ``(B, T_chunk, ...)``.

    Example:
        >>> from d2lattn import KVCache
        >>> block = TransformerEncoderBlock(8, 2, 16)
        >>> decoder = lambda X, cache: block(X, is_causal=True, kv_cache=cache)
        >>> check_kv_cache(decoder, torch.randn(2, 6, 8), KVCache, module=block).passed
        True

    Source: incremental decoding (Pope et al., 2023, section 2); book chapter 8 (the KV cache
    and the corner its causal mask starts from); karpathy/nanoGPT PR #613.
    """
    _check_model(model)
    inputs = _check_inputs(inputs, min_len=2)
    _check_options(mode, tolerance, seed)
    if not callable(new_cache):
        raise ValueError("new_cache must be a function returning an empty cache")
    B, T = inputs.shape[:2]
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 1 <= prompt_len < T:
        raise ValueError(f"prompt_len must be an integer in [1, T) = [1, {T}), got {prompt_len!r}")
    name = "check_kv_cache"
    run = _runner(model, seed, B)
    with _held_still(_find_module(model, module), mode, inputs.device), torch.no_grad():
        reference, tol, failed = _reference_run(run, (inputs, None), B, T, name, tolerance,
                                                "The outputs without a cache")
        if failed is not None:
            return failed
        cache = new_cache()
        pieces = []
        for start, stop in [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, T)]:
            piece = run(inputs[:, start:stop], cache)
            _check_time_axis(piece, B, stop - start, f"check_kv_cache (positions {start}-{stop - 1})")
            pieces.append(piece)
        cached = torch.cat(pieces, dim=1)
    dev = _position_deviation(cached, reference).amax(dim=0).nan_to_num(nan=math.inf)  # (T,)
    largest = float(dev.max())
    differs = (dev > tol).nonzero().flatten().tolist()
    how = _describe_run(inputs, mode, seed)
    if not differs:
        message = (f"A prompt of {prompt_len} and {T - prompt_len} cached steps of one position "
                   f"gave the outputs of the uncached run (within the tolerance {_fmt(tol)}; "
                   f"{how}).")
        return CheckResult(name, True, message, largest, tol, None, {"deviations": dev})
    p = differs[0]
    at = "in the prompt" if p < prompt_len else f"at cached step {p - prompt_len + 1}"
    message = (f"The cached run differs from recomputation from position {p} on ({at}) by "
               f"{_fmt(float(dev[p]))} (tolerance {_fmt(tol)}); {len(differs)} of {T} positions "
               f"differ, the largest by {_fmt(largest)} at position {int(dev.argmax())} ({how}).")
    return CheckResult(name, False, message, largest, tol, p, {"deviations": dev})


def check_finite(model: Model, inputs: Tensor,
                 valid_lens: Optional[Union[Tensor, Sequence[int]]] = None, *,
                 backward: bool = True, mode: str = "eval", seed: int = 0,
                 module: Optional[nn.Module] = None) -> CheckResult:
    """Check that the outputs, and the gradients flowing back from them, are finite.

    Fully masked rows are the usual source of NaN in attention: a query with no key it may
    attend to (a sequence of valid length 0, a causal mask with more queries than keys) has a
    row of scores that are all ``-inf``, whose softmax is ``0 / 0``. Give ``valid_lens`` with a
    0 in it to test that case. With ``backward=True`` the check also computes the gradient of
    the sum of the outputs with respect to float inputs and to every parameter that requires
    one (``torch.autograd.grad``: nothing is accumulated into ``.grad``), because NaN hidden
    in the forward pass (a ``torch.where`` that discards it) comes back in the backward pass.

    Args:
        model: ``model(inputs)``, or ``model(inputs, valid_lens)`` when ``valid_lens`` is given;
            an ``nn.Module`` or any callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids; never modified.
        valid_lens: optional ``(B,)`` integers in ``[0, T]``.
        backward: keyword-only; also check the gradients (default True).
        mode, seed, module: keyword-only; as in :func:`check_causal`.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first non-finite position of the first
        sequence with one (``None`` if pooled or all finite). ``max_deviation`` is 0.0, or
        ``nan`` on failure.

    Raises:
        ValueError: as in :func:`check_causal`, and for bad ``valid_lens``.

    Example:
        >>> def nan_on_empty_rows(x, lens):  # -inf masking: an empty row is 0/0
        ...     scores = x @ x.transpose(1, 2)
        ...     keep = torch.arange(x.shape[1]) < lens[:, None, None]
        ...     return scores.masked_fill(~keep, float("-inf")).softmax(dim=-1) @ x
        >>> check_finite(nan_on_empty_rows, torch.ones(2, 3, 4), torch.tensor([3, 0])).passed
        False

    Source: book chapter 3 (the empty-row rule: zeros, never NaN); karpathy/nanoGPT #215, #167.
    """
    _check_model(model)
    inputs = _check_inputs(inputs)
    _check_options(mode, None, seed)
    if not isinstance(backward, bool):
        raise ValueError(f"backward must be a bool, got {backward!r}")
    B, T = inputs.shape[:2]
    if valid_lens is not None:
        valid_lens = _check_valid_lens(valid_lens, B, T)
    name = "check_finite"
    run = _runner(model, seed, B)
    found = _find_module(model, module)
    how = _describe_run(inputs, mode, seed)
    with _held_still(found, mode, inputs.device), torch.enable_grad():
        x = inputs.detach().clone()
        if backward and x.is_floating_point():
            x.requires_grad_(True)
        args = (x,) if valid_lens is None else (x, valid_lens.clone())
        out = run(*args)
        where = _non_finite(out.detach())
        if where is not None:
            first = None
            if out.dim() >= 2:
                b = int((~torch.isfinite(out.detach())).flatten(1).any(dim=1).nonzero()[0])
                bad = ~torch.isfinite(out.detach()[b])
                first = int((bad.flatten(1).any(dim=1) if bad.dim() >= 2 else bad).nonzero()[0])
            lens = "" if valid_lens is None else f"; valid lengths {valid_lens.tolist()}"
            message = f"The outputs are not finite at {where}{lens} ({how})."
            return CheckResult(name, False, message, float("nan"), 0.0, first)
        targets: List[Tensor] = [x] if x.requires_grad else []
        if backward and found is not None:
            targets += [p for p in found.parameters() if p.requires_grad]
        if not backward or not targets or not out.requires_grad:
            what = "outputs" if backward else "outputs (gradients not checked)"
            return CheckResult(name, True, f"The {what} are finite ({how}).", 0.0, 0.0)
        grads = torch.autograd.grad(out, targets, grad_outputs=torch.ones_like(out),
                                    allow_unused=True)
    if x.requires_grad and grads[0] is not None and not bool(torch.isfinite(grads[0]).all()):
        gx = grads[0]
        b = int((~torch.isfinite(gx)).flatten(1).any(dim=1).nonzero()[0])
        bad = (~torch.isfinite(gx[b])).flatten(1).any(dim=1) if gx.dim() >= 3 else ~torch.isfinite(gx[b])
        positions = bad.nonzero().flatten().tolist()
        message = (f"The outputs are finite, but the gradient with respect to the inputs is not, "
                   f"at sequence {b}, {_positions(positions)}: NaN hidden in the forward "
                   f"pass comes back in the backward pass ({how}).")
        return CheckResult(name, False, message, float("nan"), 0.0, positions[0])
    names = {id(p): n for n, p in found.named_parameters()} if found is not None else {}
    for t, g in zip(targets, grads):
        if g is not None and not bool(torch.isfinite(g).all()) and t is not x:
            message = (f"The outputs are finite, but the gradient of parameter "
                       f"{names.get(id(t), '?')} is not ({how}).")
            return CheckResult(name, False, message, float("nan"), 0.0)
    return CheckResult(name, True, f"The outputs and their gradients are finite ({how}).", 0.0, 0.0)


def check_attention_weights(weights: Tensor, mask: Optional[Tensor] = None, *,
                            tolerance: Optional[float] = None) -> CheckResult:
    """Check that attention weights are non-negative and sum to one over the keys.

    The rows of ``weights (..., Q, K)`` are the queries; each must be finite, non-negative and
    sum to 1 over its K keys. With ``mask`` (bool, **True = may attend**, broadcastable), a
    masked key must get exactly 0 weight and a row with no allowed key must be all zeros (the
    book's rule; chapter 3) rather than NaN or uniform. A softmax taken over the wrong axis
    (the queries, ``dim=-2``) is named in the message.

    Args:
        weights: ``(..., Q, K)`` floats, e.g. ``MultiHeadAttention.attention_weights``.
        mask: optional bool tensor broadcastable to ``weights``, True = may attend.
        tolerance: keyword-only; the allowed error of a row sum (default: relative to the
            dtype, with ``K`` as the size).

    Returns:
        :class:`CheckResult`; ``first_position`` is the flat index of the first bad row
        (``details["row"]`` its full index), ``max_deviation`` the largest error of a row sum.

    Raises:
        ValueError: ``weights`` not a float tensor with at least 2 axes; ``mask`` not bool or
            not broadcastable; a bad tolerance.

    Example:
        >>> scores = torch.randn(2, 3, 5)
        >>> check_attention_weights(scores.softmax(dim=-1)).passed
        True
        >>> check_attention_weights(scores.softmax(dim=-2)).passed  # over the queries
        False

    Source: Bahdanau et al. (2015) and Vaswani et al. (2017): weights are a softmax over the
    keys; book chapter 3 (masked softmax, empty rows).
    """
    if not isinstance(weights, Tensor) or not weights.is_floating_point() or weights.dim() < 2:
        raise ValueError("weights must be a float tensor of shape (..., Q, K)")
    _check_options("eval", tolerance, 0)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise ValueError("mask must be a bool tensor (True = may attend)")
        try:
            if torch.broadcast_shapes(mask.shape, weights.shape) != weights.shape:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the "
                             f"weights' shape {tuple(weights.shape)}") from None
    name = "check_attention_weights"
    w = weights.detach().double()
    K = w.shape[-1]
    tol = float(tolerance) if tolerance is not None else _RTOL.get(weights.dtype, 1e-5) * max(1, K)
    keep = torch.ones_like(w, dtype=torch.bool) if mask is None else mask.to(w.device).expand(w.shape)
    expected = keep.any(dim=-1).double()  # 1 for a row with a key, 0 for an empty row
    sums = w.sum(dim=-1)
    rows = w.shape[:-1]
    problems: List[Tuple[Tensor, str]] = [
        ((~torch.isfinite(w)).any(dim=-1), "is not finite (NaN or inf)"),
        ((w < -tol).any(dim=-1), "has a negative weight"),
        (((w.abs() > tol) & ~keep).any(dim=-1), "gives weight to a masked key"),
    ]
    error = (sums - expected).abs().nan_to_num(nan=math.inf)
    problems.append((error > tol, "does not sum to its expected total"))
    largest = float(error.max())
    for bad, what in problems:
        if bool(bad.any()):
            flat = int(bad.flatten().nonzero()[0])
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), rows))
            total = f"{float(sums[index]):.3g}"
            target = "0 (it has no key it may attend to)" if expected[index] == 0 else "1"
            message = f"Row {index} (query {index[-1]}) {what}: it sums to {total}, not {target}."
            if mask is None and w.dim() >= 2 and w.shape[-2] > 1:
                cols = w.sum(dim=-2)
                if bool(((cols - 1).abs() <= tol).all()):
                    message += (" Every column sums to 1 instead: the softmax was taken over the "
                                "queries (dim=-2), not the keys.")
            message += f" {int(bad.sum())} of {bad.numel()} rows have this problem."
            return CheckResult(name, False, message, largest, tol, flat, {"row": index})
    message = (f"All {sums.numel()} rows are non-negative and sum to 1 over the {K} keys"
               + (" (0 for rows with no key), with no weight on masked keys" if mask is not None
                  else "")
               + f" (within the tolerance {_fmt(tol)}).")
    return CheckResult(name, True, message, largest, tol, None)
