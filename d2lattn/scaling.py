"""Loss against compute: the frontier of a sweep of training runs and its power law.

A scaling sweep trains models of several sizes for several budgets and records each run's
held-out loss and its compute. This module holds the few steps that turn such a table into a
prediction (chapter 12, "When does attention win?"):

- :func:`training_flops` — the compute of a run, ``6 N D`` (Kaplan et al. 2020, section 2.1);
- :func:`compute_frontier` — the runs no cheaper run beats: the best loss known at each compute;
- :func:`fit_frontier` — a saturating power law ``L(C) = E + A (C / C0)^-g`` fitted to them
  (scipy's ``curve_fit``), with :meth:`PowerLawFit.crossover`, the compute at which the fit
  reaches a given loss;
- :func:`chinchilla_optimal` — Hoffmann et al.'s (2022) rule of thumb, about 20 training
  tokens per parameter, as the model size and tokens that spend a budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from ._checks import check_finite_numbers, check_positive, check_positive_numbers

__all__ = ["PowerLawFit", "chinchilla_optimal", "compute_frontier", "fit_frontier",
           "training_flops"]


def _numbers(values: object) -> object:
    """A 1-D torch tensor or NumPy array as a list of Python numbers (for the checks below,
    which take sequences of numbers); anything else unchanged."""
    if hasattr(values, "tolist") and hasattr(values, "shape") and len(values.shape) == 1:
        return values.tolist()  # type: ignore[union-attr]
    return values


def training_flops(parameters: float, tokens: float) -> float:
    """The compute of training, ``6 N D`` floating-point operations.

    A forward pass costs about 2 operations per parameter per token (a multiply and an add),
    the backward pass twice that; the attention scores' own cost is left out, which is fair
    while the context is short next to ``12 num_hiddens`` (Kaplan et al. 2020, section 2.1,
    eq. 2.2 and Table 1).

    Args:
        parameters: ``N``, the parameters outside the embeddings (a positive number).
        tokens: ``D``, the tokens the model was trained to predict (a positive number).

    Returns:
        ``6 N D`` as a float.

    Raises:
        ValueError: if either is not a finite positive number.

    >>> training_flops(1e6, 2e6)
    12000000000000.0
    """
    N, D = check_positive_numbers("parameters and tokens", [parameters, tokens])
    return 6.0 * N * D


def compute_frontier(flops: Sequence[float], losses: Sequence[float]) -> List[int]:
    """The runs on the compute frontier: those that no run of at most their compute beats.

    Sorted by compute, a run is on the frontier if its loss is lower than that of every
    cheaper run (ties in compute go to the lower loss), so the frontier's losses fall strictly.
    It is the best loss the sweep knows how to buy at each compute (Hoffmann et al. 2022,
    section 3.1, "approach 1").

    Args:
        flops: ``(R,)`` the compute of each run (finite, positive): a sequence of numbers, a
            1-D torch tensor or NumPy array.
        losses: ``(R,)`` the held-out loss of each run (finite), the same kinds.

    Returns:
        The indices of the frontier's runs, from the cheapest.

    Raises:
        ValueError: if the lengths differ, are zero, or a value is not finite (or a compute
            not positive).

    >>> compute_frontier([1, 2, 3, 4], [3.0, 3.5, 2.0, 2.5])
    [0, 2]
    """
    C = check_positive_numbers("flops", _numbers(flops))  # type: ignore[arg-type]
    L = check_finite_numbers("losses", _numbers(losses))  # type: ignore[arg-type]
    if len(C) != len(L) or not C:
        raise ValueError(f"flops and losses must be non-empty and of the same length, got "
                         f"{len(C)} and {len(L)}")
    frontier, best = [], math.inf
    for i in sorted(range(len(C)), key=lambda i: (C[i], L[i])):
        if L[i] < best:
            best = L[i]
            frontier.append(i)
    return frontier


@dataclass(frozen=True)
class PowerLawFit:
    """``L(C) = E + A (C / scale)^-g``: a loss that falls as a power of compute towards ``E``.

    ``E`` is the loss the fit levels off at (the text's entropy plus what the model family
    cannot learn), ``A`` the reducible loss at ``C = scale``, ``g`` the exponent (Kaplan et al.
    2020, eq. 1.4, with the constant ``E`` of Hoffmann et al. 2022, eq. 2).
    """

    E: float
    A: float
    g: float
    scale: float = 1e12

    def __call__(self, flops: float) -> float:
        """The fitted loss at ``flops`` (a positive number)."""
        (C,) = check_positive_numbers("flops", [flops])
        return self.E + self.A * (C / self.scale) ** -self.g

    def crossover(self, loss: float) -> float:
        """The compute at which the fit reaches ``loss``.

        Raises:
            ValueError: if ``loss`` is not above ``E`` (the fit never reaches it) or the fit
                does not fall (``A`` or ``g`` not positive).
        """
        if not (self.A > 0 and self.g > 0):
            raise ValueError(f"the fit does not fall with compute (A = {self.A}, g = {self.g})")
        if not loss > self.E:
            raise ValueError(f"loss must be above the fit's floor E = {self.E:.4f}, got {loss}")
        return self.scale * ((loss - self.E) / self.A) ** (-1.0 / self.g)


def fit_frontier(flops: Sequence[float], losses: Sequence[float], *,
                 scale: float = 1e12) -> PowerLawFit:
    """Fit ``L(C) = E + A (C / scale)^-g`` to points of a compute frontier.

    Least squares in the loss (scipy's ``curve_fit``, started from ``E = min(losses) - 0.1``,
    ``A = max(losses) - E``, ``g = 0.5``).

    Args:
        flops: ``(P,)`` compute, positive, at least 4 distinct values (3 parameters are
            fitted, and points at one compute say nothing about the slope); a sequence of
            numbers, a 1-D torch tensor or NumPy array.
        losses: ``(P,)`` held-out losses, the same kinds.
        scale: the compute unit inside the power (keeps the fit well conditioned), a positive
            finite number.

    Returns:
        A :class:`PowerLawFit`.

    Raises:
        ValueError: fewer than 4 points or 4 distinct computes, lengths that differ, values
            not finite/positive, a ``scale`` that is not a positive finite number.
        RuntimeError: scipy's fit does not converge, or stops where it started or at values
            that are not finite (then there is no fit to return).

    Source: Kaplan et al. 2020, eq. 1.4; Hoffmann et al. 2022, eq. 2 and section 3.1.
    """
    import numpy as np
    from scipy.optimize import curve_fit

    C = check_positive_numbers("flops", _numbers(flops))  # type: ignore[arg-type]
    L = check_finite_numbers("losses", _numbers(losses))  # type: ignore[arg-type]
    check_positive("scale", scale)
    if len(C) != len(L) or len(C) < 4:
        raise ValueError(f"flops and losses need the same length, at least 4, got {len(C)} "
                         f"and {len(L)}")
    if len(set(C)) < 4:
        raise ValueError(f"flops must hold at least 4 distinct computes to fit 3 parameters, "
                         f"got {len(set(C))}: {sorted(set(C))}")
    x = np.asarray(C) / scale
    E0 = min(L) - 0.1
    p0 = [E0, max(L) - E0, 0.5]

    def law(c, E, A, g):  # noqa: ANN001, ANN202 - scipy's signature
        return E + A * c ** -g

    with np.errstate(all="ignore"):
        (E, A, g), _ = curve_fit(law, x, np.asarray(L), p0=p0, maxfev=20000)
        residual = law(x, E, A, g) - np.asarray(L)
    if not (np.isfinite([E, A, g]).all() and np.isfinite(residual).all()):
        raise RuntimeError(f"the power-law fit did not converge (E = {E}, A = {A}, g = {g})")
    if [E, A, g] == p0 and np.abs(residual).max() > 1e-12 * max(abs(v) for v in L):
        raise RuntimeError("the power-law fit did not move from its starting guess: there is "
                           "no fit to return")
    return PowerLawFit(float(E), float(A), float(g), scale)


def chinchilla_optimal(flops: float, tokens_per_parameter: float = 20.0) -> Tuple[float, float]:
    """The model size and training tokens that spend ``flops`` at a fixed ratio of the two.

    With ``C = 6 N D`` and ``D = r N``: ``N = sqrt(C / (6 r))``, ``D = r N``. Hoffmann et al.
    (2022) found ``r`` of about 20 tokens per parameter compute-optimal for their models
    (their Table 3; the ratio is a rule of thumb read off those fits, not a law).

    Returns:
        ``(N, D)``: parameters and tokens, floats.

    Raises:
        ValueError: if an argument is not a finite positive number.

    >>> [round(x) for x in chinchilla_optimal(1.2e13)]
    [316228, 6324555]
    """
    C, r = check_positive_numbers("flops and tokens_per_parameter",
                                    [flops, tokens_per_parameter])
    N = math.sqrt(C / (6.0 * r))
    return N, r * N
