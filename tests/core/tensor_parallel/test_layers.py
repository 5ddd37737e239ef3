"""ColumnParallelLinear, RowParallelLinear and VocabParallelEmbedding against nn.Linear /
nn.Embedding built from the same full weights, on 1, 2 and 4 gloo ranks: outputs, input grads
and every weight grad (fp32), plus the collectives each layer issues."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    gather_from_tensor_model_parallel_region,
)
from gigatron.testing import run_distributed
from tests.core.tensor_parallel.test_mappings import count_collectives

pytestmark = pytest.mark.multirank


S, B, H, F_OUT, V = 8, 2, 16, 24, 32  # sequence, batch, in features, out features, vocab
TOL = dict(rtol=1e-6, atol=1e-6)


def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _config(tp, sp):
    return ModelParallelConfig(
        tensor_model_parallel_size=tp, sequence_parallel=sp, use_cpu_initialization=True
    )


def _no_init(weight):
    weight.fill_(float("nan"))  # overwritten by the test's shards; NaN would expose a miss


def _reference_linear(seed, in_f, out_f, bias):
    ref = torch.nn.Linear(in_f, out_f, bias=bias)
    with torch.no_grad():
        ref.weight.copy_(_rand(seed, out_f, in_f) * 0.3)
        if bias:
            ref.bias.copy_(_rand(seed + 1, out_f))
    return ref


def _reference_run(seed, bias):
    """The unsharded reference: nn.Linear(H, F_OUT) (weight from `seed`, bias from seed + 1) on
    the full input x_full [S, B, H] (seed + 1), backward with output grad g_full [S, B, F_OUT]
    (seed + 2). Returns (ref, x_full, g_full, ref_x, ref_y); ref_x.grad and ref's grads filled."""
    ref = _reference_linear(seed, H, F_OUT, bias)
    x_full = _rand(seed + 1, S, B, H)
    g_full = _rand(seed + 2, S, B, F_OUT)
    ref_x = x_full.clone().requires_grad_(True)
    ref_y = ref(ref_x)
    (ref_y * g_full).sum().backward()
    return ref, x_full, g_full, ref_x, ref_y


def _max_err(a, b):
    """max |a - b| / (1 + |b|): <= 1e-6 exactly when assert_close(rtol=1e-6, atol=1e-6) holds."""
    a, b = a.detach(), b.detach()
    return ((a - b).abs() / (1 + b.abs())).max().item()


