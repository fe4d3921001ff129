"""Checks that find the classic attention bugs in any model: a verdict you can print.

Each check takes a model (an ``nn.Module`` or any callable) and example inputs, runs the model
on the inputs and on changed copies of them, and compares what must not move:

====================================  ============================================================
``check_causal``                      the output at position t ignores the inputs after t, and
                                      does not depend on how long the sequence is
``check_padding``                     outputs at valid positions ignore the padding: a sequence
                                      run alone, unpadded, gets the outputs of its padded batch
``check_batch_independence``          each sequence's outputs ignore the other sequences
``check_permutation_equivariance``    permuting the input positions permutes the outputs alike
``check_kv_cache``                    decoding with a cache gives the outputs of recomputation
``check_finite``                      outputs and gradients are finite (fully masked rows, NaN)
``check_attention_weights``           weights are non-negative and sum to one over the keys
====================================  ============================================================

Every check returns a :class:`CheckResult`: ``bool(result)`` is the verdict, ``result.message``
says what was changed, what moved, by how much and where (the first position that leaked), and
for a pass too the largest deviation, so that a near miss shows (a deviation of at most a tenth
of the tolerance, the size of rounding, is said to be so rather than printed, because its last
digits differ between CPUs; ``result.max_deviation`` holds it). Messages come in lines of at
most 88 characters.

How the checks keep out of the way (the same for all of them):

- **Deterministic.** By default every module the model calls is put in eval mode for the check
  (dropout off, BatchNorm on its running statistics): the module you pass (or the model, if it
  is one), and any other module the moment it is first called (a global forward pre-hook finds
  the modules a plain function calls). Before every call of the model, PyTorch's generators
  (CPU and CUDA), numpy's global generator and Python's ``random`` are reseeded with ``seed``,
  so a function that draws random numbers draws the same ones each time. ``mode="train"`` puts
  the modules in training mode instead (to catch what only training does, such as BatchNorm's
  batch statistics); dropout then draws masks by the shape of the tensor, so runs on shorter
  inputs draw other masks (see ``check_causal``'s ``prefix`` and ``check_kv_cache``). The
  changed inputs come from a separate generator, on the inputs' device. If the model calls no
  ``nn.Module`` at all, the message says so instead of naming a mode. A module the model uses
  only through its tensors (``F.batch_norm(x, bn.running_mean, ...)``) is never called, so the
  check cannot see it: pass it as ``module=``.
- **Nothing changes.** Parameters, buffers (BatchNorm's running statistics), gradients and the
  train/eval flag of every submodule of every module held are as the check found them; the
  generators' states (torch's on the CPU and on the inputs' CUDA device, numpy's, Python's)
  are restored. Every call gets fresh copies of the inputs, so a model that writes into its
  input changes neither the caller's tensors nor the next run. Buffers a run changed (a step
  counter) are put back before the next run, and a buffer or Parameter that a module
  *reassigns* gets its original object back. Gradients are taken with
  ``torch.autograd.grad``, which accumulates nothing into ``.grad``. Lazy modules
  (``nn.LazyLinear``) are materialised by the first run and stay so.
- **Tolerance suited to the dtype, the precision and each feature.** Two outputs agree when
  each feature differs by at most ``rtol * (|y| + s)``, where ``|y|`` is that feature's size in
  the reference run and ``s`` the median size of all its finite outputs (so that a sentinel
  such as ``-1e9``, or a banned logit's ``finfo.min``, widens no other feature's tolerance, and
  outputs of size 1e-6 get a tolerance of their size), with ``rtol`` 1e-10 in float64, 1e-5 in
  float32, 2e-3 in float16 and 1.6e-2 in bfloat16 (the last two after torch.testing's
  defaults); in float32 under ``torch.set_float32_matmul_precision("high")`` (TF32) 5e-3, and
  under ``"medium"`` 4e-2. A deviation is reported in units of a typical feature: the change of
  a feature of size ``|y|`` counts ``s / (|y| + s)`` of itself. Integer outputs must be equal.
  ``tolerance=`` sets one absolute tolerance instead. Equal values (infinities too) differ by 0;
  NaN or an infinity in a changed run where the reference is finite counts as an infinite
  deviation; NaN in the reference fails the check (an infinity there is compared like a value).
- **Exact where the model is differentiable.** ``check_causal``, ``check_padding`` and
  ``check_batch_independence`` first run the model with gradients enabled as well as under
  ``no_grad`` (the two must agree), then demand that the gradient of the outputs that must not
  depend on an input be *exactly* zero there (see :mod:`d2lattn._jacobian`): no tolerance, so a
  leak of any size fails. Rounding almost never makes a zero non-zero; a computation that
  mixes every position on the way, such as a causal convolution by FFT, leaves gradients of
  the size of rounding (about 1e-7 of the largest allowed one in float32) where exact
  arithmetic gives 0. A non-zero gradient within 64 units in the last place of the model's
  dtype (of the largest allowed gradient) is therefore decided in a **float64 copy** of the
  model: in float64 such a gradient is rounding, in float32, float16 or bfloat16 it may be a
  leak as small (LayerScale's 1e-6), so the check deep-copies the ``nn.Module`` (never the
  caller's), casts it with ``.double()``, runs it on float64 inputs and gives that run's
  verdict. A float16 pass is confirmed the same way, because float16 gradients below 6e-8
  underflow to 0. A function that calls no module with floating tensors is run as it is on
  float64 inputs; where no copy can be made (a function of modules: pass the module itself,
  or with ``module=`` a module outside the model) a gradient within rounding fails and a
  float16 pass says what it cannot see. A model that casts to a fixed dtype inside
  (``x.float()``) stays at that precision in the copy. The perturbation tests stay for what
  gradients cannot see (argmax, integer paths, NaN, the length).
- **Models that sample.** A model that draws random numbers gets the same generator state in
  every run; where its draws depend on the tensor's shape, the tests whose runs have another
  shape (prefixes, sequences alone, a shuffled batch) are skipped and the gradient test speaks.

**Calling the model.** By default the inputs are the model's first positional argument and
its output is a tensor or a tuple whose first element is one (``(logits, loss)``). Options
shared by the checks that call a model: ``input_name="input_ids"`` passes the inputs as that
keyword instead; ``kwargs={...}`` adds keyword arguments to every call (values that do not
depend on the batch or the positions, e.g. ``{"use_cache": False}``); ``output=`` selects the
tensor from what the model returns: a key or attribute name (``"logits"``,
``"last_hidden_state"`` of a Hugging Face ``ModelOutput``), an index, or a function. Checks that
pass the padding take ``mask_name="attention_mask"``: the padding is then passed as that
keyword, a ``(B, T)`` int64 mask of 1 (valid) and 0 (padding), Hugging Face's convention,
instead of ``valid_lens`` as the second positional argument.

**What a pass means.** A check tests the model on the inputs it is given, with the changes it
makes: a pass says that the gradients it asked for were exactly zero (where the model is
differentiable; each check's docstring says which it samples) and that those changes moved
nothing beyond the tolerance. It does not prove the property for other inputs, lengths, dtypes
or modes. Three leaks that no default reaches, each with what reaches it:

- *A leak only past the length of the example* (a sliding window wider than T, a cache or a
  position table that misbehaves beyond some length): the checks run at the T of ``inputs``,
  so pass inputs as long as the longest the model serves (its ``block_size``); at T = 512 the
  cost of ``check_causal`` is the same number of runs as at T = 16, and ``samples=`` sets how
  many cuts it tries.
- *A leak only on repeated tokens* (a model that copies from an earlier occurrence of the
  current token, an induction head gone wrong): the changed inputs are random ids, which
  rarely repeat, and the exact test is taken at the inputs you pass, so pass ``inputs`` that
  hold the repeats (real text, or a sequence followed by itself, ``x.repeat(1, 2)``);
  ``vocab_size=`` sets the range the changed ids are drawn from.
- *A leak only in training mode* (BatchNorm's batch statistics, a length leak in a branch
  that runs only when ``self.training``): the checks run in eval mode, so pass
  ``mode="train"``; ``check_causal``'s length test is then off (dropout draws its masks by the
  tensor's shape), so a model with dropout 0 needs ``prefix=True`` as well.

Source: the bugs readers report in the issue trackers of widely read attention code (causal
masks missing or off by one, padding leaking, heads split without a transpose, KV caches that
disagree with recomputation, NaN from fully masked rows); prefix and per-sequence tests as in
pangolinn; book chapter "When attention goes wrong".
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.modules.module import register_module_forward_pre_hook

from . import _jacobian

from ._checks import (check_diagnostic_batch as _check_batch,
                      check_diagnostic_call as _check_call,
                      check_diagnostic_inputs as _check_inputs,
                      check_diagnostic_model as _check_model,
                      check_diagnostic_options as _check_options,
                      check_diagnostic_pad_id as _check_pad_id,
                      check_diagnostic_prefix as _check_prefix,
                      check_diagnostic_time_axis as _check_time_axis,
                      check_diagnostic_valid_lens as _check_valid_lens,
                      check_diagnostic_vocab as _check_vocab, is_integer_dtype as _is_integer)

__all__ = [
    "CheckResult",
    "check_attention_weights",
    "check_batch_independence",
    "check_causal",
    "check_finite",
    "check_kv_cache",
    "check_padding",
    "check_permutation_equivariance",
]

#: A model: an ``nn.Module`` or any callable returning a tensor (or a tuple whose first element
#: is the tensor, as ``(logits, loss)``, or a dict / ``ModelOutput`` read with ``output=``).
Model = Callable[..., Any]

#: Output selector: ``None`` (the tensor, or a tuple's first element), a key or attribute name,
#: an index, or a function of the model's output.
Output = Union[None, int, str, Callable[[Any], Tensor]]

_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
#: float32 under ``torch.set_float32_matmul_precision``: TF32 (``"high"``) rounds a product's
#: operands to 10 mantissa bits, ``"medium"`` to bfloat16's 7; errors grow over the layers.
_FLOAT32_RTOL = {"highest": 1e-5, "high": 5e-3, "medium": 4e-2}

#: Messages are wrapped to this width (book pages cut longer lines).
LINE_WIDTH = 88


def _wrap(text: str) -> str:
    """``text`` in lines of at most :data:`LINE_WIDTH` characters (never broken at a hyphen, so
    that ``1.0e-05`` stays whole)."""
    return textwrap.fill(" ".join(text.split()), width=LINE_WIDTH, break_on_hyphens=False,
                         break_long_words=True)


@dataclass(frozen=True)
class CheckResult:
    """The verdict of a check: ``bool(result)`` is ``result.passed``.

    Attributes:
        name: the check, e.g. ``"check_causal"``.
        passed: the verdict.
        message: what was changed, what moved, by how much and where, in lines of at most 88
            characters (``str(result)`` too).
        max_deviation: on a failure, the largest deviation measured; on a pass, the one
            closest to its tolerance (the largest, where every position has the same
            tolerance: the usual case, and always with ``tolerance=``); ``inf`` where a
            changed run gave NaN or an infinity; ``nan`` when the reference outputs were not
            finite.
        tolerance: the largest deviation allowed where ``max_deviation`` was measured.
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", _wrap(self.message))

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return _wrap(f"{self.name}: {'PASSED' if self.passed else 'FAILED'}. {self.message}")

    def __repr__(self) -> str:
        return f"<{self}>"


# --- helpers ----------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    """A deviation with two significant digits (never the last bits, which differ by CPU)."""
    if x == 0:
        return "0"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf (NaN or an infinity)"
    return f"{x:.1e}"


def _against(deviation: float, tolerance: float) -> str:
    """A deviation beside its tolerance, as every failure message states it."""
    return f"{_fmt(deviation)} (tolerance {_fmt(tolerance)})"


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


def _optional_valid_lens(valid_lens: Optional[Tensor], mask_name: Optional[str], B: int,
                         T: int) -> Optional[Tensor]:
    """Checked ``valid_lens`` (or ``None``); ``mask_name`` needs them."""
    if valid_lens is not None:
        return _check_valid_lens(valid_lens, B, T)
    if mask_name is not None:
        raise ValueError("mask_name needs valid_lens")
    return None


def _first(n: int) -> str:
    """``1`` -> ``"its first position"``, ``3`` -> ``"its first 3 positions"``."""
    return "its first position" if n == 1 else f"its first {n} positions"


def _find_module(model: Model, module: Optional[nn.Module]) -> Optional[nn.Module]:
    if module is not None:
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be an nn.Module or None, got {type(module).__name__}")
        return module
    if isinstance(model, nn.Module):
        return model
    owner = getattr(model, "__self__", None)  # a bound method such as model.generate
    return owner if isinstance(owner, nn.Module) else None


