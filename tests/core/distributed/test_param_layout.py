"""Param layouts of DDP's buffers: the packed and padded layouts (hand-computed indices),
`group_params_for_buffers`, `DistributedOptimizer.compute_full_param_layout`, and DDP built from
a precomputed layout on 2 gloo ranks equal to DDP laying itself out (same indices, same
reduce-scattered grads)."""

import pytest
import torch

from gigatron.core.distributed import DistributedDataParallelConfig
from gigatron.core.distributed.param_and_grad_buffer import (
    _compute_default_per_buffer_param_layout,
    group_params_for_buffers,
)
from gigatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from gigatron.core.optimizer.param_layout import (
    BufferKey,
    FullParamLayout,
    pad_bucket_end,
    pad_param_start,
    pad_to_divisor,
)
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _params(*numels, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in numels]


def test_padding_helpers_round_up():
    assert pad_to_divisor(129, 64) == 192 and pad_to_divisor(128, 64) == 128
    assert pad_param_start(1) == 64
    assert pad_bucket_end(100, 3, False) == 384  # lcm(3, 128) = 384
    assert pad_bucket_end(100, 2, True) == 2**16


def test_packed_layout_is_reverse_order_back_to_back():
    a, b, c = _params(10, 20, 30)
    layout = _compute_default_per_buffer_param_layout([a, b, c], bucket_size=40)
    assert layout.param_index_map[c] == (0, 30, 0)
    assert layout.param_index_map[b] == (30, 50, 0)  # bucket 0 reaches 50 >= 40: closed
    assert layout.param_index_map[a] == (50, 60, 1)
    assert layout.bucket_indices == [(0, 50), (50, 60)]
    assert layout.per_bucket_numel_unpadded == [50, 10]


def test_padded_layout_aligns_params_and_pads_buckets():
    a, b = _params(10, 100)
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=True)
    layout = DistributedOptimizer._compute_per_buffer_param_layout([a, b], None, 2, cfg, [0, 1])
    assert layout.param_index_map[b] == (0, 100, 0)
    assert layout.param_index_map[a] == (128, 138, 0)  # start 100 -> 128 (64-aligned)
    assert layout.bucket_indices == [(0, 256)]  # 138 -> multiple of lcm(2, 128)
    assert layout.per_bucket_numel_unpadded == [138]
    assert layout.num_optimizer_shards == 2 and layout.param_indices == [0, 1]


def test_shared_embedding_gets_its_own_bucket():
    emb, mid, out = _params(50, 60, 70)
    emb.shared_embedding = True
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=True)
    layout = DistributedOptimizer._compute_per_buffer_param_layout([emb, mid, out], None, 1, cfg)
    assert [layout.param_index_map[p][2] for p in (out, mid, emb)] == [0, 0, 1]
    assert layout.bucket_indices == [(0, 256), (256, 384)]


def test_groups_split_by_dtype_and_expert_flag():
    dense, half = _params(4)[0], _params(4, dtype=torch.bfloat16)[0]
    expert = _params(4)[0]
    expert.allreduce = False
    groups = group_params_for_buffers([dense, half, expert], grad_reduce_in_fp32=False)
    assert set(groups) == {
        BufferKey(torch.float32, torch.float32, False),
        BufferKey(torch.bfloat16, torch.bfloat16, False),
        BufferKey(torch.float32, torch.float32, True),
    }
    with pytest.raises(ValueError, match="does not require grad"):
        group_params_for_buffers([torch.nn.Parameter(torch.zeros(2), requires_grad=False)], False)


def test_full_layout_pads_expert_buffers_for_the_expert_dp_size():
    dense, expert = _params(100, 100)
    expert.allreduce = False
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=True)
    full = DistributedOptimizer.compute_full_param_layout([dense, expert], None, 2, cfg, 3)
    by_expert = {k.is_expert_parallel: v for k, v in full.layouts.items()}
    assert by_expert[False].bucket_indices == [(0, 128)]
    assert by_expert[True].bucket_indices == [(0, 384)]
    assert by_expert[True].num_optimizer_shards == 3


def _ddp_with_and_without_layout():
    from gigatron.core import parallel_state as ps
    from gigatron.core.distributed import DistributedDataParallel
    from gigatron.core.model_parallel_config import ModelParallelConfig

    ps.initialize_model_parallel()
    dp = ps.get_data_parallel_world_size()
    out = []
    for precomputed in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(7, 9), torch.nn.Linear(9, 3))
        cfg = DistributedDataParallelConfig(
            use_distributed_optimizer=True, overlap_grad_reduce=True, bucket_size=50
        )
        layout = None
        if precomputed:
            params = [p for p in model.parameters() if p.requires_grad]
            layout = DistributedOptimizer.compute_full_param_layout(params, 50, dp, cfg)
        ddp = DistributedDataParallel(ModelParallelConfig(), cfg, model, full_param_layout=layout)
        torch.manual_seed(1 + ps.get_data_parallel_rank())
        ddp(torch.randn(4, 7)).square().sum().backward()
        ddp.finish_grad_sync()
        buffer = ddp.buffers[0]
        indices = [buffer.param_index_map[p] for p in model.parameters()]
        out.append((indices, buffer.bucket_indices, buffer.grad_data.clone()))
    bad = FullParamLayout(layouts={})
    try:
        DistributedDataParallel(ModelParallelConfig(), cfg, model, full_param_layout=bad)
    except ValueError as err:
        out.append(str(err))
    ps.destroy_model_parallel()
    return out


def test_ddp_from_a_precomputed_layout_equals_its_own_on_2_ranks():
    for own, given, error in run_distributed(_ddp_with_and_without_layout, 2):
        assert own[0] == given[0] and own[1] == given[1]
        assert len(own[1]) > 1  # several buckets, each padded to lcm(2, 128)
        assert all((end - start) % 128 == 0 for start, end in own[1])
        torch.testing.assert_close(own[2], given[2], rtol=0, atol=0)
        assert "full_param_layout has buffers" in error
