"""TransformerLayer / TransformerBlock pieces: pipeline and virtual-pipeline layer offsets,
cross attention, qk layernorm, Float16Module, spec building, norms."""

import contextlib
import dataclasses

import pytest
import torch

from gigatron.core import parallel_state
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.attention import CrossAttention, CrossAttentionSubmodules
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.module import Float16Module
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.transformer.transformer_block import TransformerBlock
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.transformer.transformer_layer import (
    get_num_layers_to_build,
    get_transformer_layer_offset,
)
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=3)


def _cfg(**kw):
    base = dict(
        num_layers=8,
        hidden_size=16,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    return TransformerConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "pp, vp, expected",  # expected[pp_rank][vp_stage] = first global layer index
    [
        (2, None, [[0], [4]]),
        (4, None, [[0], [2], [4], [6]]),
        (2, 2, [[0, 4], [2, 6]]),  # interleaved: chunks alternate between stages
        (2, 4, [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ],
)
def test_layer_offsets_for_pipeline_and_virtual_stages(pp, vp, expected):
    cfg = _cfg(
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        pipeline_dtype=torch.float32,
    )
    got = [
        [get_transformer_layer_offset(cfg, vp_stage=v, pp_rank=p) for v in range(vp or 1)]
        for p in range(pp)
    ]
    assert got == expected
    with _fake_pipeline(pp, 0):
        assert get_num_layers_to_build(cfg) == 8 // pp // (vp or 1)


@contextlib.contextmanager
def _fake_pipeline(pp_size: int, pp_rank: int):
    """Megatron's fake-init setters stand for a pipeline group in this one process (the model
    code checks the config's pipeline size against parallel_state's)."""
    parallel_state.set_pipeline_model_parallel_world_size(pp_size)
    parallel_state.set_pipeline_model_parallel_rank(pp_rank)
    try:
        yield
    finally:
        parallel_state.set_pipeline_model_parallel_rank(None)
        parallel_state.set_pipeline_model_parallel_world_size(None)


def test_block_builds_its_stage_layers_with_global_numbers():
    cfg = _cfg(
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
        pipeline_dtype=torch.float32,
    )
    with _fake_pipeline(2, 1):
        block = TransformerBlock(cfg, get_gpt_layer_local_spec(), vp_stage=1, post_process=False)
    assert [layer.layer_number for layer in block.layers] == [7, 8]
    assert block.final_layernorm is None
    assert block.layers[1].self_attention.core_attention.layer_number == 8


def test_cross_attention_matches_manual_computation():
    cfg = _cfg(add_bias_linear=False)
    from gigatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    attn = CrossAttention(
        cfg,
        CrossAttentionSubmodules(
            linear_q=ColumnParallelLinear,
            linear_kv=ColumnParallelLinear,
            core_attention=DotProductAttention,
            linear_proj=RowParallelLinear,
        ),
        layer_number=1,
    )
    x, ctx = torch.randn(5, 2, 16), torch.randn(7, 2, 16)
    out, bias = attn(x, attention_mask=None, key_value_states=ctx)
    assert bias is None and out.shape == (5, 2, 16)
    q = (x @ attn.linear_q.weight.t()).view(5, 2, 4, 4)
    kv = (ctx @ attn.linear_kv.weight.t()).view(7, 2, 4, 8)
    k, v = kv[..., :4], kv[..., 4:]
    probs = torch.einsum("sbnd,tbnd->bnst", q, k).mul(0.5).softmax(-1)
    ref = torch.einsum("bnst,tbnd->sbnd", probs, v).reshape(5, 2, 16) @ attn.linear_proj.weight.t()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_qk_layernorm_normalises_each_head():
    cfg = _cfg(num_layers=1, normalization="RMSNorm", qk_layernorm=True)
    model = GPTModel(
        cfg, get_gpt_layer_local_spec(qk_layernorm=True), 32, 16, position_embedding_type="rope"
    )
    attn = model.decoder.layers[0].self_attention
    assert attn.q_layernorm.weight.shape == (4,)  # per head dim
    x = torch.randn(6, 2, 16)
    q, k, _ = attn.get_query_key_value_tensors(x)
    raw = (x @ attn.linear_qkv.weight.t() + attn.linear_qkv.bias).view(6, 2, 4, 12)
    raw_q, raw_k = raw[..., :4], raw[..., 4:8]  # one query per group: rows [q, k, v] per head
    for got, r in ((q, raw_q), (k, raw_k)):
        ref = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + cfg.layernorm_epsilon)
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    model(torch.randint(0, 32, (2, 6)), None, None).sum().backward()
    assert attn.k_layernorm.weight.grad is not None


def test_float16_module_runs_bf16_and_returns_fp32():
    cfg = _cfg(num_layers=2, bf16=True, params_dtype=torch.bfloat16)
    model = GPTModel(cfg, get_gpt_layer_local_spec(), 32, 16, position_embedding_type="rope")
    wrapped = Float16Module(cfg, model)
    assert next(model.parameters()).dtype == torch.bfloat16
    out = wrapped(torch.randint(0, 32, (2, 6)), None, None)
    assert out.dtype == torch.float32 and out.shape == (2, 6, 32)
    out.float().sum().backward()


def test_norms_mark_sequence_parallel_and_zero_centered_gamma():
    cfg = _cfg(tensor_model_parallel_size=1, layernorm_zero_centered_gamma=True)
    norm = WrappedTorchNorm(cfg, 16, 1e-5)
    assert torch.equal(norm.weight, torch.zeros(16))
    x = torch.randn(3, 16)
    torch.testing.assert_close(norm(x), torch.nn.functional.layer_norm(x, (16,)))
    assert norm.weight.sequence_parallel is False
    rms = WrappedTorchNorm(dataclasses.replace(cfg, normalization="RMSNorm"), 16, 1e-6)
    assert rms.bias is None


def test_build_module_reports_the_class_and_accepts_path_tuples():
    spec = ModuleSpec(module=("gigatron.core.transformer.identity_op", "IdentityOp"))
    assert build_module(spec)(3) == 3
    with pytest.raises(TypeError, match="when instantiating Linear"):
        build_module(ModuleSpec(module=torch.nn.Linear, params={"bogus": 1}), 2, 3)
