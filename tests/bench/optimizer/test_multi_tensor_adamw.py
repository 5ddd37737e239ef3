"""MultiTensorAdamW against torch.optim.AdamW: the PyTorch path everywhere (fp32: two param
groups with their own lr / weight decay, a param without grad, an lr change; bf16 within one
rounding of AdamW(fused=True)); state dicts load into either optimizer; bad arguments raise. The
Triton kernel through Triton's interpreter on CPU when Triton is installed (a subprocess with
TRITON_INTERPRET=1), and on CUDA in the GPU test."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from bench.optimizer.multi_tensor_adamw import MultiTensorAdamW
from tests._paths import REPO

ROOT = str(REPO)


def _params(dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(33, 7), (5000,), (4, 3, 2), (1,), (300, 20)]
    return [
        torch.nn.Parameter((torch.randn(s, generator=g) * 0.1).to(device, dtype)) for s in shapes
    ]


def _groups(ps):
    return [
        {"params": ps[:3], "lr": 1e-2, "weight_decay": 0.1},
        {"params": ps[3:], "lr": 3e-3, "weight_decay": 0.0},
    ]


def _run(opt_cls, dtype=torch.float32, device="cpu", steps=4, **kw):
    ps = _params(dtype, device)
    opt = opt_cls(_groups(ps), betas=(0.9, 0.99), eps=1e-8, **kw)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(ps):
            skip = step == 1 and i == 1  # a param without grad in one step
            grad = (torch.randn(p.shape, generator=g) * 1e-2).to(device, dtype)
            p.grad = None if skip else grad
        if step == 2:
            opt.param_groups[0]["lr"] = 5e-3  # a scheduler's change
        opt.step()
    return ps, opt


def test_matches_torch_adamw_fp32():
    got, _ = _run(MultiTensorAdamW, use_triton=False)
    want, _ = _run(torch.optim.AdamW)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert (got[0] - _params()[0]).abs().max() > 1e-2


def test_bf16_within_one_rounding_of_fused_adamw():
    got, _ = _run(MultiTensorAdamW, dtype=torch.bfloat16, use_triton=False)
    want, _ = _run(torch.optim.AdamW, dtype=torch.bfloat16, fused=True)
    for a, b in zip(got, want, strict=True):
        a, b = a.detach().float(), b.detach().float()
        assert ((a - b).abs() <= torch.maximum(a.abs(), b.abs()) * 2**-7 + 1e-6).all()


def test_state_dict_loads_into_torch_adamw_and_back():
    ps, opt = _run(MultiTensorAdamW, steps=2, use_triton=False)
    ref = torch.optim.AdamW(_groups(ps), betas=(0.9, 0.99))
    ref.load_state_dict(opt.state_dict())
    state = ref.state[ps[0]]
    assert float(state["step"]) == 2 and state["exp_avg"].abs().max() > 0
    back = MultiTensorAdamW(_groups(ps), betas=(0.9, 0.99), use_triton=False)
    back.load_state_dict(ref.state_dict())
    torch.testing.assert_close(back.state[ps[4]]["exp_avg_sq"], opt.state[ps[4]]["exp_avg_sq"])


def _strided_run(opt_cls, **kw):
    """A transposed param (non-contiguous) with a non-contiguous grad, and a param that is a view
    at an odd element offset of a buffer (not 16-byte aligned), beside plain ones."""
    g = torch.Generator().manual_seed(3)
    buf = torch.randn(1000, generator=g)
    ps = [
        torch.nn.Parameter(torch.randn(40, 7, generator=g).t()),
        torch.nn.Parameter(buf[3:603]),  # 600 elements at byte offset 12
        torch.nn.Parameter(torch.randn(333, generator=g)),
    ]
    opt = opt_cls(ps, lr=1e-2, weight_decay=0.1, **kw)
    for _ in range(3):
        for p in ps:
            grad = torch.randn(p.shape[::-1], generator=g)
            p.grad = grad.t() if p.dim() == 2 else grad
        opt.step()
    return ps


def test_non_contiguous_and_unaligned_params_match_torch_adamw():
    got = _strided_run(MultiTensorAdamW, use_triton=False)
    want = _strided_run(torch.optim.AdamW)
    assert not got[0].is_contiguous()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_state_dict_step_is_a_cpu_float_tensor_after_load():
    ps, opt = _run(MultiTensorAdamW, steps=2, use_triton=False)
    sd = opt.state_dict()
    for state in sd["state"].values():
        state["step"] = torch.tensor(2.0, dtype=torch.float64)  # e.g. another optimizer's
    back = MultiTensorAdamW(_groups(ps), betas=(0.9, 0.99), use_triton=False)
    back.load_state_dict(sd)
    step = back.state[ps[0]]["step"]
    assert step.device.type == "cpu" and step.dtype == torch.float32 and float(step) == 2


def test_bad_arguments():
    p = [torch.nn.Parameter(torch.zeros(3))]
    for kw, match in (
        ({"amsgrad": True}, "amsgrad"),
        ({"lr": -1.0}, "lr"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"block": 1000}, "block"),
    ):
        with pytest.raises(ValueError, match=match):
            MultiTensorAdamW(p, **kw)


_INTERPRETED = """
import torch
from tests.bench.optimizer.test_multi_tensor_adamw import _run
from bench.optimizer.multi_tensor_adamw import MultiTensorAdamW
got, _ = _run(MultiTensorAdamW, use_triton=True, block=128)
want, _ = _run(torch.optim.AdamW)
err = max((a - b).abs().max().item() for a, b in zip(got, want))
print("MAXERR", err)
assert err < 1e-6, err
from tests.bench.optimizer.test_multi_tensor_adamw import _strided_run
got = _strided_run(MultiTensorAdamW, use_triton=True, block=128)
want = _strided_run(torch.optim.AdamW)
err = max((a - b).abs().max().item() for a, b in zip(got, want))
print("STRIDED", err)
assert err < 1e-6, err
# a param replaced by a larger one (same object, same id): the block table must follow its size
ps = [torch.nn.Parameter(torch.zeros(100)) for _ in range(2)]
opt = MultiTensorAdamW(ps, lr=0.1, use_triton=True, block=128)
for p in ps:
    p.grad = torch.ones(100)
