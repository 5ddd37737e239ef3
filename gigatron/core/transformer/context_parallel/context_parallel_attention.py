"""Core attention under context parallelism, without Transformer Engine.

Megatron Core runs context parallelism only through Transformer Engine's `TEDotProductAttention`
(its local `DotProductAttention` asserts `context_parallel_size == 1`). This module is gigatron's
TE-free equivalent: same constructor and forward signature as `DotProductAttention`, dispatching
on `cp_comm_type` ("p2p" ring, "all_gather", "a2a" Ulysses; None means "p2p" as in Megatron).
A per-layer list `config.cp_comm_type` is indexed by `layer_number - 1`.

Sliding windows (`config.window_size`), attention logit soft-capping (Gemma's
`attn_logit_softcapping`) and attention sinks (`config.softmax_type`, GPT-OSS) run on the
"all_gather" and "a2a" modes (the window needs a causal mask on "all_gather"); the "p2p" ring and
packed sequences refuse them.

Masks: causal attention (the GPT layers' `AttnMaskType.causal`; an explicit mask tensor is then
ignored, as TE does) or full attention (`no_mask`, or `padding` with no mask tensor). Inputs are
this rank's zigzag tokens (`gigatron.core.utils.get_batch_on_this_cp_rank`).

Shapes: s: local seq (2 zigzag chunks), b: micro-batch, np / ng: query heads / query groups on
this TP rank, hn: head dim.
"""

from __future__ import annotations

import math

from torch import Tensor

from gigatron.core import parallel_state
from gigatron.core.transformer.context_parallel import _kernels, _layout
from gigatron.core.transformer.context_parallel.a2a_attention import a2a_attention
from gigatron.core.transformer.context_parallel.all_gather_attention import all_gather_attention
from gigatron.core.transformer.context_parallel.packed_attention import packed_attention
from gigatron.core.transformer.context_parallel.ring_attention import ring_attention
from gigatron.core.transformer.dot_product_attention import (
    CAUSAL_MASK_TYPES,
    DotProductAttention,
    add_softmax_offset,
    layer_window_size,
    softmax_offset_sharded_state_dict,
)
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec

CP_COMM_TYPES = ("p2p", "all_gather", "a2a")


def resolve_cp_comm_type(cp_comm_type, config, layer_number: int) -> str:
    """The comm type of this layer: the argument, else config.cp_comm_type (str or per-layer
    list), else "p2p". Raises ValueError for unknown or unsupported types."""
    value = cp_comm_type if cp_comm_type is not None else config.cp_comm_type
    if isinstance(value, (list, tuple)):
        if len(value) != config.num_layers:
            raise ValueError(
                f"cp_comm_type list has {len(value)} entries; it needs one per layer "
                f"(num_layers = {config.num_layers})"
            )
        value = value[layer_number - 1]
    value = "p2p" if value is None else value
    if value == "a2a+p2p":
        raise ValueError(
            "cp_comm_type 'a2a+p2p' (hierarchical context parallelism) is not supported by "
            f"gigatron; use one of {CP_COMM_TYPES}"
        )
    if value not in CP_COMM_TYPES:
        raise ValueError(f"cp_comm_type ({value!r}) must be one of {CP_COMM_TYPES}")
    return value


def get_cp_core_attention(core_attention, config):
    """`ContextParallelAttention` in place of a `DotProductAttention` (or its SDPA subclass) core
    attention when `config.context_parallel_size > 1`; any other spec is returned unchanged.

    Called by `Attention` when it builds its core attention, so every GPT spec (local, fast,
    TE-named, decoder block) runs context parallel without being rebuilt.
    """
    if config.context_parallel_size <= 1:
        _check_no_cp_group(config)
        return core_attention

    module = core_attention.module if isinstance(core_attention, ModuleSpec) else core_attention
    if isinstance(module, type) and issubclass(module, DotProductAttention):
        return ContextParallelAttention
    return core_attention


def _check_no_cp_group(config) -> None:
    """A CP group in parallel_state with a config that has none would train without context
    parallelism (each rank attending over what it holds) and the schedule would still scale the
    loss by the CP size."""
    cp_world = parallel_state.get_context_parallel_world_size()
    if cp_world > 1:
        raise ValueError(
            f"parallel_state was initialized with context_parallel_size={cp_world} but the "
            f"TransformerConfig has context_parallel_size={config.context_parallel_size}: the "
            "model would run without context parallelism; pass TransformerConfig(..., "
            f"context_parallel_size={cp_world}, attention_dropout=0.0) "
            "(parallel_state.get_context_parallel_world_size())"
        )


