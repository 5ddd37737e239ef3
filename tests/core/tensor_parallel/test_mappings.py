"""Every tensor-parallel mapping on 1, 2 and 4 gloo ranks: values, gradients, and the exact
torch.distributed calls it issues in forward and in backward."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from functools import partial as P

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.tensor_parallel import mappings as M
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


# torch.distributed entry points, grouped under one name per collective kind.
_COLLECTIVES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "batch_isend_irecv": "batch_isend_irecv",
    "barrier": "barrier",
}


@contextlib.contextmanager
def count_collectives():
    """Count the torch.distributed collectives called inside the block (outermost calls only,
    so an entry point implemented with another one counts once)."""
    counts: Counter = Counter()
    depth = [0]
    originals = {n: getattr(dist, n) for n in _COLLECTIVES if hasattr(dist, n)}

    def wrap(name, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            if depth[0] == 0:
                counts[_COLLECTIVES[name]] += 1
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        return counted

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def fwd_bwd_counts(fn, x, grad):
    """Run `y = fn(x)` and `y.backward(grad)`; return (forward counts, backward counts, y)."""
    with count_collectives() as fwd:
        y = fn(x)
    with count_collectives() as bwd:
        y.backward(grad)
    return dict(fwd), dict(bwd), y


def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# s=8, b=2, h=8: divisible by 1, 2 and 4.
S, B, H = 8, 2, 8


def _cases(rank, tp, group):
    """(name, fn, input, grad_out, expected_out, expected_input_grad, fwd counts, bwd counts)."""
    full = _rand(0, S, B, H)  # same on every rank
    grads = [_rand(100 + r, S, B, H) for r in range(tp)]  # rank r's incoming grad (full shape)
    g = grads[rank]
    g_sum = sum(grads)
    hs, ss = H // tp, S // tp
    cols = slice(rank * hs, (rank + 1) * hs)
    rows = slice(rank * ss, (rank + 1) * ss)
    cols_of = [slice(r * hs, (r + 1) * hs) for r in range(tp)]
    rows_of = [slice(r * ss, (r + 1) * ss) for r in range(tp)]
    # Rank r's shard of a rank-dependent tensor, gathered in rank order.
    g_cols_cat = torch.cat([grads[r][..., cols_of[r]] for r in range(tp)], dim=-1)
    g_rows_cat = torch.cat([grads[r][rows_of[r]] for r in range(tp)], dim=0)
    partial = [_rand(200 + r, S, B, H) for r in range(tp)]  # per-rank partial sums
    p_sum = sum(partial)
    one = 1 if tp > 1 else 0

    def c(kind):
        return {kind: 1} if one else {}

    return [
        (
            "copy_to",
            P(M.copy_to_tensor_model_parallel_region, group=group),
            full,
            g,
            full,
            g_sum,
            {},
            c("all_reduce"),
        ),
        (
            "reduce_from",
            P(M.reduce_from_tensor_model_parallel_region, group=group),
            partial[rank],
            g,
            p_sum,
            g,
            c("all_reduce"),
            {},
        ),
        (
            "scatter_to_tp",
            P(M.scatter_to_tensor_model_parallel_region, group=group),
            full,
            g[..., cols],
            full[..., cols],
            g_cols_cat,
            {},
            c("all_gather"),
        ),
        (
            "gather_from_tp",
            P(M.gather_from_tensor_model_parallel_region, group=group),
            full[..., cols],
            g,
            full,
            g[..., cols],
            c("all_gather"),
            {},
        ),
        (
            "scatter_to_sp",
            P(M.scatter_to_sequence_parallel_region, group=group),
            full,
            g[rows],
            full[rows],
            g_rows_cat,
            {},
            c("all_gather"),
        ),
        (
            "gather_from_sp",
            P(M.gather_from_sequence_parallel_region, group=group),
            full[rows],
            g,
            full,
            g_sum[rows],
            c("all_gather"),
            c("reduce_scatter"),
        ),
        (
            "gather_from_sp_no_tp_grad",
            lambda x: M.gather_from_sequence_parallel_region(x, False, group),
            full[rows],
            g,
            full,
            g[rows],
            c("all_gather"),
            {},
        ),
        (
            "reduce_scatter_to_sp",
            P(M.reduce_scatter_to_sequence_parallel_region, group=group),
            partial[rank],
            g[rows],
            p_sum[rows],
            g_rows_cat,
            c("reduce_scatter"),
            c("all_gather"),
        ),
        (
            "all_gather_last_dim",
            P(M.all_gather_last_dim_from_tensor_parallel_region, group=group),
            full[..., cols],
            g,
            full,
            g_sum[..., cols],
            c("all_gather"),
            c("reduce_scatter"),
        ),
        (
            "reduce_scatter_last_dim",
            P(M.reduce_scatter_last_dim_to_tensor_parallel_region, group=group),
            partial[rank],
            g[..., cols],
            p_sum[..., cols],
            g_cols_cat,
            c("reduce_scatter"),
            c("all_gather"),
        ),
    ]


def _run_mappings(tp, use_parallel_state):
    rank = dist.get_rank()
    group = None  # the public functions default to parallel_state's TP group
    if use_parallel_state:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    else:
        group = dist.group.WORLD
    report = {}
    for name, fn, x, g, want, want_grad, want_fwd, want_bwd in _cases(rank, tp, group):
        x = x.clone().requires_grad_(True)
        x_before = x.detach().clone()
        fwd, bwd, y = fwd_bwd_counts(fn, x, g)
        torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6, msg=f"{name} output")
        torch.testing.assert_close(x.grad, want_grad, rtol=1e-6, atol=1e-6, msg=f"{name} grad")
        assert torch.equal(x.detach(), x_before), f"{name} modified its input"
        assert fwd == want_fwd, f"{name} forward collectives {fwd} != {want_fwd}"
        assert bwd == want_bwd, f"{name} backward collectives {bwd} != {want_bwd}"
        report[name] = (fwd, bwd)
    return report


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mappings_values_grads_and_counts(tp):
    reports = run_distributed(_run_mappings, tp, args=(tp, True))
    assert len(reports[0]) == 10


def test_mappings_with_explicit_group():
    run_distributed(_run_mappings, 2, args=(2, False))


def _run_all_to_all(tp):
    rank = dist.get_rank()
    group = dist.group.WORLD
    T, Hd = 8, 8
    tokens = [_rand(300 + r, T // tp, Hd) for r in range(tp)]  # rank r's tokens [T/tp, H]
    full = torch.cat(tokens, dim=0)  # [T, H]
    out = {}

    # sp2hp: [T/tp, H] -> [T, H/tp]; hp2sp inverts it. Values and counts both ways.
    x = tokens[rank].clone().requires_grad_(True)
    g = _rand(400 + rank, T, Hd // tp)
    fwd, bwd, y = fwd_bwd_counts(lambda t: M.all_to_all_sp2hp(t, group), x, g)
    torch.testing.assert_close(y, full[:, rank * Hd // tp : (rank + 1) * Hd // tp])
    # The grad of rank r's tokens is every rank's grad rows for those tokens, concatenated on h.
    grads = [_rand(400 + r, T, Hd // tp) for r in range(tp)]
    want = torch.cat([gr[rank * T // tp : (rank + 1) * T // tp] for gr in grads], dim=-1)
    torch.testing.assert_close(x.grad, want)
    out["sp2hp"] = (fwd, bwd)

    x2 = y.detach().clone().requires_grad_(True)
    fwd2, bwd2, back = fwd_bwd_counts(lambda t: M.all_to_all_hp2sp(t, group), x2, tokens[rank])
    torch.testing.assert_close(back, tokens[rank])
    out["hp2sp"] = (fwd2, bwd2)

    # Uneven all_to_all: rank r sends (i + 1) rows to rank i.
    send = [i + 1 for i in range(tp)]
    recv = [rank + 1] * tp
    x3 = _rand(500 + rank, sum(send), 3).requires_grad_(True)
    fwd3, bwd3, y3 = fwd_bwd_counts(
        lambda t: M.all_to_all(group, t, recv, send), x3, torch.ones(sum(recv), 3)
    )
    srcs = [_rand(500 + r, sum(send), 3) for r in range(tp)]
    want3 = torch.cat([s.split(send)[rank] for s in srcs], dim=0)
    torch.testing.assert_close(y3, want3)
    torch.testing.assert_close(x3.grad, torch.ones_like(x3))
    out["all_to_all"] = (fwd3, bwd3)

    # The async all-to-all equals the blocking one when only one side's split sizes are given
    # (the other side is split evenly), forward and backward.
    x4 = _rand(900 + rank, 2 * tp, 3)
    for splits in ((None, [2] * tp), ([2] * tp, None), (None, None)):
        a, b = x4.clone().requires_grad_(True), x4.clone().requires_grad_(True)
        got = M.all_to_all_async(group, a, *splits)()
        want = M.all_to_all(group, b, *splits)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        (got * torch.arange(got.numel()).view_as(got)).sum().backward()
        (want * torch.arange(want.numel()).view_as(want)).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    return out


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_all_to_all_mappings(tp):
    out = run_distributed(_run_all_to_all, tp, args=(tp,))[0]
    a2a = {"all_to_all": 1} if tp > 1 else {}
    for name in ("sp2hp", "hp2sp", "all_to_all"):
        assert out[name] == (a2a, a2a), name


def _run_uneven_sequence(tp):
    rank = dist.get_rank()
    group = dist.group.WORLD
    sizes = [r + 1 for r in range(tp)]
    chunks = [_rand(600 + r, sizes[r], 2, 3) for r in range(tp)]
    x = chunks[rank].clone().requires_grad_(True)
    g = _rand(700 + rank, sum(sizes), 2, 3)
    y = M.gather_from_sequence_parallel_region(x, True, group, output_split_sizes=sizes)
    y.backward(g)
    torch.testing.assert_close(y, torch.cat(chunks))
    g_sum = sum(_rand(700 + r, sum(sizes), 2, 3) for r in range(tp))
    torch.testing.assert_close(x.grad, g_sum.split(sizes)[rank])

    p = _rand(800 + rank, sum(sizes), 2, 3).requires_grad_(True)
    z = M.reduce_scatter_to_sequence_parallel_region(p, group, input_split_sizes=sizes)
    p_sum = sum(_rand(800 + r, sum(sizes), 2, 3) for r in range(tp))
    torch.testing.assert_close(z, p_sum.split(sizes)[rank])


def test_uneven_sequence_split_sizes():
    run_distributed(_run_uneven_sequence, 2, args=(2,))


def _run_not_divisible():
    group = dist.group.WORLD
    msgs = []
    for fn, x in [
        (M.scatter_to_sequence_parallel_region, torch.zeros(3, 2)),
        (M.scatter_to_tensor_model_parallel_region, torch.zeros(2, 3)),
        (M.reduce_scatter_to_sequence_parallel_region, torch.zeros(3, 2)),
        (M.reduce_scatter_last_dim_to_tensor_parallel_region, torch.zeros(2, 3)),
    ]:
        with pytest.raises(ValueError, match=r"\(3\) must be divisible by .* \(2\)") as err:
            fn(x, group=group)
        msgs.append(str(err.value))
    return msgs


def test_not_divisible_raises_value_error():
    msgs = run_distributed(_run_not_divisible, 2)[0]
    assert any("dim 0" in m for m in msgs) and any("last dim" in m for m in msgs)
