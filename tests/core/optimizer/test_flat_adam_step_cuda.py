"""The flat fused Adam(W) step's update (gigatron/core/optimizer/_flat_adam_step.py) on one
flat tensor with two param groups and padding: eager against torch.optim.AdamW on the same fp32
values (CPU, everywhere), and on CUDA the compiled update against the eager one; the model copy
equals the fp32 main rounded to bf16."""

import pytest
import torch

from gigatron.core.optimizer._flat_adam_step import _update_fn, flat_adam_update

BETAS, EPS = (0.9, 0.95), 1e-8


def _row(lr: float, wd: float, t: int) -> list[float]:
    b1, b2 = BETAS
    return [1 - lr * wd, lr / (1 - b1**t), (1 - b2**t) ** 0.5, 1 - b1, b2, 1 - b2, EPS, 0.0, 1.0]


def _run(device: str, n: int, fns: dict) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    split, pad = n * 3 // 5, n // 1000 + 1  # group 0 | group 1 | padding (row 2)
    main0 = torch.randn(n, device=device, generator=gen) * 0.02
    main0[n - pad :] = 0.0
    gid = torch.zeros(n, dtype=torch.uint8, device=device)
    gid[split:] = 1
    gid[n - pad :] = 2
    lrs, wds = (1e-2, 3e-3), (0.1, 0.0)
    ref_params = [torch.nn.Parameter(main0[:split].clone())]
    ref_params.append(torch.nn.Parameter(main0[split : n - pad].clone()))
    groups = [{"params": [ref_params[i]], "lr": lrs[i], "weight_decay": wds[i]} for i in (0, 1)]
    ref = torch.optim.AdamW(groups, betas=BETAS, eps=EPS, foreach=True)
    zeros = lambda: torch.zeros(n, device=device)  # noqa: E731
    states = {k: [main0.clone(), zeros(), zeros()] for k in fns}
    models = {k: torch.empty(n, dtype=torch.bfloat16, device=device) for k in fns}
    for t in (1, 2, 3):
        grad = torch.randn(n, device=device, generator=gen) * 1e-2
        grad[n - pad :] = 0.0
        rows = [_row(lrs[0], wds[0], t), _row(lrs[1], wds[1], t), [1, 0, 1, 1, 0, 1, 1, 0, 1]]
        table = torch.tensor(rows, dtype=torch.float64).float().to(device)
        for key, fn in fns.items():
            main, m, v = states[key]
            fn(main, grad, m, v, gid, table, models[key])
        ref_params[0].grad = grad[:split].clone()
        ref_params[1].grad = grad[split : n - pad].clone()
        ref.step()
    want = torch.cat([ref_params[0].detach(), ref_params[1].detach()])
    return {"states": states, "models": models, "want": want, "pad": pad}


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_eager_update_matches_torch_adamw():
    out = _run("cpu", 5000, {"eager": flat_adam_update})
    main, m, v = out["states"]["eager"]
    pad = out["pad"]
    assert _rel(main[:-pad], out["want"]) <= 2e-6
    assert (main[-pad:] == 0).all() and (m[-pad:] == 0).all() and (v[-pad:] == 0).all()
    assert torch.equal(out["models"]["eager"], main.bfloat16())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_cuda_update_matches_eager_and_torch_adamw():
    fns = {"eager": flat_adam_update, "compiled": _update_fn(torch.device("cuda"))}
    out = _run("cuda", 1 << 20, fns)
    eager, compiled = out["states"]["eager"][0], out["states"]["compiled"][0]
    assert _rel(compiled, eager) <= 2e-6
    assert _rel(eager[: -out["pad"]], out["want"]) <= 2e-6
    assert torch.equal(out["models"]["compiled"], compiled.bfloat16())