class _Held:
    """The modules a check holds still, with their state as the check found it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.ids: set = set()  # every submodule held
        self.roots: List[nn.Module] = []
        self.flags: List[Tuple[nn.Module, bool]] = []
        self.saved: List[Tuple[Tensor, Tensor]] = []
        self.grads: List[Tuple[Tensor, Optional[Tensor]]] = []
        self._tensors: set = set()
        # (module, attribute name, the object it held): a module that reassigns a buffer or
        # a Parameter (``self.steps = self.steps + 1``) gets the original object back
        self.slots: List[Tuple[nn.Module, str, Any]] = []
        self.buffers: List[Tuple[Tensor, Tensor]] = []  # reset before every run

    def hold(self, module: nn.Module) -> None:
        """Save the state of ``module`` and its submodules, then set their mode."""
        if id(module) in self.ids:
            return
        self.roots.append(module)
        for m in module.modules():
            if id(m) in self.ids:
                continue
            self.ids.add(id(m))
            self.flags.append((m, m.training))
            for key, t in list(m._parameters.items()) + list(m._buffers.items()):
                self.slots.append((m, key, t))
            for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
                if t is None or id(t) in self._tensors or _is_lazy(t):
                    continue
                self._tensors.add(id(t))
                self.saved.append((t, t.detach().clone()))
                if not isinstance(t, nn.Parameter):
                    self.buffers.append(self.saved[-1])
                if isinstance(t, nn.Parameter):
                    self.grads.append((t, None if t.grad is None else t.grad.detach().clone()))
        module.train(self.mode == "train")

    def describe(self, dtype: torch.dtype, seed: int) -> str:
        """The conditions of the run, in words: dtype, mode (only if a module was held), seed."""
        if self.roots:
            return f"{dtype} inputs, {self.mode} mode, seed {seed}"
        return f"{dtype} inputs, no nn.Module called so no mode set, seed {seed}"

    def reset_buffers(self) -> None:
        """Put back the buffers and attributes a run changed (a step counter), so that every
        run of the model starts from the state the check found."""
        self._put_back_slots()
        with torch.no_grad():
            for t, copy in self.buffers:
                if t.shape == copy.shape and not torch.equal(t, copy):
                    t.copy_(copy)

    def _put_back_slots(self) -> None:
        for m, key, t in self.slots:
            table = m._parameters if key in m._parameters else m._buffers
            if key in table and table[key] is not t and not _is_lazy(t):
                table[key] = t

    def restore(self) -> None:
        self._put_back_slots()
        with torch.no_grad():
            for t, copy in self.saved:
                if t.shape == copy.shape and not torch.equal(t, copy):
                    t.copy_(copy)
        for p, g in self.grads:
            if g is None:
                p.grad = None
            elif p.grad is None or not torch.equal(p.grad, g):
                p.grad = g
        for m, training in self.flags:
            m.training = training


_ACTIVE: List[_Held] = []  # the checks running now (a runner resets their buffers)


@contextlib.contextmanager
def _held_still(module: Optional[nn.Module], mode: str, device: torch.device) -> Iterator[_Held]:
    """Run a check with ``module`` (and every module called while it runs) in ``mode``, then
    put back their state, and the generators' (torch's, numpy's, Python's), exactly as they
    were. Yields the :class:`_Held` record (which modules were held)."""
    held = _Held(mode)
    if module is not None:
        held.hold(module)

    def on_call(called: nn.Module, args: Any) -> None:  # a module the model calls: hold it
        held.hold(called)

    handle = register_module_forward_pre_hook(on_call)
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    numpy_state, python_state = np.random.get_state(), random.getstate()
    _ACTIVE.append(held)
    try:
        with torch.random.fork_rng(devices=devices):
            yield held
    finally:
        _ACTIVE.remove(held)
        handle.remove()
        held.restore()
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def _is_lazy(t: Any) -> bool:
    """An ``nn.LazyLinear``'s parameter before its first call (no shape to save yet)."""
    return isinstance(t, nn.parameter.UninitializedTensorMixin)


def _copy(value: Any) -> Any:
    """A fresh copy of a tensor (so the model may write into it), anything else as it is."""
    return value.clone() if isinstance(value, Tensor) else value


def _select(out: Any, output: Output) -> Any:
    """The tensor ``output`` selects from the model's return value."""
    if output is None:
        if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
            return out[0]  # (logits, loss) and the like: the first element
        if isinstance(out, Mapping):
            raise ValueError(f"model returned a {type(out).__name__} with keys "
                             f"{list(out.keys())}: pass output= to choose one, e.g. "
                             f"output={next(iter(out.keys()), 'logits')!r}")
        return out
    if callable(output):
        return output(out)
    if isinstance(output, str):
        if isinstance(out, Mapping) and output in out:
            return out[output]
        if hasattr(out, output):
            return getattr(out, output)
        raise ValueError(f"output={output!r}: the model's {type(out).__name__} has no such key "
                         "or attribute")
    return out[output]


def _runner(model: Model, seed: int, B: Optional[int] = None, *, input_name: Optional[str] = None,
            kwargs: Optional[Mapping[str, Any]] = None,
            output: Output = None, reset: bool = True) -> Callable[..., Tensor]:
    """``run(x, *args, **keywords)``: call the model on fresh copies of its arguments with every
    generator reseeded (and, with ``reset``, the buffers of the modules held put back as the
    check found them: a step counter counts from the same step in every run); return its
    output tensor, checked to have ``x.shape[0]`` sequences. ``run.samples`` turns True when
    a call drew from torch's CPU generator (a model that samples)."""

    def run(x: Tensor, *args: Any, **keywords: Any) -> Tensor:
        if reset and _ACTIVE:
            _ACTIVE[-1].reset_buffers()
        torch.manual_seed(seed)  # the CPU and every CUDA device
        state = torch.get_rng_state()
        np.random.seed(seed % 2**32)
        random.seed(seed)
        extra = {k: _copy(v) for k, v in (kwargs or {}).items()}
        extra.update({k: _copy(v) for k, v in keywords.items()})
        if input_name is None:
            out = model(_copy(x), *map(_copy, args), **extra)
        else:
            out = model(*map(_copy, args), **{input_name: _copy(x)}, **extra)
        out = _select(out, output)
        if not torch.equal(torch.get_rng_state(), state):
            run.samples = True  # type: ignore[attr-defined]
        n = x.shape[0]
        if not isinstance(out, Tensor) or out.dim() < 1 or out.shape[0] != n:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"model must return a tensor of shape (B = {n}, ...), got {got}")
        return out

    run.samples = False  # type: ignore[attr-defined]
    return run


def _per_position(values: Tensor, time_axis: bool) -> Tensor:
    """The largest of ``values`` at each position, ``(B, T)`` (or each sequence, ``(B,)``)."""
    if time_axis:
        return values.flatten(2).amax(dim=2) if values.dim() >= 3 else values
    return values.flatten(1).amax(dim=1) if values.dim() >= 2 else values


def _rtol(dtype: torch.dtype) -> float:
    """The relative tolerance of ``dtype``; for float32 that of the matmul precision in force
    (``torch.get_float32_matmul_precision()``: ``"high"`` lets matrix products use TF32, 10
    mantissa bits, ``"medium"`` bfloat16, 7 bits)."""
    if dtype == torch.float32:
        return _FLOAT32_RTOL.get(torch.get_float32_matmul_precision(), _RTOL[torch.float32])
    return _RTOL.get(dtype, 1e-5)


def _scale(reference: Tensor, tolerance: Optional[float]) -> Optional[float]:
    """The size ``s`` of a typical output feature: the median of the finite ``|reference|``
    (its mean if that is 0, else 1); ``None`` with an absolute ``tolerance`` or integer
    outputs. A few huge features (a sentinel, a banned logit's ``finfo.min``) do not move a
    median."""
    if tolerance is not None or not reference.is_floating_point():
        return None
    a = reference.detach().double().abs().flatten()
    a = a[torch.isfinite(a)]
    if a.numel() == 0:
        return 1.0
    s = float(a.median())
    if s == 0.0:
        s = float(a.mean())
    return s if s > 0.0 else 1.0


def _tolerances(reference: Tensor, tolerance: Optional[float], time_axis: bool = True) -> Tensor:
    """The tolerance at each position ``(B, T)`` (or sequence ``(B,)``), float64: ``tolerance``
    if given, else ``rtol * s`` with ``s`` from :func:`_scale`, in the units of the deviations
    that :func:`_deviations` measures with that scale."""
    a = reference.detach()
    shape = a.shape[:2] if time_axis else a.shape[:1]
    if tolerance is not None:
        return torch.full(shape, float(tolerance), dtype=torch.float64, device=a.device)
    if not reference.is_floating_point():
        return torch.zeros(shape, dtype=torch.float64, device=a.device)  # integers: equal
    s = _scale(reference, tolerance)
    return torch.full(shape, _rtol(reference.dtype) * s, dtype=torch.float64, device=a.device)


def _deviations(a: Tensor, b: Tensor, time_axis: bool = True,
                scale: Optional[float] = None) -> Tensor:
    """The deviation of ``a`` from the reference ``b`` at each position ``(B, T)`` (or sequence
    ``(B,)``), float64: the largest over the features of ``|a - b|``, each scaled by
    ``scale / (|b| + scale)`` when ``scale`` is given (a feature of size ``|b|`` is allowed
    ``rtol * (|b| + scale)``: its own size, and a floor of the typical size, so that one huge
    feature widens no other feature's tolerance). Equal values (infinities too) differ by 0,
    NaN or an infinity against anything else by inf."""
    if a.shape != b.shape:
        raise ValueError(f"the model's outputs changed shape between runs: {tuple(b.shape)} "
                         f"and {tuple(a.shape)}")
    a, b = a.detach().double(), b.detach().double()
    diff = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    if scale is not None:
        size = torch.where(torch.isfinite(b), b.abs(), torch.zeros_like(b))
        diff = diff * (scale / (size + scale))
    return _per_position(diff, time_axis)


def _ratio(dev: Tensor, tol: Tensor) -> Tensor:
    """``dev / tol`` (> 1 fails), with 0 / 0 = 0 and x / 0 = inf."""
    safe = torch.where(tol > 0, tol, torch.ones_like(tol))
    return torch.where(tol > 0, dev / safe, torch.where(dev > 0, math.inf, 0.0))


def _nearest(dev: Tensor, tol: Tensor) -> Tuple[Tuple[int, ...], float, float]:
    """The deviation to report, its index and its tolerance: where some deviation exceeds its
    tolerance, the largest deviation; otherwise the one closest to its tolerance (the largest,
    when every position has the same tolerance), so that a near miss shows."""
    ratio = _ratio(dev, tol)
    if bool((ratio > 1).any()):
        flat = int(dev.flatten().argmax())
    elif not bool((ratio > 0).any()):
        flat = int(tol.flatten().argmin())
    else:
        flat = int(ratio.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), dev.shape))
    return index, float(dev[index]), float(tol[index])


def _largest_text(d: float, t: float, how: Optional[str], what: str = "deviation",
                  tols: Optional[Tensor] = None) -> str:
    """``"the largest deviation is 3.1e-06 (tolerance 1.0e-05; how)"``. A deviation of at most
    a tenth of the tolerance (rounding, whose last bits differ by CPU) is said to be so, not
    printed, with the range of ``tols`` (all the tolerances, not the one where the largest
    deviation happened to fall), so that the message is the same on every machine."""
    how = "" if how is None else f"; {how}"
    if t > 0 and d <= 0.1 * t:
        lo, hi = (t, t) if tols is None else (float(tols.min()), float(tols.max()))
        span = _fmt(lo) if _fmt(lo) == _fmt(hi) else f"{_fmt(lo)} to {_fmt(hi)}"
        return f"the largest {what} is below a tenth of the tolerance ({span}{how})"
    return f"the largest {what} is {_fmt(d)} (tolerance {_fmt(t)}{how})"


def _largest(dev: Tensor, tol: Tensor, how: str) -> str:
    """:func:`_largest_text` where ``dev`` comes closest to its tolerance ``tol``."""
    _, d, t = _nearest(dev, tol)
    return _largest_text(d, t, how, tols=tol)


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


def _non_finite(out: Tensor, nan_only: bool = False) -> Optional[str]:
    """Where ``out`` (B, T, ...) or (B, ...) is not finite (with ``nan_only``: is NaN), in
    words; None if it all is."""
    bad = torch.isnan(out) if nan_only else ~torch.isfinite(out)
    if not bool(bad.any()):
        return None
    b = int(bad.flatten(1).any(dim=1).nonzero()[0]) if out.dim() >= 2 else int(bad.nonzero()[0])
    if out.dim() >= 2:
        per_pos = bad[b].flatten(1).any(dim=1) if out.dim() >= 3 else bad[b]
        return f"sequence {b}, {_positions(per_pos.nonzero().flatten().tolist())}"
    return f"sequence {b}"


def _not_finite_result(name: str, where: str, tol: float, what: str) -> CheckResult:
    return CheckResult(name, False, f"{what} hold NaN ({where}), so nothing can be "
                       "compared; check_finite shows where the NaN comes from.",
                       float("nan"), tol)


# --- the checks -------------------------------------------------------------------------------

def _reference_run(run: Callable[..., Tensor], args: Tuple[Any, ...], B: int, T: int, name: str,
                   tolerance: Optional[float], what: str = "The outputs"
                   ) -> Tuple[Tensor, Tensor, Optional[float], Optional[CheckResult]]:
    """The run the other runs are compared with: its outputs ``(B, T, ...)``, the tolerance at
    each position ``(B, T)``, the scale of the deviations (:func:`_scale`), and the failed
    result to return when those outputs hold NaN (``None`` when they do not; an infinity, such
    as a banned logit's ``-inf``, is compared as a value: equal infinities are equal)."""
    reference = run(*args)
    _check_time_axis(reference, B, T, name)
    tol = _tolerances(reference, tolerance)
    where = _non_finite(reference, nan_only=True)
    failed = None if where is None else _not_finite_result(name, where, float(tol.min()), what)
    return reference, tol, _scale(reference, tolerance), failed


