"""Multi-latent attention (MLA, DeepSeek-V2/V3): queries and keys/values from low-rank latents.

Mirrors `megatron.core.transformer.multi_latent_attention` (MultiLatentAttention,
MLASelfAttention, MLASelfAttentionSubmodules), unfused path. Per token:

    q   = q_up(norm_q(q_down(x)))             (or one q_proj when q_lora_rank is None)
    c   = kv_down(x) = [latent (kv_lora_rank) | k_rope (qk_pos_emb_head_dim, shared by heads)]
    k|v = kv_up(norm_kv(latent))              per head: [k_nope (qk_head_dim) | v (v_head_dim)]
    query = [q_nope | rope(q_rope)], key = [k_nope | rope(k_rope)], softmax scale
    mscale(factor, mscale_all_dim)**2 / sqrt(qk_head_dim + qk_pos_emb_head_dim).

RoPE is MLA's own (plain or YaRN, built here from the config, so GPTModel passes none) and reads
the rotary channels as interleaved pairs (DeepSeek's layout), as Megatron's mla_rotary_interleaved.
TP, as Megatron's local spec: the down-projections are column-parallel with their output gathered
(every rank holds the whole latent), the up-projections column-parallel over heads, linear_proj
row-parallel. Sequence parallel: the latents are scattered back to s/tp before their norms.
gigatron's core attentions (and context-parallel attention) take one head dim for q, k and v:
v is zero-padded to the q/k head dim and the output trimmed back, which is exact.

Shapes: s: seq (s/tp under SP), b: micro-batch, h: hidden, np: heads on this rank,
qhd = qk_head_dim + qk_pos_emb_head_dim, vhd: v_head_dim, r: qk_pos_emb_head_dim.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_tensor_model_parallel_region,
    scatter_to_sequence_parallel_region,
)
from gigatron.core.transformer.attention import Attention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.rope.rope_utils import apply_rotary_pos_emb
from gigatron.core.transformer.rope.rotary_pos_embedding import RotaryEmbedding
from gigatron.core.transformer.rope.yarn_rotary_pos_embedding import (
    YarnRotaryEmbedding,
    _yarn_get_mscale,
)
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.utils import divide


@dataclass
class MLASelfAttentionSubmodules:
    """Specs of the pieces of MLASelfAttention (Megatron's names)."""

    linear_q_proj: ModuleSpec | type = None
    linear_q_down_proj: ModuleSpec | type = None
    linear_q_up_proj: ModuleSpec | type = None
    linear_kv_down_proj: ModuleSpec | type = None
    linear_kv_up_proj: ModuleSpec | type = None
    core_attention: ModuleSpec | type = None
    linear_proj: ModuleSpec | type = None
    q_layernorm: ModuleSpec | type = None
    kv_layernorm: ModuleSpec | type = None


def _interleaved_to_halves(x: Tensor) -> Tensor:
    """[..., r] pairs (x0, x1), (x2, x3), .. -> [x0, x2, .. | x1, x3, ..] (rotate-half layout)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class MultiLatentAttention(Attention):
    """Shared part: RoPE, core attention, output projection and forward; the subclass makes
    query, key and value. Attention's constructor is not run: its fused-QKV head bookkeeping
    does not apply (its core-attention call and recompute switch are reused)."""

    def __init__(
        self,
        config,
        submodules: MLASelfAttentionSubmodules,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        cp_comm_type: str | None = None,
        pg_collection=None,
        pp_layer_offset: int | None = None,
        name: str | None = None,
    ) -> None:
        MegatronModule.__init__(self, config)
        if not getattr(config, "multi_latent_attention", False):
            raise ValueError(
                "MultiLatentAttention needs an MLATransformerConfig (multi_latent_attention=True)"
            )
        self.layer_number, self.attn_mask_type = layer_number, attn_mask_type
        self.attention_type, self.pp_layer_offset, self.name = attention_type, pp_layer_offset, name
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, self.tp_size)
        self.q_head_dim = config.qk_head_dim + config.qk_pos_emb_head_dim
        self.query_projection_size = config.v_head_dim * config.num_attention_heads
        mscale = _yarn_get_mscale(config.rotary_scaling_factor, config.mscale_all_dim)
        self.softmax_scale = mscale * mscale / math.sqrt(self.q_head_dim)
        if config.rope_type == "rope":
            self.rotary_pos_emb = RotaryEmbedding(
                config.qk_pos_emb_head_dim,
                rotary_percent=config.rotary_percent,
                rotary_base=config.rotary_base,
            )
        else:
            self.rotary_pos_emb = YarnRotaryEmbedding(
                config.qk_pos_emb_head_dim,
                rotary_base=config.rotary_base,
                scaling_factor=config.rotary_scaling_factor,
                original_max_position_embeddings=config.original_max_position_embeddings,
                beta_fast=config.beta_fast,
                beta_slow=config.beta_slow,
                mscale=config.mscale,
                mscale_all_dim=config.mscale_all_dim,
            )
        # The core attentions split heads by num_query_groups: MLA has one K/V per query head.
        core_config = copy.copy(config)
        core_config.num_query_groups = config.num_attention_heads
        self._build_core_attention_and_proj(
            submodules, config, core_config, layer_number, attn_mask_type, attention_type,
            cp_comm_type, self.softmax_scale,
        )  # fmt: skip

    def _rotary_angles(self, q_len: int, inference_context) -> tuple[Tensor, float]:
        """Angles [q_len, 1, 1, r] of this step's positions (this CP rank's zigzag rows under
        CP) and the cos/sin scale (YaRN's mscale; 1 for plain RoPE)."""
        if inference_context is not None:  # angles of every cache position, then this step's
            start = inference_context.sequence_len_offset
            out = self.rotary_pos_emb(inference_context.max_sequence_length)
        else:
            start = 0
            out = self.rotary_pos_emb(q_len * self.config.context_parallel_size)
        emb, mscale = out if isinstance(out, tuple) else (out, 1.0)
        return emb[start : start + q_len], mscale

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None,
        key_value_states: Tensor | None = None,
        inference_context=None,
        rotary_pos_emb=None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        rotary_pos_cos_sin=None,
        attention_bias=None,
        packed_seq_params=None,
        position_ids=None,
        sequence_len_offset=None,
        *,
        inference_params=None,
    ) -> tuple[Tensor, Tensor | None]:
        """hidden_states [s(/tp under SP), b, h] -> (output [s(/tp), b, h], bias [h] or None)."""
        inference_context = inference_context if inference_context is not None else inference_params
        if packed_seq_params is not None:
            raise ValueError("packed_seq_params is not supported by gigatron's MLA")
        if rotary_pos_emb is not None or attention_bias is not None:
            raise ValueError(
                "MultiLatentAttention builds its own RoPE and takes no rotary_pos_emb or "
                "attention_bias (as in Megatron)"
            )
        query, key, value = self.get_query_key_value_tensors(
            hidden_states, key_value_states, inference_context=inference_context
        )
        if inference_context is not None:
            key, value = self._adjust_key_value_for_inference(inference_context, key, value)
        vhd = value.shape[-1]
        if vhd != self.q_head_dim:  # one head dim for the core attention: zero columns of v
            value = F.pad(value, (0, self.q_head_dim - vhd))
        context = self._core_attention(
            query, key, value, attention_mask, self.attn_mask_type
        )  # [sq, b, np*qhd]
        if vhd != self.q_head_dim:
            sq, b = context.shape[:2]
            context = context.view(sq, b, -1, self.q_head_dim)[..., :vhd].reshape(sq, b, -1)
        output, bias = self.linear_proj(context)  # [sq, b, np*vhd] -> [sq(/tp), b, h]
        return output, bias


