"""The Transformer's encoder and decoder blocks, built from d2lattn's attention, and a KV cache.

Each block is multi-head attention and a position-wise feed-forward network, each wrapped in a
residual connection and a LayerNorm (Vaswani et al., 2017, section 3.1)::

    post-norm (norm_first=False, the paper):   X = norm(X + sublayer(X))
    pre-norm  (norm_first=True,  GPT-2 on):    X = X + sublayer(norm(X))

``from_torch`` copies the weights of ``torch.nn.TransformerEncoderLayer`` /
``TransformerDecoderLayer`` (``batch_first=True``; any activation, with or without biases), and
the copy gives the same outputs: the tests compare them in float64.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_block_args,
    check_bool,
    check_dropout,
    check_hidden_states,
    check_positive_ints,
    check_torch_layer,
    ValidLens,
)
from .kvcache import KVCache  # re-exported: the old path works
from .multihead import MultiHeadAttention

#: An activation: ``"relu"``, ``"gelu"`` or any callable ``Tensor -> Tensor`` (as
#: ``nn.TransformerEncoderLayer``'s ``activation``).
Activation = Union[str, Callable[[Tensor], Tensor]]
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}

__all__ = ["PositionWiseFFN", "TransformerDecoderBlock", "TransformerEncoderBlock"]


class PositionWiseFFN(nn.Module):
    r"""The position-wise feed-forward network: the same two-layer MLP at every position.

    .. math:: \mathrm{FFN}(\mathbf x) = W_2\, \mathrm{dropout}(\sigma(W_1 \mathbf x + b_1)) + b_2

    Args:
        num_hiddens: input and output size.
        ffn_num_hiddens: hidden size (4 * num_hiddens in the paper).
        dropout: dropout after the activation, in ``[0, 1)``.
        activation: keyword-only; :math:`\sigma`, ``"relu"`` (the paper), ``"gelu"`` or a
            callable ``Tensor -> Tensor`` (an ``nn.Module`` is registered as a submodule).
        bias: keyword-only; whether the two linear layers have biases.

    Shapes (``forward``): X ``(B, T, num_hiddens)`` -> ``(B, T, num_hiddens)``.

    Raises:
        ValueError: a size that is not a positive integer, a dropout outside ``[0, 1)``, or an
            activation that is neither ``"relu"``, ``"gelu"`` nor callable.

    Example:
        >>> PositionWiseFFN(8, 32)(torch.ones(2, 3, 8)).shape
        torch.Size([2, 3, 8])

    Source: Vaswani et al. (2017), section 3.3, equation (2).
    """

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, dropout: float = 0.0, *,
                 activation: Activation = "relu", bias: bool = True) -> None:
        super().__init__()
        check_positive_ints(num_hiddens=num_hiddens, ffn_num_hiddens=ffn_num_hiddens)
        check_dropout(dropout)
        check_bool(bias=bias)
        self.dense1 = nn.Linear(num_hiddens, ffn_num_hiddens, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.dense2 = nn.Linear(ffn_num_hiddens, num_hiddens, bias=bias)
        self.activation = _activation(activation)

    def forward(self, X: Tensor) -> Tensor:
        """``X`` ``(..., num_hiddens)`` float -> ``(..., num_hiddens)``, position by position."""
        return self.dense2(self.dropout(self.activation(self.dense1(X))))  # (B, T, num_hiddens)


def _activation(activation: Activation) -> Callable[[Tensor], Tensor]:
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be 'relu', 'gelu' or a callable, "
                             f"got {activation!r}")
        return _ACTIVATIONS[activation]
    if not callable(activation):
        raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    return activation


def _copy_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    """Copy nn.MultiheadAttention's packed in-projection and out-projection into ours."""
    W_q, W_k, W_v = ref.in_proj_weight.chunk(3)
    biases = (None,) * 3 if ref.in_proj_bias is None else ref.in_proj_bias.chunk(3)
    for lin, W, b in ((ours.W_q, W_q, biases[0]), (ours.W_k, W_k, biases[1]),
                      (ours.W_v, W_v, biases[2]),
                      (ours.W_o, ref.out_proj.weight, ref.out_proj.bias)):
        lin.weight.copy_(W)
        if b is not None:
            lin.bias.copy_(b)