def _column_case(tp, rank, bias, gather_output, sp, skip_bias_add):
    ref, x_full, g_full, ref_x, ref_y = _reference_run(1, bias)

    layer = ColumnParallelLinear(
        H, F_OUT, config=_config(tp, sp), init_method=_no_init, bias=bias,
        gather_output=gather_output, skip_bias_add=skip_bias_add,
    )  # fmt: skip
    cols = slice(rank * F_OUT // tp, (rank + 1) * F_OUT // tp)
    rows = slice(rank * S // tp, (rank + 1) * S // tp) if sp else slice(None)
    with torch.no_grad():
        layer.weight.copy_(ref.weight[cols])
        if bias:
            layer.bias.copy_(ref.bias[cols])
    x = x_full[rows].clone().requires_grad_(True)
    with count_collectives() as fwd:
        y, out_bias = layer(x)
    if skip_bias_add and bias:
        torch.testing.assert_close(out_bias, layer.bias, rtol=0, atol=0)
        # The returned bias is this rank's shard even with gather_output (as in Megatron).
        y = y + (gather_from_tensor_model_parallel_region(out_bias) if gather_output else out_bias)
    else:
        assert out_bias is None
    want_y = ref_y if gather_output else ref_y[..., cols]
    g = g_full if gather_output else g_full[..., cols]
    with count_collectives() as bwd:
        (y * g).sum().backward()

    errs = [_max_err(y, want_y), _max_err(x.grad, ref_x.grad[rows])]
    torch.testing.assert_close(y, want_y, **TOL, msg="column output")
    torch.testing.assert_close(x.grad, ref_x.grad[rows], **TOL, msg="column input grad")
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad[cols], **TOL)
    errs.append(_max_err(layer.weight.grad, ref.weight.grad[cols]))
    if bias:
        torch.testing.assert_close(layer.bias.grad, ref.bias.grad[cols], **TOL)
        errs.append(_max_err(layer.bias.grad, ref.bias.grad[cols]))
    return max(errs), dict(fwd), dict(bwd)


def _row_case(tp, rank, bias, input_is_parallel, sp, skip_bias_add):
    ref, x_full, g_full, ref_x, ref_y = _reference_run(11, bias)

    layer = RowParallelLinear(
        H, F_OUT, config=_config(tp, sp), init_method=_no_init, bias=bias,
        input_is_parallel=input_is_parallel, skip_bias_add=skip_bias_add,
    )  # fmt: skip
    cols = slice(rank * H // tp, (rank + 1) * H // tp)
    rows = slice(rank * S // tp, (rank + 1) * S // tp) if sp else slice(None)
    with torch.no_grad():
        layer.weight.copy_(ref.weight[:, cols])
        if bias:
            layer.bias.copy_(ref.bias)
    x_cols = cols if input_is_parallel else slice(None)
    x = x_full[..., x_cols].clone().requires_grad_(True)
    with count_collectives() as fwd:
        y, out_bias = layer(x)
    if skip_bias_add and bias:
        torch.testing.assert_close(out_bias, layer.bias, rtol=0, atol=0)
        y = y + out_bias
    else:
        assert out_bias is None
    with count_collectives() as bwd:
        (y * g_full[rows]).sum().backward()

    torch.testing.assert_close(y, ref_y[rows], **TOL, msg="row output")
    torch.testing.assert_close(x.grad, ref_x.grad[..., x_cols], **TOL, msg="row input grad")
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad[:, cols], **TOL)
    errs = [
        _max_err(y, ref_y[rows]),
        _max_err(x.grad, ref_x.grad[..., x_cols]),
        _max_err(layer.weight.grad, ref.weight.grad[:, cols]),
    ]
    if bias:
        bias_grad = layer.bias.grad.clone()
        assert layer.bias.sequence_parallel == (sp and tp > 1) or not sp
        if sp and tp > 1:
            # Each rank saw only its tokens: finalize_model_grads sums SP-marked grads over TP.
            dist.all_reduce(bias_grad)
        torch.testing.assert_close(bias_grad, ref.bias.grad, **TOL)
        errs.append(_max_err(bias_grad, ref.bias.grad))
    return max(errs), dict(fwd), dict(bwd)


def _run_linear_parity(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    sps = [False, True] if tp > 1 else [False]
    results = {}
    for bias, gather, sp, skip in itertools.product(
        [True, False], [False, True], sps, [False, True]
    ):
        if gather and sp:
            continue
        key = ("column", bias, gather, sp, skip)
        results[key] = _column_case(tp, rank, bias, gather, sp, skip)
    for bias, parallel_in, sp, skip in itertools.product(
        [True, False], [True, False], sps, [False, True]
    ):
        if sp and not parallel_in:
            continue
        key = ("row", bias, parallel_in, sp, skip)
        results[key] = _row_case(tp, rank, bias, parallel_in, sp, skip)
    return results


def _expected_linear_counts(key, tp):
    if tp == 1:
        return {}, {}
    kind, _, flag, sp, _ = key
    if kind == "column":
        gather = flag
        if sp:
            return {"all_gather": 1}, {"all_gather": 1, "reduce_scatter": 1}
        return ({"all_gather": 1} if gather else {}), {"all_reduce": 1}
    input_is_parallel = flag
    if sp:
        return {"reduce_scatter": 1}, {"all_gather": 1}
    return {"all_reduce": 1}, ({} if input_is_parallel else {"all_gather": 1})


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_linear_parity_and_collectives(tp):
    per_rank = run_distributed(_run_linear_parity, tp, args=(tp,))
    assert len(per_rank[0]) == (24 if tp > 1 else 16)
    for results in per_rank:
        for key, (err, fwd, bwd) in results.items():
            assert err <= 1e-6, (key, err)
            assert (fwd, bwd) == _expected_linear_counts(key, tp), (key, fwd, bwd)


def _run_embedding_parity(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    ref = torch.nn.Embedding(V, H)
    with torch.no_grad():
        ref.weight.copy_(_rand(21, V, H))
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(22))
    g_full = _rand(23, B, S, H)
    ref_y = ref(ids)
    (ref_y * g_full).sum().backward()
    vocab = slice(rank * V // tp, (rank + 1) * V // tp)
    out = {}
    for reduce_scatter in (False, True):
        layer = VocabParallelEmbedding(
            V, H, init_method=_no_init, reduce_scatter_embeddings=reduce_scatter,
            config=_config(tp, False),
        )  # fmt: skip
        with torch.no_grad():
            layer.weight.copy_(ref.weight[vocab])
        with count_collectives() as fwd:
            y = layer(ids)
        if reduce_scatter:
            rows = slice(rank * S // tp, (rank + 1) * S // tp)
            want, g = ref_y.transpose(0, 1)[rows], g_full.transpose(0, 1)[rows]  # [s/tp, b, h]
        else:
            want, g = ref_y, g_full
        with count_collectives() as bwd:
            (y * g).sum().backward()
        torch.testing.assert_close(y, want, **TOL)
        torch.testing.assert_close(layer.weight.grad, ref.weight.grad[vocab], **TOL)
        err = max(_max_err(y, want), _max_err(layer.weight.grad, ref.weight.grad[vocab]))
        out[reduce_scatter] = (err, dict(fwd), dict(bwd))
    return out


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vocab_parallel_embedding_parity(tp):
    out = run_distributed(_run_embedding_parity, tp, args=(tp,))[0]
    assert out[False][1:] == (({"all_reduce": 1}, {}) if tp > 1 else ({}, {}))
    assert out[True][1:] == (({"reduce_scatter": 1}, {"all_gather": 1}) if tp > 1 else ({}, {}))
    assert max(err for err, _, _ in out.values()) <= 1e-6
