"""Each fast-path piece against the plain path, on CUDA in bf16 (skipped without a GPU).

- SDPA core attention (cuDNN, flash) vs the local DotProductAttention, whole GPT loss and grads;
- torch.compile of every TransformerLayer vs the same model eager;
- fused AdamW vs the foreach AdamW on the same bf16 params and grads;
(the chunked cross entropy has its own file). Tolerances are bf16's: relative error of the
loss < 5e-3, of every gradient < 3e-2 (the two paths round differently in bf16).
"""

import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.fast_path import compile_transformer_layers, sdpa_backends
from gigatron.core.transformer.transformer_config import TransformerConfig

pytestmark = pytest.mark.gpu

GPT = dict(num_layers=2, hidden_size=256, num_attention_heads=4)
LLAMA = dict(
    num_layers=2,
    hidden_size=256,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=512,
    gated_linear_unit=True,
    activation_func=F.silu,
    normalization="RMSNorm",
    add_bias_linear=False,
)
VOCAB, SEQ, BATCH = 1024, 256, 2


@pytest.fixture(autouse=True)
def single_rank():
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()


def _model(shape, spec, state=None, **config):
    cfg = TransformerConfig(
        **shape,
        **config,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
    )
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    rope = "rope" if shape.get("gated_linear_unit") else "learned_absolute"
    with torch.device("cuda"):
        model = GPTModel(
            cfg,
            spec(),
            VOCAB,
            SEQ,
            share_embeddings_and_output_weights=True,
            position_embedding_type=rope,
        )
    model = model.cuda().to(torch.bfloat16)
    if state is not None:
        model.load_state_dict(state)
    return model


def _batch():
    g = torch.Generator(device="cuda").manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda", generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda", generator=g)
    pos = torch.arange(SEQ, device="cuda").unsqueeze(0).expand(BATCH, SEQ)
    return tokens, pos, labels


def _loss_and_grads(model, backends=None):
    tokens, pos, labels = _batch()
    with sdpa_backends(backends):
        loss = model(tokens, pos, None, labels=labels).mean()
        loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


def _assert_close(got, want):
    loss1, grads1 = got
    loss0, grads0 = want
    assert abs(loss1 - loss0) / abs(loss0) < 5e-3, (float(loss1), float(loss0))
    for name, g0 in grads0.items():
        rel = (grads1[name] - g0).norm() / g0.norm().clamp_min(1e-12)
        assert rel < 3e-2, f"{name}: relative grad error {rel:.2e}"


@pytest.mark.parametrize("shape", [GPT, LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_sdpa_backend_matches_local_attention(shape, backend):
    plain = _model(shape, get_gpt_layer_local_spec)
    fast = _model(shape, get_gpt_layer_fast_spec, plain.state_dict())
    _assert_close(_loss_and_grads(fast, [backend]), _loss_and_grads(plain))


@pytest.mark.parametrize("shape", [GPT, LLAMA], ids=["gpt", "llama"])
def test_compiled_layers_match_eager(shape):
    eager = _model(shape, get_gpt_layer_fast_spec)
    compiled = _model(shape, get_gpt_layer_fast_spec, eager.state_dict())
    assert compile_transformer_layers(compiled) == shape["num_layers"]
    _assert_close(_loss_and_grads(compiled), _loss_and_grads(eager))


def _ddp_compiled_matches_eager(mode, **config):
    """Compiled layers (`mode`) of a DDP-wrapped model with overlap: three steps (warm-up,
    recording, replays under CUDA graphs) each put the eager grads into main_grad, and the
    loss is the eager loss."""
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    eager = _model(GPT, get_gpt_layer_fast_spec)
    model = _model(GPT, get_gpt_layer_fast_spec, eager.state_dict(), **config)
    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(overlap_grad_reduce=True), model
    )
    compile_transformer_layers(model, mode=mode)
    want = _loss_and_grads(eager)
    tokens, pos, labels = _batch()
    for _ in range(3):
        ddp.zero_grad_buffer()
        loss = ddp(tokens, pos, None, labels=labels).mean()
        loss.backward()
        ddp.finish_grad_sync()
        grads = {n: p.main_grad.float().clone() for n, p in model.named_parameters()}
        _assert_close((loss.detach().float(), grads), want)


def test_cuda_graph_layers_under_ddp_match_eager():
    """Per-layer CUDA graphs (mode="reduce-overhead", the DP = 2 benchmark's setting) with DDP's
    grad hooks and overlap."""
    _ddp_compiled_matches_eager("reduce-overhead")


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_wgrad_fusion_compiled_layers_under_ddp_match_eager(mode):
    """gradient_accumulation_fusion with compiled layers (and per-layer CUDA graphs) under DDP:
    the linears add dW into bf16 main_grad in place (custom op), DDP's hook skips them, the
    tied embedding's grads still arrive; equal to the eager unfused grads."""
    _ddp_compiled_matches_eager(mode, gradient_accumulation_fusion=True)


def test_compile_needs_layers():
    with pytest.raises(ValueError, match="no TransformerLayer"):
        compile_transformer_layers(torch.nn.Linear(2, 2))


def test_sdpa_backend_names_checked():
    with pytest.raises(ValueError, match="must be among"):
        sdpa_backends(["nope"])


def _adamw(params, grads, **kw):
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, **kw)
    for step_grads in grads:
        for p, gr in zip(ps, step_grads):
            p.grad = gr.to(p.dtype)
        opt.step()
    return [p.detach().float() for p in ps]


def test_fused_adamw_matches_fp32_reference():
    """bf16 params: fused AdamW lands within bf16 rounding of an fp32 AdamW and no further
    from it than the plain (foreach) bf16 AdamW."""
    g = torch.Generator(device="cuda").manual_seed(2)
    shapes = [(512, 256), (256,), (1000, 64)]
    params = [torch.randn(s, device="cuda", generator=g).bfloat16() for s in shapes]
    grads = [[torch.randn(s, device="cuda", generator=g) for s in shapes] for _ in range(3)]
    ref = _adamw([p.float() for p in params], grads, foreach=True)
    fused = _adamw(params, grads, fused=True)
    plain = _adamw(params, grads, foreach=True)
    for r, f, p, p0 in zip(ref, fused, plain, params):
        assert (r - p0.float()).abs().max() > 1e-2  # the optimizer moved the params
        # 3 steps, each rounding to bf16 (half an ulp, 2^-9 relative): allow 3 full ulps.
        assert ((f - r).abs() <= 3 * 2**-7 * r.abs() + 1e-3).all()
        assert (f - r).abs().mean() <= 1.05 * (p - r).abs().mean() + 1e-6
