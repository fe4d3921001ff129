"""The input checks of d2lattn, and their messages, in one place.

Private: every module imports its checks from here, and no module defines a check of its own
(``tests/test_dropin_layers.py`` checks that). Every check raises ``ValueError`` naming the
argument and the expected shape, dtype or range, so that bad input never becomes a silent NaN
or a raw ``RuntimeError`` from deep inside a matrix product. This module imports nothing from
d2lattn (every other module may import it).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

#: Valid lengths: ``(B,)`` (one per sequence) or ``(B, Q)`` (one per query) integers.
ValidLens = Union[Tensor, Sequence[int]]
#: A sliding window: ``w`` (the same on both sides) or ``(left, right)``; ``None`` or ``-1``
#: on one side means unbounded on that side (FlashAttention's convention).
Window = Union[int, Tuple[Optional[int], Optional[int]]]


#: True while a model feeds its own layers values that are valid by construction.
_VALUES_TRUSTED: contextvars.ContextVar = contextvars.ContextVar("d2lattn_values_trusted",
                                                                  default=False)


@contextlib.contextmanager
def values_trusted() -> Iterator[None]:
    """Skip the checks that read tensor *values* (ranges of ids and gates) inside the block.

    Reading a value is a host synchronisation on an accelerator. A model uses this where it
    produced the values itself: ``GPT.generate`` feeds back the ids it sampled, and
    :class:`~d2lattn.LinearMultiHeadAttention` passes gates that a sigmoid keeps in range.
    Shapes, dtypes and devices are still checked. While ``torch.compile`` traces, the value
    checks are off anyway (:func:`reads_values`), and the flag is left alone (Dynamo cannot
    trace a context variable).
    """
    if torch.compiler.is_compiling():
        yield
        return
    token = _VALUES_TRUSTED.set(True)
    try:
        yield
    finally:
        _VALUES_TRUSTED.reset(token)


def reads_values() -> bool:
    """Whether a check may read tensor *values* now: not inside :func:`values_trusted`, and
    not while ``torch.compile`` traces (a value read there is a graph break; the compiled
    model keeps its shape checks, and the same call in eager mode runs the value checks)."""
    return not torch.compiler.is_compiling() and not _VALUES_TRUSTED.get()


# --- numbers ----------------------------------------------------------------------------------

def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_ints(**sizes: object) -> None:
    """Raise ``ValueError`` naming the first argument that is not a positive ``int``.

    ``bool`` is rejected although it is a subclass of ``int``.

    Example:
        >>> check_positive_ints(num_hiddens=8, num_heads=0)
        Traceback (most recent call last):
            ...
        ValueError: num_heads must be a positive integer, got 0

    Source: the book's input-checking convention (bad input names the argument).
    """
    for name, value in sizes.items():
        if not _is_int(value) or value < 1:  # type: ignore[operator]
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices`` (a model's ``kind``, a
    method's name), naming the argument and listing the choices.

    Example:
        >>> check_choice("kind", "graph", ("deepsets", "sab"))
        Traceback (most recent call last):
            ...
        ValueError: kind must be one of ('deepsets', 'sab'), got 'graph'

    Source: the book's input-checking convention (bad input names the argument).
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_non_negative_ints(**sizes: object) -> None:
    """Raise ``ValueError`` naming the first argument that is not an ``int >= 0``."""
    for name, value in sizes.items():
        if not _is_int(value) or value < 0:  # type: ignore[operator]
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def check_positive(name: str, value: object) -> None:
    """A positive finite number (a scale, a temperature, an epsilon, a bandwidth)."""
    if not _is_number(value) or not value > 0 or not math.isfinite(value):  # type: ignore
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_positive_numbers(name: str, values: Sequence[object]) -> list:
    """Finite positive numbers (computes, parameter counts); returned as floats."""
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must hold finite positive numbers, got {values!r}")
    out = [float(v) for v in values]  # type: ignore[arg-type]
    if not all(math.isfinite(v) and v > 0 for v in out):
        raise ValueError(f"{name} must hold finite positive numbers, got {values!r}")
    return out


def check_finite_numbers(name: str, values: Sequence[object]) -> list:
    """Finite numbers (losses); returned as floats."""
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must hold finite numbers, got {values!r}")
    out = [float(v) for v in values]  # type: ignore[arg-type]
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must hold finite numbers, got {values!r}")
    return out


def check_positive_or_none(name: str, value: object) -> None:
    """``None`` (off) or a positive finite number (a gradient clipping norm)."""
    if value is not None and (not _is_number(value) or not value > 0  # type: ignore[operator]
                              or not math.isfinite(value)):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be None or a positive finite number, got {value!r}")


def check_scale(scale: object) -> None:
    """``None`` (meaning ``1 / sqrt(d)``) or a positive finite number."""
    if scale is not None and (not _is_number(scale) or not scale > 0  # type: ignore[operator]
                              or not math.isfinite(scale)):  # type: ignore[arg-type]
        raise ValueError(f"scale must be None or a positive finite number, got {scale!r}")


def check_dropout(dropout: object, name: str = "dropout") -> None:
    """A probability in ``[0, 1)``."""
    if not _is_number(dropout) or not 0.0 <= dropout < 1.0:  # type: ignore[operator]
        raise ValueError(f"{name} must lie in [0, 1), got {dropout!r}")


def check_mask_rate(rate: object) -> None:
    """The share of positions a masked language model blanks: a number in ``(0, 1)``."""
    if not _is_number(rate) or not 0.0 < rate < 1.0:  # type: ignore[operator]
        raise ValueError(f"rate must lie in (0, 1), got {rate!r}")


def check_bool(**flags: object) -> None:
    """Raise ``ValueError`` naming the first flag (``is_causal``, ``norm_first``...) not a bool."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")


def check_layer_norm_eps(eps: object) -> None:
    """LayerNorm's epsilon: a positive finite number (0 divides by zero on a constant row)."""
    if not _is_number(eps) or not eps > 0 or not math.isfinite(eps):  # type: ignore[operator]
        raise ValueError(f"layer_norm_eps must be a positive finite number, got {eps!r}")


def check_window(window: object) -> Optional[Tuple[Optional[int], Optional[int]]]:
    """``window`` as ``(left, right)`` (``None`` = unbounded side), or ``None`` for no window.

    An integer ``w >= 0`` means ``(w, w)``; a pair takes integers ``>= 0``, or ``None`` or
    ``-1`` for a side without limit (FlashAttention's ``window_size=(-1, -1)`` is no window).
    """
    if window is None:
        return None
    if _is_int(window):
        if window < 0:  # type: ignore[operator]
            raise ValueError(f"window must be None, an integer >= 0 or a pair (left, right), "
                             f"got {window!r}")
        return window, window  # type: ignore[return-value]
    if isinstance(window, (tuple, list)) and len(window) == 2:
        sides = []
        for side in window:
            if side is None or (_is_int(side) and side == -1):
                sides.append(None)
            elif _is_int(side) and side >= 0:
                sides.append(side)
            else:
                break
        else:
            return None if sides == [None, None] else (sides[0], sides[1])
    raise ValueError(f"window must be None, an integer >= 0 or a pair (left, right) of "
                     f"integers >= 0 (None or -1: unbounded), got {window!r}")


