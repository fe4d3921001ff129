"""d2lattn: attention mechanisms from scratch, checked against PyTorch.

One module per idea, following the three steps of attention (score, normalize, pool):

- :mod:`d2lattn.masking` — ``masked_softmax``, ``valid_lens_to_mask``, ``causal_mask``:
  normalization that ignores padding and the future;
- :mod:`d2lattn.scoring` — scoring functions (``dot_product_scores``, ``cosine_scores``,
  ``gaussian_scores``) and the layers built on them: ``DotProductAttention``,
  ``AdditiveAttention``, ``BilinearAttention``, and ``Attention`` for any score function;
- :mod:`d2lattn.multihead` — ``MultiHeadAttention`` and ``GroupedQueryAttention`` (one core);
- :mod:`d2lattn.heads` — ``split_heads``, ``merge_heads`` (every multi-head layer's reshape);
- :mod:`d2lattn.kvcache` — ``KVCache`` and the bytes a cache takes (``kv_cache_bytes``,
  ``mla_cache_bytes``), below every attention module;
- :mod:`d2lattn.positional` — ``sinusoidal_positional_encoding``, ``PositionalEncoding``,
  ``sinusoidal_shift_matrix``, ``LearnedPositionalEmbedding``, ``rotary_embedding``,
  ``alibi_slopes``, ``alibi_bias``;
- :mod:`d2lattn.kernel_regression` — ``nadaraya_watson``, ``NadarayaWatsonRegression``;
- :mod:`d2lattn.linear` — linear attention in three forms (quadratic, recurrent, chunked),
  the delta rule and its gated form, ``LinearMultiHeadAttention``, ``RecurrentState``;
- :mod:`d2lattn.plotting` — ``show_heatmaps``, ``show_fits``;
- :mod:`d2lattn.data` — the CLDR date tasks of chapters 7 and 8;
- :mod:`d2lattn.seq2seq` — encoder–decoder with and without attention, greedy decoding;
- :mod:`d2lattn.transformer` — Transformer encoder and decoder blocks, KV cache;
- :mod:`d2lattn.flash` — online softmax and block-wise (FlashAttention-style) attention;
- :mod:`d2lattn.vision` — patch embedding, a small Vision Transformer, attention rollout;
- :mod:`d2lattn.circuits` — an attention-only Transformer and induction-head measurements;
- :mod:`d2lattn.interactive` — the data behind the website's movable figures;
- :mod:`d2lattn.diagnostics` — checks that find the classic attention bugs in any model
  (``check_causal``, ``check_padding``, ``check_permutation_equivariance``, ...);
- :mod:`d2lattn.text` — two real corpora (tiny Shakespeare, Tang poems), fixed splits,
  characters as tokens;
- :mod:`d2lattn.gpt` — a decoder-only Transformer language model, sampling filters, training;
- :mod:`d2lattn.ngram` — character n-gram models with interpolated Kneser–Ney smoothing;
- :mod:`d2lattn.serving` — the KV cache at serving time: bytes per token, multi-head latent
  attention, a paged cache, StreamingLLM's sinks, rotary scaling past the trained context;
- :mod:`d2lattn.sets` — the Set Transformer's blocks: ``MultiheadAttentionBlock``,
  ``InducedSetAttentionBlock`` (inducing points), ``PoolingByMultiheadAttention``;
- :mod:`d2lattn.pointcloud` — generated point clouds, nearest neighbours,
  ``VectorSelfAttention`` (Point Transformer) and chapter 16's classifiers;
- :mod:`d2lattn.graphs` — ``GraphAttention`` (a masked softmax over the edges),
  ``normalized_adjacency`` (the graph convolution's fixed weights);
- :mod:`d2lattn.scaling` — loss against compute: ``training_flops`` (``6 N D``), the
  ``compute_frontier`` of a sweep, ``fit_frontier`` (a saturating power law) and
  ``chinchilla_optimal``;
- :mod:`d2lattn.sparse` — attention that chooses where to look: block-sparse attention over
  a selection (a masked reference and a gathered form), MoBA's gate, the Sparse Transformer's
  and BigBird's patterns, an indexer that picks tokens;
- :mod:`d2lattn.training` — ``fit``, the one training loop behind every ``train_*`` function,
  and the convention they share (arguments, callback, result).

The public names are each module's ``__all__``, re-exported here: ``d2lattn.X`` is the ``X``
of the module that defines it. Importing the package has no side effects (matplotlib is loaded
only when a plot is drawn).
"""

