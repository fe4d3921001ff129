"""d2lattn: attention mechanisms from scratch, checked against PyTorch.

One module per idea, following the three steps of attention (score, normalize, pool):

- :mod:`d2lattn.masking` — ``masked_softmax``: normalization that ignores padding;
- :mod:`d2lattn.scoring` — scoring functions: ``DotProductAttention``, ``AdditiveAttention``;
- :mod:`d2lattn.multihead` — ``MultiHeadAttention``;
- :mod:`d2lattn.positional` — ``sinusoidal_positional_encoding``, ``PositionalEncoding``;
- :mod:`d2lattn.kernel_regression` — ``nadaraya_watson``, ``NadarayaWatsonRegression``;
- :mod:`d2lattn.plotting` — ``show_heatmaps``.

Importing the package has no side effects (matplotlib is loaded only when a plot is drawn).
"""

from .kernel_regression import KERNELS, NadarayaWatsonRegression, nadaraya_watson
from .masking import masked_softmax, valid_lens_to_mask
from .multihead import MultiHeadAttention
from .plotting import show_heatmaps
from .positional import PositionalEncoding, sinusoidal_positional_encoding
from .scoring import AdditiveAttention, DotProductAttention, check_qkv

__version__ = "0.1.0"

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "KERNELS",
    "MultiHeadAttention",
    "NadarayaWatsonRegression",
    "PositionalEncoding",
    "check_qkv",
    "masked_softmax",
    "nadaraya_watson",
    "show_heatmaps",
    "sinusoidal_positional_encoding",
    "valid_lens_to_mask",
]