def check_heads(num_hiddens: object, num_heads: object, num_kv_heads: object, *,
                rotary: object = False, **sizes: object) -> None:
    """Multi-head sizes: ``num_heads`` divides ``num_hiddens``, ``num_kv_heads`` divides
    ``num_heads``, the optional input ``sizes`` (``query_size=None`` skipped) are positive, and
    ``rotary`` needs an even head size."""
    check_positive_ints(num_hiddens=num_hiddens, num_heads=num_heads, num_kv_heads=num_kv_heads)
    if num_hiddens % num_heads != 0:  # type: ignore[operator]
        raise ValueError(f"num_hiddens ({num_hiddens}) must be divisible by num_heads "
                         f"({num_heads})")
    if num_heads % num_kv_heads != 0:  # type: ignore[operator]
        raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads "
                         f"({num_kv_heads})")
    check_positive_ints(**{name: size for name, size in sizes.items() if size is not None})
    check_bool(rotary=rotary)
    if rotary and (num_hiddens // num_heads) % 2 != 0:  # type: ignore[operator]
        raise ValueError("rotary=True needs an even head size num_hiddens // num_heads, "
                         f"got {num_hiddens // num_heads}")  # type: ignore[operator]


# --- queries, keys and values -----------------------------------------------------------------

def _check_queries_keys(queries: Tensor, keys: Tensor, *, same_size: bool) -> None:
    """Float tensors with >= 3 axes, the same leading axes, and (if asked) the same size d."""
    for name, t in (("queries", queries), ("keys", keys)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor")
        if t.dim() < 3:
            raise ValueError(f"{name} must have shape (B, ..., n, size), got shape {tuple(t.shape)}")
    if keys.shape[:-2] != queries.shape[:-2]:
        raise ValueError(
            f"keys must have the leading axes of queries {tuple(queries.shape[:-2])}, "
            f"got keys of shape {tuple(keys.shape)}"
        )
    if same_size and queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same feature size d, "
            f"got {queries.shape[-1]} and {keys.shape[-1]}"
        )


def check_qkv(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    same_size: bool,
    query_size: Optional[int] = None,
    key_size: Optional[int] = None,
    value_size: Optional[int] = None,
) -> None:
    """Check the shapes of an attention call, raising ``ValueError`` with the culprit's name.

    Args:
        queries: ``(B, ..., Q, d_q)`` float.
        keys: ``(B, ..., K, d_k)`` float, the same leading axes as ``queries``.
        values: ``(B, ..., K, v)`` float, as many rows as ``keys``.
        same_size: require ``d_q == d_k`` (dot-product scores need it).
        query_size, key_size, value_size: keyword-only; if given, the feature size that
            ``d_q``, ``d_k`` and ``v`` must have (a layer's input sizes).

    Raises:
        ValueError: on a non-float input, fewer than 3 axes, or mismatched sizes.

    Example:
        >>> check_qkv(torch.ones(2, 1, 4), torch.ones(2, 10, 4), torch.ones(2, 10, 3), same_size=True)
        >>> check_qkv(torch.ones(2, 1, 4), torch.ones(2, 10, 4), torch.ones(2, 9, 3), same_size=True)
        Traceback (most recent call last):
            ...
        ValueError: values must have shape (B, ..., K, v) with the K = 10 rows of keys, got values of shape (2, 9, 3) and keys of shape (2, 10, 4)

    Source: the shape legend of the book's notation page.
    """
    _check_queries_keys(queries, keys, same_size=same_size)
    if not isinstance(values, Tensor) or not values.is_floating_point():
        raise ValueError("values must be a floating-point tensor")
    if values.shape[:-1] != keys.shape[:-1]:
        raise ValueError(
            f"values must have shape (B, ..., K, v) with the K = {keys.shape[-2]} rows of keys, "
            f"got values of shape {tuple(values.shape)} and keys of shape {tuple(keys.shape)}"
        )
    for name, t, size_name, size in (("queries", queries, "query_size", query_size),
                                     ("keys", keys, "key_size", key_size),
                                     ("values", values, "value_size", value_size)):
        if size is not None and t.shape[-1] != size:
            raise ValueError(f"{name} must have feature size {size_name} = {size}, "
                             f"got {t.shape[-1]}")


def check_scores_args(queries: Tensor, keys: Tensor) -> None:
    """Check the arguments of a score function, raising ``ValueError`` with the culprit's name."""
    _check_queries_keys(queries, keys, same_size=True)
    if queries.dtype != keys.dtype:
        raise ValueError(f"queries and keys must have the same dtype, "
                         f"got {queries.dtype} and {keys.dtype}")


def check_sdpa_inputs(queries: Tensor, keys: Tensor, values: Tensor, *,
                      enable_gqa: bool = False) -> int:
    """Queries, keys and values as SDPA takes them; return ``r``, query heads per key/value head.

    With ``enable_gqa`` the head axis (-3) of the keys and values may divide the queries'.
    """
    check_bool(enable_gqa=enable_gqa)
    r = 1
    if enable_gqa:
        for name, t in (("queries", queries), ("keys", keys)):
            if not isinstance(t, Tensor) or t.dim() < 4:
                raise ValueError(f"with enable_gqa=True, {name} must have shape "
                                 f"(B, ..., heads, n, d), got {_describe(t)}")
        h, g = queries.shape[-3], keys.shape[-3]
        if g == 0 or h < g or h % g != 0:
            raise ValueError(f"with enable_gqa=True, the query heads ({h}) must be a multiple "
                             f"of the key/value heads ({g})")
        r = h // g
        queries = queries.narrow(-3, 0, g)  # a view with the keys' head count, for check_qkv
    check_qkv(queries, keys, values, same_size=True)
    check_same_dtype_device(queries=queries, keys=keys, values=values)
    return r


def check_scores(X: object, *, with_valid_lens: bool = False) -> None:
    """Scores for a softmax: a float tensor with a key axis (and ``(B, ..., Q, K)`` when
    ``valid_lens`` will index it)."""
    if not isinstance(X, Tensor) or not X.is_floating_point():
        raise ValueError(f"X must be a floating-point tensor of scores, got {type(X).__name__}"
                         + (f" of dtype {X.dtype}" if isinstance(X, Tensor) else ""))
    if X.dim() < 1:
        raise ValueError("X must have at least one axis (the keys)")
    if with_valid_lens and X.dim() < 3:
        raise ValueError(
            f"with valid_lens, X must have shape (B, ..., Q, K), got shape {tuple(X.shape)}")


def check_scores_shape(scores: object, queries: Tensor, keys: Tensor) -> None:
    """Scores of shape ``(B, ..., Q, K)``, as a score function must return."""
    expected = (*queries.shape[:-1], keys.shape[-2])  # (B, ..., Q, K)
    if not isinstance(scores, Tensor) or tuple(scores.shape) != expected:
        got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"score_fn must return scores of shape (B, ..., Q, K) = {expected}, "
                         f"got {got}")


def check_broadcast(t: Tensor, shape: torch.Size, name: str, target: str) -> None:
    """``t`` broadcasts to ``shape`` without enlarging it (``target`` names the shape)."""
    try:
        ok = torch.broadcast_shapes(t.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to {target} "
                         f"{tuple(shape)}")


