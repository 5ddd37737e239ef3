"""One pre-norm transformer layer: x + attn(norm(x)), then (cross-attn), then x + mlp(norm(x)).
With `post_self_attn_layernorm` / `post_mlp_layernorm` (Gemma 2/3's sandwich norms) the attention
and MLP outputs are normalised too before their residual adds: x + norm(attn(norm(x))).

Mirrors `megatron.core.transformer.transformer_layer` (TransformerLayer,
TransformerLayerSubmodules, get_transformer_layer_offset, get_num_layers_to_build). Residual adds
go through the bias-dropout-add (bda) functions: `residual + dropout(out + bias)`.
`layer_number` is 1-based and global: the local number plus this pipeline stage's (and virtual
chunk's) offset.

Shapes: s: seq (s/tp under sequence parallelism), b: micro-batch, h: hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.dist_checkpointing.utils import apply_prefix_mapping
from gigatron.core.packed_seq_params import PackedSeqParams  # noqa: F401  (Megatron's name here)
from gigatron.core.transformer import _layer_split
from gigatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.utils import make_viewless_tensor


def _vp_stage_or_default(config, vp_stage):
    if config.virtual_pipeline_model_parallel_size is None:
        return None
    if vp_stage is None:
        vp_stage = parallel_state.get_virtual_pipeline_model_parallel_rank()
    if vp_stage is None:
        raise ValueError(
            "vp_stage must be given when virtual_pipeline_model_parallel_size "
            f"({config.virtual_pipeline_model_parallel_size}) is set"
        )
    return vp_stage


def get_num_layers_to_build(config, vp_stage: int | None = None, pp_rank: int | None = None) -> int:
    """Layers held by one pipeline stage (one virtual chunk of it under VPP), including uneven
    first/last stages and the embedding/loss accounting flags (`_layer_split`)."""
    even = not (
        config.num_layers_in_first_pipeline_stage
        or config.num_layers_in_last_pipeline_stage
        or config.account_for_embedding_in_pipeline_split
        or config.account_for_loss_in_pipeline_split
    )
    if (
        even
        and vp_stage is None
        and config.virtual_pipeline_model_parallel_size is not None
        and parallel_state.get_virtual_pipeline_model_parallel_rank() is None
    ):
        vp_stage = 0  # even split: every chunk holds the same number of layers
    return _layer_split.get_num_layers_to_build(
        config, _vp_stage_or_default(config, vp_stage), pp_rank
    )


def get_transformer_layer_offset(config, vp_stage: int | None = None, pp_rank: int | None = None):
    """Global index of this stage's (chunk's) first layer.

    Interleaved (VPP) layout: chunk v of stage p holds layers
    v * (L / vp) + p * (L / pp / vp) ... so consecutive stages take consecutive chunks.
    """
    return _layer_split.get_transformer_layer_offset(
        config, _vp_stage_or_default(config, vp_stage), pp_rank
    )


@dataclass
class TransformerLayerSubmodules:
    """Specs of a layer's pieces; absent pieces are identities."""

    input_layernorm: ModuleSpec | type = IdentityOp
    self_attention: ModuleSpec | type = IdentityOp
    self_attn_bda: ModuleSpec | type = IdentityFuncOp
    pre_cross_attn_layernorm: ModuleSpec | type = IdentityOp
    cross_attention: ModuleSpec | type = IdentityOp
    cross_attn_bda: ModuleSpec | type = IdentityFuncOp
    pre_mlp_layernorm: ModuleSpec | type = IdentityOp
    mlp: ModuleSpec | type = IdentityOp
    mlp_bda: ModuleSpec | type = IdentityFuncOp
    sharded_state_dict_keys_map: dict[str, str] = field(default_factory=dict)
    # gigatron (the names of Megatron-Bridge's Gemma layer): norms of the attention / MLP output
    # before the residual add; None = the config's norm where config.post_self_attn_layernorm /
    # config.post_mlp_layernorm is set, else none.
    post_self_attn_layernorm: ModuleSpec | type | None = None
    post_mlp_layernorm: ModuleSpec | type | None = None


