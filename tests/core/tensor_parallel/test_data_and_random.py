"""broadcast_data inside TP groups, 1-D split/gather, seeding from parallel_state's ranks and
checkpoint(distribute_saved_activations=True) on gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gigatron.core import parallel_state
from gigatron.core.tensor_parallel import (
    broadcast_data,
    checkpoint,
    gather_split_1d_tensor,
    get_cuda_rng_tracker,
    model_parallel_cuda_manual_seed,
    split_tensor_into_1d_equal_chunks,
)
from gigatron.testing import run_distributed
from tests.core.tensor_parallel.test_mappings import count_collectives

pytestmark = pytest.mark.multirank


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _batch(global_rank):
    gen = torch.Generator().manual_seed(global_rank)
    return {
        "tokens": torch.randint(0, 100, (2, 5), generator=gen),
        "labels": torch.randint(0, 100, (2, 5), generator=gen),
        "position_ids": torch.arange(5).repeat(2, 1, 1),  # 3 dims
        "scalar": torch.tensor(7),  # 0 dims
    }


def _run_broadcast(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    src = parallel_state.get_tensor_model_parallel_src_rank()
    keys = ["tokens", "labels", "position_ids", "scalar"]
    data = _batch(dist.get_rank()) if tp_rank == 0 else {}
    with count_collectives() as counts:
        out = broadcast_data(keys, data, torch.int64)
    want = _batch(src)  # every rank of a TP group gets its TP rank 0's batch
    for key in keys:
        assert out[key].dtype == torch.int64, key
        assert torch.equal(out[key].cpu(), want[key]), key
    return dict(counts)


@pytest.mark.parametrize("tp", [1, 2])
def test_broadcast_data_within_tp_groups(tp):
    counts = run_distributed(_run_broadcast, 4, args=(tp,))
    assert counts == [{"broadcast": 2}] * 4


def _run_broadcast_bad_dtype():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    with pytest.raises(ValueError, match="'tokens' has dtype torch.int64, expected torch.int32"):
        broadcast_data(["tokens"], {"tokens": torch.zeros(2, dtype=torch.int64)}, torch.int32)
    return True


def test_broadcast_data_dtype_mismatch():
    assert run_distributed(_run_broadcast_bad_dtype, 1) == [True]


def _run_1d_split_gather(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    full = torch.arange(24.0).view(2, 3, 4)
    chunk = split_tensor_into_1d_equal_chunks(full)
    assert torch.equal(chunk, full.view(-1)[rank * 24 // tp : (rank + 1) * 24 // tp])
    fresh = split_tensor_into_1d_equal_chunks(full, new_buffer=True)
    assert fresh.data_ptr() != full.data_ptr() and torch.equal(fresh, chunk)
    assert torch.equal(gather_split_1d_tensor(chunk), full.view(-1))
    return True


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_and_gather_1d(tp):
    assert run_distributed(_run_1d_split_gather, tp, args=(tp,)) == [True] * tp


def _block(x, w):
    h = F.dropout(torch.tanh(x @ w), p=0.5, training=True)
    with get_cuda_rng_tracker().fork():
        h = F.dropout(h, p=0.3, training=True)
    return h @ w.t()


def _run_distributed_checkpoint(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    results = []
    for use_checkpoint in (False, True):
        model_parallel_cuda_manual_seed(11)  # tp_rank from parallel_state: streams differ per rank
        torch.manual_seed(11)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(4, 8, generator=gen).requires_grad_(True)
        w = torch.randn(8, 8, generator=gen).requires_grad_(True)
        inp = x * 1.0  # a non-leaf, non-view input, as hidden states are
        if use_checkpoint:
            y = checkpoint(_block, True, inp, w)
            assert inp.shape == (32 // tp,)  # only this rank's 1-D chunk is kept until backward
        else:
            y = _block(inp, w)
        (y * y).sum().backward()
        results.append((y.detach(), x.grad, w.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with get_cuda_rng_tracker().fork():  # the tracker drives the CUDA generator when there is one
        return rank, torch.rand(1, device=DEVICE).item()


def test_checkpoint_distribute_saved_activations():
    out = run_distributed(_run_distributed_checkpoint, 2, args=(2,))
    assert out[0][1] != out[1][1]  # model-parallel streams are seeded per TP rank
