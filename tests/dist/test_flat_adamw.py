"""FlatAdamW (AdamW over DDP's flat grad buffers, params moved into matching flat buffers)
against torch.optim.AdamW on the same DDP-reduced grads: DP = 2 gloo ranks, a tiny GPTModel with
tied embeddings, small buckets, three fp32 steps (first step's params equal to 1e-6, later ones
to 1% of an lr-sized update); the bf16 update against AdamW(fused=True) on the same grads."""

import shutil

import pytest
import torch

from gigatron.testing import run_distributed

VOCAB, SEQ, MBS, HIDDEN = 96, 16, 2, 32


def _train(flat: bool, dtype: torch.dtype):
    """Three DDP steps on this rank's batches: the params (as fp32) after each step."""
    import torch.distributed as dist

    from gigatron.core import parallel_state
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.optimizer.flat_adamw import FlatAdamW
    from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from gigatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel()  # DP = 2
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
    )
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(), VOCAB, SEQ).to(dtype)
    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=6000)
    ddp = DistributedDataParallel(cfg, ddp_config, model)
    params = [p for p in model.parameters() if p.requires_grad]
    if flat:
        opt = FlatAdamW(ddp, lr=1e-2, weight_decay=0.1)
        assert all(p.data_ptr() != q.data_ptr() for p, q in zip(params, params[1:]))
    else:
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=dtype == torch.bfloat16)
    rank, history = dist.get_rank(), []
    for step in range(3):
        ddp.zero_grad_buffer()
        opt.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(100 * step + rank)
        tokens = torch.randint(0, VOCAB, (MBS, SEQ), generator=gen)
        pos = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ)
        ddp(tokens, pos, None, labels=tokens).float().mean().backward()
        ddp.finish_grad_sync()
        if not flat:
            for p in params:
                p.grad = p.main_grad
        opt.step()
        history.append([p.detach().float().clone() for p in params])
    return history


def test_flat_adamw_matches_torch_adamw_under_ddp():
    ref = run_distributed(_train, 2, args=(False, torch.float32), timeout=180)
    got = run_distributed(_train, 2, args=(True, torch.float32), timeout=180)
    moved = 0.0
    for rank in range(2):
        for step, (a, b) in enumerate(zip(got[rank], ref[rank], strict=True)):
            # First step: the update formula, to fp32 rounding. Later steps: Adam divides by
            # sqrt(v), which amplifies rounding differences of tiny grads, so 1% of one
            # lr-sized update (a wrong moment or bias correction is off by ~lr).
            tol = 1e-6 if step == 0 else 1e-4
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                torch.testing.assert_close(x, y, rtol=1e-6, atol=tol, msg=f"step {step} param {i}")
        moved = max(moved, max((x - y).abs().max().item() for x, y in zip(got[0][-1], got[0][0])))
    assert moved > 1e-3  # the params really changed over the steps


def test_bf16_update_matches_torch_fused_adamw():
    """bf16 params and moments, the same grads fed to both for three steps: AdamW(fused=True)'s
    numbers (fp32 math, bf16 storage) to within one bf16 rounding."""
    from gigatron.core.optimizer.flat_adamw import adamw_flat_update

    gen = torch.Generator().manual_seed(0)
    p0 = (torch.randn(4096, generator=gen) * 0.05).bfloat16()
    ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1, fused=True)
    flat, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    for step in (1, 2, 3):
        grad = (torch.randn(4096, generator=gen) * 1e-2).bfloat16()
        ref.grad = grad.clone()
        opt.step()
        scalars = torch.tensor([1 - 1e-2 * 0.1, 1e-2 / (1 - 0.9**step), (1 - 0.999**step) ** 0.5])
        adamw_flat_update(flat, grad, m, v, scalars, 0.9, 0.999, 1e-8)
        got, want = flat.float(), ref.detach().float()
        # one bf16 ulp (8 mantissa bits) of the largest operand (p0 where the update cancels it)
        scale = torch.maximum(torch.maximum(got.abs(), want.abs()), p0.float().abs())
        assert ((got - want).abs() <= scale * 2**-7).all(), (step, (got - want).abs().max())
        torch.testing.assert_close(m, opt.state[ref]["exp_avg"], rtol=8e-3, atol=1e-6)
    assert (flat.float() - p0.float()).abs().max() > 1e-2


def test_flat_adamw_refuses_the_distributed_optimizer():
    from types import SimpleNamespace

    from gigatron.core.optimizer.flat_adamw import FlatAdamW

    fake = SimpleNamespace(ddp_config=SimpleNamespace(use_distributed_optimizer=True))
    with pytest.raises(ValueError, match="use_distributed_optimizer"):
        FlatAdamW(fake)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")  # fmt: skip
def test_compiled_update_matches_eager():
    from gigatron.core.optimizer.flat_adamw import _update_fn

    g = torch.Generator().manual_seed(0)
    n = 1000
    outs = []
    for compiled in (False, True):
        p = torch.randn(n, generator=torch.Generator().manual_seed(1))
        m, v = torch.zeros(n), torch.zeros(n)
        for step in (1, 2):
            grad = torch.randn(n, generator=g.manual_seed(step))
            scalars = torch.tensor([0.999, 1e-2 / (1 - 0.9**step), (1 - 0.99**step) ** 0.5])
            _update_fn(compiled)(p, grad, m, v, scalars, 0.9, 0.99, 1e-8)
        outs.append((p, m, v))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
def test_compiled_bf16_update_matches_torch_fused_adamw_cuda():
    """The compiled (Triton) update on CUDA, bf16: AdamW(fused=True)'s params within one bf16
    rounding, its moments within one rounding, over three steps of the same grads."""
    from gigatron.core.optimizer.flat_adamw import _update_fn

    gen = torch.Generator(device="cuda").manual_seed(0)
    n = 1 << 20
    p0 = (torch.randn(n, device="cuda", generator=gen) * 0.05).bfloat16()
    ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1, fused=True)
    flat, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    for step in (1, 2, 3):
        grad = (torch.randn(n, device="cuda", generator=gen) * 1e-2).bfloat16()
        ref.grad = grad.clone()
        opt.step()
        scalars = torch.tensor(
            [1 - 1e-2 * 0.1, 1e-2 / (1 - 0.9**step), (1 - 0.999**step) ** 0.5], device="cuda"
        )
        _update_fn(True)(flat, grad, m, v, scalars, 0.9, 0.999, 1e-8)
        got, want = flat.float(), ref.detach().float()
        scale = torch.maximum(torch.maximum(got.abs(), want.abs()), p0.float().abs())
        assert ((got - want).abs() <= scale * 2**-7).all(), step
        torch.testing.assert_close(m, opt.state[ref]["exp_avg"], rtol=8e-3, atol=1e-6)
