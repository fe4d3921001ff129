r"""Attention that chooses where to look: block-sparse attention over a selection.

Full attention scores every key for every query. Sparse attention lets each query read only
some *blocks* of keys, chosen by a fixed pattern (the Sparse Transformer's strided pattern,
BigBird's window + global + random blocks) or by the input itself (MoBA's parameter-free gate,
a DeepSeek-style indexer that picks single tokens). Whatever chooses, the attention over the
chosen keys is the same softmax; this module writes it twice:

- :func:`block_sparse_attention_reference`: the full score matrix with every unselected key
  masked, the definition;
- :func:`block_sparse_attention`: the selected blocks gathered per query, so that work and
  memory grow with the keys read (``T_q * k * S``), not with ``T_q * T_k``.

Shapes (one legend for the module):
    B batch, h heads, T_q queries, T_k keys, d the query/key size, d_v the value size,
    S the block size, n = ceil(T_k / S) key blocks (the last one may be shorter), k the
    number of blocks each query reads.

A **selection** ``block_index`` is an integer tensor ``(B, h, T_q, k)`` (a size-1 batch or
head dimension broadcasts): for each query, the key blocks it reads, each in ``[0, n)``, no
block twice, and ``-1`` in slots left empty. Under ``causal=True`` the queries are the last
``T_q`` of the ``T_k`` positions (query ``i`` sits at position ``i + T_k - T_q``, as with a KV
cache) and a query never reads a key after itself, also inside a selected block. A query that
reads no key gets zero weights and a zero output (the book's rule for an empty row, chapter 3).

Source: chapter 17; MoBA: Lu et al. (2025), "MoBA: Mixture of Block Attention for Long-Context
LLMs", arXiv 2502.13189, section 2.2; Sparse Transformer: Child et al. (2019), "Generating Long
Sequences with Sparse Transformers", section 4.2; BigBird: Zaheer et al. (2020), "Big Bird:
Transformers for Longer Sequences", section 2; the indexer: DeepSeek-AI (2025), "DeepSeek-V3.2:
Pushing the Frontier of Open Large Language Models", equation (1).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from ._checks import (check_block_selection, check_block_sparse_qkv, check_non_negative_ints,
                      check_positive_ints)

__all__ = [
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "selection_mask",
    "keys_read",
    "moba_select",
    "strided_selection",
    "bigbird_selection",
    "indexer_scores",
    "indexer_select",
    "window_selection",
    "NativeSparseAttention",
]


def _num_blocks(num_keys: int, block_size: int) -> int:
    return -(-num_keys // block_size)


# ---------------------------------------------------------------------------------------------
# which keys a selection reads


def selection_mask(block_index: Tensor, num_keys: int, *, block_size: int,
                   causal: bool = False) -> Tensor:
    """The keys each query reads, as a boolean mask.

    Args:
        block_index: ``(B, h, T_q, k)`` integer selection (see the module's docstring).
        num_keys: ``T_k``. block_size: ``S``, a positive integer.
        causal: keyword-only; also hide the keys after each query (queries are the last ``T_q``
            positions).

    Returns:
        ``(B, h, T_q, T_k)`` bool, ``True`` where the query reads the key.

    Raises:
        ValueError: a bad selection (shape, a block out of range or named twice), a bad
            ``block_size`` or ``num_keys``.

    Example:
        >>> selection_mask(torch.tensor([[[[1], [0]]]]), 4, block_size=2).int()
        tensor([[[[0, 0, 1, 1],
                  [1, 1, 0, 0]]]], dtype=torch.int32)
    """
    check_positive_ints(num_keys=num_keys, block_size=block_size)
    b, hh, T_q, _ = block_index.shape if isinstance(block_index, Tensor) and \
        block_index.dim() == 4 else (1, 1, 0, 0)
    index = check_block_selection(block_index, b, hh, T_q, _num_blocks(num_keys, block_size))
    key_block = torch.arange(num_keys, device=index.device) // block_size  # (T_k,)
    mask = (index[..., :, None] == key_block).any(dim=-2)  # (B, h, T_q, T_k)
    if causal:
        mask = mask & _causal(T_q, num_keys, index.device)
    return mask


def _causal(T_q: int, T_k: int, device: torch.device) -> Tensor:
    """``(T_q, T_k)`` bool: key ``j`` is not after query ``i`` (at position ``i + T_k - T_q``)."""
    rows = torch.arange(T_q, device=device)[:, None] + (T_k - T_q)
    return torch.arange(T_k, device=device)[None, :] <= rows


def keys_read(block_index: Tensor, num_keys: int, *, block_size: int,
              causal: bool = False) -> int:
    """How many query-key scores a selection computes: the keys read, summed over queries,
    heads and the batch (exact; full attention computes ``B h T_q T_k``, or about half of it
    under ``causal``).

    Example:
        >>> keys_read(torch.tensor([[[[1], [0]]]]), 4, block_size=2)
        4
    """
    return int(selection_mask(block_index, num_keys, block_size=block_size, causal=causal).sum())


# ---------------------------------------------------------------------------------------------
# attention over a selection


def _empty_row_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis where ``-inf`` marks a key not read; a row with no key read
    gives zeros (not NaN)."""
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = (scores - top).exp()
    total = weights.sum(dim=-1, keepdim=True)
    return weights / torch.where(total > 0, total, torch.ones_like(total))


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def block_sparse_attention_reference(queries: Tensor, keys: Tensor, values: Tensor,
                                     block_index: Tensor, *, block_size: int,
                                     causal: bool = False,
                                     scale: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    r"""Attention over the selected blocks, by definition: every score, then a mask.

    .. math:: \mathrm{softmax}\big(QK^\top / \sqrt{d} + M\big) V, \qquad
        M_{ij} = 0 \text{ if query } i \text{ reads key } j, \; -\infty \text{ otherwise}

    Args:
        queries: ``(B, h, T_q, d)`` float. keys: ``(B, h, T_k, d)``. values: ``(B, h, T_k, d_v)``.
        block_index: ``(B, h, T_q, k)`` integer selection (module docstring).
        block_size: keyword-only; ``S``. causal: keyword-only; no key after its query.
        scale: keyword-only; the score's factor, ``1 / sqrt(d)`` by default.

    Returns:
        ``(output, attention_weights)``: ``(B, h, T_q, d_v)`` and ``(B, h, T_q, T_k)``, in the
        inputs' dtype (half precision is accumulated in float32). Costs ``T_q T_k`` scores.

    Raises:
        ValueError: shapes that do not fit, mixed dtypes, a bad selection or block size.
    """
    B, h, T_q, T_k = check_block_sparse_qkv(queries, keys, values)
    check_positive_ints(block_size=block_size)
    index = check_block_selection(block_index, B, h, T_q, _num_blocks(T_k, block_size))
    c = 1 / math.sqrt(queries.shape[-1]) if scale is None else float(scale)
    acc = _acc(queries.dtype)
    read = selection_mask(index, T_k, block_size=block_size, causal=causal)  # (B, h, T_q, T_k)
    scores = queries.to(acc) @ keys.to(acc).transpose(-2, -1) * c  # (B, h, T_q, T_k)
    scores = scores.masked_fill(~read, float("-inf"))
    weights = _empty_row_softmax(scores)
    output = weights @ values.to(acc)  # (B, h, T_q, d_v)
    return output.to(queries.dtype), weights.to(queries.dtype)


def block_sparse_attention(queries: Tensor, keys: Tensor, values: Tensor, block_index: Tensor,
                           *, block_size: int, causal: bool = False,
                           scale: Optional[float] = None,
                           query_chunk: Optional[int] = None) -> Tensor:
    r"""Attention over the selected blocks, gathered: work and memory grow with the keys read.

    For each query the ``k`` selected blocks of keys and values are gathered
    (``(B, h, T_q, k S, d)``), scored, masked where a slot is empty, a key lies past the
    sequence's end or (``causal``) after the query, and pooled. It equals
    :func:`block_sparse_attention_reference` (values and gradients; tests/test_sparse.py) at
    ``T_q k S`` scores instead of ``T_q T_k``.

    Args and Raises: as :func:`block_sparse_attention_reference`, and ``query_chunk``
    (keyword-only): gather for this many queries at a time (``None``: all at once). The work is
    the same; the memory of the gathered keys and values is ``query_chunk * k * S * (d + d_v)``
    numbers instead of ``T_q * k * S * (d + d_v)``.

    Returns:
        ``(B, h, T_q, d_v)`` in the inputs' dtype.

    Example:
        >>> q, k, v = torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 3)
        >>> sel = torch.tensor([[[[0], [0], [1], [1]]]])  # each query reads its own block
        >>> out = block_sparse_attention(q, k, v, sel, block_size=2, causal=True)
        >>> ref, _ = block_sparse_attention_reference(q, k, v, sel, block_size=2, causal=True)
        >>> torch.allclose(out, ref)
        True
    """
    B, h, T_q, T_k = check_block_sparse_qkv(queries, keys, values)
    check_positive_ints(block_size=block_size)
    n = _num_blocks(T_k, block_size)
    index = check_block_selection(block_index, B, h, T_q, n)  # (B, h, T_q, k)
    if query_chunk is not None:
        check_positive_ints(query_chunk=query_chunk)
        if query_chunk < T_q:
            return torch.cat([
                _gathered(queries[:, :, i:i + query_chunk], keys, values,
                          index[:, :, i:i + query_chunk], block_size, causal, scale,
                          offset=T_k - T_q + i)
                for i in range(0, T_q, query_chunk)], dim=2)
    return _gathered(queries, keys, values, index, block_size, causal, scale, offset=T_k - T_q)


def _gathered(queries: Tensor, keys: Tensor, values: Tensor, index: Tensor, block_size: int,
              causal: bool, scale: Optional[float], offset: int) -> Tensor:
    """:func:`block_sparse_attention` for queries at positions ``offset, offset + 1, ...``
    (inputs already checked)."""
    B, h, T_q, _ = queries.shape
    T_k = keys.shape[2]
    n = _num_blocks(T_k, block_size)
    S, d, d_v, k = block_size, queries.shape[-1], values.shape[-1], index.shape[-1]
    c = 1 / math.sqrt(d) if scale is None else float(scale)
    acc = _acc(queries.dtype)
    pad = n * S - T_k  # the last block, filled up to S (the filler is never read)
    kb = torch.nn.functional.pad(keys.to(acc), (0, 0, 0, pad)).reshape(B * h, n, S * d)
    vb = torch.nn.functional.pad(values.to(acc), (0, 0, 0, pad)).reshape(B * h, n, S * d_v)
    flat = index.reshape(B * h, T_q, k)
    rows = torch.arange(B * h, device=queries.device)[:, None, None]
    safe = flat.clamp(min=0)
    k_sel = kb[rows, safe].reshape(B * h, T_q, k * S, d)  # (Bh, T_q, kS, d)
    v_sel = vb[rows, safe].reshape(B * h, T_q, k * S, d_v)  # (Bh, T_q, kS, d_v)
    position = (safe[..., None] * S + torch.arange(S, device=queries.device))  # (Bh, T_q, k, S)
    read = (flat[..., None] >= 0) & (position < T_k)
    if causal:
        last = torch.arange(T_q, device=queries.device)[None, :, None, None] + offset
        read = read & (position <= last)
    read = read.reshape(B * h, T_q, k * S)
    q = queries.to(acc).reshape(B * h, T_q, 1, d)
    scores = (q @ k_sel.transpose(-2, -1)).squeeze(-2) * c  # (Bh, T_q, kS)
    weights = _empty_row_softmax(scores.masked_fill(~read, float("-inf")))
    output = (weights[..., None, :] @ v_sel).squeeze(-2)  # (Bh, T_q, d_v)
    return output.reshape(B, h, T_q, d_v).to(queries.dtype)


# ---------------------------------------------------------------------------------------------
# choosing: a parameter-free gate (MoBA), fixed patterns, an indexer


def _sorted_selection(chosen: Tensor, keep: Tensor) -> Tensor:
    """The chosen block numbers, empty slots ``-1``, in increasing order with ``-1`` last."""
    big = torch.iinfo(torch.long).max
    ordered = torch.where(keep, chosen, torch.full_like(chosen, big)).sort(dim=-1).values
    return torch.where(ordered == big, torch.full_like(ordered, -1), ordered)


def moba_select(queries: Tensor, keys: Tensor, *, block_size: int, top_k: int,
                causal: bool = True) -> Tensor:
    r"""MoBA's gate: each query reads the ``top_k`` blocks whose mean key it scores highest.

    .. math:: s_{i} = \langle q, \bar k_{I_i} \rangle, \quad
        \bar k_{I_i} = \tfrac{1}{|I_i|} \textstyle\sum_{j \in I_i} k_j, \qquad
        \text{read } \operatorname{top-}k_i\, s_i

    No parameters: the gate learns only through the attention it selects. Under ``causal``
    (MoBA's setting) the blocks after the query's own are never chosen and the query's own
    block always is (then masked causally inside by the attention).

    Args:
        queries: ``(B, h, T_q, d)`` float. keys: ``(B, h, T_k, d)``.
        block_size: keyword-only; ``S``. top_k: keyword-only; blocks per query, ``>= 1``.
        causal: keyword-only; as in the module's docstring.

    Returns:
        ``(B, h, T_q, top_k)`` int64 selection, blocks in increasing order, ``-1`` in the slots
        left when fewer blocks are allowed (early queries under ``causal``).

    Raises:
        ValueError: bad shapes, block size or ``top_k``.

    Source: Lu et al. (2025), arXiv 2502.13189, section 2.2, equations (3)-(5).
    """
    B, h, T_q, T_k = check_block_sparse_qkv(queries, keys, keys)
    check_positive_ints(block_size=block_size, top_k=top_k)
    n = _num_blocks(T_k, block_size)
    acc = _acc(queries.dtype)
    pad = n * block_size - T_k
    sums = torch.nn.functional.pad(keys.to(acc), (0, 0, 0, pad)).reshape(
        B, h, n, block_size, -1).sum(dim=-2)  # (B, h, n, d)
    sizes = torch.full((n,), float(block_size), dtype=acc, device=keys.device)
    sizes[-1] = T_k - (n - 1) * block_size
    means = sums / sizes[:, None]
    gate = queries.to(acc) @ means.transpose(-2, -1)  # (B, h, T_q, n)
    allowed = torch.ones(T_q, n, dtype=torch.bool, device=queries.device)
    if causal:
        own = (torch.arange(T_q, device=queries.device) + (T_k - T_q)) // block_size  # (T_q,)
        blocks = torch.arange(n, device=queries.device)
        allowed = blocks[None, :] <= own[:, None]
        gate = torch.where(blocks == own[:, None], torch.full_like(gate, float("inf")), gate)
    gate = gate.masked_fill(~allowed, float("-inf"))
    k = min(top_k, n)
    top = gate.topk(k, dim=-1)  # ties: torch.topk's order
    chosen = _sorted_selection(top.indices, top.values > float("-inf"))
    if k < top_k:
        chosen = torch.nn.functional.pad(chosen, (0, top_k - k), value=-1)
    return chosen


def _per_query(block_rows: Tensor, num_queries: int, query_block: int) -> Tensor:
    """``(n_q, k)`` selections of query blocks, given to each query: ``(1, 1, T_q, k)``."""
    owner = torch.arange(num_queries) // query_block
    return block_rows[owner][None, None]


def _pad_rows(rows: list) -> Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([sorted(r) + [-1] * (width - len(r)) for r in rows], dtype=torch.long)


def strided_selection(num_tokens: int, *, block_size: int, local_blocks: int,
                      stride: int) -> Tensor:
    r"""The Sparse Transformer's strided pattern, in blocks, for causal self-attention.

    Query block ``b`` reads its own block and the ``local_blocks - 1`` before it (the first
    head's pattern, :math:`A^{(1)}`) and every earlier block ``j`` with
    :math:`(b - j) \bmod \text{stride} = 0` (the second head's, :math:`A^{(2)}`), here merged
    into one selection.

    Returns:
        ``(1, 1, T, k)`` int64 selection (broadcasts over batch and heads), ``-1`` padded.

    Source: Child et al. (2019), arXiv 1904.10509, section 4.2 (strided attention).
    """
    check_positive_ints(num_tokens=num_tokens, block_size=block_size, local_blocks=local_blocks,
                        stride=stride)
    n = _num_blocks(num_tokens, block_size)
    rows = [{j for j in range(max(0, b - local_blocks + 1), b + 1)}
            | {j for j in range(b + 1) if (b - j) % stride == 0} for b in range(n)]
    return _per_query(_pad_rows(rows), num_tokens, block_size)


def bigbird_selection(num_tokens: int, *, block_size: int, window_blocks: int = 3,
                      global_blocks: int = 1, random_blocks: int = 1,
                      generator: Optional[torch.Generator] = None) -> Tensor:
    r"""BigBird's pattern, in blocks, for bidirectional attention: a window, global blocks and
    random blocks.

    Query block ``b`` reads the ``window_blocks`` blocks centred on it, the first
    ``global_blocks`` blocks, and ``random_blocks`` other blocks drawn without replacement
    (from ``generator``); a global block's queries read every block.

    Returns:
        ``(1, 1, T, k)`` int64 selection (broadcasts over batch and heads), ``-1`` padded.

    Source: Zaheer et al. (2020), arXiv 2007.14062, section 2 (BigBird-ITC) and appendix D
    (the blocked form).
    """
    check_positive_ints(num_tokens=num_tokens, block_size=block_size, window_blocks=window_blocks)
    check_non_negative_ints(global_blocks=global_blocks, random_blocks=random_blocks)
    n = _num_blocks(num_tokens, block_size)
    half = window_blocks // 2
    rows = []
    for b in range(n):
        if b < global_blocks:
            rows.append(set(range(n)))
            continue
        row = set(range(max(0, b - half), min(n, b - half + window_blocks))) | \
            set(range(min(global_blocks, n)))
        others = [j for j in range(n) if j not in row]
        if others and random_blocks:
            pick = torch.randperm(len(others), generator=generator)[:random_blocks]
            row |= {others[int(i)] for i in pick}
        rows.append(row)
    return _per_query(_pad_rows(rows), num_tokens, block_size)


def indexer_scores(index_queries: Tensor, index_keys: Tensor, head_weights: Tensor) -> Tensor:
    r"""A lightning indexer's scores: how much each query wants each past token.

    .. math:: I_{t,s} = \sum_{j=1}^{H_I} w_{t,j}\, \mathrm{ReLU}\big(q^I_{t,j} \cdot k^I_s\big)

    A few small heads in low precision in DeepSeek-V3.2; each query then attends to the
    ``top_k`` tokens by this score (:func:`indexer_select`).

    Args:
        index_queries: ``(B, T_q, H_I, d_I)`` float. index_keys: ``(B, T_k, d_I)`` (one key per
            token, shared by the indexer's heads). head_weights: ``(B, T_q, H_I)``.

    Returns:
        ``(B, T_q, T_k)`` scores.

    Source: DeepSeek-AI (2025), DeepSeek-V3.2, equation (1).
    """
    if not isinstance(index_queries, Tensor) or index_queries.dim() != 4:
        raise ValueError("index_queries must be a tensor of shape (B, T_q, H_I, d_I), got "
                         f"{getattr(index_queries, 'shape', type(index_queries).__name__)}")
    B, T_q, H, d = index_queries.shape
    if not isinstance(index_keys, Tensor) or index_keys.dim() != 3 or \
            index_keys.shape[0] != B or index_keys.shape[2] != d:
        raise ValueError(f"index_keys must have shape (B, T_k, d_I) = ({B}, T_k, {d}), got "
                         f"{getattr(index_keys, 'shape', type(index_keys).__name__)}")
    if not isinstance(head_weights, Tensor) or tuple(head_weights.shape) != (B, T_q, H):
        raise ValueError(f"head_weights must have shape (B, T_q, H_I) = ({B}, {T_q}, {H}), got "
                         f"{getattr(head_weights, 'shape', type(head_weights).__name__)}")
    dots = torch.einsum("bqhd,bkd->bqhk", index_queries, index_keys)  # (B, T_q, H_I, T_k)
    return (head_weights[..., None] * dots.relu()).sum(dim=2)  # (B, T_q, T_k)


def indexer_select(scores: Tensor, *, top_k: int, causal: bool = True) -> Tensor:
    """The ``top_k`` tokens of each query by an indexer's scores, as a selection of blocks of
    one token (``block_size=1``), shared by every head.

    Args:
        scores: ``(B, T_q, T_k)`` float (:func:`indexer_scores`). top_k: keyword-only, ``>= 1``.
        causal: keyword-only; only tokens up to the query (queries are the last ``T_q``).

    Returns:
        ``(B, 1, T_q, top_k)`` int64, tokens in increasing order, ``-1`` in slots left empty.
    """
    if not isinstance(scores, Tensor) or scores.dim() != 3 or not scores.is_floating_point():
        raise ValueError("scores must be a float tensor of shape (B, T_q, T_k), got "
                         f"{getattr(scores, 'shape', type(scores).__name__)}")
    check_positive_ints(top_k=top_k)
    _, T_q, T_k = scores.shape
    if causal:
        if T_q > T_k:
            raise ValueError(f"causal selection needs T_q <= T_k, got {T_q} > {T_k}")
        scores = scores.masked_fill(~_causal(T_q, T_k, scores.device), float("-inf"))
    k = min(top_k, T_k)
    top = scores.topk(k, dim=-1)
    chosen = _sorted_selection(top.indices, top.values > float("-inf"))
    if k < top_k:
        chosen = torch.nn.functional.pad(chosen, (0, top_k - k), value=-1)
    return chosen[:, None]


# ---------------------------------------------------------------------------------------------
# Native Sparse Attention: three branches mixed by learned gates


def window_selection(num_tokens: int, window: int) -> Tensor:
    """Causal sliding window as a selection of one-token blocks: token ``t`` reads tokens
    ``t - window + 1 .. t`` (``block_size=1``; ``-1`` where the window starts before 0).

    Returns:
        ``(1, 1, T, window)`` int64.
    """
    check_positive_ints(num_tokens=num_tokens, window=window)
    t = torch.arange(num_tokens)[:, None]
    tokens = t - torch.arange(window - 1, -1, -1)[None, :]  # (T, window), increasing
    return torch.where(tokens >= 0, tokens, torch.full_like(tokens, -1))[None, None]


class NativeSparseAttention(torch.nn.Module):
    r"""Native Sparse Attention (NSA): compressed blocks, selected blocks and a window, gated.

    .. math:: o_t = \sum_{c \in \{\mathrm{cmp}, \mathrm{slc}, \mathrm{win}\}}
        g^c_t \,\mathrm{Attn}\big(q_t, \tilde K^c_t, \tilde V^c_t\big), \qquad g^c_t \in (0, 1)

    1. **Compression**: each complete block of ``block_size`` keys (values) becomes one key
       (value) by a learned map of the block with its positions, :math:`\varphi(k_{il+1..il+l})`
       (the paper's eq. 7 with stride = block length); a query attends over the compressed
       blocks that end at or before it.
    2. **Selection**: the compressed branch's attention probabilities score the blocks (eq. 8,
       with equal compression and selection blocks); each query reads the ``top_n`` best blocks
       in full, its own block always among them (masked causally inside), through
       :func:`block_sparse_attention`. The choice is not differentiable; the scores it uses are
       learned by the compressed branch.
    3. **Window**: the last ``window`` tokens.

    The gates are a sigmoid of a linear map of the token (eq. 5). One key/value head per query
    head here (the paper shares them in GQA groups and sums the group's selection scores).

    Args:
        num_hiddens: ``D``. num_heads: ``h`` (``D`` divisible by ``h``).
        block_size: keyword-only; ``l``, the compression and selection block length.
        top_n: keyword-only; blocks read in full by each query. window: keyword-only.
        bias: keyword-only; biases of the projections.

    Shapes (``forward``):
        ``X`` ``(B, T, D)`` float, causal self-attention; returns ``(B, T, D)``. After a call,
        ``selection`` holds the blocks chosen, ``(B, h, T, top_n)``, and ``gates`` the three
        gates, ``(B, T, h, 3)`` (compressed, selected, window).

    Raises:
        ValueError: bad sizes at construction, an input that is not ``(B, T, D)``.

    Source: Yuan et al. (2025), "Native Sparse Attention: Hardware-Aligned and Natively
    Trainable Sparse Attention", arXiv 2502.11089, section 3.2-3.3, equations (5)-(12).
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, block_size: int, top_n: int,
                 window: int, bias: bool = False) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, num_heads=num_heads, block_size=block_size,
                            top_n=top_n, window=window)
        if num_hiddens % num_heads:
            raise ValueError(f"num_hiddens ({num_hiddens}) must be divisible by num_heads "
                             f"({num_heads})")
        self.num_heads, self.block_size, self.top_n, self.window = num_heads, block_size, top_n, window
        d_h = num_hiddens // num_heads
        self.W_q = torch.nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = torch.nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_v = torch.nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_o = torch.nn.Linear(num_hiddens, num_hiddens, bias=bias)
        # phi: the block's keys (values) with a learned position each, flattened, to one
        self.block_positions = torch.nn.Parameter(torch.zeros(block_size, d_h))
        self.compress_keys = torch.nn.Linear(block_size * d_h, d_h)
        self.compress_values = torch.nn.Linear(block_size * d_h, d_h)
        self.W_gate = torch.nn.Linear(num_hiddens, 3 * num_heads)
        self.selection: Optional[Tensor] = None
        self.gates: Optional[Tensor] = None

    def compress(self, X: Tensor, phi: torch.nn.Linear) -> Tensor:
        """``(B, h, T, d_h)`` -> ``(B, h, T // l, d_h)``: one summary per complete block."""
        B, h, T, d_h = X.shape
        n, l = T // self.block_size, self.block_size
        blocks = X[:, :, :n * l].reshape(B, h, n, l, d_h) + self.block_positions
        return phi(blocks.reshape(B, h, n, l * d_h))

    def forward(self, X: Tensor) -> Tensor:
        """Causal self-attention of ``X`` ``(B, T, D)`` float; returns ``(B, T, D)`` and
        keeps ``selection`` ``(B, h, T, top_n)`` and ``gates`` ``(B, T, h, 3)``."""
        if not isinstance(X, Tensor) or X.dim() != 3 or X.shape[-1] != self.W_q.in_features:
            raise ValueError(f"X must be a float tensor of shape (B, T, {self.W_q.in_features}), "
                             f"got {getattr(X, 'shape', type(X).__name__)}")
        B, T, D = X.shape
        h, l = self.num_heads, self.block_size
        split = lambda Y: Y.reshape(B, T, h, D // h).transpose(1, 2)  # noqa: E731  (B, h, T, d_h)
        q, k, v = split(self.W_q(X)), split(self.W_k(X)), split(self.W_v(X))
        scale = 1 / math.sqrt(D // h)
        # 1. compressed blocks; block i (positions il .. il + l - 1) is seen from t >= il + l - 1
        k_cmp, v_cmp = self.compress(k, self.compress_keys), self.compress(v, self.compress_values)
        n_cmp = k_cmp.shape[2]
        ends = torch.arange(n_cmp, device=X.device) * l + l - 1
        seen = ends[None, :] <= torch.arange(T, device=X.device)[:, None]  # (T, n_cmp)
        scores = (q @ k_cmp.transpose(-2, -1) * scale).masked_fill(~seen, float("-inf"))
        p_cmp = _empty_row_softmax(scores)  # (B, h, T, n_cmp)
        o_cmp = p_cmp @ v_cmp  # (B, h, T, d_h)
        # 2. selection from the compressed scores (own block forced), blocks read in full
        n = _num_blocks(T, l)
        block_score = torch.full((B, h, T, n), float("-inf"), dtype=p_cmp.dtype, device=X.device)
        block_score[..., :n_cmp] = torch.where(seen, p_cmp.detach(), block_score[..., :n_cmp])
        own = torch.arange(T, device=X.device) // l
        block_score = torch.where(torch.arange(n, device=X.device) == own[:, None],
                                  torch.full_like(block_score, float("inf")), block_score)
        top = block_score.topk(min(self.top_n, n), dim=-1)
        chosen = _sorted_selection(top.indices, top.values > float("-inf"))
        o_slc = block_sparse_attention(q, k, v, chosen, block_size=l, causal=True)
        # 3. the window, a selection of single tokens
        o_win = block_sparse_attention(q, k, v, window_selection(T, self.window).to(X.device),
                                       block_size=1, causal=True)
        gates = torch.sigmoid(self.W_gate(X)).reshape(B, T, h, 3)
        g = gates.permute(0, 2, 1, 3)  # (B, h, T, 3)
        out = g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win  # (B, h, T, d_h)
        self.selection, self.gates = chosen, gates.detach()
        return self.W_o(out.transpose(1, 2).reshape(B, T, D))