opt.step()
ps[1].data = torch.zeros(300)
ps[1].grad = torch.ones(300)
opt.state.pop(ps[1])
opt.step()
assert (ps[1] != 0).all(), (ps[1] == 0).sum()
print("RESIZED ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")
def test_triton_kernel_interpreted_matches_torch_adamw():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MAXERR" in out.stdout and "STRIDED" in out.stdout and "RESIZED" in out.stdout


_PTX = """
import re, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bench.optimizer._triton_adamw import _adamw_blocks
sig = dict.fromkeys(["block_tensor"], "*i32") | dict.fromkeys(["block_offset", "numel"], "*i64")
sig |= dict.fromkeys(["param_addr", "grad_addr", "exp_avg_addr", "exp_avg_sq_addr"], "*i64")
sig |= dict.fromkeys(["decay", "step_size", "bias2_sqrt"], "*fp32")
sig |= dict.fromkeys(["beta1", "beta2", "eps"], "fp32")
consts = dict(PARAM_DTYPE=tl.bfloat16, GRAD_DTYPE=tl.bfloat16, BLOCK=4096, ALIGNED=True)
sig |= dict.fromkeys(consts, "constexpr")
src = ASTSource(fn=_adamw_blocks, signature=sig, constexprs=consts)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("V4", len(re.findall(r"ld\\.global\\.v4", ptx)), len(re.findall(r"st\\.global\\.v4", ptx)))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")
def test_triton_kernel_compiles_to_vector_loads_for_sm90():
    """Offline compile (no GPU): full blocks of aligned tensors must use 16-byte accesses; the
    addresses come from memory, so without hints every bf16 element was its own 2-byte load."""
    out = subprocess.run(
        [sys.executable, "-c", _PTX], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0 and "ptxas" in out.stderr:
        pytest.skip("no ptxas for an offline CUDA compile")
    assert out.returncode == 0, out.stderr[-3000:]
    v4_loads, v4_stores = map(int, out.stdout.split()[1:3])
    assert v4_loads >= 16 and v4_stores >= 12, out.stdout  # 4 tensors x 32 bf16 per thread


@pytest.mark.gpu
def test_triton_kernel_cuda_bf16_matches_fused_adamw():
    got, opt = _run(MultiTensorAdamW, dtype=torch.bfloat16, device="cuda")
    want, _ = _run(torch.optim.AdamW, dtype=torch.bfloat16, device="cuda", fused=True)
    assert opt._tables  # the Triton path ran
    for a, b in zip(got, want, strict=True):
        a, b = a.detach().float(), b.detach().float()
        assert ((a - b).abs() <= torch.maximum(a.abs(), b.abs()) * 2**-7 + 1e-6).all()


def test_triton_path_host_logic_with_a_recording_launch(monkeypatch):
    """The host side of the Triton path, with the kernel replaced by one that records its
    arguments (runs without Triton): per-tensor scalars equal torch AdamW's bias corrections per
    group; the device address arrays are reused while every address stays and rebuilt when one
    moves (a new grad tensor); a non-contiguous grad goes to the PyTorch update instead."""
    import types

    calls = []

    def launch(tables, addrs, scalars, betas_eps, param_dtype, grad_dtype, block, aligned):
        calls.append([t.clone() for t in addrs] + [t.clone() for t in scalars] + [addrs[0]])

    fake = types.ModuleType("bench.optimizer._triton_adamw")
    fake.launch = launch
    monkeypatch.setitem(sys.modules, "bench.optimizer._triton_adamw", fake)
    import bench.optimizer as pkg

    monkeypatch.setattr(pkg, "_triton_adamw", fake, raising=False)
    ps = _params()
    opt = MultiTensorAdamW(_groups(ps), betas=(0.9, 0.99), use_triton=True)
    grads = [torch.ones_like(p) for p in ps]
    for p, g in zip(ps, grads, strict=True):
        p.grad = g
    opt.step()
    opt.step()
    assert len(calls) == 2
    first, second = calls
    assert second[-1] is first[-1]  # same addresses: the device arrays were reused
    want = [p.data_ptr() for p in ps] + [g.data_ptr() for g in grads]
    assert first[0].tolist() + first[1].tolist() == want
    decay, step_size, bias2 = second[4:7]  # step 2: lr 1e-2 / wd 0.1, then lr 3e-3 / wd 0
    assert decay.tolist() == pytest.approx([1 - 1e-3] * 3 + [1.0] * 2)
    assert step_size.tolist() == pytest.approx([1e-2 / 0.19] * 3 + [3e-3 / 0.19] * 2)
    assert bias2.tolist() == pytest.approx([(1 - 0.99**2) ** 0.5] * 5)
    ps[2].grad = torch.ones_like(ps[2])  # a new tensor: a new address
    ps[0].grad = torch.ones(7, 33).t()  # non-contiguous: PyTorch path
    before = ps[0].detach().clone()
    opt.step()
    assert calls[-1][-1] is not first[-1]
    assert calls[-1][0].tolist() == [p.data_ptr() for p in ps[1:3]] + [p.data_ptr() for p in ps[3:]]
    assert calls[-1][1].tolist()[1] == ps[2].grad.data_ptr()
    assert not torch.equal(ps[0].detach(), before)  # stepped by the PyTorch update


def test_step_count_is_float32_under_a_half_default_dtype():
    """torch AdamW keeps `step` float32 unless the default dtype is float64; a step made with
    the default dtype bf16 stops counting at 256 (256 + 1 rounds to 256)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float32))
        opt = MultiTensorAdamW([p], lr=1e-3, use_triton=False)
        p.grad = torch.ones(4, dtype=torch.float32)
        opt.step()
        assert opt.state[p]["step"].dtype == torch.float32
        opt.state[p]["step"].fill_(256.0)
        opt.step()
        assert float(opt.state[p]["step"]) == 257.0
    finally:
        torch.set_default_dtype(old)