class ContextParallelAttention(MegatronModule):
    """Scaled dot-product attention of this rank's queries against the whole sequence."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str = "self",
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ):
        super().__init__(config)
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.cp_comm_type = resolve_cp_comm_type(cp_comm_type, config, self.layer_number)
        if pg_collection is not None and getattr(pg_collection, "cp", None) is not None:
            self.cp_group = pg_collection.cp
        else:
            self.cp_group = parallel_state.get_context_parallel_group()
        self.cp_global_ranks = _global_ranks(self.cp_group)
        if config.context_parallel_size != self.cp_group.size():
            raise ValueError(
                f"config.context_parallel_size ({config.context_parallel_size}) must equal the "
                f"context-parallel group size ({self.cp_group.size()})"
            )
        if softmax_scale is None:
            softmax_scale = config.softmax_scale
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(config.kv_channels)
        # apply_query_key_layer_scaling divides by layer_number and multiplies back inside the
        # fp32 softmax: the product is the same scale (the math here is fp32 throughout).
        self.softmax_scale = softmax_scale
        self.attention_dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )
        self.window_size = layer_window_size(config, self.layer_number)
        self.softcap = config.attn_logit_softcapping
        np_per_rank = config.num_attention_heads // config.tensor_model_parallel_size
        add_softmax_offset(self, config, np_per_rank)
        # what the ring and packed sequences lack, named by its field (None: plain attention)
        self._variant = None
        if self.window_size is not None:
            self._variant = f"window_size ({config.window_size})"
        elif self.softcap:
            self._variant = f"attn_logit_softcapping ({self.softcap})"
        elif self.softmax_offset is not None:
            self._variant = f"softmax_type ({config.softmax_type!r})"
        if self._variant is not None and self.cp_comm_type == "p2p":
            raise ValueError(
                f"{self._variant} under context parallelism needs cp_comm_type 'all_gather' or "
                f"'a2a' (layer {self.layer_number} has 'p2p'; gigatron's ring has no window, "
                "soft-capping or sink)"
            )

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """The learnable `softmax_offset` split over TP (as DotProductAttention's)."""
        return softmax_offset_sharded_state_dict(self, prefix, sharded_offsets, metadata)

    def _is_causal(self, attention_mask, mask_type) -> bool:
        if mask_type in (AttnMaskType.causal, AttnMaskType.causal_bottom_right):
            return True  # TE ignores the mask tensor for causal masks; so do we
        if mask_type == AttnMaskType.no_mask or (
            mask_type == AttnMaskType.padding and attention_mask is None
        ):
            return False
        raise ValueError(
            f"attn_mask_type {mask_type.name} with a mask tensor is not supported under context "
            "parallelism (causal or full attention only)"
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params=None,
    ) -> Tensor:
        """q [s, b, np, hn], k/v [s, b, ng, hn] (local zigzag tokens) -> [s, b, np*hn].
        packed_seq_params (thd, b = 1): per-document zigzag tokens, attention inside each
        document (packed_attention.py)."""
        if attention_bias is not None:
            raise ValueError(
                "attention_bias is not supported by gigatron's ContextParallelAttention"
            )
        if self.training and self.attention_dropout_p > 0:
            raise ValueError(
                f"attention_dropout ({self.attention_dropout_p}) must be 0 under context "
                "parallelism in gigatron (set config.attention_dropout=0.0)"
            )
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        s, b, np_, hn = query.shape
        if packed_seq_params is not None and self._variant is not None:
            raise ValueError(
                f"{self._variant} with packed sequences under context parallelism is not "
                "supported by gigatron"
            )
        if packed_seq_params is not None:  # an explicit mask tensor is ignored, as TE does
            causal = mask_type in CAUSAL_MASK_TYPES
            context = packed_attention(
                query, key, value, packed_seq_params, scale=self.softmax_scale, causal=causal,
                group=self.cp_group,
            )  # fmt: skip
            return context.reshape(s, b, np_ * hn)
        causal = self._is_causal(attention_mask, mask_type)
        if causal and s % 2 and self.cp_group.size() > 1:
            raise ValueError(
                f"local sequence length ({s}) must be even under causal context parallelism: "
                "each rank holds two zigzag chunks (get_batch_on_this_cp_rank)"
            )
        kw = dict(scale=self.softmax_scale, causal=causal, group=self.cp_group)
        variant = dict(window=self.window_size, softcap=self.softcap, sink=self.softmax_offset)
        if self.cp_group.size() == 1:
            q, k, v = _layout.to_grouped(query, key, value)
            out = _kernels.attention(q, k, v, self.softmax_scale, causal, **variant)
            context = _layout.from_grouped(out)
        elif self.cp_comm_type == "p2p":
            context = ring_attention(query, key, value, global_ranks=self.cp_global_ranks, **kw)
        elif self.cp_comm_type == "all_gather":
            context = all_gather_attention(query, key, value, **kw, **variant)
        else:
            context = a2a_attention(query, key, value, **kw, **variant)
        return context.reshape(s, b, np_ * hn)  # [s, b, np*hn]


def _global_ranks(group) -> list[int]:
    import torch.distributed as dist

    return [dist.get_global_rank(group, r) for r in range(group.size())]
