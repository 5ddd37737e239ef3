"""Weight initialisation of the parallel layers: CPU init gives the same full weights at every TP
size (strided too), GPU-style init forks the RNG tracker, plus the parameter attributes,
`_extra_state`, externally supplied weights and construction errors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    model_parallel_cuda_manual_seed,
    param_is_not_tensor_parallel_duplicate,
)
from gigatron.testing import run_distributed
from tests.core.tensor_parallel.test_mappings import count_collectives

pytestmark = pytest.mark.multirank


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _init(w):
    torch.nn.init.normal_(w, std=0.02)


def _gather(shard, dim, stride, tp):
    """Full weight from every rank's shard: each shard holds `stride` slices, rank-interleaved."""
    parts = [torch.empty_like(shard) for _ in range(tp)]
    dist.all_gather(parts, shard.contiguous())
    slices_per_rank = [p.chunk(stride, dim=dim) for p in parts]
    ordered = [slices_per_rank[r][k] for k in range(stride) for r in range(tp)]
    return torch.cat(ordered, dim=dim)


def _run_cpu_init(tp, stride, dtype):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = ModelParallelConfig(
        tensor_model_parallel_size=tp, use_cpu_initialization=True, params_dtype=dtype
    )
    torch.manual_seed(1234)
    col = ColumnParallelLinear(16, 32, config=config, init_method=_init, stride=stride)
    torch.manual_seed(1234)
    row = RowParallelLinear(
        32, 16, config=config, init_method=_init, bias=True, input_is_parallel=True,
        skip_bias_add=False, stride=stride,
    )  # fmt: skip
    torch.manual_seed(1234)
    emb = VocabParallelEmbedding(64, 16, init_method=_init, config=config)
    assert col.weight.dtype == dtype and row.weight.dtype == dtype and emb.weight.dtype == dtype
    assert col.weight.device.type == "cpu"
    return {
        "column": _gather(col.weight.data, 0, stride, tp),
        "row": _gather(row.weight.data, 1, stride, tp),
        "embedding": _gather(emb.weight.data, 0, 1, tp),
        "column_bias": col.bias.data.clone(),
    }


@pytest.mark.parametrize("stride", [1, 2])
def test_cpu_initialization_is_tp_invariant(stride):
    full = {
        tp: run_distributed(_run_cpu_init, tp, args=(tp, stride, torch.float32)) for tp in (1, 2, 4)
    }
    torch.manual_seed(1234)
    expected_col = torch.empty(32, 16)
    _init(expected_col)
    for tp, per_rank in full.items():
        for rank_out in per_rank:
            for name in ("column", "row", "embedding"):
                assert torch.equal(rank_out[name], full[1][0][name]), (tp, name)
            assert torch.equal(rank_out["column_bias"], torch.zeros_like(rank_out["column_bias"]))
    assert torch.equal(full[1][0]["column"], expected_col)  # same as init_method on the full weight


def test_cpu_initialization_respects_params_dtype():
    out = run_distributed(_run_cpu_init, 2, args=(2, 1, torch.bfloat16))[0]
    assert out["column"].dtype == torch.bfloat16