def check_bool_mask(mask: object, shape: torch.Size, name: str, target: str) -> None:
    """A bool mask (True = may attend) that broadcasts to ``shape``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor (True = may attend)")
    check_broadcast(mask, shape, name, target)


# --- valid lengths ----------------------------------------------------------------------------

def as_valid_lens(valid_lens: ValidLens) -> Tensor:
    """``valid_lens`` as an integer tensor (not yet checked against the shapes)."""
    if not isinstance(valid_lens, Tensor):
        try:
            valid_lens = torch.as_tensor(valid_lens)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"valid_lens must be an integer tensor of shape (B,) or (B, Q); got {valid_lens!r}"
            ) from err
    if valid_lens.dtype == torch.bool or valid_lens.is_floating_point() or valid_lens.is_complex():
        raise ValueError(f"valid_lens must have an integer dtype, got {valid_lens.dtype}")
    return valid_lens


def check_valid_lens_range(valid_lens: Tensor, num_keys: int) -> None:
    """Every entry in ``[0, num_keys]``."""
    if valid_lens.numel() > 0 and reads_values():
        lo, hi = int(valid_lens.min()), int(valid_lens.max())
        if lo < 0 or hi > num_keys:
            raise ValueError(
                f"valid_lens entries must lie in [0, {num_keys}] (the number of keys); "
                f"got values in [{lo}, {hi}]"
            )


def check_valid_lens(valid_lens: ValidLens, B: Optional[int], Q: int, K: int) -> Tensor:
    """``valid_lens`` as int64 of shape ``(B,)`` or ``(B, Q)``, with entries in ``[0, K]``:
    the one check of every function and layer that takes ``valid_lens`` (``B=None``: any
    batch size, for :func:`d2lattn.valid_lens_to_mask`, which has no batch to compare)."""
    lens = as_valid_lens(valid_lens)
    b = lens.shape[0] if B is None and lens.dim() in (1, 2) else B
    if lens.shape not in ((b,), (b, Q)):
        shapes = (f"(B,) or (B, Q) = (B, {Q})" if B is None
                  else f"(B,) = ({B},) or (B, Q) = ({B}, {Q})")
        raise ValueError(f"valid_lens must have shape {shapes}, got shape {tuple(lens.shape)}")
    check_valid_lens_range(lens, K)
    return lens.to(torch.int64)


# --- tensors ----------------------------------------------------------------------------------

def _describe(t: object) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


def check_same_dtype_device(**tensors: Tensor) -> None:
    """All tensors share one dtype and one device (as SDPA requires)."""
    names, ts = list(tensors), list(tensors.values())
    if len({t.dtype for t in ts}) > 1:
        got = ", ".join(f"{n} {t.dtype}" for n, t in zip(names, ts))
        raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} must have the same dtype, "
                         f"got {got}")
    if len({t.device for t in ts}) > 1:
        raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} must be on the same device")


def check_input_dtype(name: str, X: Tensor, param_dtype: torch.dtype) -> None:
    """A layer's input has its parameters' dtype (unless autocast converts it).

    Without this a float64 input into a float32 layer fails deep inside a matrix product.
    """
    if X.dtype != param_dtype and not torch.is_autocast_enabled(X.device.type):
        raise ValueError(f"{name} has dtype {X.dtype} but the layer's parameters are "
                         f"{param_dtype}: convert one of them (layer.to({X.dtype}) or "
                         f"{name}.to({param_dtype}))")


def split_attn_mask(attn_mask: object, num_queries: int, num_keys: int,
                    ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Check an ``attn_mask`` and return it as ``(bool_mask, float_bias)``, one of them ``None``.

    A bool mask is True = may attend; a float mask is added to the scores (``-inf`` forbids a
    key), as ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` take it. Its last
    two axes must broadcast to ``(Q, K)``.
    """
    if attn_mask is None:
        return None, None
    if not isinstance(attn_mask, Tensor) or not (attn_mask.dtype == torch.bool
                                                 or attn_mask.is_floating_point()):
        raise ValueError("attn_mask must be a bool tensor (True = may attend) or a float "
                         "tensor added to the scores, got "
                         + (f"dtype {attn_mask.dtype}" if isinstance(attn_mask, Tensor)
                            else type(attn_mask).__name__))
    tail = tuple(attn_mask.shape[-2:])
    if attn_mask.dim() < 2 or tail[0] not in (1, num_queries) or tail[1] not in (1, num_keys):
        raise ValueError(
            f"attn_mask must broadcast to (..., Q, K) = (..., {num_queries}, {num_keys}), "
            f"got shape {tuple(attn_mask.shape)}")
    if attn_mask.dtype == torch.bool:
        return attn_mask, None
    return None, attn_mask


def check_kv_cache_chunk(kv_cache: object, is_causal: bool, attn_mask: object,
                         num_queries: int) -> None:
    """A KV cache with several new queries needs a causal (or explicit) mask.

    With ``is_causal=False`` the new queries would see each other's keys, the future included,
    but not as a bidirectional layer would (the cache holds no keys after them): neither causal
    nor bidirectional. One query at a time is fine (it sees the whole cache either way).
    """
    if kv_cache is not None and not is_causal and attn_mask is None and num_queries > 1:
        raise ValueError(
            f"kv_cache with is_causal=False and a chunk of {num_queries} queries would let the "
            "new positions see each other's future; pass is_causal=True (or an attn_mask over "
            "all cached and new keys, or one query at a time)")


def check_cache_update(cached: Optional[Tensor], new: Tensor, name: str) -> None:
    """New keys or values for a cache: the cached dtype and device, no silent promotion."""
    if cached is not None and (new.dtype != cached.dtype or new.device != cached.device):
        raise ValueError(f"new {name} of dtype {new.dtype} on {new.device} do not match the "
                         f"cached {name} ({cached.dtype} on {cached.device}); convert them "
                         "first, a cache is not promoted silently")


# --- the inputs of the other modules (tokens, images, regression data, Transformer blocks) -------

def check_tokens(tokens: object, name: str = "tokens", vocab_size: Optional[int] = None, *,
                 any_int: bool = False) -> Tensor:
    """Token ids ``(B, T)``: any integer dtype, or, with ``vocab_size``, int64 ids in
    ``[0, vocab_size)`` (what an ``nn.Embedding`` of that size takes).

    ``any_int=True`` accepts any integer dtype with ``vocab_size`` too. The range check, the
    one part that reads the values, is skipped under :func:`values_trusted`, while
    ``torch.compile`` traces (:func:`reads_values`) and on the ``meta`` device (which has no
    values)."""
    integer = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
    if vocab_size is not None and not any_int:
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            got = (f"{tokens.dtype} of shape {tuple(tokens.shape)}"
                   if isinstance(tokens, Tensor) else f"{type(tokens).__name__} of shape ?")
            raise ValueError(f"{name} must be a LongTensor of shape (B, T), got {got}")
    elif not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype not in integer:
        raise ValueError(f"{name} must be an integer tensor of shape (B, T), got "
                         + (f"dtype {tokens.dtype} and shape {tuple(tokens.shape)}"
                            if isinstance(tokens, Tensor) else type(tokens).__name__))
    if (vocab_size is not None and tokens.numel() and reads_values()
            and tokens.device.type != "meta"):
        low, high = (int(v) for v in torch.stack([tokens.min(), tokens.max()]).tolist())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} entries must lie in [0, {vocab_size}) (vocab_size, the "
                             f"vocabulary size), got values in [{low}, {high}]")
    return tokens


def check_square_weights(attention_weights: object) -> Tensor:
    """Self-attention weights: float ``(B, ..., T, T)``; returned unchanged."""
    if (not isinstance(attention_weights, Tensor) or not attention_weights.is_floating_point()
            or attention_weights.dim() < 3
            or attention_weights.shape[-1] != attention_weights.shape[-2]):
        raise ValueError("attention_weights must be a float tensor of shape (B, ..., T, T), got "
                         + (f"shape {tuple(attention_weights.shape)}"
                            if isinstance(attention_weights, Tensor)
                            else type(attention_weights).__name__))
    return attention_weights


