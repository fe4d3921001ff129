"""One training loop, and the convention every ``train_*`` function of the library follows.

The library trains five kinds of model: :func:`d2lattn.gpt.train_lm` (a language model),
:func:`d2lattn.circuits.train_induction` (induction heads), :func:`d2lattn.seq2seq.train_seq2seq`
(an encoder--decoder), :func:`d2lattn.sets.train_set_model` (sets and point clouds) and
:func:`d2lattn.graphs.train_node_classifier` (nodes of a graph). They differ in their data, loss,
optimizer and learning-rate schedule, and agree on everything else:

- **Arguments.** ``model`` and the training data are positional; everything else is
  keyword-only, with the same name for the same thing: ``steps`` (optimizer steps), ``lr``
  (the peak learning rate), ``batch_size`` (examples per step; not for full-batch training),
  ``seed`` (seeds the generator that draws the batches, so the same seed and the same initial
  weights give the same run; the initial weights and dropout are the caller's, from
  ``torch.manual_seed``; no ``seed`` where nothing is drawn), ``clip`` (the largest global
  gradient norm, ``None``: no clipping), ``stop_after`` (run only the first ``stop_after``
  steps of the ``steps``-step schedule, to retrace the start of a longer run) and
  ``callback``.
- **The step.** Training mode, the loss of a fresh batch, ``zero_grad``, ``backward``,
  clipping, the optimizer step, then the learning-rate scheduler's step, if any.
- **The callback.** ``callback(step, model, loss)`` after each step, with ``step`` the number
  of steps done (``1 .. steps``) and ``loss`` that step's training loss (a float). To measure
  the untrained model, call the callback yourself with ``step = 0`` before training. The
  callback may switch the model to eval mode (to evaluate it): the next step switches it back.
- **The result.** The training loss of every step, a list of Python floats, each measured on
  that step's batch before its update. A loss that is not finite ends training: the list
  ends with it and the weights are left as they were before that step; a finite loss with
  gradients that are not finite raises ``FloatingPointError`` before the step. The model is
  left in eval mode, also when training ends with an error.

:func:`fit` is that loop; each ``train_*`` function builds its optimizer and its batches and
hands them to it. A script with a model of its own can use :func:`fit` the same way.

Source: the minibatch training loop of Zhang et al., *Dive into Deep Learning* (d2l.ai),
chapter 3, with PyTorch's optimizer, gradient clipping and scheduler interfaces.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional

import torch
from torch import Tensor, nn

from ._checks import check_finite_gradients, check_positive_ints, check_positive_or_none

__all__ = ["fit"]

#: The type of a training callback: ``callback(step, model, loss)``.
Callback = Callable[[int, nn.Module, float], None]


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, batch_loss: Callable[[], Tensor], *,
        steps: int, stop_after: Optional[int] = None, clip: Optional[float] = None,
        lr_at: Optional[Callable[[int], float]] = None,
        scheduler: Optional[torch.optim.lr_scheduler.LRScheduler] = None,
        callback: Optional[Callback] = None) -> List[float]:
    """Take ``steps`` optimizer steps on the losses ``batch_loss()`` returns; the losses.

    Each step: ``model.train()``; the learning rate ``lr_at(i)`` of step ``i`` (0-based) set in
    every parameter group, if ``lr_at`` is given; ``loss = batch_loss()`` (it draws the step's
    batch and returns its scalar loss); ``optimizer.zero_grad(set_to_none=True)``;
    ``loss.backward()``; clipping of the global gradient norm to ``clip``; ``optimizer.step()``;
    ``scheduler.step()``, if given; ``callback(i + 1, model, loss)``. See the module docstring
    for the convention this loop defines.

    Args:
        model: the module to train, in place (its mode is set here).
        optimizer: an optimizer over the model's parameters.
        batch_loss: called once per step, with no arguments: a scalar float tensor.
        steps: the length of the schedule, a positive ``int`` (keyword-only, as all below).
        stop_after: ``None``, or a positive ``int``: run only ``min(steps, stop_after)`` steps.
        clip: ``None`` (no clipping) or the largest global gradient norm, ``> 0``.
        lr_at: the learning rate of step ``i`` (0-based), for schedules written as a function.
        scheduler: a PyTorch learning-rate scheduler, stepped after each optimizer step.
        callback: ``callback(step, model, loss)`` after each step (``step`` from 1).

    Returns:
        the loss of every step taken, Python floats; it ends early with a non-finite loss
        (no update is made with it). The model is left in eval mode, also when an error
        ends training.

    Raises:
        ValueError: ``steps`` or ``stop_after`` not a positive ``int``, ``clip`` not ``None``
            or positive.
        RuntimeError: ``batch_loss`` raised ``StopIteration`` (its batches ran out before
            the last step); the steps taken so far stand.
        FloatingPointError: a finite loss whose gradients are not finite (NaN or inf); raised
            before the optimizer step, so the weights stay as they were.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> w = nn.Linear(1, 1)
        >>> opt = torch.optim.SGD(w.parameters(), lr=0.1)
        >>> x = torch.tensor([[1.0], [2.0]])
        >>> seen = []
        >>> losses = fit(w, opt, lambda: ((w(x) - 2 * x) ** 2).mean(), steps=50,
        ...              callback=lambda step, model, loss: seen.append(step))
        >>> len(losses), seen[:3], seen[-1], losses[-1] < 0.01 * losses[0]
        (50, [1, 2, 3], 50, True)

    Source: module docstring (the library's training convention).
    """
    check_positive_ints(steps=steps)
    if stop_after is not None:
        check_positive_ints(stop_after=stop_after)
    check_positive_or_none("clip", clip)
    losses: List[float] = []
    try:
        for i in range(steps if stop_after is None else min(steps, stop_after)):
            model.train()
            if lr_at is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(i)
            try:
                loss = batch_loss()
            except StopIteration as err:  # inside map() or a generator it would end them
                raise RuntimeError(f"batch_loss ran out of batches at step {i + 1} of "
                                   f"{steps}: its data source is exhausted (give it at "
                                   f"least as many batches as steps)") from err
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            check_finite_gradients(model, i + 1)
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            if callback is not None:
                callback(i + 1, model, losses[-1])
    finally:  # also after an error: the model is not left training
        model.eval()
    return losses
