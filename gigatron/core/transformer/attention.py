"""Self- and cross-attention: projections, RoPE, core attention, output projection.

Mirrors `megatron.core.transformer.attention` (Attention, SelfAttention, CrossAttention). The fused
QKV weight is laid out per query group, as in Megatron: rows [q_1 .. q_{np/ng}, k, v] for group 1,
then group 2, ... so a TP rank holding whole groups holds its heads' q, k and v in one contiguous
row block of the column-parallel weight.

Shapes: s: seq (sq queries, sk keys), b: micro-batch, h: hidden, np / ng: query heads / query
groups on this rank, hn: head dim (kv_channels).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.packed_seq_params import (  # PackedSeqParams: Megatron's name here
    PackedSeqParams,  # noqa: F401
    layout_bounds,
)
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.rope.rope_utils import apply_rotary_pos_emb
from gigatron.core.transformer.rope.rotary_pos_embedding import RotaryEmbedding
from gigatron.core.transformer.rope.yarn_rotary_pos_embedding import (
    _yarn_get_concentration_factor_from_config,
)
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.transformer_config import MLATransformerConfig  # noqa: F401  (Megatron imports it from here)
from gigatron.core.transformer.utils import check_attention_mask, is_layer_window_attention
from gigatron.core.utils import divide


@dataclass
class SelfAttentionSubmodules:
    """Specs of the pieces of SelfAttention."""

    linear_qkv: ModuleSpec | type = None
    core_attention: ModuleSpec | type = None
    linear_proj: ModuleSpec | type = None
    q_layernorm: ModuleSpec | type = None
    k_layernorm: ModuleSpec | type = None


@dataclass
class CrossAttentionSubmodules:
    """Specs of the pieces of CrossAttention."""

    linear_q: ModuleSpec | type = None
    linear_kv: ModuleSpec | type = None
    core_attention: ModuleSpec | type = None
    linear_proj: ModuleSpec | type = None


class Attention(MegatronModule):
    """Shared part: head bookkeeping, core attention, output projection and forward."""

    def __init__(
        self,
        config,
        submodules,
        layer_number: int,
        attn_mask_type,
        attention_type,
        cp_comm_type=None,
        pg_collection=None,
    ):
        super().__init__(config)
        self.layer_number = layer_number
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_size = tp_size
        self.query_projection_size = config.kv_channels * config.num_attention_heads
        self.kv_projection_size = config.kv_channels * config.num_query_groups
        self.hidden_size_per_attention_head = config.kv_channels
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, tp_size)
        # Fewer K/V heads than TP ranks: each K/V head is shared by tp/ng ranks, which gather
        # the QKV projection and keep their group (Megatron's scheme).
        self.kv_replicated = config.num_query_groups < tp_size
        core_config = config
        if self.kv_replicated:
            if attention_type != "self" or tp_size % config.num_query_groups != 0:
                raise ValueError(
                    f"num_query_groups ({config.num_query_groups}) < tensor_model_parallel_size "
                    f"({tp_size}) needs self-attention and tp divisible by num_query_groups"
                )
            self.num_query_groups_per_partition = 1
            core_config = dataclasses.replace(config, num_query_groups=tp_size)
        else:
            self.num_query_groups_per_partition = divide(config.num_query_groups, tp_size)
        self._build_core_attention_and_proj(
            submodules, config, core_config, layer_number, attn_mask_type, attention_type,
            cp_comm_type, config.softmax_scale,
        )  # fmt: skip
        # YaRN's concentration factor on cos / sin (1.0 unless the config's yarn_* fields scale:
        # Megatron's Attention caches it from the config the same way)
        self._mscale = _yarn_get_concentration_factor_from_config(config)
        # Gemma 3: sliding-window layers rotate with their own RoPE base (no saved state: the
        # inverse frequencies are a non-persistent buffer); `_local_rotary_pos_emb` follows the
        # model's table.
        self.local_rotary_pos_emb = None
        if config.rotary_base_local is not None and is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, layer_number
        ):
            self.local_rotary_pos_emb = RotaryEmbedding(
                config.kv_channels,
                1.0,
                config.rotary_interleaved,
                rotary_base=config.rotary_base_local,
                use_cpu_initialization=config.use_cpu_initialization,
            )

    def _build_core_attention_and_proj(
        self, submodules, config, core_config, layer_number, attn_mask_type, attention_type,
        cp_comm_type, softmax_scale,
    ) -> None:  # fmt: skip
        """`core_attention` (built with `core_config`; under context_parallel_size > 1
        DotProductAttention / SDPA -> ContextParallelAttention) and the row-parallel
        `linear_proj` from `query_projection_size` back to the hidden size."""
        from gigatron.core.transformer.context_parallel import get_cp_core_attention

        self.core_attention = build_module(
            get_cp_core_attention(submodules.core_attention, config),
            config=core_config,
            layer_number=layer_number,
            attn_mask_type=attn_mask_type,
            attention_type=attention_type,
            cp_comm_type=cp_comm_type,
            softmax_scale=softmax_scale,
        )
        self.checkpoint_core_attention = (
            config.recompute_granularity == "selective" and "core_attn" in config.recompute_modules
        )
        self.linear_proj = build_module(
            submodules.linear_proj,
            self.query_projection_size,
            config.hidden_size,
            config=config,
            init_method=config.output_layer_init_method,
            bias=config.add_bias_linear,
            input_is_parallel=True,
            skip_bias_add=True,
            is_expert=False,
            tp_comm_buffer_name="proj",
        )

    def _core_attention(
        self, query, key, value, attention_mask, attn_mask_type, attention_bias=None,
        packed_seq_params=None,
    ) -> Tensor:  # fmt: skip
        # attention_bias (e.g. T5's relative positions, [1|b, np, sq, sk]) and packed_seq_params
        # are passed only when given: core attentions that do not take them keep refusing them.
        extra = {} if attention_bias is None else {"attention_bias": attention_bias}
        if packed_seq_params is not None:
            extra["packed_seq_params"] = packed_seq_params
        if not (self.checkpoint_core_attention and self.training):
            return self.core_attention(
                query, key, value, attention_mask, attn_mask_type=attn_mask_type, **extra
            )

        def run(q, k, v):
            return self.core_attention(
                q, k, v, attention_mask, attn_mask_type=attn_mask_type, **extra
            )

        # Recompute the [b, np, sq, sk] scores/probs in backward instead of storing them.
        return tensor_parallel.checkpoint(run, False, query, key, value)

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None,
        key_value_states: Tensor | None = None,
        inference_context=None,
        rotary_pos_emb: Tensor | tuple[Tensor, Tensor] | None = None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        rotary_pos_cos_sin=None,
        attention_bias=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        *,
        inference_params=None,
    ) -> tuple[Tensor, Tensor | None]:
        """hidden_states [s(/tp under SP), b, h] -> (output [s(/tp), b, h], bias [h] or None).

        packed_seq_params (thd, b = 1; see gigatron.core.packed_seq_params): RoPE positions
        restart at every document and no token attends to another document's tokens."""
        inference_context = inference_context if inference_context is not None else inference_params
        check_attention_mask(attention_mask)
        cu_seqlens = None
        if packed_seq_params is not None:
            if self.attention_type != "self" or inference_context is not None:
                raise ValueError(
                    "packed_seq_params needs self-attention without inference_context in gigatron"
                )
            cu_seqlens = layout_bounds(packed_seq_params)
        query, key, value = self.get_query_key_value_tensors(hidden_states, key_value_states)
        no_rope = self.config.no_rope_freq
        if no_rope and no_rope[self.layer_number - 1]:  # a NoPE layer (layer_number is 1-based)
            rotary_pos_emb = None
        if rotary_pos_emb is not None and self.local_rotary_pos_emb is not None:
            rotary_pos_emb = self._local_rotary_pos_emb(rotary_pos_emb, cu_seqlens is not None)
        if rotary_pos_emb is not None and cu_seqlens is not None:
            q_pos_emb, k_pos_emb = (
                rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
            )  # [>= longest document, 1, 1, dim], not split over CP ranks
            cp_group = getattr(self.core_attention, "cp_group", None)
            rope = dict(
                config=self.config, cu_seqlens=cu_seqlens, cp_group=cp_group, mscale=self._mscale
            )
            query = apply_rotary_pos_emb(query, q_pos_emb, **rope)
            key = apply_rotary_pos_emb(key, k_pos_emb, **rope)
        elif rotary_pos_emb is not None:
            if not isinstance(rotary_pos_emb, tuple):
                rotary_pos_emb = (rotary_pos_emb, rotary_pos_emb)
            q_pos_emb, k_pos_emb = rotary_pos_emb
            if inference_context is not None:  # angles cover max_sequence_length positions
                start = inference_context.sequence_len_offset
                q_pos_emb = q_pos_emb[start : start + query.size(0)]
                k_pos_emb = k_pos_emb[start : start + key.size(0)]
            query = apply_rotary_pos_emb(query, q_pos_emb, config=self.config, mscale=self._mscale)
            key = apply_rotary_pos_emb(key, k_pos_emb, config=self.config, mscale=self._mscale)
        if inference_context is not None:
            key, value = self._adjust_key_value_for_inference(inference_context, key, value)
        context = self._core_attention(
            query, key, value, attention_mask, self.attn_mask_type, attention_bias,
            packed_seq_params,
        )  # fmt: skip
        output, bias = self.linear_proj(context)  # [sq, b, np*hn] -> [sq(/tp), b, h]
        return output, bias

    def _local_rotary_pos_emb(self, rotary_pos_emb, packed: bool) -> Tensor:
        """A sliding-window layer's own RoPE angles (base `config.rotary_base_local`, no
        scaling: Gemma 3's local layers) for the positions the model's table covers: the same
        rows, the same context-parallel slice. [s(/cp), 1, 1, dim] like `rotary_pos_emb`."""
        table = rotary_pos_emb[0] if isinstance(rotary_pos_emb, tuple) else rotary_pos_emb
        rope = self.local_rotary_pos_emb
        if table.shape[-1] != rope.dim:
            raise ValueError(
                f"rotary_base_local needs RoPE over the whole head (kv_channels {rope.dim}); the "
                f"model's angles cover {table.shape[-1]} channels (rotary_percent < 1)"
            )
        rows = table.shape[0]
        if rope.cp_group is not None and not packed:  # the model's table is this rank's slice
            rows *= rope.cp_group.size()
        return rope(rows, packed_seq=packed).to(table.device, table.dtype)

    def _adjust_key_value_for_inference(self, inference_context, key, value):
        """Append this step's rotated keys and values [s, b, ng, hn] to the static KV cache and
        return all cached ones [sk, b, ng, hn]. A causal mask (None given) then lines the new
        queries up with the last s keys, which both core attentions do for sq < sk."""
        if self.attention_type != "self":
            raise ValueError(
                f"inference_context with {self.attention_type} attention is not supported by "
                "gigatron (self-attention only)"
            )
        return inference_context.append_key_value(self.layer_number, key, value)