class MLASelfAttention(MultiLatentAttention):
    """MLA whose queries, keys and values all come from `hidden_states`."""

    def __init__(
        self,
        config,
        submodules: MLASelfAttentionSubmodules,
        layer_number: int,
        attn_mask_type=AttnMaskType.padding,
        cp_comm_type: str | None = None,
        pg_collection=None,
        pp_layer_offset: int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(
            config, submodules, layer_number, attn_mask_type, "self", cp_comm_type,
            pg_collection, pp_layer_offset, name,
        )  # fmt: skip
        c = config
        column = dict(
            config=c,
            init_method=c.init_method,
            gather_output=False,
            bias=False,
            skip_bias_add=False,
            is_expert=False,
        )
        heads = c.num_attention_heads
        if c.q_lora_rank is None:
            self.linear_q_proj = build_module(
                submodules.linear_q_proj, c.hidden_size, heads * self.q_head_dim, **column
            )
        else:
            self.linear_q_down_proj = build_module(
                submodules.linear_q_down_proj, c.hidden_size, c.q_lora_rank, **column
            )
            self.linear_q_up_proj = build_module(
                submodules.linear_q_up_proj, c.q_lora_rank, heads * self.q_head_dim, **column
            )
        self.linear_kv_down_proj = build_module(
            submodules.linear_kv_down_proj,
            c.hidden_size,
            c.kv_lora_rank + c.qk_pos_emb_head_dim,
            **column,
        )
        self.linear_kv_up_proj = build_module(
            submodules.linear_kv_up_proj,
            c.kv_lora_rank,
            heads * (c.qk_head_dim + c.v_head_dim),
            **column,
        )
        norm = dict(config=c, eps=c.layernorm_epsilon)
        if c.q_lora_rank is not None:
            self.q_layernorm = build_module(
                submodules.q_layernorm, hidden_size=c.q_lora_rank, **norm
            )
        self.kv_layernorm = build_module(
            submodules.kv_layernorm, hidden_size=c.kv_lora_rank, **norm
        )

    def _whole_latent(self, x: Tensor, width: int) -> Tensor:
        """A column-parallel down-projection's output [s, b, width/tp] -> [s, b, width] (its
        input was gathered over SP too, so s is the whole sequence)."""
        if x.shape[-1] != width:
            x = gather_from_tensor_model_parallel_region(x)
        return x

    def get_query_key_value_tensors(
        self, hidden_states, key_value_states=None, position_ids=None, packed_seq_params=None,
        inference_context=None, *, inference_params=None,
    ):  # fmt: skip
        """[s(/tp), b, h] -> q [s, b, np, qhd], k [s, b, np, qhd], v [s, b, np, vhd]."""
        c = self.config
        inference_context = inference_context if inference_context is not None else inference_params
        sp = c.sequence_parallel and self.tp_size > 1
        q = q_latent = None
        if c.q_lora_rank is None:
            q, _ = self.linear_q_proj(hidden_states)  # [s, b, np*qhd]
        else:
            q_latent, _ = self.linear_q_down_proj(hidden_states)  # [s, b, q_lora_rank/tp]
            q_latent = self._whole_latent(q_latent, c.q_lora_rank)  # [s, b, q_lora_rank]
            if sp:  # the norm and q_up take this rank's s/tp rows, like the block input
                q_latent = scatter_to_sequence_parallel_region(q_latent)
        kv_combined, _ = self.linear_kv_down_proj(hidden_states)
        kv_combined = self._whole_latent(kv_combined, c.kv_lora_rank + c.qk_pos_emb_head_dim)
        kv_latent, k_rope = torch.split(
            kv_combined, [c.kv_lora_rank, c.qk_pos_emb_head_dim], dim=-1
        )  # [s, b, kv_lora_rank], [s, b, r]
        if sp:
            kv_latent = scatter_to_sequence_parallel_region(kv_latent)  # [s/tp, b, kv_lora_rank]
        if self.tp_size > 1:
            # Every head uses the one rotary key; each rank holds only its heads, so its grad is
            # summed over TP here (kv_latent's and q's are summed by the column-parallel up-proj).
            k_rope = copy_to_tensor_model_parallel_region(k_rope)

        def up_proj_and_rope(q, q_latent, kv_latent, k_rope):
            return self._up_proj_and_rope(q, q_latent, kv_latent, k_rope, inference_context)

        if (
            c.recompute_granularity == "selective"
            and "mla_up_proj" in c.recompute_modules
            and self.training
            and torch.is_grad_enabled()
        ):  # recompute "mla_up_proj": the up projections and RoPE run again at backward
            args = (q, q_latent, kv_latent, k_rope)
            return tensor_parallel.checkpoint(up_proj_and_rope, False, *args)
        return up_proj_and_rope(q, q_latent, kv_latent, k_rope)

    def _up_proj_and_rope(self, q, q_latent, kv_latent, k_rope, inference_context):
        """q [s, b, np*qhd] (no q LoRA) or q_latent [s(/tp), b, q_lora_rank], kv_latent
        [s(/tp), b, kv_lora_rank], k_rope [s, b, r] -> query, key [s, b, np, qhd], value
        [s, b, np, vhd]."""
        c = self.config
        if q is None:
            q, _ = self.linear_q_up_proj(self.q_layernorm(q_latent))  # [s, b, np*qhd]
        kv, _ = self.linear_kv_up_proj(self.kv_layernorm(kv_latent))  # [s, b, np*(qk+vhd)]

        s, b = q.shape[:2]
        np_ = self.num_attention_heads_per_partition
        q = q.view(s, b, np_, self.q_head_dim)
        kv = kv.view(s, b, np_, c.qk_head_dim + c.v_head_dim)
        q_nope, q_rope = torch.split(q, [c.qk_head_dim, c.qk_pos_emb_head_dim], dim=-1)
        k_nope, value = torch.split(kv, [c.qk_head_dim, c.v_head_dim], dim=-1)
        freqs, mscale = self._rotary_angles(s, inference_context)  # [s, 1, 1, r]
        q_rope = apply_rotary_pos_emb(_interleaved_to_halves(q_rope), freqs, mscale=mscale)
        k_rope = apply_rotary_pos_emb(
            _interleaved_to_halves(k_rope.unsqueeze(2)), freqs, mscale=mscale
        )  # [s, b, 1, r]
        query = torch.cat([q_nope, q_rope], dim=-1)  # [s, b, np, qhd]
        key = torch.cat([k_nope, k_rope.expand(-1, -1, np_, -1)], dim=-1)  # [s, b, np, qhd]
        return query.contiguous(), key.contiguous(), value.contiguous()