def _torch_activation(layer: nn.Module) -> Activation:
    """The layer's activation: F.relu and F.gelu as names, anything else a (copied) callable."""
    act = layer.activation
    for name, fn in _ACTIVATIONS.items():
        if act is fn:
            return name
    return copy.deepcopy(act) if isinstance(act, nn.Module) else act


class _TransformerBlock(nn.Module):
    """What the two blocks share: their arguments and checks, the building of their sublayers,
    and ``from_torch``.

    The sublayers are built in the order of the forward pass, which is also the order of the
    seeded initialization and of the ``state_dict``: ``self_attention`` and ``norm1``; in the
    decoder, ``cross_attention`` and ``norm2``; ``ffn`` and the last LayerNorm; then one
    dropout per sublayer (``dropout1``, ``dropout2``, ...).
    """

    _cross_attends = False  # True in the decoder block
    _torch_cls: type = nn.Module  # the PyTorch layer ``from_torch`` copies

    def __init__(self, num_hiddens: int, num_heads: int, ffn_num_hiddens: int,
                 dropout: float = 0.0, *, norm_first: bool = False,
                 layer_norm_eps: float = 1e-5, rotary: bool = False,
                 activation: Activation = "relu", bias: bool = True,
                 self_attention: Optional[nn.Module] = None) -> None:
        super().__init__()
        check_block_args(num_hiddens, num_heads, ffn_num_hiddens, dropout, norm_first,
                         layer_norm_eps, bias)
        if self_attention is not None and not isinstance(self_attention, nn.Module):
            raise ValueError(f"self_attention must be None or an nn.Module, got "
                             f"{type(self_attention).__name__}")
        self.num_hiddens = num_hiddens
        self.norm_first = norm_first

        def layer_norm() -> nn.LayerNorm:
            return nn.LayerNorm(num_hiddens, eps=layer_norm_eps, bias=bias)

        if self_attention is None:
            self_attention = MultiHeadAttention(num_hiddens, num_heads, dropout, bias=bias,
                                                rotary=rotary)
        self.self_attention = self_attention
        self.norm1 = layer_norm()
        if self._cross_attends:
            self.cross_attention = MultiHeadAttention(num_hiddens, num_heads, dropout, bias=bias)
            self.norm2 = layer_norm()
        self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens, dropout,
                                   activation=activation, bias=bias)
        num_sublayers = 3 if self._cross_attends else 2
        self.add_module(f"norm{num_sublayers}", layer_norm())
        for i in range(1, num_sublayers + 1):
            self.add_module(f"dropout{i}", nn.Dropout(dropout))

    @classmethod
    def _from_torch(cls, layer: nn.Module) -> "_TransformerBlock":
        """Both blocks' ``from_torch``: the sizes and options of ``layer``, then its weights."""
        bias = check_torch_layer(layer, cls._torch_cls)
        ref = layer.self_attn
        block = cls(ref.embed_dim, ref.num_heads, layer.linear1.out_features, layer.dropout.p,
                    norm_first=layer.norm_first, layer_norm_eps=layer.norm1.eps,
                    activation=_torch_activation(layer), bias=bias)
        block.to(device=ref.in_proj_weight.device, dtype=ref.in_proj_weight.dtype)
        with torch.no_grad():
            _copy_mha(block.self_attention, ref)
            if cls._cross_attends:
                _copy_mha(block.cross_attention, layer.multihead_attn)
            block.ffn.dense1.load_state_dict(layer.linear1.state_dict())
            block.ffn.dense2.load_state_dict(layer.linear2.state_dict())
            for name, norm in layer.named_children():
                if name.startswith("norm"):
                    getattr(block, name).load_state_dict(norm.state_dict())
        return block.train(layer.training)