def check_lengths(name: str, valid_lens: Tensor, B: int, T: int) -> None:
    """Sequence lengths ``(B,)`` of integers in ``[1, T]`` (no empty sequence)."""
    if not isinstance(valid_lens, Tensor) or valid_lens.dim() != 1 or valid_lens.shape[0] != B \
            or valid_lens.dtype in (torch.bool,) or valid_lens.is_floating_point():
        raise ValueError(f"{name} must be an integer tensor of shape (B,) = ({B},), got "
                         f"{valid_lens!r}")
    if B and (int(valid_lens.min()) < 1 or int(valid_lens.max()) > T):
        raise ValueError(f"{name} entries must lie in [1, {T}] (the padded length), got values "
                         f"in [{int(valid_lens.min())}, {int(valid_lens.max())}]")


def check_images(images: Tensor, patch_size: int, in_channels: Optional[int] = None,
                 name: str = "images") -> None:
    """Images ``(B, C, H, W)`` float, ``C = in_channels`` if given, ``H`` and ``W`` multiples
    of ``patch_size``."""
    if not isinstance(images, Tensor) or not images.is_floating_point() or images.dim() != 4:
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"{name} must be a float tensor of shape (B, C, H, W), got {got}")
    _, C, H, W = images.shape
    if in_channels is not None and C != in_channels:
        raise ValueError(f"{name} must have C = in_channels = {in_channels} channels, got {C}")
    if H % patch_size or W % patch_size:
        raise ValueError(f"{name}: height and width ({H}, {W}) must be multiples of "
                         f"patch_size = {patch_size}")


def check_nw_inputs(x_query: Tensor, x_train: Tensor, y_train: Tensor) -> None:
    """Check the three 1-D inputs of a Nadaraya–Watson call, raising ``ValueError``."""
    for name, t in (("x_train", x_train), ("y_train", y_train), ("x_query", x_query)):
        check_1d_float(name, t)
    if not x_query.dtype == x_train.dtype == y_train.dtype:
        raise ValueError(f"x_train, y_train and x_query must share one dtype, got "
                         f"{x_train.dtype}, {y_train.dtype} and {x_query.dtype}")
    if x_train.shape != y_train.shape:
        raise ValueError(f"x_train and y_train must have the same length, got "
                         f"{x_train.shape[0]} and {y_train.shape[0]}")
    if x_train.shape[0] == 0:
        raise ValueError("x_train must hold at least one training example")


def check_1d_float(name: str, t: Tensor) -> None:
    """Raise ``ValueError`` unless ``t`` is a 1-D floating-point tensor."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a 1-D floating-point tensor, got {type(t).__name__}")
    if not t.is_floating_point() or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D floating-point tensor, got shape "
                         f"{tuple(t.shape)} and dtype {t.dtype}")


def check_torch_layer(layer: nn.Module, cls: type) -> bool:
    """Check a PyTorch layer that ``from_torch`` can copy; return whether it has biases."""
    if not isinstance(layer, cls):
        raise ValueError(f"layer must be a torch.nn.{cls.__name__}, got {type(layer).__name__}")
    attns = [layer.self_attn] + ([layer.multihead_attn] if hasattr(layer, "multihead_attn")
                                 else [])
    if not all(attn.batch_first for attn in attns):
        raise ValueError("layer must be built with batch_first=True")
    if any(attn.in_proj_weight is None or attn.bias_k is not None for attn in attns):
        raise ValueError("layer must have equal q/k/v sizes and no add_bias_kv")
    norms = [m for name, m in layer.named_children() if name.startswith("norm")]
    has_bias = [attn.in_proj_bias is not None for attn in attns]
    has_bias += [attn.out_proj.bias is not None for attn in attns]
    has_bias += [layer.linear1.bias is not None, layer.linear2.bias is not None]
    has_bias += [norm.bias is not None for norm in norms]
    if len(set(has_bias)) != 1:
        raise ValueError("layer must have all its biases or none (built with bias=True or "
                         "bias=False)")
    if not callable(layer.activation):
        raise ValueError(f"layer's activation must be callable, got {layer.activation!r}")
    return has_bias[0]


def check_hidden_states(X: Tensor, num_hiddens: int, name: str = "X",
                        dtype: Optional[torch.dtype] = None) -> None:
    """A block's input: float ``(B, T, num_hiddens)``, of the parameters' ``dtype`` if given."""
    if not isinstance(X, Tensor) or not X.is_floating_point() or X.dim() != 3 \
            or X.shape[-1] != num_hiddens:
        got = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"{name} must be a float tensor of shape (B, T, num_hiddens = "
                         f"{num_hiddens}), got {got}")
    if dtype is not None:
        check_input_dtype(name, X, dtype)


def check_block_args(num_hiddens: int, num_heads: int, ffn_num_hiddens: int, dropout: float,
                     norm_first: bool, layer_norm_eps: float, bias: bool) -> None:
    """A Transformer block's constructor arguments."""
    check_positive_ints(num_hiddens=num_hiddens, num_heads=num_heads,
                        ffn_num_hiddens=ffn_num_hiddens)
    check_dropout(dropout)
    check_bool(norm_first=norm_first, bias=bias)
    check_layer_norm_eps(layer_norm_eps)


def check_positions_input(X: object, num_hiddens: int, max_len: int, why: str = "") -> None:
    """The input of a position table: float ``(..., T, num_hiddens)`` with ``T <= max_len``."""
    if not isinstance(X, Tensor) or not X.is_floating_point() or X.dim() < 2:
        raise ValueError("X must be a floating-point tensor of shape (B, T, num_hiddens)")
    T, d = X.shape[-2], X.shape[-1]
    if d != num_hiddens:
        raise ValueError(f"X must have last axis num_hiddens = {num_hiddens}, got {d}")
    if T > max_len:
        raise ValueError(f"sequence length {T} exceeds max_len = {max_len}{why}")


def check_decoder_args(vocab_size: object, embed_size: object, num_hiddens: object,
                       attention: object, context_size: Optional[object]) -> None:
    """An attention decoder's sizes, and an attention layer that is an ``nn.Module``."""
    check_positive_ints(vocab_size=vocab_size, embed_size=embed_size, num_hiddens=num_hiddens)
    if context_size is not None:
        check_positive_ints(context_size=context_size)
    if not isinstance(attention, nn.Module):
        raise ValueError(f"attention must be an nn.Module (an attention layer), got "
                         f"{type(attention).__name__}")


# --- the diagnostics' arguments (d2lattn.diagnostics) -----------------------------------------

def check_diagnostic_model(model: object) -> None:
    if not callable(model):
        raise ValueError(f"model must be an nn.Module or a callable, got {type(model).__name__}")


def check_diagnostic_inputs(inputs: object, min_len: int = 1) -> Tensor:
    if not isinstance(inputs, Tensor) or inputs.dim() < 2:
        got = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise ValueError("inputs must be a tensor of shape (B, T, ...): (B, T, d) floats or "
                         f"(B, T) token ids, got {got}")
    if not (inputs.is_floating_point() or is_integer_dtype(inputs)):
        raise ValueError(f"inputs must be floating point or integer token ids, got {inputs.dtype}")
    if inputs.shape[0] < 1 or inputs.shape[1] < min_len:
        raise ValueError(f"inputs must have B >= 1 sequences of T >= {min_len} positions, got "
                         f"shape {tuple(inputs.shape)}")
    if inputs.is_floating_point() and not bool(torch.isfinite(inputs).all()):
        raise ValueError("inputs must be finite (no NaN or inf)")
    return inputs


def is_integer_dtype(t: Tensor) -> bool:
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