class SelfAttention(Attention):
    """Attention whose queries, keys and values all come from `hidden_states`."""

    def __init__(
        self,
        config,
        submodules: SelfAttentionSubmodules,
        layer_number: int,
        attn_mask_type=AttnMaskType.padding,
        cp_comm_type=None,
        pg_collection=None,
        pp_layer_offset: int | None = None,
        name=None,
    ):
        super().__init__(config, submodules, layer_number, attn_mask_type, "self", cp_comm_type)
        # Megatron 0.19+: the stage's layer offset (its inference KV cache is indexed by
        # layer_number - offset; gigatron's is keyed by the global layer_number) and a label
        self.pp_layer_offset, self.name = pp_layer_offset, name
        self.linear_qkv = build_module(
            submodules.linear_qkv,
            config.hidden_size,
            self.query_projection_size + 2 * self.kv_projection_size,
            config=config,
            init_method=config.init_method,
            gather_output=False,
            bias=config.add_bias_linear or config.add_qkv_bias,
            skip_bias_add=False,
            is_expert=False,
            tp_comm_buffer_name="qkv",
        )
        self.q_layernorm = self._qk_norm(submodules.q_layernorm)
        self.k_layernorm = self._qk_norm(submodules.k_layernorm)

    def _qk_norm(self, spec):
        # A spec that leaves the Q/K norm unset (None) lets config.qk_layernorm choose the
        # default norm, as Megatron's SelfAttention falls back to TENorm.
        if spec is None and self.config.qk_layernorm:
            from gigatron.core.transformer.torch_norm import WrappedTorchNorm

            spec = WrappedTorchNorm
        if spec is None:
            return None
        return build_module(
            spec,
            hidden_size=self.hidden_size_per_attention_head,
            config=self.config,
            eps=self.config.layernorm_epsilon,
        )

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None):
        """[s, b, h] -> q [sq, b, np, hn], k [sq, b, ng, hn], v [sq, b, ng, hn]."""
        mixed_qkv, _ = self.linear_qkv(hidden_states)  # [sq, b, ng*(np/ng+2)*hn]
        ng, hn = self.num_query_groups_per_partition, self.hidden_size_per_attention_head
        np_ = self.num_attention_heads_per_partition
        if self.kv_replicated:
            from gigatron.core import tensor_parallel

            # [sq, b, ng_all*(q/g+2)*hn] on every rank, then this rank's group "q.. k v".
            mixed_qkv = tensor_parallel.all_gather_last_dim_from_tensor_parallel_region(mixed_qkv)
            ranks_per_group = self.tp_size // self.config.num_query_groups
            tp_rank = parallel_state.get_tensor_model_parallel_rank()
            size = mixed_qkv.shape[-1] // self.config.num_query_groups
            group = tp_rank // ranks_per_group
            mixed_qkv = mixed_qkv[..., group * size : (group + 1) * size]
            q_per_group = self.config.num_attention_heads // self.config.num_query_groups
        else:
            q_per_group = np_ // ng
        mixed_qkv = mixed_qkv.view(*mixed_qkv.shape[:2], ng, (q_per_group + 2) * hn)
        query, key, value = torch.split(mixed_qkv, [q_per_group * hn, hn, hn], dim=3)
        query = query.reshape(query.size(0), query.size(1), -1, hn)  # [sq, b, ng*q/g, hn]
        if self.kv_replicated:  # keep this rank's np query heads of the group
            sub = parallel_state.get_tensor_model_parallel_rank() % ranks_per_group
            query = query[:, :, sub * np_ : (sub + 1) * np_]  # [sq, b, np, hn]
        if self.q_layernorm is not None:
            query = self.q_layernorm(query)
        if self.k_layernorm is not None:
            key = self.k_layernorm(key)
        return query, key, value