from . import (
    circuits,
    data,
    diagnostics,
    flash,
    gpt,
    graphs,
    heads,
    interactive,
    kernel_regression,
    kvcache,
    linear,
    masking,
    multihead,
    ngram,
    plotting,
    pointcloud,
    positional,
    scaling,
    scoring,
    seq2seq,
    serving,
    sets,
    sparse,
    text,
    training,
    transformer,
    vision,
)
from .circuits import *  # noqa: F401,F403
from .data import *  # noqa: F401,F403
from .diagnostics import *  # noqa: F401,F403
from .flash import *  # noqa: F401,F403
from .gpt import *  # noqa: F401,F403
from .graphs import *  # noqa: F401,F403
from .heads import *  # noqa: F401,F403
from .interactive import *  # noqa: F401,F403
from .kernel_regression import *  # noqa: F401,F403
from .kvcache import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .masking import *  # noqa: F401,F403
from .multihead import *  # noqa: F401,F403
from .ngram import *  # noqa: F401,F403
from .plotting import *  # noqa: F401,F403
from .pointcloud import *  # noqa: F401,F403
from .positional import *  # noqa: F401,F403
from .scaling import *  # noqa: F401,F403
from .scoring import *  # noqa: F401,F403
from .seq2seq import *  # noqa: F401,F403
from .serving import *  # noqa: F401,F403
from .sets import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403
from .text import *  # noqa: F401,F403
from .training import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
from .vision import *  # noqa: F401,F403

__version__ = "0.1.0"

_MODULES = (circuits, data, diagnostics, flash, gpt, graphs, heads, interactive,
            kernel_regression, kvcache, linear, masking, multihead, ngram, plotting, pointcloud,
            positional, scaling, scoring, seq2seq, serving, sets, sparse, text, training,
            transformer, vision)
__all__ = sorted(name for module in _MODULES for name in module.__all__)

#: Names that were public here and are no longer, with where they went (one release).
_DEPRECATED = {
    "check_qkv": "d2lattn._checks.check_qkv (an internal check; no chapter uses it)",
    "check_positive_ints": "d2lattn._checks.check_positive_ints (an internal check)",
}


def __getattr__(name: str) -> object:
    """The deprecated names still work for one release, with a ``DeprecationWarning``."""
    if name in _DEPRECATED:
        import warnings

        from . import _checks

        warnings.warn(f"d2lattn.{name} is no longer public: use {_DEPRECATED[name]}",
                      DeprecationWarning, stacklevel=2)
        return getattr(_checks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _flash_moved(name: str) -> object:
    """``d2lattn.flash.GroupedQueryAttention`` moved to :mod:`d2lattn.multihead` (one
    multi-head core); the old path works, with a ``DeprecationWarning``, for one release.
    Installed from here, the package's root, so that :mod:`d2lattn.flash` imports nothing
    above it (multihead imports flash)."""
    if name == "GroupedQueryAttention":
        import warnings

        warnings.warn("d2lattn.flash.GroupedQueryAttention moved to "
                      "d2lattn.multihead.GroupedQueryAttention (also d2lattn."
                      "GroupedQueryAttention); the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return multihead.GroupedQueryAttention
    raise AttributeError(f"module 'd2lattn.flash' has no attribute {name!r}")


flash.__getattr__ = _flash_moved  # PEP 562: read from the module's namespace on a miss