def check_diagnostic_valid_lens(valid_lens: object, B: int, T: int) -> Tensor:
    if isinstance(valid_lens, (list, tuple)):
        valid_lens = torch.tensor(valid_lens)
    if not isinstance(valid_lens, Tensor) or not is_integer_dtype(valid_lens) \
            or tuple(valid_lens.shape) != (B,):
        got = (f"{valid_lens.dtype} of shape {tuple(valid_lens.shape)}"
               if isinstance(valid_lens, Tensor) else type(valid_lens).__name__)
        raise ValueError(f"valid_lens must be integers of shape (B,) = ({B},), got {got}")
    if bool((valid_lens < 0).any()) or bool((valid_lens > T).any()):
        raise ValueError(f"valid_lens must lie in [0, T] = [0, {T}], got {valid_lens.tolist()}")
    return valid_lens


def check_diagnostic_options(mode: str, tolerance: Optional[float], seed: int) -> None:
    if mode not in ("eval", "train"):
        raise ValueError(f"mode must be 'eval' or 'train', got {mode!r}")
    if tolerance is not None and (isinstance(tolerance, bool)
                                  or not isinstance(tolerance, (int, float))
                                  or not tolerance > 0 or not math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be None or a positive finite number, got {tolerance!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def check_diagnostic_vocab(inputs: Tensor, vocab_size: Optional[int]) -> None:
    if vocab_size is None:
        return
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    if not inputs.is_floating_point() and (int(inputs.max()) >= vocab_size
                                           or int(inputs.min()) < 0):
        raise ValueError(f"token ids must lie in [0, vocab_size) = [0, {vocab_size})")


def check_diagnostic_time_axis(out: Tensor, B: int, T: int, what: str) -> None:
    if out.dim() < 2 or out.shape[1] != T:
        raise ValueError(f"{what} needs outputs of shape (B, T, ...) = ({B}, {T}, ...), got "
                         f"{tuple(out.shape)}")


def check_diagnostic_call(input_name: object, mask_name: object, kwargs: object,
                          output: object) -> None:
    """How a diagnostic calls the model: ``input_name`` and ``mask_name`` None or a keyword's
    name, ``kwargs`` None or a mapping with string keys, ``output`` None, an int, a str or a
    callable (d2lattn.diagnostics)."""
    for name, value in (("input_name", input_name), ("mask_name", mask_name)):
        if value is not None and (not isinstance(value, str) or not value.isidentifier()):
            raise ValueError(f"{name} must be None or a keyword argument's name, got {value!r}")
    if kwargs is not None and (not hasattr(kwargs, "items")
                               or not all(isinstance(k, str) for k in kwargs)):
        raise ValueError(f"kwargs must be None or a dict of keyword arguments, got "
                         f"{type(kwargs).__name__}")
    if kwargs is not None:
        for name in (input_name, mask_name):
            if name is not None and name in kwargs:
                raise ValueError(f"kwargs must not hold {name!r}: the check passes it itself")
    if not (output is None or callable(output) or isinstance(output, str)
            or (isinstance(output, int) and not isinstance(output, bool))):
        raise ValueError(f"output must be None, an index, a key or attribute name, or a "
                         f"function of the model's output, got {output!r}")


def check_diagnostic_pad_id(inputs: Tensor, padding: Tensor, pad_id: object) -> None:
    """``pad_id``: None, or an int that every padded position of the token ids ``inputs``
    holds (``padding``: bool ``(B, T)``, True = padded) (d2lattn.diagnostics)."""
    if pad_id is None:
        return
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise ValueError(f"pad_id must be None or an int, got {pad_id!r}")
    if inputs.is_floating_point():
        raise ValueError("pad_id needs (B, T) integer token ids as inputs, got floats")
    if not bool((inputs[padding.to(inputs.device)] == pad_id).all()):
        raise ValueError(f"with pad_id = {pad_id}, every padded position (after the valid "
                         "ones, or before them with left padding) must hold the pad id")


def check_diagnostic_batch(inputs: Tensor) -> None:
    """At least two sequences: a model that mixes the batch is invisible at B = 1
    (d2lattn.diagnostics)."""
    if inputs.shape[0] < 2:
        raise ValueError(f"inputs must hold B >= 2 sequences for a batch to be mixed, got "
                         f"shape {tuple(inputs.shape)}")


def check_diagnostic_prefix(prefix: object) -> None:
    """``prefix``: None or a bool (d2lattn.diagnostics.check_causal)."""
    if prefix is not None and not isinstance(prefix, bool):
        raise ValueError(f"prefix must be None, True or False, got {prefix!r}")


def check_layer_and_head(layer: object, head: object, num_layers: int, num_heads: int) -> None:
    """Raise ``ValueError`` unless ``layer`` is an int in [0, num_layers) and ``head`` one in
    [0, num_heads) (the head read by d2lattn.circuits' OV and QK circuits)."""
    for name, value, bound in (("layer", layer, num_layers), ("head", head, num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
            raise ValueError(f"{name} must be an integer in [0, {bound}), got {value!r}")


def check_logits(logits: object) -> None:
    """Raise ``ValueError`` unless ``logits`` is a float tensor of shape (..., V) (d2lattn.gpt)."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise ValueError("logits must be a float tensor of shape (..., V)")


def check_stream_scorer(model: object, data: object, extra: int) -> None:
    """The checks every scorer of a token stream shares (d2lattn.gpt's ``held_out_losses`` and
    ``sliding_window_losses``): a causal GPT (a model with a ``config`` that has ``causal``,
    ``vocab_size`` and ``block_size``), 1-D integer tokens of its vocabulary, more than
    ``block_size + extra`` of them."""
    config = getattr(model, "config", None)
    if not all(hasattr(config, a) for a in ("causal", "vocab_size", "block_size")):
        raise ValueError(f"model must be a GPT, got {type(model).__name__}")
    if not config.causal:
        raise ValueError("model must be causal (config.causal=True): a bidirectional model "
                         "sees the tokens it is asked to predict")
    if not isinstance(data, Tensor) or data.dim() != 1:
        raise ValueError(f"data must be a 1-D LongTensor of tokens (N,), got "
                         f"{getattr(data, 'shape', type(data).__name__)}")
    check_tokens(data[None], "data", config.vocab_size)
    T = config.block_size
    if data.numel() <= T + extra:
        raise ValueError(f"data must hold more than block_size{f' + {extra}' if extra else ''}"
                         f" = {T + extra} tokens, got {data.numel()}")


def check_block_sparse_qkv(queries: Tensor, keys: Tensor,
                           values: Tensor) -> Tuple[int, int, int, int]:
    """``(B, h, T_q, T_k)`` of 4-D float queries, keys and values of one dtype that fit together,
    ``T_k >= 1`` (d2lattn.sparse)."""
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(x, Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"{name} must be a float tensor of shape (B, h, T, d), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    B, h, T_q, d = queries.shape
    if keys.shape[:2] != (B, h) or keys.shape[-1] != d:
        raise ValueError(f"keys must have shape (B, h, T_k, d) = ({B}, {h}, T_k, {d}), got "
                         f"{tuple(keys.shape)}")
    if values.shape[:3] != keys.shape[:3]:
        raise ValueError(f"values must have shape (B, h, T_k, d_v) with (B, h, T_k) = "
                         f"{tuple(keys.shape[:3])}, got {tuple(values.shape)}")
    if not queries.dtype == keys.dtype == values.dtype:
        raise ValueError("queries, keys and values must share one dtype, got "
                         f"{queries.dtype}, {keys.dtype}, {values.dtype}")
    T_k = keys.shape[2]
    if T_k < 1:
        raise ValueError("keys must hold at least one position (T_k >= 1)")
    return B, h, T_q, T_k


def check_block_selection(block_index: Tensor, B: int, h: int, T_q: int, num_blocks: int) -> Tensor:
    """``block_index`` broadcast to ``(B, h, T_q, k)``, after its shape and values are checked:
    block numbers in ``[0, num_blocks)`` or ``-1``, no block twice for one query
    (d2lattn.sparse)."""
    if not isinstance(block_index, Tensor) or block_index.dim() != 4 or \
            block_index.is_floating_point() or block_index.dtype == torch.bool:
        raise ValueError("block_index must be an integer tensor of shape (B, h, T_q, k), got "
                         f"{getattr(block_index, 'shape', type(block_index).__name__)}")
    b, hh, t, k = block_index.shape
    if b not in (1, B) or hh not in (1, h) or t != T_q or k < 1:
        raise ValueError(f"block_index must have shape ({B} or 1, {h} or 1, T_q = {T_q}, k >= 1), "
                         f"got {tuple(block_index.shape)}")
    if block_index.numel():
        low, high = int(block_index.min()), int(block_index.max())
        if low < -1 or high >= num_blocks:
            raise ValueError(f"block_index must hold block numbers in [0, {num_blocks}) or -1 for "
                             f"an empty slot, got values in [{low}, {high}]")
        ordered = block_index.sort(dim=-1).values
        repeated = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
        if bool(repeated.any()):
            raise ValueError("block_index names a block twice for one query: each block may be "
                             "selected once")
    return block_index.long().expand(B, h, T_q, k)


def check_finite_gradients(model: torch.nn.Module, step: int) -> None:
    """Raise ``FloatingPointError`` before an optimizer step if a gradient is not finite
    (d2lattn.training): one host read per step (the loss is already read), so the weights are
    never updated with NaN."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grads and not bool(torch.stack([g.detach().float().isfinite().all()
                                       for g in grads]).all()):
        bad = [n for n, p in model.named_parameters()
               if p.grad is not None and not bool(p.grad.isfinite().all())]
        raise FloatingPointError(f"step {step}: the loss is finite but the gradients of "
                                 f"{bad[:3]}{' ...' if len(bad) > 3 else ''} are not (NaN "
                                 f"or inf); no update was made")


def check_local_inputs(X: object, positions: object, neighbours: object, d: int,
                       k: int) -> None:
    """The inputs of a layer over each point's neighbours (d2lattn.pointcloud): ``X``
    ``(B, N, d)``, ``positions`` ``(B, N, 3)``, ``neighbours`` ``None`` or ``(B, N, k)``."""
    if not isinstance(X, Tensor) or X.dim() != 3 or X.shape[-1] != d:
        raise ValueError(f"X must have shape (B, N, {d}), got "
                         f"{getattr(X, 'shape', type(X).__name__)}")
    if (not isinstance(positions, Tensor) or positions.shape[:2] != X.shape[:2]
            or positions.shape[-1] != 3):
        raise ValueError(f"positions must have shape (B, N, 3) = {(*X.shape[:2], 3)}, got "
                         f"{getattr(positions, 'shape', type(positions).__name__)}")
    if neighbours is not None and (not isinstance(neighbours, Tensor)
                                   or neighbours.shape != (*X.shape[:2], k)):
        got = (tuple(neighbours.shape) if isinstance(neighbours, Tensor)
               else type(neighbours).__name__)
        raise ValueError(f"neighbours must have shape {(*X.shape[:2], k)}, got {got}")


def check_temperature(temperature: object, *, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``temperature`` is a positive finite number, or ``0`` where
    ``allow_zero`` (greedy decoding, the limit of ever smaller temperatures) (d2lattn.gpt)."""
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not (temperature > 0 or (allow_zero and temperature == 0))
            or not math.isfinite(temperature)):
        kind = "finite number >= 0" if allow_zero else "positive finite number"
        raise ValueError(f"temperature must be a {kind}, got {temperature!r}")


def check_top_k(top_k: object, vocab_size: int, *, optional: bool = False) -> None:
    """Top-k's ``k``: an integer in ``[1, V]`` (or ``None`` where ``optional``) (d2lattn.gpt)."""
    if optional and top_k is None:
        return
    if not _is_int(top_k) or not 1 <= top_k <= vocab_size:  # type: ignore[operator]
        raise ValueError(f"top_k must be None or an integer in [1, {vocab_size}], got {top_k!r}"
                         if optional else
                         f"top_k must be an integer in [1, V = {vocab_size}], got {top_k!r}")


def check_top_p(top_p: object, *, optional: bool = False) -> None:
    """Top-p's ``p``: a number in ``(0, 1]`` (or ``None`` where ``optional``) (d2lattn.gpt)."""
    if optional and top_p is None:
        return
    if not _is_number(top_p) or not 0 < top_p <= 1:  # type: ignore[operator]
        raise ValueError(("top_p must be None or a number" if optional else "top_p must be a number")
                         + f" in (0, 1], got {top_p!r}")


# --- text (d2lattn.data, d2lattn.text) ---------------------------------------------------------

def check_text(text: object, name: str = "text", *, non_empty: bool = False) -> None:
    """A string (a non-empty one where ``non_empty``)."""
    if non_empty and (not isinstance(text, str) or not text):
        raise ValueError(f"{name} must be a non-empty string")
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string, got {type(text).__name__}")


def check_texts(texts: object, name: str = "texts") -> None:
    """A collection of strings, not one string (iterating a string gives its characters)."""
    if isinstance(texts, str):
        raise ValueError(f"{name} must be a list of strings, not a single string")


def check_ids(ids: object, vocab_size: int) -> list:
    """Token ids to decode, a 1-D tensor or a sequence of ints in ``[0, vocab_size)``; the ids
    as a list of ints."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise ValueError(f"ids must be a 1-D tensor, got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    out = [int(i) for i in ids]  # type: ignore[attr-defined]
    for i in out:
        if not 0 <= i < vocab_size:
            raise ValueError(f"ids must lie in [0, {vocab_size}), got {i}")
    return out


def check_token_lists(sequences: object) -> list:
    """``B >= 1`` sequences (lists or 1-D tensors) of non-negative int tokens; as lists."""
    if len(sequences) == 0:  # type: ignore[arg-type]
        raise ValueError("sequences must hold at least one sequence")
    rows = [s.tolist() if isinstance(s, Tensor) else list(s) for s in sequences]  # type: ignore
    for row in rows:
        for tok in row:
            if not _is_int(tok) or tok < 0:
                raise ValueError(f"sequences must hold non-negative integer tokens, got {tok!r}")
    return rows


def check_token_stream(data: object, block_size: int) -> None:
    """A 1-D tensor of token ids longer than ``block_size`` (windows of it are cut)."""
    if not isinstance(data, Tensor) or data.dim() != 1 or data.numel() <= block_size:
        raise ValueError(f"data must be a 1-D tensor longer than block_size = {block_size}")


# --- positions (d2lattn.positional) ------------------------------------------------------------

def check_offset(k: object) -> None:
    """A relative offset: an integer of any sign."""
    if not _is_int(k):
        raise ValueError(f"k must be an integer offset, got {k!r}")


def check_even_size(num_hiddens: object) -> None:
    """A size made of (sin, cos) pairs: a positive even integer."""
    if not _is_int(num_hiddens) or num_hiddens < 2 or num_hiddens % 2 != 0:  # type: ignore
        raise ValueError(f"num_hiddens must be a positive even integer, got {num_hiddens!r}")


def check_rotary_args(X: object, base: object, positions: object,
                      frequencies: object = None) -> None:
    """Rotary embedding's input ``(..., T, d)`` float with an even ``d``, ``base > 1``,
    ``positions`` ``None`` or ``(T,)`` and ``frequencies`` ``None`` or ``(d/2,)``."""
    if not isinstance(X, Tensor) or not X.is_floating_point() or X.dim() < 2:
        raise ValueError("X must be a floating-point tensor of shape (..., T, d)")
    T, d = X.shape[-2], X.shape[-1]
    if d % 2 != 0:
        raise ValueError(f"X must have an even last axis d (feature pairs are rotated), got {d}")
    if not _is_number(base) or not base > 1:  # type: ignore[operator]
        raise ValueError(f"base must be a number > 1, got {base!r}")
    if positions is not None and (not isinstance(positions, Tensor)
                                  or tuple(positions.shape) != (T,)):
        raise ValueError(f"positions must be a tensor of shape (T,) = ({T},), got "
                         + (str(tuple(positions.shape)) if isinstance(positions, Tensor)
                            else type(positions).__name__))
    if frequencies is not None and (not isinstance(frequencies, Tensor)
                                    or tuple(frequencies.shape) != (d // 2,)):
        raise ValueError(f"frequencies must be a tensor of shape (d/2,) = ({d // 2},), got "
                         + (str(tuple(frequencies.shape)) if isinstance(frequencies, Tensor)
                            else type(frequencies).__name__))


def check_slopes(slopes: object, num_heads: int) -> None:
    """ALiBi's slopes: a float tensor ``(H,)``."""
    if not isinstance(slopes, Tensor) or not slopes.is_floating_point() \
            or tuple(slopes.shape) != (num_heads,):
        raise ValueError(f"slopes must be a float tensor of shape (H,) = ({num_heads},), got "
                         + (f"shape {tuple(slopes.shape)} of dtype {slopes.dtype}"
                            if isinstance(slopes, Tensor) else type(slopes).__name__))

# --- serving (d2lattn.serving) ------------------------------------------------------------------

ROPE_SCALINGS = ("none", "interpolation", "ntk", "yarn")


def check_rope_scaling(method: object, factor: object, original_context: object) -> None:
    """Raise ``ValueError`` unless ``method`` is a known rotary scaling, ``factor >= 1`` a
    number, and ``original_context`` a positive integer where YaRN needs it."""
    check_choice("method", method, ROPE_SCALINGS)
    if not _is_number(factor) or not factor >= 1 or not math.isfinite(factor):  # type: ignore
        raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
    if method == "yarn":
        check_positive_ints(original_context=original_context)


def check_streaming(window: object, num_sinks: object) -> None:
    """``window``: ``None`` or a positive integer; ``num_sinks``: an integer ``>= 0``, and
    sinks only with a window (a full cache keeps every token anyway)."""
    if window is not None:
        check_positive_ints(window=window)
    check_non_negative_ints(num_sinks=num_sinks)
    if window is None and num_sinks:
        raise ValueError(f"num_sinks = {num_sinks} needs a window (a full cache keeps all)")


def check_lengths_list(lengths: object, name: str = "lengths") -> Tuple[int, ...]:
    """A non-empty sequence of non-negative integers (tokens per request), as a tuple."""
    if isinstance(lengths, Tensor):
        lengths = lengths.tolist()
    if (not isinstance(lengths, (list, tuple)) or not lengths
            or not all(_is_int(n) and n >= 0 for n in lengths)):  # type: ignore[operator]
        raise ValueError(f"{name} must be a non-empty sequence of integers >= 0, got {lengths!r}")
    return tuple(int(n) for n in lengths)  # type: ignore[arg-type]


def check_paged_chunk(keys: object, values: object, num_heads: int, head_size: int,
                      dtype: torch.dtype) -> None:
    """New keys and values for a :class:`~d2lattn.serving.PagedKVCache`: two tensors of shape
    ``(num_heads, T_new, head_size)`` and the cache's dtype."""
    for name, t in (("keys", keys), ("values", values)):
        if (not isinstance(t, Tensor) or t.dim() != 3 or t.shape[0] != num_heads
                or t.shape[2] != head_size):
            raise ValueError(f"{name} must have shape (num_heads = {num_heads}, T_new, "
                             f"head_size = {head_size}), got {_describe(t)}")
        if t.dtype != dtype:
            raise ValueError(f"{name} must have the cache's dtype {dtype}, got {t.dtype}")
    if keys.shape != values.shape:  # type: ignore[union-attr]
        raise ValueError(f"keys {tuple(keys.shape)} and values "  # type: ignore[union-attr]
                         f"{tuple(values.shape)} must have one shape")  # type: ignore
# --- linear attention and the delta rule (chapter 14) ----------------------------------------

def check_linear_qkv(queries: object, keys: object, values: object) -> None:
    """Queries ``(..., T, d_k)``, keys ``(..., T, d_k)``, values ``(..., T, d_v)``: floating
    tensors of one dtype and device, the same leading axes and the same length ``T``."""
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() < 2:
            raise ValueError(f"{name} must be a floating tensor of shape (..., T, d), "
                             f"got {_describe(t)}")
    assert isinstance(queries, Tensor) and isinstance(keys, Tensor)
    assert isinstance(values, Tensor)
    if queries.shape != keys.shape:
        raise ValueError(f"queries and keys must have the same shape (..., T, d_k), got "
                         f"{tuple(queries.shape)} and {tuple(keys.shape)}")
    if values.shape[:-1] != keys.shape[:-1]:
        raise ValueError(f"values must have shape (..., T, d_v) with the keys' leading axes "
                         f"{tuple(keys.shape[:-1])}, got {tuple(values.shape)}")
    check_same_dtype_device(queries=queries, keys=keys, values=values)


def check_chunk_size(chunk_size: object) -> None:
    """A positive integer: the number of positions per block of the chunked form."""
    check_positive_ints(chunk_size=chunk_size)


def check_linear_state(state: object, name: str, shape: Tuple[int, ...], like: Tensor) -> None:
    """``None`` or a tensor of ``shape`` with ``like``'s dtype (or float32, the dtype a state
    of half-precision inputs is carried in) and device (a carried state)."""
    if state is None:
        return
    if not isinstance(state, Tensor) or tuple(state.shape) != shape:
        raise ValueError(f"{name} must be None or a tensor of shape {shape}, got "
                         f"{_describe(state)}")
    half = like.dtype in (torch.float16, torch.bfloat16)
    if (state.dtype != like.dtype and not (half and state.dtype == torch.float32)) \
            or state.device != like.device:
        raise ValueError(f"{name} must have dtype {like.dtype}"
                         + (" or torch.float32" if half else "")
                         + f" on {like.device}, got {state.dtype} on {state.device}")


def check_gates(name: str, gate: object, keys: Tensor, low_open: bool) -> None:
    """A gate ``(..., T)`` of the keys' dtype: ``beta`` in ``[0, 2]`` (the delta rule's
    learning rate; ``low_open=False``) or ``alpha`` in ``(0, 1]`` (a decay; ``low_open=True``)."""
    shape = tuple(keys.shape[:-1])
    if not isinstance(gate, Tensor) or tuple(gate.shape) != shape:
        raise ValueError(f"{name} must be a tensor of shape (..., T) = {shape}, got "
                         f"{_describe(gate)}")
    check_same_dtype_device(keys=keys, **{name: gate})
    if not reads_values():
        return  # gates the layer made itself (a sigmoid), or compiling: not read back
    if low_open:
        if not bool(((gate > 0) & (gate <= 1)).all()):
            raise ValueError(f"{name} must lie in (0, 1] (a decay factor)")
    elif not bool(((gate >= 0) & (gate <= 2)).all()):
        raise ValueError(f"{name} must lie in [0, 2] (the delta rule is stable for "
                         f"beta * |k|^2 <= 2)")


def check_linear_rule(rule: object) -> None:
    """One of the update rules of :class:`~d2lattn.LinearMultiHeadAttention`."""
    if rule not in ("additive", "delta", "gated_delta"):
        raise ValueError(f"rule must be 'additive', 'delta' or 'gated_delta', got {rule!r}")


def check_linear_call(queries: Tensor, keys: Tensor, values: Tensor, valid_lens: object,
                      attn_mask: object, is_causal: object, scale: object) -> None:
    """The drop-in call of a causal linear-attention layer: self-attention (one tensor for
    queries, keys and values), ``is_causal=True``, no padding, mask or scale."""
    if not (queries is keys and keys is values):
        raise ValueError("a linear-attention layer is self-attention: pass the same tensor "
                         "as queries, keys and values")
    if is_causal is not True:
        raise ValueError("a linear-attention layer is causal: call it with is_causal=True")
    if valid_lens is not None or attn_mask is not None or scale is not None:
        raise ValueError("a linear-attention layer takes no valid_lens, attn_mask or scale "
                         "(its causal sum has no weights to mask)")


def check_additive_args(queries: Tensor, keys: Tensor, values: Tensor, eps: object,
                        initial_state: object) -> None:
    """The arguments of the additive linear-attention forms: queries, keys and values,
    ``eps > 0``, and ``initial_state`` ``None`` or ``(S, z)`` of the right shapes."""
    check_linear_qkv(queries, keys, values)
    check_positive("eps", eps)
    if initial_state is not None:
        if not isinstance(initial_state, tuple) or len(initial_state) != 2:
            raise ValueError("initial_state must be None or a tuple (S, z)")
        lead, d_k, d_v = tuple(keys.shape[:-2]), keys.shape[-1], values.shape[-1]
        check_linear_state(initial_state[0], "initial_state S", lead + (d_k, d_v), keys)
        check_linear_state(initial_state[1], "initial_state z", lead + (d_k,), keys)


def check_delta_args(queries: Tensor, keys: Tensor, values: Tensor, beta: object,
                     alpha: object, initial_state: object) -> None:
    """The arguments of the delta-rule forms: queries, keys and values, gates ``beta`` (and
    ``alpha``) of shape ``(..., T)``, ``initial_state`` ``None`` or ``(..., d_k, d_v)``."""
    check_linear_qkv(queries, keys, values)
    check_gates("beta", beta, keys, low_open=False)
    if alpha is not None:
        check_gates("alpha", alpha, keys, low_open=True)
    lead, d_k, d_v = tuple(keys.shape[:-2]), keys.shape[-1], values.shape[-1]
    check_linear_state(initial_state, "initial_state", lead + (d_k, d_v), keys)


# --- sets, point clouds and graphs (d2lattn.pointcloud, d2lattn.graphs) ---

def check_adjacency(adjacency: object, N: int, name: str = "adjacency") -> Tensor:
    """A graph's adjacency: a dense bool ``(N, N)`` or ``(B, N, N)`` (d2lattn.graphs)."""
    if isinstance(adjacency, Tensor) and adjacency.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) bool tensor, got the layout "
                         f"{adjacency.layout}: pass {name}.to_dense(), or, for a large graph, "
                         "its edges as edge_index (2, E)")
    if (not isinstance(adjacency, Tensor) or adjacency.dtype != torch.bool
            or adjacency.dim() not in (2, 3) or adjacency.shape[-2:] != (N, N)):
        raise ValueError(f"{name} must be a bool tensor of shape (N, N) or (B, N, N) with "
                         f"N = {N}, got {getattr(adjacency, 'dtype', type(adjacency).__name__)} "
                         f"{tuple(getattr(adjacency, 'shape', ()))}")
    return adjacency