def _lengths_argument(lens: Tensor, T: int, device: torch.device, mask_name: Optional[str],
                      padding_side: str = "right", mask_convention: str = "keep"
                      ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """How the padding reaches the model: ``valid_lens`` as the second positional argument,
    or a ``(B, T)`` mask as the keyword ``mask_name``: int64 1 (valid) and 0 (padding),
    Hugging Face's convention (``mask_convention="keep"``), or bool True at the padding,
    ``nn.MultiheadAttention``'s ``key_padding_mask`` (``"ignore"``); the valid positions come
    first (``padding_side="right"``) or last (``"left"``)."""
    if mask_name is None:
        return (lens.clone(),), {}
    keep = ~_padding_of(lens, T, device, padding_side)
    return (), {mask_name: keep.long() if mask_convention == "keep" else ~keep}


def _padding_of(lens: Tensor, T: int, device: torch.device, padding_side: str) -> Tensor:
    """bool ``(B, T)``, True at the padded positions."""
    positions = torch.arange(T, device=device)[None, :]
    lens = lens.to(device)[:, None]
    return positions >= lens if padding_side == "right" else positions < T - lens


def _validate_mask_options(padding_side: object, mask_convention: object,
                        mask_name: Optional[str]) -> None:
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if mask_convention not in ("keep", "ignore"):
        raise ValueError(f"mask_convention must be 'keep' (1 = a valid position) or 'ignore' "
                         f"(True = padding), got {mask_convention!r}")
    if mask_name is None and (padding_side != "right" or mask_convention != "keep"):
        raise ValueError("padding_side and mask_convention need mask_name (valid_lens passed "
                         "positionally mean right padding)")


def _sampled(n: int, samples: int, generator: torch.Generator) -> List[int]:
    """All of ``range(n)`` if ``n <= 2 * samples``, else ``samples`` of them: the first, the
    last, and the others drawn at random (sorted)."""
    if n <= 2 * samples:
        return list(range(n))
    drawn = (torch.randperm(n - 2, generator=generator)[:max(samples - 2, 0)] + 1).tolist()
    return sorted({0, n - 1, *drawn})


def check_causal(model: Model, inputs: Tensor,
                 valid_lens: Optional[Union[Tensor, Sequence[int]]] = None, *,
                 mode: str = "eval", tolerance: Optional[float] = None, seed: int = 0,
                 vocab_size: Optional[int] = None,
                 module: Optional[nn.Module] = None, prefix: Optional[bool] = None,
                 samples: int = 8, exact: bool = True, mask_name: Optional[str] = None,
                 padding_side: str = "right", mask_convention: str = "keep",
                 input_name: Optional[str] = None, kwargs: Optional[Mapping[str, Any]] = None,
                 output: Output = None) -> CheckResult:
    r"""Check that the output at every position t ignores the inputs after t and the length.

    The check cuts the sequence after position c, for ``samples`` cuts c (all of them when
    :math:`T - 1 \le 2 \cdot` ``samples``; otherwise the first, the last and the others drawn
    at random), and asks whether the outputs at positions ``0..c`` depend on the inputs after
    c. Four tests, in this order:

    1. **Grad modes**: the model is run once under ``torch.no_grad()`` and once with gradients
       enabled (as training runs it); the outputs must agree (a model that takes another path
       when ``torch.is_grad_enabled()`` fails here).
    2. **Exact** (``exact=True``, where the outputs carry a gradient): for each cut, one
       backward pass of a random weighting of the outputs at ``0..c``; the gradient at every
       input position after c must be *exactly* 0 (for token ids: at the outputs of the
       ``nn.Embedding`` modules). No tolerance: a leak of any size (LayerScale at 1e-6, a soft
       mask ``scores + log(mask + 1e-7)``, outputs of size 1e-6, a leak beside a feature of
       size 1e8, a leak only in the backward pass) fails, and reduced matmul precision cannot
       raise a false alarm. Gradients within the rounding of the model's dtype (an FFT's),
       and a float16 pass, are decided in a float64 copy of the model (see the module's
       notes), which costs one more run and backward passes.
    3. **The future** (perturbation): for each cut, every input after c is changed (random
       values for floats, other token ids for integers) and the outputs at ``0..c`` are
       compared with the reference under the tolerance. This sees what gradients cannot: an
       argmax, an integer path, NaN that appears only for other inputs.
    4. **The length** (``prefix``): for each cut, the model runs on ``inputs[:, :c+1]`` alone;
       every output must be that of the full run (a model that divides by T, or counts
       positions from the end, passes tests 2 and 3 and fails this one).

    With ``valid_lens``, the check runs on a padded batch (the padding passed as the model
    takes it, see ``mask_name``): only the outputs at valid positions are asked about, and the
    exact test also demands a zero gradient at the padded positions (causal *and* padding: a
    mask combined with ``|`` instead of ``&``, or left padding that the model ignores, fails).
    The length test is skipped with padding.

    Cost: one run without and one with gradients, one backward pass (about two runs) per cut,
    one run per cut for the future and one shorter run per cut for the length: about
    ``4 * samples + 2`` runs of the model, whatever T (T = 512: 8 cuts).

    **What a pass means.** Exactly, for the sampled cuts c, at these inputs: no output at
    ``0..c`` has a non-zero derivative with respect to any input after c (nor any padded input),
    whatever its size; and changing the inputs after c, or cutting them off, moved no output
    at ``0..c`` beyond the tolerance. It is not a proof for other inputs, other cuts, longer
    sequences or the other mode: a leak only past the example's T needs ``inputs`` that long
    (the cost does not grow with T), one only on repeated tokens needs ``inputs`` that repeat,
    and one only in training mode ``mode="train"`` (with ``prefix=True`` for a length leak
    there, when the model has no dropout).

    Args:
        model: ``model(inputs)`` (with ``valid_lens``: ``model(inputs, valid_lens)`` or
            ``model(inputs, **{mask_name: mask})``) maps ``inputs`` to ``(B, T, ...)`` outputs
            (a tuple's first element is used); an ``nn.Module`` or any callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` integer token ids, ``T >= 2``; never
            modified (every call gets a copy).
        valid_lens: optional ``(B,)`` integers in ``[1, T]``: the valid positions of each
            sequence (the first ones, or with ``padding_side="left"`` the last ones).
        mode: keyword-only; ``"eval"`` (default) or ``"train"``, the mode of every module the
            model calls during the check (see the module's notes; restored afterwards).
        tolerance: keyword-only; the largest absolute deviation that counts as "unchanged"
            in tests 1, 3, 4; default: relative to the dtype, the matmul precision and each
            output feature's size (see the module's notes).
        seed: keyword-only; seeds the cuts, the changed inputs and the generators before each
            call.
        vocab_size: keyword-only; for token ids, changed ids are drawn from
            ``[0, vocab_size)`` (default: ``inputs.max() + 1``).
        module: keyword-only; a module to hold still from the start (any module the model
            calls is held anyway, from its first call).
        prefix: keyword-only; run the length test (default: in eval mode without padding yes;
            in train mode no, because dropout draws its masks by the tensor's shape). Pass
            False for a model that only accepts sequences of length T.
        samples: keyword-only; the number of cuts (default 8; all ``T - 1`` when
            ``T - 1 <= 2 * samples``).
        exact: keyword-only; run the gradient test 2 (default True).
        mask_name, padding_side, mask_convention: keyword-only; pass the padding as the
            keyword ``mask_name``, a ``(B, T)`` mask: int64 1 = valid (``"keep"``, Hugging
            Face's ``attention_mask``) or bool True = padding (``"ignore"``,
            ``key_padding_mask``); valid positions first (``"right"``) or last (``"left"``).
        input_name, kwargs, output: keyword-only; how the model is called and what it
            returns (see the module's notes): e.g. ``input_name="input_ids",
            output="logits"`` for a Hugging Face model.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first leaking position,
        ``details["deviations"]`` the ``(T - 1,)`` largest change at each position t in the
        future test (0 where no cut reached t), ``details["reads"]`` the later positions
        that the first leaking position reads, ``details["cuts"]`` the cuts,
        ``details["exact"]`` whether the gradient test ran (or why not, a string),
        ``details["gradients"]`` (when it ran) the ``(T,)`` largest gradient at each input
        position after a cut (all 0 on a pass; on its failure, that of the first leaking
        position, whose entry of ``details["deviations"]`` then holds the largest),
        ``details["prefix_deviations"]`` (when the length test ran) the largest change of the
        run on the first c + 1 positions, per cut.

    Raises:
        ValueError: ``model`` not callable; ``inputs`` not ``(B, T, ...)`` float or integer
            with ``T >= 2``, or not finite; outputs not ``(B, T, ...)``; a bad option; the
            model raised an error on a prefix (pass ``prefix=False``).

    Example:
        >>> check_causal(lambda x: x.cumsum(dim=1), torch.ones(2, 5, 3)).passed
        True
        >>> leaky = check_causal(lambda x: x + x.roll(-1, dims=1), torch.ones(2, 5, 3))
        >>> leaky.passed, leaky.first_position, leaky.details["reads"]
        (False, 0, [1])
        >>> check_causal(lambda x: x.cumsum(dim=1) / x.shape[1], torch.ones(2, 5, 3)).passed
        False

    Source: Vaswani et al. (2017), section 3.2.3 (the decoder must not see later positions);
    the prefix and gradient tests of pangolinn; book chapters 8 and "When attention goes
    wrong".
    """
    _check_model(model)
    inputs = _check_inputs(inputs, min_len=2)
    _check_options(mode, tolerance, seed)
    _check_vocab(inputs, vocab_size)
    _check_prefix(prefix)
    _check_call(input_name, mask_name, kwargs, output)
    _validate_mask_options(padding_side, mask_convention, mask_name)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    if not isinstance(exact, bool):
        raise ValueError(f"exact must be True or False, got {exact!r}")
    B, T = inputs.shape[:2]
    valid_lens = _optional_valid_lens(valid_lens, mask_name, B, T)
    if valid_lens is not None and bool((valid_lens < 1).any()):
        raise ValueError("valid_lens for check_causal must be >= 1 (an empty sequence has no "
                         "position to test)")
    if input_name is not None and valid_lens is not None and mask_name is None:
        raise ValueError("input_name needs mask_name: with the inputs passed as a keyword, the "
                         "padding must be one too")
    if prefix is None:
        prefix = mode == "eval" and valid_lens is None
    name = "check_causal"
    device = inputs.device
    generator = torch.Generator(device=device).manual_seed(seed)
    cuts = _sampled(T - 1, samples, torch.Generator().manual_seed(seed))
    run_options = dict(input_name=input_name, kwargs=kwargs, output=output)
    run = _runner(model, seed, B, **run_options)
    positions = torch.arange(T, device=device)
    padding = (torch.zeros(B, T, dtype=torch.bool, device=device) if valid_lens is None
               else _padding_of(valid_lens, T, device, padding_side))
    valid = ~padding

    def call(x: Tensor, run: Callable[..., Tensor] = run) -> Tensor:
        if valid_lens is None:
            return run(x)
        args, keywords = _lengths_argument(valid_lens, T, device, mask_name, padding_side,
                                           mask_convention)
        return run(x, *args, **keywords)

    details: Dict[str, Any] = {"cuts": cuts, "reads": []}
    with _held_still(_find_module(model, module), mode, device) as held:
        with torch.no_grad():
            reference = call(inputs)
        _check_time_axis(reference, B, T, name)
        tol, scale = _tolerances(reference, tolerance), _scale(reference, tolerance)
        how = held.describe(inputs.dtype, seed)
        where = _non_finite(reference[valid][None], nan_only=True)
        if where is not None:
            where = _non_finite(reference.masked_fill(padding.view(
                B, T, *([1] * (reference.dim() - 2))), 0.0), nan_only=True)
            return _not_finite_result(name, str(where), float(tol.min()), "The outputs")
        nan_at_padding = bool(torch.isnan(reference).any())
        # 1. grad modes: the run with gradients enabled must give the same outputs
        probe = _jacobian.Probe(call, inputs, generator)
        _check_time_axis(probe.out, B, T, name)
        mode_dev = _deviations(probe.out, reference, scale=scale).masked_fill(padding, 0.0)
        if bool((mode_dev > tol).any()):
            index, largest, tol_there = _nearest(mode_dev, tol)
            message = (f"The model gives other outputs with gradients enabled than under "
                       f"torch.no_grad(): at position {index[1]} of sequence {index[0]} they "
                       f"differ by {_against(largest, tol_there)}. It takes another path when "
                       f"torch.is_grad_enabled(); the checks below would test only one of the "
                       f"two ({how}).")
            return CheckResult(name, False, message, largest, tol_there, index[1],
                               {**details, "grad_modes": mode_dev.amax(dim=0).cpu()})
        # 2. exact: the gradient after each cut (and at the padding) must be exactly 0
        if nan_at_padding:
            probe.why_not = ("the outputs hold NaN at padded positions, which would make "
                             "every gradient NaN")
        details["exact"] = exact and (probe.usable or probe.why_not)
        if exact and probe.usable:
            found: Dict[int, Tensor] = {}  # the gradients each probe found

            def causal_test(pr: Any) -> Tuple[Optional[int], Optional[int]]:
                bad, within, found[id(pr)] = _causal_gradients(pr, cuts, valid, padding,
                                                               positions)
                return bad, within

            bad, decider, note, details["float64"] = _exact_verdict(
                causal_test, probe, lambda: _float64_probe(model, module, held, call, inputs,
                                                           seed, run_options))
            gradients = found[id(decider)]
            if bad is not None:
                return _causal_exact_failure(decider, bad, valid, padding, positions,
                                             _how(decider, probe, how), details, gradients, note)
            details["gradients"] = gradients.cpu()
            details["note"] = note
        del probe
        with torch.no_grad():
            # 3. the future: change the inputs after each cut
            dev = torch.zeros(B, T - 1, dtype=torch.float64, device=device)
            for c in cuts:
                changed = _perturbed(inputs, (positions > c).expand(B, T), generator, vocab_size)
                d = _deviations(call(changed), reference, scale=scale)  # (B, T)
                d = d.masked_fill(padding, 0.0)[:, :c + 1]
                dev[:, :c + 1] = torch.maximum(dev[:, :c + 1], d)
            leaking = (dev > tol[:, :-1]).any(dim=0).nonzero().flatten().tolist()
            reads: List[int] = []
            if leaking and T <= 64:
                p = leaking[0]
                for q in range(p + 1, T):  # which later positions does position p read?
                    changed = _perturbed(inputs, (positions == q).expand(B, T), generator,
                                         vocab_size)
                    moved = _deviations(call(changed), reference, scale=scale)[:, p]
                    if bool((moved.masked_fill(padding[:, p], 0.0) > tol[:, p]).any()):
                        reads.append(q)
            # 4. the length: run the first c + 1 positions alone
            prefix_dev: Optional[Tensor] = None
            prefix_first: Optional[Tuple[int, int]] = None  # (length, position)
            sampled_skip = bool(run.samples) and prefix  # type: ignore[attr-defined]
            if not leaking and prefix and not sampled_skip:
                prefix_dev = torch.zeros(B, len(cuts), dtype=torch.float64, device=device)
                prefix_tol = torch.zeros_like(prefix_dev)
                for i, c in enumerate(cuts):
                    try:
                        out = run(inputs[:, :c + 1])
                    except Exception as error:  # noqa: BLE001  the model refuses shorter inputs
                        raise ValueError(
                            f"check_causal runs the model on the first c + 1 positions to test "
                            f"that the outputs do not depend on the length; on {c + 1} "
                            f"positions it raised {type(error).__name__}: {error}. Pass "
                            "prefix=False for a model that only accepts sequences of length "
                            "T") from error
                    _check_time_axis(out, B, c + 1, f"check_causal (prefix of {c + 1})")
                    d = _deviations(out, reference[:, :c + 1], scale=scale)  # (B, c + 1)
                    k = _ratio(d, tol[:, :c + 1]).argmax(dim=1, keepdim=True)  # (B, 1)
                    prefix_dev[:, i] = d.gather(1, k)[:, 0]
                    prefix_tol[:, i] = tol[:, :c + 1].gather(1, k)[:, 0]
                    bad = (d > tol[:, :c + 1]).any(dim=0).nonzero().flatten().tolist()
                    if bad and prefix_first is None:
                        prefix_first = (c + 1, bad[0])
    deviations = dev.amax(dim=0).cpu()  # (T - 1,)
    details.update({"deviations": deviations, "reads": reads})
    exact_words = _exact_words(details.get("exact"), len(cuts), T, details.get("float64"),
                               details.pop("note", ""))
    if not leaking and prefix_dev is not None:
        details["prefix_deviations"] = prefix_dev.amax(dim=0).cpu()
        if prefix_first is not None:
            length, p = prefix_first
            index, largest, tol_there = _nearest(prefix_dev, prefix_tol)
            message = (f"Changing the inputs after each cut left the outputs before it "
                       f"unchanged, but the outputs depend on the sequence length: run on "
                       f"{_first(length)} alone, the model gives position {p} another output "
                       f"than in the full run of {T}. The largest change over the "
                       f"{len(cuts)} shorter runs is {_against(largest, tol_there)}, in the "
                       f"run on {_first(cuts[index[1]] + 1)} ({how}).")
            return CheckResult(name, False, message, largest, tol_there, p, details)
    if not leaking:
        tested = (f"changing the inputs after t left the outputs at 0..t unchanged" +
                  (", and a run on the first t + 1 positions alone gave the same outputs"
                   if prefix_dev is not None else ""))
        all_dev, all_tol = dev, tol[:, :-1]
        if prefix_dev is not None:
            all_dev = torch.cat([dev, prefix_dev], dim=1)
            all_tol = torch.cat([all_tol, prefix_tol], dim=1)
        _, largest, tol_there = _nearest(all_dev, all_tol)
        where = f"every position t of {T}" if len(cuts) == T - 1 else \
            f"{len(cuts)} positions t of {T}"
        padded = "" if valid_lens is None else \
            f" ({int(padding.sum())} padded positions, padding on the {padding_side})"
        skipped = (" The model draws random numbers (the same generator state in every run, "
                   "but draws that depend on the tensor's shape), so the length test, whose "
                   "runs are shorter, was skipped." if sampled_skip else "")
        message = (f"{exact_words}For {where}{padded}, {tested}; "
                   f"{_largest(all_dev.cpu(), all_tol.cpu(), how)}.{skipped}")
        return CheckResult(name, True, message, largest, tol_there, None, details)
    _, largest, tol_there = _nearest(dev, tol[:, :-1])
    p = leaking[0]
    what = _positions(reads) if reads else "later positions"
    worst = f"{_fmt(float(deviations.max()))}, at position {int(deviations.argmax())}"
    message = (f"The output at position {p} changed by {_fmt(float(dev[:, p].max()))} when the "
               f"inputs after it changed (tolerance {_fmt(float(tol[:, p].min()))}): it reads "
               f"{what}. {len(leaking)} of the first {T - 1} positions leak; the largest "
               f"deviation is {worst} ({how}).")
    return CheckResult(name, False, message, largest, tol_there, p, details)


#: A gradient at most this many units in the last place of the dtype of the largest allowed
#: one may be rounding (an FFT gives such gradients where exact arithmetic gives 0).
_ROUNDING_ULPS = 64


def _above_rounding(g: Tensor, g_all: Tensor, forbidden: Tensor, dtype: torch.dtype) -> Tensor:
    """``g`` with the entries at most :data:`_ROUNDING_ULPS` units in the last place of
    ``dtype`` of the largest allowed gradient (``g_all`` where not ``forbidden``) set to 0: a
    model computed through an FFT (a causal convolution by the convolution theorem) has
    gradients of that size where it has none in exact arithmetic. In float64 such a gradient
    is rounding; in another dtype it is undecided (a leak of LayerScale's 1e-6 is as small in
    float32), and a float64 copy of the model decides (:func:`_float64_twin`)."""
    allowed = g_all.masked_fill(forbidden, 0.0)
    allowed = torch.where(torch.isfinite(allowed), allowed, torch.zeros_like(allowed))
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    floor = _ROUNDING_ULPS * eps * float(allowed.max())
    return torch.where(g.abs() <= floor, torch.zeros_like(g), g)


def _above_float64_rounding(g: Tensor, g_all: Tensor, forbidden: Tensor,
                            dtype: torch.dtype) -> Tensor:
    """:func:`_above_rounding` in float64 only (where it decides); in other dtypes every
    non-zero counts."""
    return _above_rounding(g, g_all, forbidden, dtype) if dtype == torch.float64 else g


def _float64_twin(model: Model, module: Optional[nn.Module], held: _Held
                  ) -> Tuple[Optional[Model], Optional[str]]:
    """The model in float64, to decide gradients within the rounding of a lower precision:
    a deep copy of the ``nn.Module`` (or of the module a bound method belongs to), never the
    caller's; a function that calls no module with floating parameters or buffers as it is
    (its float64 inputs make it float64). ``(None, why)`` when no copy can be made: a function
    of modules (the check cannot swap them for copies)."""
    owner = model if isinstance(model, nn.Module) else getattr(model, "__self__", None)
    if isinstance(owner, nn.Module):
        if module is not None and all(m is not module for m in owner.modules()):
            return None, ("module= is not part of the model, so a copy of the model would "
                          "still use it")
        held.reset_buffers()
        try:
            twin = copy.deepcopy(owner).double()
        except Exception as error:  # noqa: BLE001  (an attribute deepcopy cannot copy)
            return None, f"copying the model raised {type(error).__name__}"
        if owner is model:
            return twin, None
        return types.MethodType(model.__func__, twin), None  # type: ignore[union-attr]
    tensors = [t for m in held.roots for t in list(m.parameters()) + list(m.buffers())]
    if module is None and not any(t.is_floating_point() for t in tensors):
        return model, None
    return None, ("the model is a function that calls modules, which the check cannot swap "
                  "for float64 copies; pass the nn.Module itself")


def _float64_probe(model: Model, module: Optional[nn.Module], held: _Held,
                   call: Callable[..., Tensor], inputs: Tensor, seed: int,
                   run_options: Mapping[str, Any]) -> Tuple[Optional[Any], Optional[str]]:
    """The gradient probe (:class:`d2lattn._jacobian.Probe`) of a float64 copy of the model
    (:func:`_float64_twin`) on float64 copies of the inputs, ``call(x, run)`` calling it as
    the check calls the model; ``(None, why)`` when there is none."""
    twin, why = _float64_twin(model, module, held)
    if twin is None:
        return None, why
    run64 = _runner(twin, seed, inputs.shape[0], **run_options)
    x = inputs.double() if inputs.is_floating_point() else inputs
    try:
        probe = _jacobian.Probe(lambda x: call(x, run64), x,
                                torch.Generator(device=inputs.device).manual_seed(seed + 2))
    except Exception as error:  # noqa: BLE001  (a model that runs in its own dtype only)
        return None, f"the float64 copy raised {type(error).__name__}"
    if probe.out.dtype != torch.float64:
        return None, f"the float64 copy returned {probe.out.dtype}"
    if not probe.usable:
        return None, str(probe.why_not)
    return probe, None


def _undecided(dtype: torch.dtype, why: Optional[str]) -> str:
    """Why a gradient within rounding still fails: no float64 copy could decide."""
    return (f" Every such gradient is within the rounding of {dtype} (at most "
            f"{_ROUNDING_ULPS} units in the last place of the largest allowed one), as an FFT "
            f"gives them too; a float64 copy of the model would decide, but {why}.")


def _how(decider: Any, probe: Any, how: str) -> str:
    """The conditions of a verdict the float64 copy gave (``decider`` is not ``probe``)."""
    if decider is probe:
        return how
    why = ("could have underflowed" if probe.out.dtype == torch.float16 else
           "were within rounding")
    return f"{how}; in a float64 copy of the model, because the {probe.out.dtype} gradients {why}"


def _exact_verdict(test: Callable[[Any], Tuple[Any, Any]], probe: Any,
                   float64_probe: Callable[[], Tuple[Optional[Any], Optional[str]]]
                   ) -> Tuple[Any, Any, str, bool]:
    """The exact test's verdict: ``test(probe)`` gives ``(bad, within)``, what has a gradient
    beyond rounding (``None`` if nothing) and what has one within rounding only. Within
    rounding, and for every float16 pass (whose gradients below 2**-24 = 6.0e-08 underflow to
    0), a float64 copy of the model decides (``float64_probe()``, see :func:`_float64_probe`).
    Returns ``(bad, the probe that decided, a note for the message, whether float64
    decided)``; a gradient within rounding that no float64 copy could decide fails."""
    bad, within = test(probe)
    dtype = probe.out.dtype
    if bad is not None or (within is None and dtype != torch.float16):
        return bad, probe, "", False
    probe64, why = float64_probe()
    if probe64 is None:
        if within is not None:
            return within, probe, _undecided(dtype, why), False
        return None, probe, (f" The gradients were taken in float16, where those below "
                             f"6.0e-08 underflow to 0; a float64 copy of the model would see "
                             f"them, but {why}."), False
    bad, _ = test(probe64)
    return bad, probe64, "", True


def _causal_gradients(probe: Any, cuts: Sequence[int], valid: Tensor, padding: Tensor,
                      positions: Tensor) -> Tuple[Optional[int], Optional[int], Tensor]:
    """The exact test of :func:`check_causal` on ``probe``: the first cut whose outputs have
    a gradient after it (or at the padding) beyond rounding (:func:`_above_rounding`), the
    first whose have one only within rounding, and the ``(T,)`` largest gradient beyond
    rounding at each input position."""
    B, T = valid.shape
    gradients = torch.zeros(T, dtype=torch.float64, device=valid.device)
    within = None
    for c in cuts:
        ask = valid & (positions <= c)[None, :]
        if not bool(ask.any()):
            continue
        future = (positions > c)[None, :].expand(B, T)
        g_all, g_own = probe.influences(ask)  # the padding: each sequence's own
        g = torch.where(future, g_all, g_own.masked_fill(~padding, 0.0))
        beyond = _above_rounding(g, g_all, future | padding, probe.out.dtype)
        gradients = torch.maximum(gradients, beyond.amax(dim=0))
        if bool((beyond != 0).any()):
            return c, within, gradients
        if within is None and probe.out.dtype != torch.float64 and bool((g != 0).any()):
            within = c
    return None, within, gradients


def _exact_words(exact: Any, num_cuts: int, T: int, float64: Any = None,
                 note: str = "") -> str:
    """The gradient test's part of a pass message."""
    if exact is True:
        decided = ("; decided in a float64 copy of the model" if float64 else "")
        return (f"Exact: the gradient of the outputs at 0..t with respect to every input "
                f"after t is exactly 0 (at {num_cuts} cuts t{decided}).{note} ")
    if isinstance(exact, str):
        return f"The gradient test could not run ({exact}). "
    return ""


def _causal_exact_failure(probe: Any, c: int, valid: Tensor, padding: Tensor,
                          positions: Tensor, how: str, details: Dict[str, Any],
                          gradients: Tensor, note: str = "") -> CheckResult:
    """The result when the outputs at ``0..c`` have a non-zero gradient after ``c`` (or at
    the padding): the first position that does, found with one backward pass per position
    (at most 64), and what it reads."""
    name = "check_causal"
    T = positions.numel()
    p, g, kind = None, None, "future"
    for t in range(min(c + 1, 64)):
        ask = valid & (positions == t)[None, :]
        if not bool(ask.any()):
            continue
        g_all, g_own = probe.influences(ask)
        future = (positions > t)[None, :].expand_as(g_all)
        g_own = _above_float64_rounding(g_own, g_all, future | padding, probe.out.dtype)
        g_all = _above_float64_rounding(g_all, g_all, future | padding, probe.out.dtype)
        if bool((g_all[future] != 0).any()):
            p, g = t, g_all.masked_fill(~future, 0.0)
            break
        if bool((g_own[padding] != 0).any()):
            p, g, kind = t, g_own.masked_fill(~padding, 0.0), "padding"
            break
    if p is None:  # not found among the first 64: report the cut
        ask = valid & (positions <= c)[None, :]
        future = (positions > c)[None, :].expand_as(padding)
        g_all, g_own = probe.influences(ask)
        g = torch.where(future, g_all, g_own.masked_fill(~padding, 0.0))
    per_position = g.amax(dim=0).cpu()  # (T,)
    reads = per_position.nonzero().flatten().tolist()
    largest = float(per_position.max())
    deviations = torch.zeros(T - 1, dtype=torch.float64)
    if p is not None and p < T - 1:
        deviations[p] = largest  # the gradient test stops at the first leaking position
    details = {**details, "reads": reads, "gradients": per_position,
               "exact": True, "deviations": deviations, "undecided": bool(note)}
    grad = _fmt(largest).replace(" (NaN or an infinity)", " or NaN")
    if p is None:
        message = (f"The outputs at positions 0-{c} have a non-zero gradient with respect to "
                   f"the inputs at {_positions(reads)} after them or at the padding (largest "
                   f"|gradient| {grad}; exactly 0 is required) ({how}).{note}")
        return CheckResult(name, False, message, largest, 0.0, None, details)
    if kind == "padding":
        message = (f"The output at valid position {p} has a non-zero gradient with respect to "
                   f"the padded {_positions(reads)} (largest |gradient| {grad}; exactly 0 is "
                   f"required): it reads the padding, so the mask misses it (a causal mask "
                   f"combined with the padding mask by | instead of &, or padding on the other "
                   f"side than the mask assumes) ({how}).{note}")
    else:
        message = (f"The output at position {p} has a non-zero gradient with respect to the "
                   f"inputs after it (largest |gradient| {grad}; exactly 0 is required): it "
                   f"reads {_positions(reads)}. It reads the future, however little "
                   f"({how}).{note}")
    return CheckResult(name, False, message, largest, 0.0, p, details)


def _grad_modes(name: str, probe: Any, reference: Tensor, tol: Tensor, scale: Optional[float],
                valid: Tensor, time_axis: bool, how: str) -> Optional[CheckResult]:
    """The failed result when the run with gradients enabled (``probe.out``) differs from the
    reference run under ``torch.no_grad()`` at a ``valid`` place, else ``None``."""
    if probe.out.shape != reference.shape:
        raise ValueError(f"the model's outputs have shape {tuple(probe.out.shape)} with "
                         f"gradients enabled and {tuple(reference.shape)} under no_grad")
    dev = _deviations(probe.out, reference, time_axis, scale).masked_fill(~valid, 0.0)
    if not bool((dev > tol).any()):
        return None
    index, largest, tol_there = _nearest(dev, tol)
    where = (f"at position {index[1]} of sequence {index[0]}" if len(index) == 2
             else f"in sequence {index[0]}")
    message = (f"The model gives other outputs with gradients enabled than under "
               f"torch.no_grad(): {where} they differ by {_against(largest, tol_there)}. It "
               f"takes another path when torch.is_grad_enabled(); the other tests would see "
               f"only one of the two ({how}).")
    return CheckResult(name, False, message, largest, tol_there,
                       index[1] if len(index) == 2 else None, {"grad_modes": dev.cpu()})


def _first_reader(probe: Any, b: int, valid: Tensor, forbidden: Tensor, time_axis: bool,
                  per_sequence: bool = True) -> Tuple[Optional[int], Tensor]:
    """The first valid output position of sequence ``b`` (at most the first 64) whose
    gradient is not 0 somewhere ``forbidden`` ((B, T) bool), and that gradient masked to the
    forbidden places; ``(None, gradient of all of b's valid outputs)`` when none is found or
    the outputs have no positions."""
    B = valid.shape[0]
    if time_axis:
        for t in torch.nonzero(valid[b]).flatten().tolist()[:64]:
            ask = torch.zeros_like(valid)
            ask[b, t] = True
            g = probe.influence(ask, per_sequence=per_sequence)
            if bool((g[forbidden] != 0).any()):
                return t, g.masked_fill(~forbidden, 0.0)
    ask = torch.zeros_like(valid)
    ask[b] = valid[b]
    return None, probe.influence(ask, per_sequence=per_sequence).masked_fill(~forbidden, 0.0)


def _padding_gradients(probe: Any, valid: Tensor, padding: Tensor) -> Tuple[Tensor, Tensor]:
    """The exact test of :func:`check_padding` on ``probe``: the ``(B, T)`` gradient of the
    ``valid`` outputs at the padded inputs beyond rounding (:func:`_above_rounding`), and all
    of it."""
    g_all = probe.influence(valid, per_sequence=True)
    g = g_all.masked_fill(~padding, 0.0)
    return _above_rounding(g, g_all, padding, probe.out.dtype), g


def _batch_gradients(probe: Any, tested: Sequence[int], valid: Tensor, time_axis: bool
                     ) -> Tuple[Optional[int], Optional[int]]:
    """The exact test of :func:`check_batch_independence` on ``probe``: the first tested
    sequence whose outputs have a gradient at another sequence's inputs beyond rounding
    (:func:`_above_rounding`), and the first with one only within rounding."""
    B, T = probe.B, probe.T
    rows = torch.arange(B, device=valid.device)[:, None]
    within = None
    for b in tested:
        ask = valid & (rows == b) if time_axis else (rows[:, 0] == b)
        g = probe.influence(ask, per_sequence=True)
        others = (rows != b).expand(B, T)
        beyond = _above_rounding(g.masked_fill(~others, 0.0), g, others, probe.out.dtype)
        if bool((beyond != 0).any()):
            return b, within
        if within is None and probe.out.dtype != torch.float64 and bool((g[others] != 0).any()):
            within = b
    return None, within


def _gradient_words(g: float) -> str:
    return _fmt(g).replace(" (NaN or an infinity)", " or NaN")


def check_padding(model: Model, inputs: Tensor, valid_lens: Union[Tensor, Sequence[int]], *,
                  mode: str = "eval", tolerance: Optional[float] = None, seed: int = 0,
                  vocab_size: Optional[int] = None, pooled: Optional[bool] = None,
                  module: Optional[nn.Module] = None, pad_id: Optional[int] = None,
                  mask_name: Optional[str] = None, padding_side: str = "right",
                  mask_convention: str = "keep", input_name: Optional[str] = None,
                  kwargs: Optional[Mapping[str, Any]] = None,
                  output: Output = None, exact: bool = True) -> CheckResult:
    """Check that outputs at valid positions ignore the padding.

    Sequence ``b`` is valid at positions ``0 .. valid_lens[b] - 1`` (with
    ``padding_side="left"``, as decoders batch their prompts: the last ``valid_lens[b]``
    positions); the rest is padding. First
    the padded batch is run under ``torch.no_grad()`` and with gradients enabled, which must
    agree (a model that takes another path when ``torch.is_grad_enabled()`` fails). Then
    **exact** (``exact=True``, where the outputs carry a gradient; one backward pass): the
    gradient of a random weighting of the outputs at the valid positions (or the pooled
    outputs) with respect to every padded input must be exactly 0, whatever its size (for
    token ids: at the outputs of the ``nn.Embedding`` modules). Then two perturbation tests,
    for what gradients cannot see (a pad id the model looks for, an argmax, NaN).
    **Alone**: each padded sequence with at least one valid position is run alone,
    without its padding (``inputs[b:b+1, :valid_lens[b]]``, or its last ``valid_lens[b]``
    positions with left padding), and its outputs at the valid positions (or its pooled
    output) must equal those it gets in the padded batch: the padding
    is tested as the model uses it, whatever marks it (``valid_lens``, a mask, or a pad id the
    model looks for). **Content** (skipped when ``pad_id`` is given, since the padding must
    then hold the pad id): the padding is filled with other values (or other token ids) and
    the outputs at the valid positions (or the pooled outputs) must not move. Outputs *at*
    padded positions may change: nothing should read them. A model that masks the padding
    keys passes; one that forgets the mask, uses the wrong convention, or pools (averages)
    over the padding fails.

    Args:
        model: ``model(inputs, valid_lens)`` (or ``model(inputs, **{mask_name: mask})``) maps
            to ``(B, T, ...)`` outputs, or to ``(B, ...)`` pooled outputs; an ``nn.Module`` or
            any callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids; never modified.
        valid_lens: ``(B,)`` integers in ``[0, T]`` (a list works too), at least one of them
            ``< T`` (otherwise there is no padding to change). The model gets a copy.
        mode, tolerance, seed, vocab_size, module: keyword-only; as in :func:`check_causal`.
        pooled: keyword-only; ``None`` (default) reads it from the output shapes: per position
            if the outputs' second axis is T in the batch and the valid length in a sequence
            run alone; if the outputs have the same shape for every length, per position of a
            static length when they are ``(B, T, ...)`` with three axes or more (a model that
            pads or cuts its outputs to the batch's length T: output q of a sequence run
            alone is compared with its valid position q in the batch), pooled otherwise
            (``(B, C)``, ``(B, 1, C)``, k pooled vectors ``(B, k, C)`` as a Perceiver's
            latents: all compared). Pass True or False to decide yourself: False reads outputs
            of any static length S per position (positions from S on are not compared), True
            reads ``(B, T, C)`` as k = T pooled vectors.
        pad_id: keyword-only; for token ids whose padding holds this id (checked), for a model
            that finds its padding by the id; the content test is then skipped.
        mask_name, padding_side, mask_convention: keyword-only; as in :func:`check_causal`:
            pass the padding as the keyword ``mask_name``, a ``(B, T)`` mask (e.g.
            ``"attention_mask"``), instead of ``valid_lens``: int64 1 = valid (``"keep"``,
            default) or bool True = padding (``"ignore"``, ``key_padding_mask``); valid
            positions first (``"right"``, default) or last (``"left"``: a decoder's prompts,
            padded on the left, which a model that ignores its mask reads at every valid
            position). ``padding_side`` and ``mask_convention`` need ``mask_name``.
        input_name, kwargs, output: keyword-only; as in :func:`check_causal` (``input_name``
            needs ``mask_name``).
        exact: keyword-only; run the gradient test (default True).

    Cost: two runs of the batch, one backward pass, one run per padded sequence, one run with
    the padding changed.

    **What a pass means.** Exactly, at these inputs: no valid output has a non-zero derivative
    with respect to any padded input (gradients within rounding, and a float16 pass, decided
    in a float64 copy of the model, see the module's notes); and the sequences run alone, and
    the batch with other padding, gave the same valid outputs within the tolerance. Padding on
    the other side needs ``padding_side=``, a leak only in training mode ``mode="train"``.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first valid position that moved (in
        the first sequence where one did), ``details["deviations"]`` the ``(B, T)`` largest
        changes of both tests (``(B,)`` when pooled, ``(B, S)`` with a static length S;
        padded positions hold 0), ``details["sequence"]`` the sequence of the first failure,
        ``details["pooled"]`` how the outputs were read and ``details["static"]`` the
        static length S (``None`` if the outputs follow the input's length).

    Raises:
        ValueError: bad ``model``, ``inputs`` or options as in :func:`check_causal`
            (``padding_side`` or ``mask_convention`` without ``mask_name``); ``valid_lens``
            not ``(B,)`` integers in ``[0, T]`` or without padding; outputs of another batch
            size, or whose shape is neither per position (of the input's length or a static
            one) nor pooled; padding that does not hold ``pad_id``.

    Example:
        >>> mean_over_all = lambda x, lens: x.mean(dim=1)  # pools over the padding too
        >>> check_padding(mean_over_all, torch.ones(2, 4, 3), torch.tensor([4, 2])).passed
        False

    Source: the ``valid_lens`` masking of book chapter 3; the padding-mask questions of the
    Annotated Transformer's issue tracker (harvardnlp/annotated-transformer #37, #137); the
    per-sequence padding test of pangolinn.
    """
    _check_model(model)
    inputs = _check_inputs(inputs)
    _check_options(mode, tolerance, seed)
    _check_vocab(inputs, vocab_size)
    _check_call(input_name, mask_name, kwargs, output)
    if input_name is not None and mask_name is None:
        raise ValueError("input_name needs mask_name: with the inputs passed as a keyword, the "
                         "padding must be one too")
    B, T = inputs.shape[:2]
    valid_lens = _check_valid_lens(valid_lens, B, T)
    if bool((valid_lens == T).all()):
        raise ValueError(f"valid_lens must leave some padding (an entry < T = {T}) for the "
                         "check to change, got all equal to T")
    if pooled is not None and not isinstance(pooled, bool):
        raise ValueError(f"pooled must be None, True or False, got {pooled!r}")
    _validate_mask_options(padding_side, mask_convention, mask_name)
    lens = valid_lens.to(inputs.device)
    padding = _padding_of(lens, T, inputs.device, padding_side)  # (B, T), True = padded
    _check_pad_id(inputs, padding, pad_id)
    name = "check_padding"
    generator = torch.Generator(device=inputs.device).manual_seed(seed)
    run_options = dict(input_name=input_name, kwargs=kwargs, output=output)
    run = _runner(model, seed, B, **run_options)

    def call(x: Tensor, lengths: Tensor, run: Callable[..., Tensor] = run) -> Tensor:
        args, keywords = _lengths_argument(lengths, x.shape[1], x.device, mask_name,
                                           padding_side, mask_convention)
        return run(x, *args, **keywords)

    def first(b: int) -> int:  # sequence b's first valid position in the batch
        return 0 if padding_side == "right" else T - int(lens[b])

    num_padded = int((lens < T).sum())
    alone_ids = [b for b in range(B) if 0 < int(lens[b]) < T]
    with _held_still(_find_module(model, module), mode, inputs.device) as held, torch.no_grad():
        reference = call(inputs, valid_lens)
        alone = {}
        for b in alone_ids:
            alone[b] = call(inputs[b:b + 1, first(b):first(b) + int(lens[b])],
                            valid_lens[b:b + 1])
            if run.samples and exact:  # type: ignore[attr-defined]
                alone = {}  # draws depend on the shape: the gradient test speaks instead
                break
        shapes = {tuple(out.shape[1:]) for out in alone.values()}
        same = bool(alone) and shapes == {tuple(reference.shape[1:])}
        if pooled is None:  # read the outputs' shapes
            if not alone:
                per_position = reference.dim() >= 2 and reference.shape[1] == T
            elif same:  # the same shape for every length: pooled, or (B, T, ...) padded or
                # cut to the batch's length T (k pooled vectors, as a Perceiver's latents,
                # would be misread only when k = T: pass pooled=True then)
                per_position = reference.dim() >= 3 and reference.shape[1] == T
            elif reference.dim() >= 2 and reference.shape[1] == T and all(
                    out.shape[1] == int(lens[b]) and out.shape[2:] == reference.shape[2:]
                    for b, out in alone.items()):
                per_position = True
            else:
                raise ValueError(f"check_padding cannot read the outputs: shape "
                                 f"{tuple(reference.shape)} for T = {T} and "
                                 f"{sorted(shapes)} for sequences run alone; pass pooled=")
        else:
            per_position = not pooled
        static = per_position and (same or reference.dim() >= 2 and reference.shape[1] != T)
        if per_position and not static:
            _check_time_axis(reference, B, T, "check_padding (pooled=False)")
        if static and not same and alone:
            raise ValueError(f"check_padding (pooled=False) reads outputs of shape "
                             f"{tuple(reference.shape)} for T = {T} as a static length "
                             f"{reference.shape[1]}, but the sequences run alone gave "
                             f"{sorted(shapes)}")
        S = reference.shape[1] if per_position else 0
        hint = ("" if per_position or reference.dim() < 2 or reference.shape[1] == 1
                or not same else
                f" If these are outputs per position of a static length S = "
                f"{reference.shape[1]} (padded or cut to it), pass pooled=False.")
        tol = _tolerances(reference, tolerance, time_axis=per_position)  # (B, S) or (B,)
        scale = _scale(reference, tolerance)
        if per_position:  # the outputs at valid input positions (S may differ from T)
            valid = torch.zeros(B, S, dtype=torch.bool, device=inputs.device)
            valid[:, :min(S, T)] = ~padding[:, :min(S, T)]
        else:
            valid = torch.ones(B, dtype=torch.bool, device=inputs.device)
        if _non_finite(reference[valid][None] if per_position else reference,
                       nan_only=True) is not None:
            return _not_finite_result(name, "at valid positions", float(tol.min()), "The outputs")
        how = held.describe(inputs.dtype, seed)
        probe = _jacobian.Probe(lambda x: call(x, valid_lens), inputs,
                                torch.Generator(device=inputs.device).manual_seed(seed + 1))
        failed = _grad_modes(name, probe, reference, tol, scale, valid, per_position, how)
        if failed is not None:
            return failed
        exact_ran: Any = exact and (probe.usable or probe.why_not)
        float64, note = False, ""
        if exact and probe.usable:  # the gradient at the padding must be exactly 0
            def padding_test(pr: Any) -> Tuple[Optional[Tensor], Optional[Tensor]]:
                g_beyond, g = _padding_gradients(pr, valid, padding)
                return (g_beyond if bool((g_beyond != 0).any()) else None,
                        g if pr.out.dtype != torch.float64 and bool((g != 0).any()) else None)

            bad, decider, note, float64 = _exact_verdict(
                padding_test, probe, lambda: _float64_probe(
                    model, module, held, lambda x, run: call(x, valid_lens, run), inputs, seed,
                    run_options))
            g = torch.zeros_like(padding, dtype=torch.float64) if bad is None else bad
            if bool((g != 0).any()):
                b = int((g != 0).any(dim=1).nonzero()[0])
                p, g_b = _first_reader(decider, b, valid, padding, per_position)
                read = g_b[b].cpu()
                largest = float(read.max())
                where = (f"The output at valid position {p} of sequence {b}" if p is not None
                         else f"The {'pooled output' if not per_position else 'output'} of "
                              f"sequence {b}")
                message = (f"{where} (valid length {int(lens[b])}) has a non-zero "
                           f"gradient with respect to its padded "
                           f"{_positions(read.nonzero().flatten().tolist())} (largest "
                           f"|gradient| {_gradient_words(largest)}; exactly 0 is required): it "
                           f"reads the padding, however little. "
                           f"{int((g != 0).any(dim=1).sum())} of {num_padded} padded sequences "
                           f"do ({_how(decider, probe, how)}).{note}{hint}")
                return CheckResult(name, False, message, largest, 0.0, p,
                                   {"deviations": torch.zeros_like(tol).cpu(),
                                    "pooled": not per_position, "sequence": b,
                                    "gradients": g.cpu(), "exact": True,
                                    "undecided": bool(note)})
        del probe
        alone_dev = torch.zeros_like(tol)
        for b, out in alone.items():
            if per_position:  # alone, its output q is that of position first(b) + q
                f = first(b)
                n = max(min(int(lens[b]), S - f), 0)
                alone_dev[b, f:f + n] = _deviations(out[:, :n], reference[b:b + 1, f:f + n],
                                                    scale=scale)[0]
            else:
                alone_dev[b] = _deviations(out, reference[b:b + 1], time_axis=False,
                                            scale=scale)[0]
        content_dev = torch.zeros_like(tol)
        if pad_id is None:
            changed = _perturbed(inputs, padding, generator, vocab_size)
            content_dev = _deviations(call(changed, valid_lens), reference, per_position, scale)
            if per_position:
                content_dev = content_dev.masked_fill(~valid, 0.0)
    dev = torch.maximum(alone_dev, content_dev).cpu()
    tol = tol.cpu()
    details: Dict[str, Any] = {"deviations": dev, "pooled": not per_position,
                               "static": S if static else None, "exact": exact_ran,
                               "float64": float64}
    valid = valid.cpu()
    _, largest, tol_there = _nearest(dev[valid], tol[valid])  # padded positions do not count
    what = (f"Filling the padded positions ({num_padded} of {B} sequences have padding) with "
            "other values")
    moved = content_dev.cpu() > tol
    if bool(moved.any()) and per_position:
        b = int(moved.any(dim=1).nonzero()[0])
        p = int(moved[b].nonzero()[0])
        message = (f"{what} moved the output at valid position {p} of sequence {b} (valid "
                   f"length {int(lens[b])}) by {_fmt(float(content_dev[b, p]))} (tolerance "
                   f"{_fmt(float(tol[b, p]))}). {int(moved.sum())} of {int(valid.sum())} valid "
                   f"positions moved; {_largest(content_dev.cpu(), tol, how)}.")
        return CheckResult(name, False, message, largest, tol_there, p, {**details, "sequence": b})
    if bool(moved.any()):
        b = int(moved.nonzero()[0])
        message = (f"{what} moved the pooled output of sequence {b} (valid length "
                   f"{int(lens[b])} of {T}) by {_fmt(float(content_dev[b]))} (tolerance "
                   f"{_fmt(float(tol[b]))}): the pooling reads the padding. {int(moved.sum())} "
                   f"of {num_padded} padded sequences moved; "
                   f"{_largest(content_dev.cpu(), tol, how)}.{hint}")
        return CheckResult(name, False, message, largest, tol_there, None,
                           {**details, "sequence": b})
    moved = alone_dev.cpu() > tol
    if bool(moved.any()):
        b = int(moved.flatten(1).any(dim=1).nonzero()[0]) if per_position else \
            int(moved.nonzero()[0])
        L = int(lens[b])
        if per_position:
            p = int(moved[b].nonzero()[0])
            where = f"at valid position {p}"
            by = float(alone_dev[b, p])
        else:
            p, where, by = None, "in its pooled output", float(alone_dev[b])
        message = (f"Sequence {b} (valid length {L} of {T}) run alone, without its padding, "
                   f"gave other outputs than in the padded batch: {where} by "
                   f"{_against(by, float(tol[b] if p is None else tol[b, p]))}. The model "
                   f"reads the padding (or, if check_batch_independence fails too, the other "
                   f"sequences); {_largest(alone_dev.cpu(), tol, how)}.{hint}")
        return CheckResult(name, False, message, largest, tol_there, p, {**details, "sequence": b})
    unmoved = (f"the outputs at all {int(valid.sum())} valid positions" if per_position
               else "the pooled outputs")
    tests = f"Each of the {len(alone)} padded sequences run alone, without its padding, " \
            f"gave its outputs in the batch"
    if pad_id is None:
        tests += f", and filling the padding with other values left {unmoved} unchanged"
    else:
        tests += f" (padding holds pad_id = {pad_id}, so it was not refilled)"
    if exact_ran is True:
        decided = " (decided in a float64 copy of the model)" if float64 else ""
        tests = ("Exact: the gradient of the outputs at the valid positions with respect to "
                 f"every padded input is exactly 0{decided}.{note} " + tests)
    elif isinstance(exact_ran, str):
        tests = f"The gradient test could not run ({exact_ran}). " + tests
    message = f"{tests}; {_largest(dev[valid], tol[valid], how)}."
    return CheckResult(name, True, message, largest, tol_there, None, details)


def check_batch_independence(model: Model, inputs: Tensor,
                             valid_lens: Optional[Union[Tensor, Sequence[int]]] = None, *,
                             mode: str = "eval", tolerance: Optional[float] = None,
                             seed: int = 0, module: Optional[nn.Module] = None,
                             mask_name: Optional[str] = None, padding_side: str = "right",
                             mask_convention: str = "keep", input_name: Optional[str] = None,
                             kwargs: Optional[Mapping[str, Any]] = None,
                             output: Output = None, exact: bool = True) -> CheckResult:
    """Check that each sequence's outputs ignore the other sequences of the batch.

    The check runs the whole batch under ``torch.no_grad()`` and with gradients enabled (the
    two must agree). **Exact** (``exact=True``, where the outputs carry a gradient): for each
    sequence b (all of them when ``B <= 16``, else 8 drawn at random), one backward pass of a
    random weighting of b's outputs; the gradient with respect to every other sequence's
    inputs must be exactly 0. Then, for what gradients cannot see, it runs each sequence alone
    (a batch of one) and the batch in a shuffled order (a random permutation that moves every
    sequence), and compares each sequence's outputs (at its valid positions, with
    ``valid_lens``); a model that sorts its batch (by length, say) and returns it unsorted
    fails the shuffled run. A model that mixes
    the batch fails: ``.view(T, B, C)`` where a transpose was meant, a shift or a roll along the
    batch axis (sequence b reading sequence b - 1), statistics taken over the batch (BatchNorm
    in training mode). Such a bug is invisible at B = 1, and a check that runs one sequence at
    a time never sees it.

    Args:
        model: ``model(inputs)``, or ``model(inputs, valid_lens)`` when ``valid_lens`` is given
            (or ``model(inputs, **{mask_name: mask})``), maps to ``(B, ...)`` outputs; an
            ``nn.Module`` or any callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids with ``B >= 2``; never modified.
        valid_lens: optional ``(B,)`` integers in ``[0, T]``; outputs of shape ``(B, T, ...)``
            are then compared at the valid positions only.
        mode, tolerance, seed, module: keyword-only; as in :func:`check_causal`.
        mask_name, padding_side, mask_convention: keyword-only; as in :func:`check_causal`
            (which positions of each sequence are valid, and how the mask says so).
        input_name, kwargs, output: keyword-only; as in :func:`check_causal`.
        exact: keyword-only; run the gradient test (default True).

    Cost: two runs of the batch, one backward pass per sequence tested, ``B`` runs of one
    sequence and one shuffled run of the batch.

    **What a pass means.** Exactly, at these inputs: no tested sequence's outputs have a
    non-zero derivative with respect to another sequence's inputs (gradients within rounding,
    and a float16 pass, decided in a float64 copy of the model, see the module's notes); and
    alone, or shuffled, every sequence got its outputs within the tolerance. A batch that
    mixes only in training mode (BatchNorm's batch statistics) needs ``mode="train"``.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first position of the first sequence
        that moved (``None`` for outputs without positions), ``details["deviations"]`` the
        ``(B,)`` largest change of each sequence and ``details["sequence"]`` the first
        sequence that moved.

    Raises:
        ValueError: as in :func:`check_causal`; ``B < 2``; bad ``valid_lens``.

    Example:
        >>> x = torch.randn(3, 5, 4)
        >>> check_batch_independence(lambda x: x.softmax(dim=-1), x).passed
        True
        >>> check_batch_independence(lambda x: x + x.roll(1, dims=0), x).passed
        False

    Source: batch-independence tests of model test suites (pangolinn's per-sequence runs);
    book chapter "When attention goes wrong".
    """
    _check_model(model)
    inputs = _check_inputs(inputs)
    _check_batch(inputs)
    _check_options(mode, tolerance, seed)
    _check_call(input_name, mask_name, kwargs, output)
    _validate_mask_options(padding_side, mask_convention, mask_name)
    B, T = inputs.shape[:2]
    valid_lens = _optional_valid_lens(valid_lens, mask_name, B, T)
    name = "check_batch_independence"
    run_options = dict(input_name=input_name, kwargs=kwargs, output=output)
    run = _runner(model, seed, B, **run_options)

    def call(rows: Union[slice, Tensor], x: Optional[Tensor] = None,
             run: Callable[..., Tensor] = run) -> Tensor:
        x = inputs[rows] if x is None else x[rows]
        if valid_lens is None:
            return run(x)
        args, keywords = _lengths_argument(valid_lens[rows], T, x.device, mask_name,
                                           padding_side, mask_convention)
        return run(x, *args, **keywords)

    with _held_still(_find_module(model, module), mode, inputs.device) as held, torch.no_grad():
        reference = call(slice(0, B))
        time_axis = reference.dim() >= 2 and reference.shape[1] == T
        tol = _tolerances(reference, tolerance, time_axis)
        scale = _scale(reference, tolerance)
        valid = torch.ones(tol.shape, dtype=torch.bool, device=tol.device)
        if time_axis and valid_lens is not None:
            valid = ~_padding_of(valid_lens, T, tol.device, padding_side)
        if _non_finite(reference[valid][None] if time_axis else reference,
                       nan_only=True) is not None:
            return _not_finite_result(name, "at valid positions", float(tol.min()), "The outputs")
        how = held.describe(inputs.dtype, seed)
        probe = _jacobian.Probe(lambda x: call(slice(0, B), x), inputs,
                                torch.Generator(device=inputs.device).manual_seed(seed + 1))
        failed = _grad_modes(name, probe, reference, tol, scale, valid, time_axis, how)
        if failed is not None:
            return failed
        exact_ran: Any = exact and (probe.usable or probe.why_not)
        tested = _sampled(B, 8, torch.Generator().manual_seed(seed))
        float64, note = False, ""
        if exact and probe.usable:
            bad, decider, note, float64 = _exact_verdict(
                lambda pr: _batch_gradients(pr, tested, valid, time_axis), probe,
                lambda: _float64_probe(model, module, held, lambda x, run: call(
                    slice(0, B), x, run), inputs, seed, run_options))
            if bad is not None:
                b = bad
                rows = torch.arange(B, device=inputs.device)[:, None]
                ask = valid & (rows == b) if time_axis else (rows[:, 0] == b)
                others = (rows != b).expand(B, T)
                p, g_b = _first_reader(decider, b, valid if time_axis else ask, others,
                                       time_axis)
                read = (g_b != 0).any(dim=1).nonzero().flatten().tolist()
                largest = float(g_b.max())
                at = f" at position {p}" if p is not None else ""
                message = (f"The outputs of sequence {b}{at} have a non-zero gradient with "
                           f"respect to the inputs of sequence"
                           f"{'s' if len(read) > 1 else ''} {_spans(read)} of the batch "
                           f"of {B} (largest |gradient| {_gradient_words(largest)}; "
                           f"exactly 0 is required): they read other sequences, however "
                           f"little ({_how(decider, probe, how)}).{note}")
                return CheckResult(name, False, message, largest, 0.0, p,
                                   {"deviations": torch.zeros(B, dtype=torch.float64),
                                    "sequence": b, "reads": read, "exact": True,
                                    "undecided": bool(note)})
        del probe
        dev = torch.zeros_like(tol)
        samples = bool(run.samples)  # type: ignore[attr-defined]
        for b in range(0 if samples and exact_ran is True else B):
            dev[b] = _deviations(call(slice(b, b + 1)), reference[b:b + 1], time_axis, scale)[0]
        # the batch shuffled: a model that sorts its batch must put it back
        order = _derangement(B, torch.Generator().manual_seed(seed))
        shuffle_dev = torch.zeros_like(tol)
        if not (samples and exact_ran is True):
            shuffled = _deviations(call(order.to(inputs.device)),
                                   reference[order.to(tol.device)], time_axis, scale)
            shuffle_dev[order.to(tol.device)] = shuffled
        shuffle_dev = shuffle_dev.masked_fill(~valid, 0.0)
        dev = dev.masked_fill(~valid, 0.0)
        shuffle_only = bool((shuffle_dev > tol).any()) and not bool((dev > tol).any())
        dev = torch.maximum(dev, shuffle_dev).cpu()
    tol = tol.cpu()
    moved = dev > tol
    per_sequence = dev.flatten(1).amax(dim=1) if dev.dim() == 2 else dev
    details: Dict[str, Any] = {"deviations": per_sequence, "exact": exact_ran,
                               "tested": tested, "order": order, "float64": float64}
    _, largest, tol_there = _nearest(dev, tol)
    if not bool(moved.any()):
        valid = valid.cpu()
        words = ""
        if exact_ran is True:
            which = f"any of the {B} sequences" if len(tested) == B else \
                f"{len(tested)} of the {B} sequences"
            decided = " (decided in a float64 copy of the model)" if float64 else ""
            words = (f"Exact: the gradient of the outputs of {which} with respect to every "
                     f"other sequence is exactly 0{decided}.{note} ")
        elif isinstance(exact_ran, str):
            words = f"The gradient test could not run ({exact_ran}). "
        if samples and exact_ran is True:
            message = (f"{words}The model draws random numbers, whose values depend on the "
                       f"batch's shape and order, so the runs alone and shuffled were "
                       f"skipped ({how}).")
        else:
            message = (f"{words}Each of the {B} sequences run alone, and in the shuffled "
                       f"batch, gave the outputs it has in the batch; "
                       f"{_largest(dev[valid], tol[valid], how)}.")
        return CheckResult(name, True, message, largest, tol_there, None, details)
    b = int(moved.flatten(1).any(dim=1).nonzero()[0]) if moved.dim() == 2 else \
        int(moved.nonzero()[0])
    p = int(moved[b].nonzero()[0]) if moved.dim() == 2 else None
    where = f" (first at position {p})" if p is not None else ""
    count = int((moved.flatten(1).any(dim=1) if moved.dim() == 2 else moved).sum())
    if shuffle_only:
        message = (f"Each sequence run alone gave its outputs, but in the batch shuffled "
                   f"(order {order.tolist()}) sequence {b}'s outputs moved by "
                   f"{_fmt(float(per_sequence[b]))}{where}: the model returns its outputs in "
                   f"another order than its inputs (a batch sorted, by length say, and not "
                   f"put back). {count} of {B} sequences moved; {_largest(dev, tol, how)}.")
        return CheckResult(name, False, message, largest, tol_there, p,
                           {**details, "sequence": b})
    message = (f"Sequence {b} run alone gave other outputs than in the batch of {B}: they "
               f"moved by {_fmt(float(per_sequence[b]))}{where}, so they read other sequences "
               f"of the batch. {count} of {B} sequences moved; {_largest(dev, tol, how)}.")
    return CheckResult(name, False, message, largest, tol_there, p, {**details, "sequence": b})


def _is_cyclic_shift(perm: Tensor) -> bool:
    """``perm`` is ``(i + k) mod T`` for some k: a circular convolution commutes with it."""
    T = perm.numel()
    return bool(((perm - perm[0]) % T == torch.arange(T)).all())


def _derangement(T: int, generator: torch.Generator) -> Tensor:
    """A random permutation of ``range(T)`` that moves every position (T >= 2) and, for
    T >= 4, is not a cyclic shift (every derangement of 2 or 3 positions is one)."""
    identity = torch.arange(T)
    while True:  # about e = 2.7 draws on average
        perm = torch.randperm(T, generator=generator)
        if not bool((perm == identity).any()) and not (T >= 4 and _is_cyclic_shift(perm)):
            return perm


def check_permutation_equivariance(model: Model, inputs: Tensor, *, mode: str = "eval",
                                   tolerance: Optional[float] = None, seed: int = 0,
                                   module: Optional[nn.Module] = None,
                                   num_permutations: int = 2, input_name: Optional[str] = None,
                                   kwargs: Optional[Mapping[str, Any]] = None,
                                   output: Output = None) -> CheckResult:
    """Check that permuting the input positions permutes the outputs in the same way.

    With ``num_permutations`` random derangements ``perm`` of the T positions (permutations
    that move every position, drawn from a generator seeded with ``seed``), the check compares
    ``model(inputs[:, perm])`` with ``model(inputs)[:, perm]``. Self-attention without
    positions and without a mask is permutation-equivariant (book chapter 5), so an encoder
    without positional information must pass. A model with positions, or a causal one, must
    *fail*: that is how it can tell order. A position-free model that fails mixes positions
    where it should not (for example heads split with ``view`` but no ``transpose``, which
    mixes positions into heads).

    Args:
        model: ``model(inputs)`` maps to ``(B, T, ...)`` outputs; an ``nn.Module`` or any
            callable.
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids, ``T >= 2``; never modified.
        mode, tolerance, seed, module: keyword-only; as in :func:`check_causal`. In
            ``mode="train"`` a dropout mask is drawn for positions, not for inputs, so it does
            not move with the permutation: dropout makes this check fail in training mode.
        num_permutations: keyword-only; how many derangements to try (default 2, at least 1).
            A permutation that leaves a position in place would not test it; for T >= 4 none
            is a cyclic shift (a circular convolution commutes with those), and for T = 3,
            where every derangement is one, a swap of positions 0 and 1 is added. Outputs of
            shape ``(B, T, T, ...)`` (pairwise, for inputs whose feature size is not T) are
            permuted on both position axes.
        input_name, kwargs, output: keyword-only; as in :func:`check_causal`.

    Returns:
        :class:`CheckResult`; ``first_position`` is the first position of the permuted output
        that differs, ``details["permutation"]`` the first permutation,
        ``details["permutations"]`` all of them and ``details["deviations"]`` the ``(T,)``
        largest difference at each position.

    Raises:
        ValueError: as in :func:`check_causal`; ``num_permutations`` not a positive int.

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
    _check_call(input_name, None, kwargs, output)
    if isinstance(num_permutations, bool) or not isinstance(num_permutations, int) \
            or num_permutations < 1:
        raise ValueError(f"num_permutations must be an int >= 1, got {num_permutations!r}")
    B, T = inputs.shape[:2]
    name = "check_permutation_equivariance"
    generator = torch.Generator().manual_seed(seed)
    perms = [_derangement(T, generator) for _ in range(num_permutations)]
    if T == 3:  # every derangement of 3 is a cyclic shift: add a swap, which is not
        perms.append(torch.tensor([1, 0, 2]))
    run = _runner(model, seed, B, input_name=input_name, kwargs=kwargs, output=output)
    with _held_still(_find_module(model, module), mode, inputs.device) as held, torch.no_grad():
        reference, tol, scale, failed = _reference_run(run, (inputs,), B, T, name, tolerance)
        if failed is not None:
            return failed
        devs, tols = [], []
        # pairwise outputs (B, T, T, ...) are permuted on every position axis
        pairwise = (reference.dim() >= 3 and reference.shape[2] == T
                    and (inputs.dim() == 2 or inputs.shape[2] != T))
        for perm in perms:
            index = perm.to(inputs.device)
            expected = reference[:, index][:, :, index] if pairwise else reference[:, index]
            devs.append(_deviations(run(inputs[:, index]), expected, scale=scale))  # (B, T)
            tols.append(tol[:, index])
        how = held.describe(inputs.dtype, seed)
    dev, tol = torch.stack(devs).cpu(), torch.stack(tols).cpu()  # (P, B, T)
    per_position = dev.amax(dim=(0, 1))  # (T,)
    moved = (dev > tol).any(dim=1)  # (P, T)
    details = {"permutation": perms[0], "permutations": perms, "deviations": per_position}
    _, largest, tol_there = _nearest(dev, tol)
    which = "permutation that moves every position" if len(perms) == 1 else \
        f"{len(perms)} permutations that move every position"
    if not bool(moved.any()):
        message = (f"Permuting the {T} positions ({which}) permuted the outputs the same way; "
                   f"{_largest(dev, tol, how)}.")
        return CheckResult(name, True, message, largest, tol_there, None, details)
    k = int(moved.any(dim=1).nonzero()[0])
    p = int(moved[k].nonzero()[0])
    count = int(moved.any(dim=0).sum())
    message = (f"Permuting the {T} positions did not permute the outputs: position {p} of the "
               f"permuted run (input position {int(perms[k][p])}) differs by "
               f"{_against(float(dev[k, :, p].max()), float(tol[k, :, p].min()))}; "
               f"{count} of {T} positions differ, {_largest(dev, tol, how)}. Expected of a "
               f"model with positions or a causal mask; a bug in a model without them.")
    return CheckResult(name, False, message, largest, tol_there, p, details)


def check_kv_cache(model: Model, inputs: Tensor, new_cache: Callable[[], Any], *,
                   prompt_len: int = 1, mode: str = "eval", tolerance: Optional[float] = None,
                   seed: int = 0, module: Optional[nn.Module] = None,
                   output: Output = None, chunks: bool = True) -> CheckResult:
    """Check that decoding with a KV cache gives the outputs of recomputing every prefix.

    The reference is one call without a cache, ``model(inputs, None)``. The cached run starts
    a fresh cache, ``cache = new_cache()``, feeds the first ``prompt_len`` positions at once,
    ``model(inputs[:, :prompt_len], cache)``, then one position at a time,
    ``model(inputs[:, t:t+1], cache)``, and concatenates the outputs along the positions. A
    correct cache gives the same ``(B, T, ...)`` outputs; a cache that forgets the position
    offset, a causal mask aligned to the wrong corner for the single new query, or keys
    appended twice, does not, and the message names the first step that differs. With
    ``chunks`` (default) a second cached run feeds the same prompt, then chunks of 2 and 3
    positions in turn (the last one shorter if need be), each appended to a non-empty cache at
    another offset, as chunked prefill, speculative decoding and a chat's second turn do: a
    cache that sets ``is_causal = T_new > 1`` (a mask from the wrong corner for a chunk), or
    that counts calls rather than positions, fails it.

    In ``mode="train"``, dropout is on: the cached run calls the model on chunks of other
    shapes than the one uncached call, so dropout draws other masks and a model with dropout
    probability above 0 *fails* (the reseeding cannot make masks of different shapes agree).
    Use ``mode="train"`` only to test what else training changes, with dropout set to 0 (e.g.
    build the model with ``dropout=0.0``); the default, eval mode, is the mode a cache is used
    in.

    Args:
        model: ``model(chunk, cache)`` maps ``(B, T_chunk, ...)`` inputs to ``(B, T_chunk,
            ...)`` outputs, appending to ``cache``; ``model(inputs, None)`` runs without a
            cache (wrap your model in a function if its call looks different).
        inputs: ``(B, T, d)`` floats or ``(B, T)`` token ids, ``T > prompt_len``; never modified.
        new_cache: a function of no arguments returning an empty cache (a ``KVCache``, a list
            of them, ...).
        prompt_len: keyword-only; the positions fed at once before decoding, ``1 <= prompt_len
            < T``.
        mode, tolerance, seed, module, output: keyword-only; as in :func:`check_causal` (see
            above for ``mode="train"``).
        chunks: keyword-only; also run the cache with chunks of 2 and 3 positions (default
            True; pass False for a model that decodes one position at a time only).

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
    _check_call(None, None, None, output)
    if not callable(new_cache):
        raise ValueError("new_cache must be a function returning an empty cache")
    B, T = inputs.shape[:2]
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 1 <= prompt_len < T:
        raise ValueError(f"prompt_len must be an integer in [1, T) = [1, {T}), got {prompt_len!r}")
    name = "check_kv_cache"
    run = _runner(model, seed, B, output=output, reset=False)  # a cache may live in buffers
    with _held_still(_find_module(model, module), mode, inputs.device) as held, torch.no_grad():
        reference, tol, scale, failed = _reference_run(run, (inputs, None), B, T, name, tolerance,
                                                "The outputs without a cache")
        if failed is not None:
            return failed
        def cached_run(spans: List[Tuple[int, int]]) -> Tensor:
            held.reset_buffers()
            cache = new_cache()
            pieces = []
            for start, stop in spans:
                piece = run(inputs[:, start:stop], cache)
                _check_time_axis(piece, B, stop - start,
                                 f"check_kv_cache (positions {start}-{stop - 1})")
                pieces.append(piece)
            return torch.cat(pieces, dim=1)

        steps = [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, T)]
        cached = cached_run(steps)
        spans = [(0, prompt_len)]
        while spans[-1][1] < T:  # chunks of 2 and 3 in turn, at several offsets
            size = 2 if len(spans) % 2 == 1 else 3
            spans.append((spans[-1][1], min(spans[-1][1] + size, T)))
        chunked = cached_run(spans) if chunks and len(spans) < len(steps) else None
        how = held.describe(inputs.dtype, seed)
    dev_bt, tol = _deviations(cached, reference, scale=scale).cpu(), tol.cpu()  # (B, T)
    if chunked is not None and not bool((dev_bt > tol).any()):
        chunk_bt = _deviations(chunked, reference, scale=scale).cpu()
        if bool((chunk_bt > tol).any()):
            chunk_dev = chunk_bt.amax(dim=0)
            p = int((chunk_bt > tol).any(dim=0).nonzero()[0])
            k = next(i for i, (a, b) in enumerate(spans) if a <= p < b)
            a, b = spans[k]
            _, largest, tol_there = _nearest(chunk_bt, tol)
            message = (f"One position at a time the cache gave the outputs of recomputation, "
                       f"but fed in chunks it did not: the chunk of positions {a}-{b - 1}, "
                       f"appended to a cache of {a}, differs from position {p} on by "
                       f"{_against(float(chunk_dev[p]), float(tol[:, p].min()))}. A chunk of "
                       f"several new queries needs the causal mask aligned to the end of the "
                       f"keys (not is_causal = T_new > 1 from the top-left corner) and "
                       f"positions counted by tokens, not by calls ({how}).")
            return CheckResult(name, False, message, largest, tol_there, p,
                               {"deviations": chunk_dev, "chunks": spans})
        dev_bt = torch.maximum(dev_bt, chunk_bt)
    dev = dev_bt.amax(dim=0)  # (T,)
    _, largest, tol_there = _nearest(dev_bt, tol)
    differs = (dev_bt > tol).any(dim=0).nonzero().flatten().tolist()
    if not differs:
        again = ("" if chunked is None else
                 f", and again in {len(spans) - 1} chunks of 2 and 3 positions,")
        message = (f"A prompt of {prompt_len} and {T - prompt_len} cached steps of one position"
                   f"{again} gave the outputs of the uncached run; "
                   f"{_largest(dev_bt, tol, how)}.")
        return CheckResult(name, True, message, largest, tol_there, None, {"deviations": dev})
    p = differs[0]
    at = "in the prompt" if p < prompt_len else f"at cached step {p - prompt_len + 1}"
    message = (f"The cached run differs from recomputation from position {p} on ({at}) by "
               f"{_against(float(dev[p]), float(tol[:, p].min()))}; "
               f"{len(differs)} of {T} positions differ, the largest by {_fmt(float(dev.max()))} "
               f"at position {int(dev.argmax())} ({how}).")
    return CheckResult(name, False, message, largest, tol_there, p, {"deviations": dev})