class CrossAttention(Attention):
    """Attention with queries from `hidden_states` and keys/values from `key_value_states`."""

    def __init__(
        self,
        config,
        submodules: CrossAttentionSubmodules,
        layer_number: int,
        attn_mask_type=AttnMaskType.padding,
        cp_comm_type=None,
        pg_collection=None,
        name=None,
    ):
        super().__init__(config, submodules, layer_number, attn_mask_type, "cross", cp_comm_type)
        self.name = name  # Megatron 0.19+: a label
        if config.num_query_groups != config.num_attention_heads:
            raise ValueError(
                f"num_query_groups ({config.num_query_groups}) must equal num_attention_heads "
                f"({config.num_attention_heads}) in cross attention (as in Megatron)"
            )
        common = dict(
            config=config,
            init_method=config.init_method,
            gather_output=False,
            bias=config.add_bias_linear,
            skip_bias_add=False,
            is_expert=False,
        )
        self.linear_q = build_module(
            submodules.linear_q, config.hidden_size, self.query_projection_size, **common
        )
        self.linear_kv = build_module(
            submodules.linear_kv, config.hidden_size, 2 * self.kv_projection_size, **common
        )

    def get_query_key_value_tensors(self, hidden_states, key_value_states):
        """q from hidden_states [sq, b, h], k/v from key_value_states [sk, b, h]."""
        if key_value_states is None:
            raise ValueError("CrossAttention needs key_value_states (the encoder output)")
        hn = self.hidden_size_per_attention_head
        mixed_kv, _ = self.linear_kv(key_value_states)  # [sk, b, 2*ng*hn]
        mixed_kv = mixed_kv.view(*mixed_kv.shape[:2], self.num_query_groups_per_partition, 2 * hn)
        key, value = torch.split(mixed_kv, [hn, hn], dim=3)  # [sk, b, ng, hn] each
        query, _ = self.linear_q(hidden_states)  # [sq, b, np*hn]
        query = query.view(*query.shape[:2], self.num_attention_heads_per_partition, hn)
        return query, key, value
