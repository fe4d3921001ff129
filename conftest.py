"""Shared pytest set-up: names available to the docstring examples in d2lattn."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    import d2lattn

    doctest_namespace["torch"] = torch
    doctest_namespace.update({name: getattr(d2lattn, name) for name in d2lattn.__all__})
    torch.set_printoptions(precision=4)
