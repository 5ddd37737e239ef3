"""`flat_adam_update` (gigatron/core/optimizer/_flat_adam_step.py) under torch.compile
(dynamic=True, as the CUDA path compiles it), here with Inductor's CPU backend: shards of
several sizes that are views at odd offsets of one buffer, bf16 model views and fp32 models
(model=None), a uint8 group index into the scalar table: the compiled update equals eager to
fp32 rounding, writes every output in place, and needs at most two graphs (model or None)."""

import shutil

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from gigatron.core.optimizer._flat_adam_step import flat_adam_update


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU backend needs g++")
def test_compiled_update_matches_eager():
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(flat_adam_update, dynamic=True)
    gen = torch.Generator().manual_seed(0)
    param_buf = torch.zeros(20000, dtype=torch.bfloat16)
    fp32_buf = torch.randn(20000, generator=gen)
    grad_buf = torch.randn(20000, generator=gen)
    table = torch.rand(3, 9, generator=gen) * 0.5 + 0.5
    table[2] = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])  # padding row
    off = 7  # not 3 or 9: duck sizing would tie it to the table's shape (a recompile)
    for i, n in enumerate((128, 384, 1000, 2048, 640, 4096)):
        bf16 = i % 2 == 0
        gid = torch.randint(0, 3, (n,), dtype=torch.uint8, generator=gen)
        state = [torch.randn(n, generator=gen) * 0.1, torch.rand(n, generator=gen) * 0.01]
        main = torch.randn(n, generator=gen) if bf16 else fp32_buf[off : off + n]
        grad = grad_buf[off : off + n]
        ref = [main.clone(), state[0].clone(), state[1].clone()]
        ref_model = torch.zeros(n, dtype=torch.bfloat16) if bf16 else None
        flat_adam_update(ref[0], grad, ref[1], ref[2], gid, table, ref_model)
        model = param_buf[off : off + n] if bf16 else None
        compiled(main, grad, state[0], state[1], gid, table, model)
        for got, want in zip((main, state[0], state[1]), ref, strict=True):
            err = ((got - want).abs().max() / want.abs().max()).item()
            assert err <= 1e-6, (n, err)
        if bf16:  # the model param is the compiled main rounded to bf16
            assert torch.equal(model, main.bfloat16())
        off += n + 5
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU backend needs g++")
def test_compiled_sync_free_update_matches_eager_and_skips():
    """The sync-free step's inputs (clip coefficient and skip flag as 0-dim tensors): compiled
    equals eager with the coefficient applied; with skip set (a NaN grad) nothing changes."""
    torch._dynamo.reset()
    compiled = torch.compile(flat_adam_update, dynamic=True)
    gen = torch.Generator().manual_seed(1)
    n = 3000
    table = torch.rand(2, 9, generator=gen) * 0.5 + 0.5
    table[:, 8] = 1.0  # the host scale column: 1 when the coefficient comes as a tensor
    gid = torch.randint(0, 2, (n,), dtype=torch.uint8, generator=gen)
    for skip in (False, True):
        grad = torch.randn(n, generator=gen)
        if skip:
            grad[5] = float("nan")
        start = [torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 0.1]
        start.append(torch.rand(n, generator=gen) * 0.01)
        coeff, flag = torch.tensor(0.25), torch.tensor(skip)
        ref = [t.clone() for t in start]
        scaled = table.clone()
        scaled[:, 8] = 0.25  # eager reference: the coefficient in the table
        flat_adam_update(*ref[:1], grad, *ref[1:], gid, scaled, None)
        got = [t.clone() for t in start]
        model = torch.zeros(n, dtype=torch.bfloat16)
        compiled(got[0], grad, got[1], got[2], gid, table, model, coeff, flag)
        want = start if skip else ref
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
        assert torch.equal(model, got[0].bfloat16())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU backend needs g++")
def test_shard_offsets_equal_to_lengths_do_not_recompile(monkeypatch):
    """DP rank 1's shards: each view starts where an earlier length ends (offset == n), which
    duck shaping turned into guards that recompiled the pass per shard (DP = 2 on CUDA hit
    dynamo's recompile limit). Under `_duck_shapes_off` (as the step runs them), shards of many
    sizes and offsets compile one graph (none here starts at offset 0, which is specialised)."""
    from gigatron.core.optimizer import _flat_adam_step as flat

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(flat, "_COMPILED", {})
    update = flat._compiled_or_eager(torch.compile(flat.flat_adam_update, dynamic=True))
    gen = torch.Generator().manual_seed(2)
    grad_buf = torch.randn(50000, generator=gen)
    param_buf = torch.zeros(50000, dtype=torch.bfloat16)
    table = torch.rand(2, 9, generator=gen) * 0.5 + 0.5
    off = 0
    for n in (300, 300, 600, 1200, 1200, 2400, 4000, 4000, 8000, 300):
        off += n  # rank 1 of 2: its shard starts one shard length into the bucket
        main, m, v = torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)
        gid = torch.zeros(n, dtype=torch.uint8)
        with flat._duck_shapes_off():  # as FlatAdamStep._update runs the pass on CUDA
            update(main, grad_buf[off : off + n], m, v, gid, table, param_buf[off : off + n])
        off += n
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # 2 with duck shapes