def check_finite(model: Model, inputs: Tensor,
                 valid_lens: Optional[Union[Tensor, Sequence[int]]] = None, *,
                 backward: bool = True, mode: str = "eval", seed: int = 0,
                 module: Optional[nn.Module] = None, mask_name: Optional[str] = None,
                 input_name: Optional[str] = None, kwargs: Optional[Mapping[str, Any]] = None,
                 output: Output = None) -> CheckResult:
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
        backward: keyword-only; also check the gradients (default True), with respect to the
            inputs and to the parameters of every module held (see the module's notes).
        mode, seed, module: keyword-only; as in :func:`check_causal`.
        mask_name: keyword-only; as in :func:`check_padding`.
        input_name, kwargs, output: keyword-only; as in :func:`check_causal`.

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
    _check_call(input_name, mask_name, kwargs, output)
    if not isinstance(backward, bool):
        raise ValueError(f"backward must be a bool, got {backward!r}")
    B, T = inputs.shape[:2]
    valid_lens = _optional_valid_lens(valid_lens, mask_name, B, T)
    name = "check_finite"
    run = _runner(model, seed, B, input_name=input_name, kwargs=kwargs, output=output)
    found = _find_module(model, module)
    with _held_still(found, mode, inputs.device) as held, torch.enable_grad():
        x = inputs.detach().clone()
        if backward and x.is_floating_point():
            x.requires_grad_(True)
        if valid_lens is None:
            out = run(x)  # the runner passes a copy: a model may write into its input
        else:
            args, keywords = _lengths_argument(valid_lens, T, inputs.device, mask_name)
            out = run(x, *args, **keywords)
        how = held.describe(inputs.dtype, seed)
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
        params: Dict[int, str] = {}
        if backward:
            for root in held.roots:
                for n, p in root.named_parameters():
                    if p.requires_grad and id(p) not in params:
                        params[id(p)] = f"{type(root).__name__}.{n}" if root is not found else n
                        targets.append(p)
        if not backward or not targets or not out.requires_grad:
            what = "outputs" if backward else "outputs (gradients not checked)"
            return CheckResult(name, True, f"The {what} are finite ({how}).", 0.0, 0.0)
        grads = torch.autograd.grad(out, targets, grad_outputs=torch.ones_like(out),
                                    allow_unused=True)
    if x.requires_grad and grads[0] is not None and not bool(torch.isfinite(grads[0]).all()):
        gx = grads[0]
        b = int((~torch.isfinite(gx)).flatten(1).any(dim=1).nonzero()[0])
        bad = (~torch.isfinite(gx[b])).flatten(1).any(dim=1) if gx.dim() >= 3 \
            else ~torch.isfinite(gx[b])
        positions = bad.nonzero().flatten().tolist()
        message = (f"The outputs are finite, but the gradient with respect to the inputs is not, "
                   f"at sequence {b}, {_positions(positions)}: NaN hidden in the forward "
                   f"pass comes back in the backward pass ({how}).")
        return CheckResult(name, False, message, float("nan"), 0.0, positions[0])
    for t, g in zip(targets, grads):
        if g is not None and not bool(torch.isfinite(g).all()) and t is not x:
            message = (f"The outputs are finite, but the gradient of parameter "
                       f"{params.get(id(t), '?')} is not ({how}).")
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

    The bounds do not grow with K: a row sum may differ from its target by the dtype's
    tolerance (1e-10 in float64, 1e-5 in float32, 2e-3 in float16, 1.6e-2 in bfloat16; the
    rounding of weights that sum to 1 adds up to at most about one unit in the last place of
    1, however many keys there are), and a masked key's weight must be exactly 0 (a softmax
    over a ``-inf`` or ``-1e9`` score underflows to exactly 0), so that a small weight spread
    over many masked keys cannot hide below a tolerance.

    Args:
        weights: ``(..., Q, K)`` floats, e.g. ``MultiHeadAttention.attention_weights``.
        mask: optional bool tensor broadcastable to ``weights``, True = may attend.
        tolerance: keyword-only; the allowed error of a row sum and of a negative weight, and
            then also the largest total weight allowed on a row's masked keys (default: as
            above; a total, so that many masked keys cannot each hold a little).

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
    tol = float(tolerance) if tolerance is not None else _RTOL.get(weights.dtype, 1e-5)
    masked_tol = float(tolerance) if tolerance is not None else 0.0
    keep = torch.ones_like(w, dtype=torch.bool) if mask is None else mask.to(w.device).expand(w.shape)
    expected = keep.any(dim=-1).double()  # 1 for a row with a key, 0 for an empty row
    sums = w.sum(dim=-1)
    rows = w.shape[:-1]
    problems: List[Tuple[Tensor, str]] = [
        ((~torch.isfinite(w)).any(dim=-1), "is not finite (NaN or inf)"),
        ((w < -tol).any(dim=-1), "has a negative weight"),
        ((w.abs() * (~keep).double()).sum(dim=-1) > masked_tol, "gives weight to a masked key"),
    ]
    error = (sums - expected).abs()
    error = torch.where(torch.isnan(error), torch.full_like(error, math.inf), error)
    problems.append((error > tol, "does not sum to its expected total"))
    largest = float(error.max())
    for bad, what in problems:
        if bool(bad.any()):
            flat = int(bad.flatten().nonzero()[0])
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), rows))
            total = f"{float(sums[index]):.3g}"
            target = "0 (it has no key it may attend to)" if expected[index] == 0 else "1"
            message = f"Row {index} (query {index[-1]}) {what}: it sums to {total}, not {target}."
            if what == "gives weight to a masked key":
                on_masked = float((w[index] * (~keep[index]).double()).abs().sum())
                message += f" Its masked keys hold {on_masked:.2g} in all."
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
               + f"; {_largest_text(largest, tol, None, 'error of a row sum')}.")
    return CheckResult(name, True, message, largest, tol, None)
