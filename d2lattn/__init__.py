"""d2lattn: attention mechanisms from scratch, checked against PyTorch.

One module per idea, following the three steps of attention (score, normalize, pool):

- :mod:`d2lattn.masking` — ``masked_softmax``, ``valid_lens_to_mask``, ``causal_mask``:
  normalization that ignores padding and the future;
- :mod:`d2lattn.scoring` — scoring functions (``dot_product_scores``, ``cosine_scores``,
  ``gaussian_scores``) and the layers built on them: ``DotProductAttention``,
  ``AdditiveAttention``, ``BilinearAttention``, and ``Attention`` for any score function;
- :mod:`d2lattn.multihead` — ``MultiHeadAttention``;
- :mod:`d2lattn.positional` — ``sinusoidal_positional_encoding``, ``PositionalEncoding``,
  ``sinusoidal_shift_matrix``, ``LearnedPositionalEmbedding``, ``rotary_embedding``,
  ``alibi_slopes``, ``alibi_bias``;
- :mod:`d2lattn.kernel_regression` — ``nadaraya_watson``, ``NadarayaWatsonRegression``;
- :mod:`d2lattn.plotting` — ``show_heatmaps``, ``show_fits``;
- :mod:`d2lattn.data` — the CLDR date tasks of chapters 7 and 8;
- :mod:`d2lattn.seq2seq` — encoder–decoder with and without attention, greedy decoding;
- :mod:`d2lattn.transformer` — Transformer encoder and decoder blocks, KV cache;
- :mod:`d2lattn.flash` — online softmax and block-wise (FlashAttention-style) attention;
- :mod:`d2lattn.vision` — patch embedding, a small Vision Transformer, attention rollout;
- :mod:`d2lattn.circuits` — an attention-only Transformer and induction-head measurements;
- :mod:`d2lattn.interactive` — the data behind the website's movable figures;
- :mod:`d2lattn.text` — two real corpora (tiny Shakespeare, Tang poems), fixed splits, characters as tokens;
- :mod:`d2lattn.gpt` — a decoder-only Transformer language model, sampling filters, training;
- :mod:`d2lattn.ngram` — character n-gram models with interpolated Kneser–Ney smoothing.

Importing the package has no side effects (matplotlib is loaded only when a plot is drawn).
"""

from .kernel_regression import KERNELS, NadarayaWatsonRegression, nadaraya_watson
from .masking import causal_mask, masked_softmax, valid_lens_to_mask
from .multihead import MultiHeadAttention
from .plotting import show_fits, show_heatmaps
from .positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    alibi_bias,
    alibi_slopes,
    rotary_embedding,
    sinusoidal_positional_encoding,
    sinusoidal_shift_matrix,
)
from .scoring import (
    AdditiveAttention,
    Attention,
    BilinearAttention,
    DotProductAttention,
    ScoreFn,
    check_positive_ints,
    check_qkv,
    cosine_scores,
    dot_product_scores,
    gaussian_scores,
)
from . import circuits, data, flash, gpt, interactive, ngram, seq2seq, text, transformer, vision
from .circuits import *  # noqa: F401,F403  (names listed in circuits.__all__)
from .data import *  # noqa: F401,F403  (names listed in data.__all__)
from .flash import *  # noqa: F401,F403  (names listed in flash.__all__)
from .gpt import *  # noqa: F401,F403  (names listed in gpt.__all__)
from .interactive import *  # noqa: F401,F403  (names listed in interactive.__all__)
from .ngram import *  # noqa: F401,F403  (names listed in ngram.__all__)
from .seq2seq import *  # noqa: F401,F403  (names listed in seq2seq.__all__)
from .text import *  # noqa: F401,F403  (names listed in text.__all__)
from .transformer import *  # noqa: F401,F403  (names listed in transformer.__all__)
from .vision import *  # noqa: F401,F403  (names listed in vision.__all__)

__version__ = "0.1.0"

__all__ = [
    "AdditiveAttention",
    "Attention",
    "BilinearAttention",
    "DotProductAttention",
    "KERNELS",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "NadarayaWatsonRegression",
    "PositionalEncoding",
    "ScoreFn",
    "alibi_bias",
    "alibi_slopes",
    "causal_mask",
    "check_positive_ints",
    "check_qkv",
    "cosine_scores",
    "dot_product_scores",
    "gaussian_scores",
    "masked_softmax",
    "nadaraya_watson",
    "rotary_embedding",
    "show_fits",
    "show_heatmaps",
    "sinusoidal_positional_encoding",
    "sinusoidal_shift_matrix",
    "valid_lens_to_mask",
]
for _module in (circuits, data, flash, gpt, interactive, ngram, seq2seq, text, transformer,
                vision):
    __all__ += _module.__all__
del _module
__all__.sort()