def check_edge_index(edge_index: object, N: int) -> Tensor:
    """A graph's edges: integers ``(2, E)``, row 0 the sources, row 1 the targets, in
    ``[0, N)`` (the range is read unless :func:`reads_values` says not to)."""
    if (not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2
            or edge_index.is_floating_point() or edge_index.is_complex()
            or edge_index.dtype == torch.bool or edge_index.layout != torch.strided):
        raise ValueError("edge_index must be a dense integer tensor of shape (2, E) (sources, "
                         f"targets), got {_describe(edge_index)}")
    if edge_index.numel() and reads_values():
        low, high = (int(v) for v in torch.stack([edge_index.min(), edge_index.max()]).tolist())
        if low < 0 or high >= N:
            raise ValueError(f"edge_index entries must lie in [0, N) = [0, {N}) (node ids), got "
                             f"values in [{low}, {high}]")
    return edge_index


def check_set_lens(valid_lens: Tensor, B: int, N: int) -> Tensor:
    """Sizes of ``B`` padded sets of ``N`` elements: integers ``(B,)`` in ``[1, N]``."""
    if (not isinstance(valid_lens, Tensor) or valid_lens.shape != (B,)
            or valid_lens.is_floating_point() or valid_lens.dtype == torch.bool):
        raise ValueError(f"valid_lens must be an integer tensor of shape ({B},), got "
                         f"{getattr(valid_lens, 'shape', type(valid_lens).__name__)}")
    if bool((valid_lens < 1).any()) or bool((valid_lens > N).any()):
        raise ValueError(f"valid_lens must lie in [1, N={N}]")
    return valid_lens


