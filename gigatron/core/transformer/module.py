"""MegatronModule base class and the fp16/bf16 wrapper Float16Module.

Mirrors `megatron.core.transformer.module`. `MegatronModule.sharded_state_dict` is Megatron's
default: this module's own tensors as TP-replicated ShardedTensors (`_extra_state` as
ShardedObjects), then every child's `sharded_state_dict` (or the same default for plain torch
modules), all with the `sharded_offsets` (prepended axes, e.g. the stacked-layer axis) handed
down; modules that shard over TP or rename keys override it. Float16Module casts the wrapped
model to half precision, converts floating inputs on the first pipeline stage and upcasts outputs
to fp32 on the last stage.
"""

from __future__ import annotations

import torch

from gigatron.core import parallel_state
from gigatron.core.transformer.utils import (
    ensure_metadata_has_dp_cp_group,
    make_sharded_tensors_for_checkpoint,
    sharded_state_dict_default,
)


def param_is_not_shared(param: torch.nn.Parameter) -> bool:
    """False for parameters marked `shared` (e.g. the tied output weight of the last stage)."""
    return not getattr(param, "shared", False)


class MegatronModule(torch.nn.Module):
    """nn.Module holding a `config`; base of every gigatron model module."""

    def __init__(self, config):
        super().__init__()
        if getattr(config, "hidden_size", None) == 0:
            raise ValueError(
                f"{type(self).__name__}: config.hidden_size (0) must be set to a positive value "
                "to build a model (0 is Megatron's default for a config that is not a model's)"
            )
        self.config = config

    def state_dict_for_save_checkpoint(self, prefix: str = "", keep_vars: bool = False):
        """The plain state dict (Megatron keeps this hook for legacy checkpoints)."""
        return self.state_dict(prefix=prefix, keep_vars=keep_vars)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """{state-dict key: ShardedTensor | ShardedTensorFactory | ShardedObject} of this module
        and its children; `sharded_offsets`: (axis, offset, size) of axes prepended by the
        modules above (the stacked-layer axis), `metadata`: options handed down (e.g.
        `non_homogeneous_layers`)."""
        own: dict = {}
        self._save_to_state_dict(own, "", keep_vars=True)
        tp_group = getattr(self, "tp_group", None)
        metadata = ensure_metadata_has_dp_cp_group(metadata)
        dp_cp_group = metadata["dp_cp_group"]
        out = make_sharded_tensors_for_checkpoint(
            own, prefix, sharded_offsets=sharded_offsets, tp_group=tp_group, dp_cp_group=dp_cp_group
        )
        for name, module in self.named_children():
            out.update(
                sharded_state_dict_default(
                    module, f"{prefix}{name}.", sharded_offsets, metadata, tp_group=tp_group
                )
            )
        return out

    def set_is_first_microbatch(self):
        """Mark the next forward as the first microbatch (used by FP8 weight caching; no-op)."""
        for m in self.modules():
            if hasattr(m, "is_first_microbatch"):
                m.is_first_microbatch = True


def _convert(val, conversion, from_types):
    if isinstance(val, (tuple, list)):
        out = [_convert(v, conversion, from_types) for v in val]
        return tuple(out) if isinstance(val, tuple) else out
    if isinstance(val, dict):
        return {k: _convert(v, conversion, from_types) for k, v in val.items()}
    if isinstance(val, torch.Tensor) and val.dtype in from_types:
        return conversion(val)
    return val


def fp32_to_float16(val, float16_convertor):
    """Convert fp32 tensors inside (nested) tuples/lists/dicts with `float16_convertor`."""
    return _convert(val, float16_convertor, (torch.float32,))


def float16_to_fp32(val):
    """Convert fp16/bf16 tensors inside (nested) tuples/lists/dicts to fp32."""
    return _convert(val, lambda t: t.float(), (torch.float16, torch.bfloat16))


def mark_keep_in_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """Mark a parameter or buffer that `Float16Module` leaves in FP32; returns the tensor."""
    tensor.keep_in_fp32 = True
    return tensor


def convert_module_to_dtype_except_fp32_marked(
    module: torch.nn.Module, dtype: torch.dtype
) -> torch.nn.Module:
    """Cast `module`'s floating-point parameters and buffers to `dtype` in place, except those
    marked with `mark_keep_in_fp32`."""

    def cast(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point() and not getattr(t, "keep_in_fp32", False):
            return t.to(dtype)
        return t

    return module._apply(cast)


class Float16Module(MegatronModule):
    """Run `module` in fp16 (config.fp16) or bf16 (config.bf16)."""

    wraps_model = True  # core.utils.unwrap_model follows .module

    def __init__(self, config, module: torch.nn.Module):
        super().__init__(config)
        self.fp16, self.bf16 = config.fp16, config.bf16
        self.vp_size = config.virtual_pipeline_model_parallel_size
        self.vp_stage = getattr(module, "vp_stage", None)
        if self.fp16:
            self.add_module(
                "module", convert_module_to_dtype_except_fp32_marked(module, torch.half)
            )
            self.float16_convertor = lambda t: t.half()
        elif self.bf16:
            self.add_module(
                "module", convert_module_to_dtype_except_fp32_marked(module, torch.bfloat16)
            )
            self.float16_convertor = lambda t: t.bfloat16()
        else:
            raise ValueError("Float16Module needs config.fp16=True or config.bf16=True")

    def set_input_tensor(self, input_tensor):
        return self.module.set_input_tensor(input_tensor)

    def _is_first(self) -> bool:
        first_chunk = self.vp_stage is None or self.vp_stage == 0
        return first_chunk and parallel_state.is_pipeline_first_stage(ignore_virtual=True)

    def _is_last(self) -> bool:
        last_chunk = self.vp_stage is None or self.vp_stage == (self.vp_size or 1) - 1
        return last_chunk and parallel_state.is_pipeline_last_stage(ignore_virtual=True)

    def forward(self, *inputs, fp32_output: bool = True, **kwargs):
        if self._is_first():
            inputs = fp32_to_float16(inputs, self.float16_convertor)
        outputs = self.module(*inputs, **kwargs)
        if self._is_last() and fp32_output:
            outputs = float16_to_fp32(outputs)
        return outputs

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def state_dict_for_save_checkpoint(self, prefix="", keep_vars=False):
        return self.module.state_dict_for_save_checkpoint(prefix=prefix, keep_vars=keep_vars)

    def sharded_state_dict(self, prefix="", *args, **kwargs):
        return self.module.sharded_state_dict(prefix, *args, **kwargs)

    def load_state_dict(self, state_dict, strict=True):
        return self.module.load_state_dict(state_dict, strict=strict)
