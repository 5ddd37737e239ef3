"""Float16Module casts to fp16 / bf16, except tensors marked with mark_keep_in_fp32."""

from __future__ import annotations

import pytest
import torch

from gigatron.core.transformer.module import (
    Float16Module,
    convert_module_to_dtype_except_fp32_marked,
    mark_keep_in_fp32,
)
from gigatron.core.transformer.transformer_config import TransformerConfig


def _module() -> torch.nn.Module:
    m = torch.nn.Linear(2, 2)
    m.fp32_param = mark_keep_in_fp32(torch.nn.Parameter(torch.zeros(4)))
    m.register_buffer("fp32_buf", mark_keep_in_fp32(torch.ones(3)))
    m.register_buffer("buf", torch.ones(3))
    m.register_buffer("steps", torch.zeros(1, dtype=torch.int64))
    return m


def test_mark_keep_in_fp32_returns_the_tensor_marked():
    t = torch.zeros(2)
    assert mark_keep_in_fp32(t) is t and t.keep_in_fp32 is True


@pytest.mark.parametrize(("flag", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_float16_module_keeps_marked_tensors_in_fp32(flag, dtype):
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, **{flag: True})
    inner = _module()
    param = inner.fp32_param
    wrapped = Float16Module(config, inner)
    assert wrapped.module.weight.dtype == dtype and wrapped.module.buf.dtype == dtype
    assert wrapped.module.fp32_param.dtype == torch.float32 and wrapped.module.fp32_param is param
    assert wrapped.module.fp32_buf.dtype == torch.float32
    assert wrapped.module.steps.dtype == torch.int64


def test_convert_module_to_dtype_except_fp32_marked_is_in_place():
    m = _module()
    assert convert_module_to_dtype_except_fp32_marked(m, torch.bfloat16) is m
    assert m.weight.dtype == torch.bfloat16 and m.fp32_param.dtype == torch.float32