def grid_parts(value: Any) -> tuple[list, list | None, list | None]:
    """(values, labels, groups) of a grid panel's entry in a frame: a plain list of rows has
    neither labels nor groups (None). Public as :func:`d2lattn.interactive.grid_parts`.

    >>> grid_parts({"values": [[0.5, 0.0]], "labels": [["a0", ""]], "groups": [[0, None]]})
    ([[0.5, 0.0]], [['a0', '']], [[0, None]])
    >>> grid_parts([[1.0]])
    ([[1.0]], None, None)
    """
    if isinstance(value, Mapping):
        return list(value["values"]), value.get("labels"), value.get("groups")
    return list(value), None, None


def check_grid_entry(panel: Mapping[str, Any], value: Any, where: str) -> None:
    """An interactive figure's grid entry in one frame: rows of numbers, or
    ``{"values", "labels", "groups"}`` of one shape (``d2lattn.interactive``)."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"values", "labels", "groups"}
        if "values" not in value or unknown:
            raise ValueError(f"{where}: a grid entry that is a dict needs 'values' and may have "
                             f"'labels' and 'groups', got the keys {sorted(value)}")
    values, labels, groups = grid_parts(value)
    shape = [len(row) for row in values]
    for name, rows in (("labels", labels), ("groups", groups)):
        if rows is not None and [len(row) for row in rows] != shape:
            raise ValueError(f"{where}: {name} must have the shape of values (rows of "
                             f"{shape}), got rows of {[len(row) for row in rows]}")
    if labels is not None and not all(isinstance(x, str) for row in labels for x in row):
        raise ValueError(f"{where}: labels must be strings (\"\" for none)")
    if groups is not None:
        n = len(panel.get("groups", []))
        bad = [g for row in groups for g in row
               if g is not None and (isinstance(g, bool) or not isinstance(g, int)
                                     or not 0 <= g < n)]
        if bad:
            raise ValueError(f"{where}: groups must be None or an index into the panel's "
                             f"{n} groups, got {bad[0]!r}")
