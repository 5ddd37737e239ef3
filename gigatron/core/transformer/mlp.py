"""Feed-forward block: fc1 (column-parallel) -> activation -> fc2 (row-parallel).

Mirrors `megatron.core.transformer.mlp` (MLP, MLPSubmodules). With `gated_linear_unit` fc1 has
2*ffn rows and each TP rank's shard is [gate_shard; up_shard] (stride 2 over the global
[all gate; all up] weight), so the output is act(gate) * (up + glu_linear_offset): SwiGLU when
the activation is silu, quick GEGLU with quick_gelu; `activation_func_clamp_value` c first clamps
gate to <= c and up to [-c, c] (GPT-OSS: quick GEGLU, offset 1, c = 7; `glu_activation`, shared
with the experts).

Checkpoints hold fc1 of a GLU as the global [all gate; all up] tensor, as in Megatron: the
`sharded_state_dict` wraps fc1's weight and bias in `apply_swiglu_sharded_factory`, which saves
each rank's [gate_r; up_r] as two boxes (gate at fragment r, up at fragment tp + r of 2 * tp).

Shapes: s: seq, b: micro-batch, h: hidden, f: ffn hidden size, tp: tensor-parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gigatron.compat import missing_names
from gigatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.utils import sharded_state_dict_default


@dataclass
class MLPSubmodules:
    """Specs of fc1, fc2 and (optionally) an activation module."""

    linear_fc1: ModuleSpec | type = None
    linear_fc2: ModuleSpec | type = None
    activation_func: ModuleSpec | type = None


class MLP(MegatronModule):
    """h -> f (x2 for GLU) -> h; returns (output, bias) with the fc2 bias not yet added."""

    def __init__(
        self,
        config,
        submodules: MLPSubmodules,
        is_expert: bool = False,
        input_size: int | None = None,
        ffn_hidden_size: int | None = None,
        tp_group=None,
        name=None,
        pg_collection=None,
    ):
        super().__init__(config)
        self.input_size = config.hidden_size if input_size is None else input_size
        ffn = config.ffn_hidden_size if ffn_hidden_size is None else ffn_hidden_size
        glu = config.gated_linear_unit
        extra = {} if tp_group is None else {"tp_group": tp_group}
        self.linear_fc1 = build_module(
            submodules.linear_fc1,
            self.input_size,
            2 * ffn if glu else ffn,
            config=config,
            init_method=config.init_method,
            gather_output=False,
            bias=config.add_bias_linear,
            # Megatron adds the fc1 bias in the MLP (skip_bias_add=True); gigatron lets the
            # GEMM add it (cuBLAS epilogue), which also gives torch.compile the cheap 2-D
            # bias-gradient reduction instead of one fused into the activation backward.
            skip_bias_add=False,
            is_expert=is_expert,
            tp_comm_buffer_name="fc1",
            stride=2 if glu else 1,
            **extra,
        )
        self.activation_func = config.activation_func
        self.linear_fc2 = build_module(
            submodules.linear_fc2,
            ffn,
            config.hidden_size,
            config=config,
            init_method=config.output_layer_init_method,
            bias=config.add_bias_linear,
            input_is_parallel=True,
            skip_bias_add=True,
            is_expert=is_expert,
            tp_comm_buffer_name="fc2",
            **extra,
        )

    def forward(self, hidden_states: Tensor, per_token_scale=None, **kwargs):
        """[s(/tp), b, h] -> (output [s(/tp), b, h], fc2 bias [h] or None)."""
        x = self._fc1_and_activation(hidden_states)
        if per_token_scale is not None:
            x = (x * per_token_scale.unsqueeze(-1)).to(x.dtype)
        return self.linear_fc2(x)  # ([s(/tp), b, h], bias)

    def _fc1_and_activation(self, hidden_states: Tensor) -> Tensor:
        """[s(/tp), b, h] -> fc1 (+ bias), activation -> [s, b, f/tp]."""
        x, bias = self.linear_fc1(hidden_states)  # [s, b, f/tp] (2f/tp for GLU)
        if bias is not None:
            x = x + bias
        if self.config.gated_linear_unit:
            return glu_activation(x, self.config, self.activation_func)  # [s, b, f/tp]
        return self.activation_func(x)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """fc1 and fc2's entries; with GLU fc1's weight and bias as swiglu factories."""
        out = {}
        for name, module in self._modules.items():
            sub = sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets, metadata)
            if self.config.gated_linear_unit and name == "linear_fc1":
                for key in (f"{prefix}{name}.weight", f"{prefix}{name}.bias"):
                    if key in sub:
                        sub[key] = apply_swiglu_sharded_factory(sub[key], sharded_offsets)
            out.update(sub)
        return out


def glu_activation(x: Tensor, config, activation_func) -> Tensor:
    """[..., 2f] (gate half, up half) -> [..., f]: act(gate) * (up + glu_linear_offset), the
    halves clamped first when config.activation_func_clamp_value is set (Megatron's `glu`)."""
    gate, up = torch.chunk(x, 2, dim=-1)
    clamp = config.activation_func_clamp_value
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(min=-clamp, max=clamp)
    return activation_func(gate) * (up + config.glu_linear_offset)


def apply_swiglu_sharded_factory(
    original_sh_ten: ShardedTensor, sharded_offsets=(), singleton_local_shards: bool = False
) -> ShardedTensorFactory:
    """A factory saving a GLU fc1 shard [gate_r; up_r] (TP piece r of tp along axis 0) as two
    boxes of the global [all gate; all up]: gate at fragment r, up at fragment tp + r of 2 * tp;
    loading concatenates them back. `sharded_offsets`: the prepended axes (stacked layer)."""
    if singleton_local_shards:
        raise ValueError("apply_swiglu_sharded_factory: singleton_local_shards is not supported")
    p = len(sharded_offsets)
    local_rows = original_sh_ten.local_shape[0]
    tp_rank = original_sh_ten.global_offset[p] // local_rows
    tp_size = original_sh_ten.axis_fragmentations[p]

    @torch.no_grad()
    def build(key, t, replica_id, flattened_range):
        gate, up = torch.chunk(t, 2, dim=0)
        return [
            ShardedTensor.from_rank_offsets(
                key,
                half,
                *sharded_offsets,
                (p, frag, 2 * tp_size),
                replica_id=replica_id,
                prepend_axis_num=p,
            )  # fmt: skip
            for half, frag in ((gate, tp_rank), (up, tp_size + tp_rank))
        ]

    def merge(pieces):
        with torch.no_grad():
            return torch.cat(pieces)

    return ShardedTensorFactory(
        original_sh_ten.key,
        original_sh_ten.data,
        build,
        merge,
        original_sh_ten.replica_id,
        flattened_range=original_sh_ten.flattened_range,
    )


# `from ...transformer.mlp import MoEMLP` (tutorials' name) says what to use instead
__getattr__ = missing_names.module_getattr(__name__)
