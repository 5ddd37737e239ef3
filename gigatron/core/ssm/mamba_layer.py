"""One Mamba layer: x + mixer(norm(x)) (pre-norm residual block around a MambaMixer).

Mirrors `megatron.core.ssm.mamba_layer` (MambaLayer, MambaLayerSubmodules). Megatron's TE spec
fuses the norm into the mixer's in_proj (`mixer.in_proj.layer_norm_weight`); gigatron keeps it a
separate `norm` module and writes the TE key through `sharded_state_dict_keys_map`, as its
transformer layers do.

Shapes: s: seq (/tp with sequence parallelism), b: micro-batch, h: hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from gigatron.core.dist_checkpointing.utils import apply_prefix_mapping
from gigatron.core.transformer.identity_op import IdentityOp
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module


@dataclass
class MambaLayerSubmodules:
    """Specs of the input norm, the mixer and the bias-dropout-add after it."""

    norm: ModuleSpec | type = IdentityOp
    mixer: ModuleSpec | type = IdentityOp
    mamba_bda: ModuleSpec | type = IdentityOp
    sharded_state_dict_keys_map: dict[str, str] = field(default_factory=dict)


class MambaLayer(MegatronModule):
    """[s, b, h] -> [s, b, h]."""

    def __init__(
        self,
        config,
        submodules: MambaLayerSubmodules,
        layer_number: int = 1,
        pg_collection=None,
        pp_layer_offset: int = 0,
        name: str | None = None,
    ):
        super().__init__(config)
        self.submodules_config = submodules
        self.layer_number = layer_number
        self.hidden_dropout = config.hidden_dropout
        self.mixer = build_module(
            submodules.mixer, config, d_model=config.hidden_size, layer_number=layer_number,
            pg_collection=pg_collection, pp_layer_offset=pp_layer_offset,
        )  # fmt: skip
        self.norm = build_module(
            submodules.norm, config=config, hidden_size=config.hidden_size,
            eps=config.layernorm_epsilon,
        )  # fmt: skip
        self.mamba_bda = build_module(submodules.mamba_bda)

    def mamba_state_shapes_per_request(self):
        """The mixer's (conv state, SSM state) shapes of one sequence."""
        return self.mixer.mamba_state_shapes_per_request()

    def forward(self, hidden_states: Tensor, attention_mask=None, inference_context=None,
                rotary_pos_emb=None, *, inference_params=None, packed_seq_params=None):  # fmt: skip
        """[s, b, h] -> [s, b, h]; attention_mask and rotary_pos_emb are unused (as Megatron)."""
        context = inference_context if inference_context is not None else inference_params
        residual = hidden_states.float() if self.config.fp32_residual_connection else hidden_states
        hidden_states = self.norm(hidden_states.to(self.config.params_dtype))
        out_with_bias = self.mixer(
            hidden_states, inference_context=context, packed_seq_params=packed_seq_params
        )
        bda = self.mamba_bda(training=self.training, fused=self.config.bias_dropout_fusion)
        return bda(out_with_bias, residual, self.hidden_dropout)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """The children's entries, renamed by the spec's `sharded_state_dict_keys_map`."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        keys_map = self.submodules_config.sharded_state_dict_keys_map
        if keys_map:
            renames = {f"{prefix}{k}": f"{prefix}{v}" for k, v in keys_map.items()}
            apply_prefix_mapping(sharded, renames)
        return sharded