def _post_norm(spec, enabled: bool, norm_kwargs: dict):
    """The post-attention / post-MLP norm: `spec`, else the config's norm when `enabled`."""
    if spec is None:
        spec = WrappedTorchNorm if enabled else IdentityOp
    return build_module(spec, **norm_kwargs)


def _apply_post_norm(norm, out_with_bias):
    """(out [s, b, h], bias [h] | None) -> (norm(out + bias), None); unchanged without a norm."""
    if isinstance(norm, IdentityOp):
        return out_with_bias
    out, bias = out_with_bias
    return norm(out if bias is None else out + bias), None


class TransformerLayer(MegatronModule):
    """A single transformer layer built from `submodules`."""

    def __new__(cls, *args, **kwargs):
        # Checked here, not in __init__, so __init__ keeps Megatron's signature.
        submodules = args[1] if len(args) > 1 else kwargs.get("submodules")
        if submodules is None or hasattr(submodules, "module"):
            got = "none" if submodules is None else "a ModuleSpec (the whole layer spec)"
            raise TypeError(
                f"{cls.__name__} needs submodules=TransformerLayerSubmodules (got {got}); build "
                "it from a layer spec: spec = get_gpt_layer_local_spec() (gigatron.core.models."
                "gpt.gpt_layer_specs), then TransformerLayer(config, spec.submodules) or "
                "build_module(spec, config=config)"
            )
        return super().__new__(cls)

    def __init__(
        self,
        config,
        submodules: TransformerLayerSubmodules,
        layer_number: int = 1,
        hidden_dropout: float | None = None,
        pg_collection=None,
        vp_stage: int | None = None,
        is_mtp_layer: bool = False,
        add_layer_offset: bool = True,
        pp_layer_offset: int | None = None,
        name=None,
    ):
        super().__init__(config)
        self.submodules_config = submodules
        if add_layer_offset and not is_mtp_layer:  # MTP layers are numbered 1..D on their own
            offset = pp_layer_offset
            if offset is None:
                offset = get_transformer_layer_offset(config, vp_stage)
            layer_number += offset
        self.layer_number = layer_number
        self.vp_stage = vp_stage
        self.hidden_dropout = config.hidden_dropout if hidden_dropout is None else hidden_dropout
        norm_kwargs = dict(
            config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon
        )
        self.input_layernorm = build_module(submodules.input_layernorm, **norm_kwargs)
        self.self_attention = build_module(
            submodules.self_attention, config=config, layer_number=layer_number
        )
        self.post_self_attn_layernorm = _post_norm(
            submodules.post_self_attn_layernorm, config.post_self_attn_layernorm, norm_kwargs
        )
        self.self_attn_bda = build_module(submodules.self_attn_bda)
        self.pre_cross_attn_layernorm = build_module(
            submodules.pre_cross_attn_layernorm, **norm_kwargs
        )
        self.cross_attention = build_module(
            submodules.cross_attention, config=config, layer_number=layer_number
        )
        self.cross_attn_bda = build_module(submodules.cross_attn_bda, config=config)
        self.pre_mlp_layernorm = build_module(submodules.pre_mlp_layernorm, **norm_kwargs)
        self.mlp = build_module(submodules.mlp, config=config)
        if hasattr(self.mlp, "set_layer_number"):  # MoE layers file aux losses per layer
            self.mlp.set_layer_number(self.layer_number)
        self.post_mlp_layernorm = _post_norm(
            submodules.post_mlp_layernorm, config.post_mlp_layernorm, norm_kwargs
        )
        self.mlp_bda = build_module(submodules.mlp_bda)
        # Megatron's selective recompute by module: "mlp" the dense MLP, "moe" the whole MoE
        # layer (checkpointed), "layernorm" both norms (outputs freed, recomputed at backward)
        selective = config.recompute_modules if config.recompute_granularity == "selective" else ()
        is_moe = getattr(self.mlp, "router", None) is not None
        self.recompute_mlp = ("moe" if is_moe else "mlp") in selective
        self.recompute_layernorm = (
            "layernorm" in selective and not config.apply_residual_connection_post_layernorm
        )

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """Every submodule's entries (MegatronModule's default), with the checkpoint keys renamed
        through the spec's `sharded_state_dict_keys_map` (the local spec's norms under
        Transformer Engine's fused names, `input_layernorm.weight` ->
        `self_attention.linear_qkv.layer_norm_weight`); the dict keys stay the module's."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        keys_map = self.submodules_config.sharded_state_dict_keys_map
        if keys_map:
            apply_prefix_mapping(
                sharded, {f"{prefix}{old}": f"{prefix}{new}" for old, new in keys_map.items()}
            )
        return sharded

    def _bda(self, bda, out_with_bias, residual: Tensor) -> Tensor:
        return bda(self.training, self.config.bias_dropout_fusion)(
            out_with_bias, residual, self.hidden_dropout
        )

    def _norm_checkpoint(self, norm):
        """A CheckpointWithoutOutput for `norm` under recompute "layernorm" while training; None
        otherwise or for an identity norm (IdentityOp returns its input: nothing to free)."""
        if not (self.recompute_layernorm and self.training and torch.is_grad_enabled()):
            return None
        if isinstance(norm, IdentityOp):
            return None
        return tensor_parallel.CheckpointWithoutOutput()

    @staticmethod
    def _norm(norm, x: Tensor, ckpt) -> Tensor:
        """norm(x) [s, b, h]; its output freed after use and recomputed under `ckpt`."""
        return norm(x) if ckpt is None else ckpt.checkpoint(norm, x)

    def _mlp(self, x: Tensor):
        if not (self.recompute_mlp and self.training):
            return self.mlp(x)

        def run(inp):
            out, bias = self.mlp(inp)
            # bda computes dropout(out + bias): adding the bias here is the same sum, and keeps
            # the bias parameter itself out of the checkpointed outputs.
            return out if bias is None else out + bias

        return tensor_parallel.checkpoint(run, False, x), None

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        rotary_pos_emb: Tensor | None = None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        rotary_pos_cos_sin=None,
        attention_bias=None,
        inference_context=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        padding_mask=None,
        *,
        inference_params=None,
    ) -> tuple[Tensor, Tensor | None]:
        """hidden_states [s, b, h] -> (hidden_states [s, b, h], context)."""
        residual = hidden_states
        norm_ckpt = self._norm_checkpoint(self.input_layernorm)
        normed = self._norm(self.input_layernorm, hidden_states, norm_ckpt)
        if self.config.apply_residual_connection_post_layernorm:
            residual = normed
        attn_out = self.self_attention(
            normed,
            attention_mask=attention_mask,
            rotary_pos_emb=rotary_pos_emb,
            attention_bias=attention_bias,
            packed_seq_params=packed_seq_params,
            inference_context=inference_context,
        )
        if norm_ckpt is not None:  # the norm's output is refilled when attention's grad arrives
            norm_ckpt.discard_output_and_register_recompute(attn_out[0])
        attn_out = _apply_post_norm(self.post_self_attn_layernorm, attn_out)
        hidden_states = self._bda(self.self_attn_bda, attn_out, residual)

        residual = hidden_states
        normed = self.pre_cross_attn_layernorm(hidden_states)
        cross_out = self.cross_attention(
            normed, attention_mask=context_mask, key_value_states=context
        )
        if isinstance(cross_out, dict) and "context" in cross_out:
            context = cross_out["context"]
        hidden_states = self._bda(self.cross_attn_bda, cross_out, residual)

        residual = hidden_states
        norm_ckpt = self._norm_checkpoint(self.pre_mlp_layernorm)
        normed = self._norm(self.pre_mlp_layernorm, hidden_states, norm_ckpt)
        if self.config.apply_residual_connection_post_layernorm:
            residual = normed
        mlp_out = self._mlp(normed)
        if norm_ckpt is not None:
            norm_ckpt.discard_output_and_register_recompute(mlp_out[0])
        mlp_out = _apply_post_norm(self.post_mlp_layernorm, mlp_out)
        hidden_states = self._bda(self.mlp_bda, mlp_out, residual)
        output = make_viewless_tensor(
            hidden_states, requires_grad=hidden_states.requires_grad, keep_graph=True
        )
        return output, context