def _run_gpu_style_init(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = ModelParallelConfig(tensor_model_parallel_size=tp)
    with pytest.raises(ValueError, match="model-parallel-rng is not added"):
        from gigatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().reset()
        ColumnParallelLinear(8, 8, config=config, init_method=_init)
    model_parallel_cuda_manual_seed(42)
    default_before = torch.randn(3, device=DEVICE)
    model_parallel_cuda_manual_seed(42)
    col = ColumnParallelLinear(8, 8, config=config, init_method=_init)
    assert col.weight.device.type == DEVICE.type
    # Init ran on the forked stream: the default generator did not advance.
    assert torch.equal(torch.randn(3, device=DEVICE), default_before)
    model_parallel_cuda_manual_seed(42)
    again = ColumnParallelLinear(8, 8, config=config, init_method=_init)
    assert torch.equal(col.weight, again.weight)
    # GPU-style init is per-rank: shards differ between TP ranks (seed + 2718 + tp_rank).
    parts = [torch.empty_like(col.weight) for _ in range(tp)]
    dist.all_gather(parts, col.weight.data)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    gen = torch.Generator(DEVICE).manual_seed(42 + 2718 + tp_rank)
    want = torch.empty(8 // tp, 8, device=DEVICE).normal_(std=0.02, generator=gen)
    torch.testing.assert_close(col.weight.data, want, rtol=0, atol=0)
    return [torch.equal(parts[0], p) for p in parts[1:]]


def test_gpu_style_init_forks_tracker():
    same = run_distributed(_run_gpu_style_init, 2, args=(2,))[0]
    assert same == [False]


def _run_attributes_and_errors(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)
    col = ColumnParallelLinear(8, 8, config=config, init_method=_init, stride=2)
    assert (col.weight.tensor_model_parallel, col.weight.partition_dim) == (True, 0)
    assert col.weight.partition_stride == 2 and col.weight.allreduce is True
    assert (col.bias.tensor_model_parallel, col.bias.partition_dim) == (True, 0)
    row = RowParallelLinear(
        8, 8, config=config, init_method=_init, bias=True, input_is_parallel=True,
        skip_bias_add=False,
    )  # fmt: skip
    assert (row.weight.tensor_model_parallel, row.weight.partition_dim) == (True, 1)
    assert not hasattr(row.bias, "tensor_model_parallel") and row.bias.sequence_parallel is False
    assert param_is_not_tensor_parallel_duplicate(col.weight)
    assert param_is_not_tensor_parallel_duplicate(row.bias) == (rank == 0)

    # Empty _extra_state entries, as Megatron's (TE-compatible) layers have.
    sd = col.state_dict()
    assert set(sd) == {"weight", "bias", "_extra_state"} and sd["_extra_state"] is None
    col.load_state_dict(sd)

    # skip_weight_param_allocation: the weight comes with each forward call.
    shared = ColumnParallelLinear(
        8, 8, config=config, init_method=_init, bias=False, skip_weight_param_allocation=True
    )
    assert shared.weight is None
    x = torch.randn(4, 1, 8)
    y, _ = shared(x, weight=col.weight)
    torch.testing.assert_close(y, x @ col.weight.t())
    with pytest.raises(ValueError, match="supplied weight shape"):
        shared(x, weight=torch.zeros(3, 8))
    with pytest.raises(ValueError, match="must be passed to forward"):
        shared(x)

    sp_config = ModelParallelConfig(
        tensor_model_parallel_size=tp, sequence_parallel=True, use_cpu_initialization=True
    )
    col_sp = ColumnParallelLinear(8, 8, config=sp_config, init_method=_init, gather_output=True)
    with pytest.raises(
        ValueError, match="gather_output=True cannot be used with sequence_parallel"
    ):
        col_sp(torch.randn(2, 1, 8))
    with pytest.raises(ValueError, match="input_is_parallel=True"):
        RowParallelLinear(
            8, 8, config=sp_config, init_method=_init, bias=True, input_is_parallel=False,
            skip_bias_add=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"output_size \(6\) must be divisible .* \(4\)"):
        ColumnParallelLinear(8, 6, config=config, init_method=_init)
    with pytest.raises(ValueError, match=r"num_embeddings \(10\) must be divisible"):
        VocabParallelEmbedding(10, 8, init_method=_init, config=config)
    with pytest.raises(TypeError):
        RowParallelLinear(8, 8, config=config, init_method=_init)  # bias etc. are required
    return True


def test_attributes_state_dict_and_errors():
    assert run_distributed(_run_attributes_and_errors, 4, args=(4,)) == [True] * 4


def _run_grad_accumulation_fusion():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    config = ModelParallelConfig(use_cpu_initialization=True, gradient_accumulation_fusion=True)
    col = ColumnParallelLinear(8, 4, config=config, init_method=_init, bias=False)
    x = torch.randn(3, 2, 8)
    want = torch.einsum("sbo,sbh->oh", torch.ones(3, 2, 4), x)
    # Without main_grad the weight gradient goes to .grad as usual.
    col(x)[0].sum().backward()
    torch.testing.assert_close(col.weight.grad, want)
    # With main_grad (set by DDP) it is accumulated there and .grad stays empty.
    col.weight.grad = None
    col.weight.main_grad = torch.full((4, 8), 1.0)
    col(x)[0].sum().backward()
    torch.testing.assert_close(col.weight.main_grad, want + 1.0)
    assert col.weight.grad is None
    # A frozen weight gets no gradient anywhere (Megatron's linear_with_frozen_weight).
    col.weight.requires_grad_(False)
    x.requires_grad_(True)
    col(x)[0].sum().backward()
    torch.testing.assert_close(col.weight.main_grad, want + 1.0)
    torch.testing.assert_close(x.grad, torch.ones(3, 2, 4) @ col.weight)
    return True


def test_gradient_accumulation_fusion_into_main_grad():
    assert run_distributed(_run_grad_accumulation_fusion, 1) == [True]


def _run_expert_layers():
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, expert_model_parallel_size=2
    )
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    config = ModelParallelConfig(expert_model_parallel_size=2)
    model_parallel_cuda_manual_seed(5)
    col = ColumnParallelLinear(8, 4, config=config, init_method=_init, is_expert=True)
    # Expert weights come from the expert stream: seed + 1024 + 100 * ep_rank + etp_rank.
    gen = torch.Generator(DEVICE).manual_seed(5 + 1024 + 100 * ep_rank)
    want = torch.empty(4, 8, device=DEVICE).normal_(std=0.02, generator=gen)
    torch.testing.assert_close(col.weight.data, want, rtol=0, atol=0)
    assert col.weight.allreduce is False and col.bias.allreduce is False
    row = RowParallelLinear(
        4, 8, config=config, init_method=_init, bias=True, input_is_parallel=True,
        skip_bias_add=True, is_expert=True,
    )  # fmt: skip
    # The token dispatcher communicates for expert layers: the layers themselves issue nothing.
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    with count_collectives() as counts:
        h, _ = col(x)
        y, bias = row(h)
        (y + bias).sum().backward()
    assert dict(counts) == {}
    bad = RowParallelLinear(
        4, 8, config=config, init_method=_init, bias=True, input_is_parallel=True,
        skip_bias_add=False, is_expert=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="skip_bias_add=True"):
        bad(h)
    return True


def test_expert_layers():
    assert run_distributed(_run_expert_layers, 2) == [True, True]