def test_caches_stay_bounded_under_a_momentum_schedule_and_changing_grad_sets(monkeypatch):
    """OneCycleLR (cycle_momentum) changes beta1, hence the batch key, every step: the address
    arrays are kept for this step's batches only (one entry per step grew without bound). Grads
    present on changing subsets of the params (MoE experts without tokens) each need a block
    table: only the most recent `_MAX_TABLES` stay. The recorded launches see each step's betas."""
    import types

    from bench.optimizer import multi_tensor_adamw as mod

    calls = []
    fake = types.ModuleType("bench.optimizer._triton_adamw")
    fake.launch = lambda tables, addrs, scalars, betas_eps, *rest: calls.append(betas_eps)
    monkeypatch.setitem(sys.modules, "bench.optimizer._triton_adamw", fake)
    import bench.optimizer as pkg

    monkeypatch.setattr(pkg, "_triton_adamw", fake, raising=False)
    ps = [torch.nn.Parameter(torch.zeros(10 + i)) for i in range(10)]
    opt = MultiTensorAdamW(ps, lr=1e-3, use_triton=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=40)
    for step in range(30):
        for i, p in enumerate(ps):  # every param but ps[k % 11] (all at k % 11 == 10)
            p.grad = None if i == step % 11 else torch.ones_like(p)
        opt.step()
        sched.step()
        assert len(opt._addresses) == 1, len(opt._addresses)
    assert len({c[0] for c in calls}) > 10  # beta1 moved: a new batch key most steps
    assert len(opt._tables) == mod._MAX_TABLES < 11  # 11 grad subsets were used


def test_state_dict_with_amsgrad_or_maximize_is_refused():
    ps = _params()
    for key in ("amsgrad", "maximize"):
        torch_opt = torch.optim.AdamW(ps, lr=1e-3, **{key: True})
        with pytest.raises(ValueError, match=f"param group 0 has {key}=True"):
            MultiTensorAdamW(ps, lr=1e-3).load_state_dict(torch_opt.state_dict())
    plain = torch.optim.AdamW(ps, lr=1e-3).state_dict()  # amsgrad / maximize False: loads
    MultiTensorAdamW(ps, lr=1e-3).load_state_dict(plain)