class TransformerEncoderBlock(_TransformerBlock):
    r"""A Transformer encoder block: self-attention and a feed-forward network, each with a
    residual connection and LayerNorm.

    .. math::
        \text{post-norm:}\quad & Y = \mathrm{LN}_1(X + \mathrm{MHA}(X, X, X)), \quad
            Z = \mathrm{LN}_2(Y + \mathrm{FFN}(Y)) \\
        \text{pre-norm:}\quad & Y = X + \mathrm{MHA}(\mathrm{LN}_1 X), \quad
            Z = Y + \mathrm{FFN}(\mathrm{LN}_2 Y)

    Args:
        num_hiddens: d, the model size (input and output).
        num_heads: h; must divide ``num_hiddens``.
        ffn_num_hiddens: hidden size of the feed-forward network.
        dropout: dropout on the attention weights, after the activation and on each
            sublayer's output before it is added to the residual (where
            ``nn.TransformerEncoderLayer`` puts it), in ``[0, 1)``.
        norm_first: keyword-only; False for post-norm (the paper), True for pre-norm.
        layer_norm_eps: keyword-only; the LayerNorms' epsilon, a positive number.
        rotary: keyword-only; rotary position embedding in the self-attention (see
            :class:`~d2lattn.MultiHeadAttention`).
        activation: keyword-only; the feed-forward network's activation, ``"relu"``,
            ``"gelu"`` or a callable (see :class:`PositionWiseFFN`).
        bias: keyword-only; False removes every bias: the attention's projections, the
            feed-forward network's and the LayerNorms' (``nn.TransformerEncoderLayer``'s
            ``bias``).
        self_attention: keyword-only; ``None`` (default) builds the multi-head attention
            below; or a module built by the caller that takes the same call,
            ``self_attention(Z, Z, Z, valid_lens, attn_mask=, is_causal=, kv_cache=)`` ->
            ``(B, T, num_hiddens)``: chapter 14's recurrent cores and chapter 15's latent
            attention enter a :class:`~d2lattn.GPT` this way (``rotary`` is then unused).

    Submodules:
        self_attention: ``MultiHeadAttention(num_hiddens, num_heads, dropout, bias)``, or the
            module given.
        norm1, norm2: ``nn.LayerNorm(num_hiddens, bias=bias)``.
        ffn: :class:`PositionWiseFFN`.

    Shapes (``forward``):
        X ``(B, T, num_hiddens)`` float, the parameters' dtype; ``valid_lens`` ``None``,
        ``(B,)`` or ``(B, T)`` integers (padding keys get no weight). Keyword-only:
        ``attn_mask`` (bool, True = may attend, or float, added to the scores, as in
        :class:`~d2lattn.MultiHeadAttention`), ``is_causal`` (True makes the block a GPT-style
        decoder block) and ``kv_cache`` (a :class:`KVCache`, for decoding with
        ``is_causal=True``). Returns ``(B, T, num_hiddens)``.

    Raises:
        ValueError: bad constructor arguments (``layer_norm_eps <= 0`` included); in
            ``forward``, ``X`` not ``(B, T, num_hiddens)`` float of the parameters' dtype, bad
            masks, or a ``kv_cache`` with ``is_causal=False`` and several new positions.

    Example:
        >>> block = TransformerEncoderBlock(num_hiddens=16, num_heads=4, ffn_num_hiddens=32)
        >>> block(torch.ones(2, 5, 16), torch.tensor([3, 5])).shape
        torch.Size([2, 5, 16])

    Source: Vaswani et al. (2017), section 3.1 and figure 1; pre-norm: Xiong et al. (2020),
    "On Layer Normalization in the Transformer Architecture", figure 1.
    """

    _torch_cls = nn.TransformerEncoderLayer
    norm2: nn.LayerNorm  # after the feed-forward network
    dropout1: nn.Dropout
    dropout2: nn.Dropout

    def forward(self, X: Tensor, valid_lens: Optional[ValidLens] = None, *,
                attn_mask: Optional[Tensor] = None, is_causal: bool = False,
                kv_cache: Optional[KVCache] = None,
                attention: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
        """One block: ``X`` ``(B, T, d)`` -> ``(B, T, d)``; see the class docstring.

        ``attention`` (keyword-only) replaces the call of ``self.self_attention`` by a
        function of the (normalised) input ``Z`` ``(B, T, d)`` that returns ``(B, T, d)``,
        for one call: the residuals, norms, dropouts and feed-forward network stay the
        block's own (:func:`~d2lattn.serving.gpt_logits` runs a GPT under a cache policy this
        way). It takes no ``valid_lens``, ``attn_mask``, ``is_causal`` or ``kv_cache``.
        """
        check_hidden_states(X, self.num_hiddens, dtype=self.norm1.weight.dtype)
        if attention is not None and (valid_lens is not None or attn_mask is not None
                                      or is_causal or kv_cache is not None):
            raise ValueError("attention replaces the self-attention call: leave valid_lens, "
                             "attn_mask, is_causal and kv_cache at their defaults")

        def attend(Z: Tensor) -> Tensor:
            if attention is not None:
                return self.dropout1(attention(Z))  # (B, T, d)
            out = self.self_attention(Z, Z, Z, valid_lens, attn_mask=attn_mask,
                                      is_causal=is_causal, kv_cache=kv_cache)
            return self.dropout1(out)  # (B, T, d)

        def feed_forward(Z: Tensor) -> Tensor:
            return self.dropout2(self.ffn(Z))  # (B, T, d)

        if self.norm_first:
            X = X + attend(self.norm1(X))  # 1. self-attention, 2. add
            return X + feed_forward(self.norm2(X))  # 3. feed-forward, 4. add
        X = self.norm1(X + attend(X))  # 1. self-attention, 2. add & norm
        return self.norm2(X + feed_forward(X))  # 3. feed-forward, 4. add & norm

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "TransformerEncoderBlock":
        """A block with the weights, sizes, dtype and device of a PyTorch encoder layer.

        Args:
            layer: ``nn.TransformerEncoderLayer`` built with ``batch_first=True``; any
                activation (ReLU, GELU, a callable: a module is copied), with biases or
                ``bias=False``.

        Returns:
            a :class:`TransformerEncoderBlock` in the same train/eval mode whose outputs equal
            the layer's (``valid_lens`` for ``src_key_padding_mask``, ``is_causal=True`` for a
            causal ``src_mask``, ``attn_mask`` for another ``src_mask``: a float one as it is,
            a bool one negated, since PyTorch's True means *ignore*).

        Raises:
            ValueError: if ``layer`` is not such a layer.

        Example:
            >>> ref = torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)
            >>> TransformerEncoderBlock.from_torch(ref).ffn.dense1.weight.shape
            torch.Size([16, 8])

        Source: the parameter layout of ``torch.nn.TransformerEncoderLayer``.
        """
        return cls._from_torch(layer)


class TransformerDecoderBlock(_TransformerBlock):
    r"""A Transformer decoder block: masked self-attention, cross-attention to the encoder's
    output, and a feed-forward network, each with a residual connection and LayerNorm.

    .. math::
        \text{post-norm:}\quad & Y = \mathrm{LN}_1(X + \mathrm{MHA}_{\text{causal}}(X, X, X)),
            \quad Z = \mathrm{LN}_2(Y + \mathrm{MHA}(Y, M, M)), \quad
            O = \mathrm{LN}_3(Z + \mathrm{FFN}(Z)) \\
        \text{pre-norm:}\quad & Y = X + \mathrm{MHA}_{\text{causal}}(\mathrm{LN}_1 X), \quad
            Z = Y + \mathrm{MHA}(\mathrm{LN}_2 Y, M, M), \quad O = Z + \mathrm{FFN}(\mathrm{LN}_3 Z)

    where :math:`M` is the encoder's output (the *memory*).

    Args:
        num_hiddens: d, the model size; the memory has this size too.
        num_heads: h; must divide ``num_hiddens``.
        ffn_num_hiddens: hidden size of the feed-forward network.
        dropout: as in :class:`TransformerEncoderBlock`, in ``[0, 1)``.
        norm_first: keyword-only; False for post-norm, True for pre-norm.
        layer_norm_eps: keyword-only; the LayerNorms' epsilon, a positive number.
        rotary: keyword-only; rotary position embedding in the self-attention only.
        activation, bias, self_attention: keyword-only; as in
            :class:`TransformerEncoderBlock`.

    Submodules:
        self_attention, cross_attention: ``MultiHeadAttention(num_hiddens, num_heads,
        dropout, bias)``; norm1, norm2, norm3: ``nn.LayerNorm``; ffn: :class:`PositionWiseFFN`.

    Shapes (``forward``):
        X ``(B, T, num_hiddens)`` float, the decoder's inputs (shifted targets); memory
        ``(B, S, num_hiddens)``; ``memory_valid_lens`` ``None``, ``(B,)`` or ``(B, T)``
        integers in ``[0, S]`` (padding of the source). Keyword-only: ``is_causal`` (default
        True: position ``t`` sees positions ``<= t`` only), ``kv_cache`` (a :class:`KVCache`
        for the self-attention; then ``X`` holds only the new positions), ``valid_lens``
        (padding of the targets: ``(B,)`` or ``(B, T)``, over all ``K`` self-attention keys
        with a cache; ``nn.TransformerDecoderLayer``'s ``tgt_key_padding_mask``),
        ``attn_mask`` (the self-attention's mask, ``tgt_mask``) and ``memory_mask`` (the
        cross-attention's, ``(T, S)``, ``(B, T, S)`` or ``(B, h, T, S)``), each bool (True =
        may attend) or float (added to the scores). All masks combine with AND. Returns
        ``(B, T, num_hiddens)``.

    Attributes:
        The attention weights of the last call are ``self_attention.attention_weights`` and
        ``cross_attention.attention_weights``, ``(B, h, T, T)`` and ``(B, h, T, S)``.

    Raises:
        ValueError: bad constructor arguments; in ``forward``, inputs not
            ``(B, T, num_hiddens)`` float of the parameters' dtype, bad lengths or masks.

    Example:
        >>> block = TransformerDecoderBlock(num_hiddens=16, num_heads=4, ffn_num_hiddens=32)
        >>> memory = torch.ones(2, 7, 16)
        >>> block(torch.ones(2, 5, 16), memory, torch.tensor([7, 4])).shape
        torch.Size([2, 5, 16])
        >>> block.cross_attention.attention_weights.shape
        torch.Size([2, 4, 5, 7])

    Source: Vaswani et al. (2017), section 3.1 and figure 1 (decoder); section 3.2.3 (masking).
    """

    _cross_attends = True
    _torch_cls = nn.TransformerDecoderLayer
    cross_attention: MultiHeadAttention
    norm2: nn.LayerNorm  # after the cross-attention
    norm3: nn.LayerNorm  # after the feed-forward network
    dropout1: nn.Dropout
    dropout2: nn.Dropout
    dropout3: nn.Dropout

    def forward(self, X: Tensor, memory: Tensor, memory_valid_lens: Optional[ValidLens] = None,
                *, is_causal: bool = True, kv_cache: Optional[KVCache] = None,
                valid_lens: Optional[ValidLens] = None, attn_mask: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None) -> Tensor:
        """``X`` ``(B, T, d)`` attends to itself (causal by default) and to ``memory``
        ``(B, S, d)``; returns ``(B, T, d)``. The masks and the cache are described in the
        class docstring."""
        check_hidden_states(X, self.num_hiddens, dtype=self.norm1.weight.dtype)
        check_hidden_states(memory, self.num_hiddens, "memory", dtype=self.norm1.weight.dtype)
        if memory.shape[0] != X.shape[0]:
            raise ValueError(f"memory must have the batch size of X ({X.shape[0]}), "
                             f"got {memory.shape[0]}")

        def self_attend(Z: Tensor) -> Tensor:
            return self.dropout1(self.self_attention(Z, Z, Z, valid_lens, attn_mask=attn_mask,
                                                     is_causal=is_causal, kv_cache=kv_cache))

        def cross_attend(Z: Tensor) -> Tensor:
            return self.dropout2(self.cross_attention(Z, memory, memory, memory_valid_lens,
                                                      attn_mask=memory_mask))

        def feed_forward(Z: Tensor) -> Tensor:
            return self.dropout3(self.ffn(Z))

        if self.norm_first:
            X = X + self_attend(self.norm1(X))  # 1. masked self-attention
            X = X + cross_attend(self.norm2(X))  # 2. attend to the encoder's output
            return X + feed_forward(self.norm3(X))  # 3. feed-forward
        X = self.norm1(X + self_attend(X))
        X = self.norm2(X + cross_attend(X))
        return self.norm3(X + feed_forward(X))

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> "TransformerDecoderBlock":
        """A block with the weights, sizes, dtype and device of a PyTorch decoder layer.

        Args:
            layer: ``nn.TransformerDecoderLayer`` built with ``batch_first=True``; any
                activation, with biases or ``bias=False``.

        Returns:
            a :class:`TransformerDecoderBlock` in the same train/eval mode whose outputs equal
            the layer's (``is_causal=True`` for a causal ``tgt_mask``, ``attn_mask`` for
            another ``tgt_mask``, ``valid_lens`` for ``tgt_key_padding_mask``,
            ``memory_valid_lens`` for ``memory_key_padding_mask``, ``memory_mask`` for
            ``memory_mask``; bool masks negated, since PyTorch's True means *ignore*).

        Raises:
            ValueError: if ``layer`` is not such a layer.

        Example:
            >>> ref = torch.nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True)
            >>> TransformerDecoderBlock.from_torch(ref).norm3.weight.shape
            torch.Size([8])

        Source: the parameter layout of ``torch.nn.TransformerDecoderLayer``.
        """
        return cls._from_torch(layer)
