"""HybridStack: the decoder of a hybrid model, one layer per pattern symbol of this stage.

Mirrors `megatron.core.models.hybrid.hybrid_block` (HybridStack, HybridStackSubmodules, and the
older names MambaStack / MambaStackSubmodules). Megatron's canonical module is the models one
and `megatron.core.ssm.mamba_block` re-exports it; gigatron keeps the code here, on the floor of
the layers it builds, and `gigatron.core.models.hybrid.hybrid_block` re-exports it.
`M` MambaLayer, `*` attention-only TransformerLayer, `-` MLP-only layer, `E` MoE layer, then
`final_norm` on the last stage.
Checkpoint keys are per layer, `decoder.layers.<global index>.<name>`, as Megatron's (no stacked
layer axis: the layers differ). Gated DeltaNet (`G`), DSA (`D`) and MLA (`+`) layers are not
built yet: a pattern holding one is refused by name.

Shapes: s: seq (/tp with sequence parallelism), b: micro-batch, h: hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from gigatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
from gigatron.core.layout_invariant_init import init_rng_scope
from gigatron.core.ssm.mamba_hybrid_layer_allocation import Symbols
from gigatron.core.transformer.identity_op import IdentityOp
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.transformer.utils import sharded_state_dict_default
from gigatron.core.utils import make_viewless_tensor

_NOT_BUILT = {Symbols.GDN: "Gated DeltaNet", Symbols.DS_ATTENTION: "DSA", Symbols.MLA: "MLA"}


@dataclass
class HybridStackSubmodules:
    """One layer spec per symbol (Megatron's fields)."""

    mamba_layer: ModuleSpec | type = IdentityOp
    gdn_layer: ModuleSpec | type = IdentityOp
    attention_layer: ModuleSpec | type = IdentityOp
    dsa_layer: ModuleSpec | type = IdentityOp
    mla_layer: ModuleSpec | type = IdentityOp
    mlp_layer: ModuleSpec | type = IdentityOp
    moe_layer: ModuleSpec | type = IdentityOp


class HybridStack(MegatronModule):
    """[s, b, h] -> [s, b, h] through this stage's layers (`layer_type_list`, the first being
    global layer `pp_layer_offset` + 1)."""

    def __init__(self, config, submodules: HybridStackSubmodules, pre_process: bool = True,
                 layer_type_list: list[str] | None = None, pp_layer_offset: int = 0,
                 post_layer_norm: bool = True, post_process: bool = True, pg_collection=None,
                 is_mtp_layer: bool = False, name: str | None = None):  # fmt: skip
        super().__init__(config)
        if layer_type_list is None:
            raise ValueError("HybridStack: layer_type_list must be given (select_pipeline_segment)")
        for symbol in layer_type_list:
            if symbol in _NOT_BUILT:
                raise ValueError(
                    f"hybrid layer pattern symbol '{symbol}' ({_NOT_BUILT[symbol]} layer) is not "
                    "implemented by gigatron yet; use M, *, - or E"
                )
        self.pre_process, self.post_process = pre_process, post_process
        self.post_layer_norm = post_layer_norm
        self.layer_type_list = list(layer_type_list)
        self.input_tensor = None
        self.layers = nn.ModuleList()
        for i, symbol in enumerate(self.layer_type_list):
            number = i + 1 + pp_layer_offset
            # Seeded by the global layer number: the same layer gets the same weights whatever
            # stage builds it (gigatron.core.layout_invariant_init).
            with init_rng_scope(config, f"layer.{number}"):
                self.layers.append(
                    self._build_layer(submodules, symbol, number, pg_collection, pp_layer_offset)
                )
        self.final_norm = None
        if post_process and post_layer_norm:
            self.final_norm = WrappedTorchNorm(
                config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon
            )

    def _build_layer(self, submodules, symbol, number, pg_collection, pp_layer_offset):
        spec = {
            Symbols.MAMBA: submodules.mamba_layer,
            Symbols.ATTENTION: submodules.attention_layer,
            Symbols.MLP: submodules.mlp_layer,
            Symbols.MOE: submodules.moe_layer,
        }[symbol]
        if spec is IdentityOp:
            raise ValueError(f"HybridStack: the spec has no layer for pattern symbol '{symbol}'")
        if symbol == Symbols.MAMBA:
            return build_module(
                spec,
                config=self.config,
                layer_number=number,
                pg_collection=pg_collection,
                pp_layer_offset=pp_layer_offset,
            )
        return build_module(spec, config=self.config, layer_number=number, add_layer_offset=False)

    def set_input_tensor(self, input_tensor: Tensor) -> None:
        """The activation received from the previous pipeline stage."""
        self.input_tensor = input_tensor

    def mamba_state_shapes_per_request(self):
        """The first Mamba layer's (conv state, SSM state) shapes, or None without one."""
        for symbol, layer in zip(self.layer_type_list, self.layers):
            if symbol == Symbols.MAMBA:
                return layer.mamba_state_shapes_per_request()
        return None

    def forward(self, hidden_states: Tensor | None, attention_mask: Tensor | None = None,
                inference_context=None, rotary_pos_emb: Tensor | None = None, *,
                inference_params=None, packed_seq_params=None, **unused) -> Tensor:  # fmt: skip
        """hidden_states [s, b, h] -> [s, b, h]; without pre_process the input comes from
        set_input_tensor."""
        if packed_seq_params is not None:
            raise ValueError("HybridStack: packed_seq_params (packed sequences) is not implemented")
        context = inference_context if inference_context is not None else inference_params
        if not self.pre_process:
            hidden_states = self.input_tensor
        hidden_states = make_viewless_tensor(hidden_states, requires_grad=True, keep_graph=True)
        for symbol, layer in zip(self.layer_type_list, self.layers):
            if symbol == Symbols.MAMBA:
                hidden_states = layer(hidden_states, attention_mask, inference_context=context)
            else:
                hidden_states, _ = layer(
                    hidden_states,
                    attention_mask=attention_mask,
                    rotary_pos_emb=rotary_pos_emb,
                    inference_context=context,
                )
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
            hidden_states = make_viewless_tensor(hidden_states, requires_grad=True, keep_graph=True)
        return hidden_states

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """Per-layer entries `<prefix>layers.<global index>.<name>`, then the final norm."""
        out = {}
        for j, layer in enumerate(self.layers):
            local, glob = f"{prefix}layers.{j}.", f"{prefix}layers.{layer.layer_number - 1}."
            sharded = layer.sharded_state_dict(local, (), metadata)
            replace_prefix_for_sharding(sharded, local, glob)
            out.update(sharded)
        for name, module in self.named_children():
            if module is not self.layers:
                out.update(sharded_state_dict_default(module, f"{prefix}{name}.", (), metadata))
        return out


# Megatron's older names
MambaStackSubmodules = HybridStackSubmodules
MambaStack = HybridStack
