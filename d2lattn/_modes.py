"""Evaluation helpers run a model in eval mode and give it back in the mode they found.

One home for the rule every evaluation helper follows (``GPT.generate``, ``held_out_losses``,
``fill_in_losses``, ``serving.gpt_logits``): switch dropout off while measuring, then put back
each submodule's own ``training`` flag, so a model that was training keeps training, and a
model with a frozen (eval-mode) part keeps it frozen.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

__all__: list = []  # private: the package does not re-export it


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` and all its submodules in eval mode; restore every flag on exit.

    The flags are restored even when the body raises.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train()
        >>> net[1].eval()  # a frozen part
        Dropout(p=0.5, inplace=False)
        >>> with evaluating(net):
        ...     print(net.training, net[1].training)
        False False
        >>> net.training, net[0].training, net[1].training
        (True, True, False)
    """
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, flag in flags:
            m.training = flag
