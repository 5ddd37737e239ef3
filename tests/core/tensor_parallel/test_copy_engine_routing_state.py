"""Copy-engine collective routing state (gigatron/core/tensor_parallel/_collectives.py): a group
is routed once enabled, CPU tensors never are (the ops are CUDA-only), and
`parallel_state.destroy_model_parallel` routes every group back to NCCL (group names can be
reused by the next initialisation)."""

import torch

from gigatron.core import parallel_state
from gigatron.core.tensor_parallel import _collectives as C
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()


def test_enable_disable_and_reset_on_destroy():
    group = parallel_state.get_tensor_model_parallel_group()
    x = torch.ones(2, 3)
    C.enable_copy_engine_collectives(group)
    assert group.group_name in C._COPY_ENGINE_GROUPS
    assert not C._copy_engine(x, group)  # CPU tensors stay on the process group's collectives
    C.enable_copy_engine_collectives(group, False)
    assert group.group_name not in C._COPY_ENGINE_GROUPS
    C.enable_copy_engine_collectives(group)
    parallel_state.destroy_model_parallel()
    assert not C._COPY_ENGINE_GROUPS
