"""gradient_accumulation_fusion with an fp32 main_grad and bf16 activations on CUDA: the weight
gradient is accumulated by one cuBLAS GEMM into the fp32 buffer (aten `addmm.dtype_out`), so it
is never rounded to bf16: closer to an fp64 reference than the bf16 GEMM + fp32 add it
replaces, and repeated accumulation (microbatches) adds up exactly as fp32 sums do."""

from __future__ import annotations

import pytest
import torch

from gigatron.core.tensor_parallel import wgrad

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_main_grad_accumulates_in_one_gemm(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    n, o, h = 512, 384, 256
    main_grad = torch.randn(o, h, device="cuda", generator=g)
    start = main_grad.clone()
    ref = start.double()
    for _ in range(3):  # three microbatches
        dy = torch.randn(n, o, device="cuda", generator=g).to(dtype)
        x = torch.randn(n, h, device="cuda", generator=g).to(dtype)
        wgrad.wgrad_accumulate_(main_grad, dy, x)
        ref += dy.double().t() @ x.double()
    assert wgrad._ADDMM_FP32["ok"] is True, "addmm.dtype_out was not used on this build"
    err = (main_grad.double() - ref).abs().max().item()
    # the old path: dW rounded to the activation dtype before the fp32 add
    old = start.clone()
    g = torch.Generator(device="cuda").manual_seed(0)
    torch.randn(o, h, device="cuda", generator=g)
    for _ in range(3):
        dy = torch.randn(n, o, device="cuda", generator=g).to(dtype)
        x = torch.randn(n, h, device="cuda", generator=g).to(dtype)
        old.add_(dy.t().matmul(x).float())
    old_err = (old.double() - ref).abs().max().item()
    assert err < 1e-3, err  # fp32 accumulation of ~512-term dot products of size ~20
    assert err < old_err / 4, (err, old_err)


def test_linear_backward_with_fusion_matches_reference():
    """A ColumnParallelLinear-style call path: weight_grad() with DDP's flag set."""
    from types import SimpleNamespace

    w = torch.nn.Parameter(torch.randn(64, 32, device="cuda", dtype=torch.bfloat16))
    w.main_grad = torch.zeros(64, 32, device="cuda", dtype=torch.float32)
    w.grad_added_to_main_grad = False
    ctx = SimpleNamespace(gradient_accumulation_fusion=True)
    dy = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(128, 32, device="cuda", dtype=torch.bfloat16)
    placeholder = wgrad.weight_grad(ctx, w, dy, x)
    assert placeholder.shape == w.shape and w.grad_added_to_main_grad
    want = dy.double().t() @ x.double()
    torch.testing.assert_close(w.main_grad.double(), want, rtol=0, atol=1e-4)
