"""parallel_state.get_amax_reduction_group: the FP8 amax group for each flag pair."""

import pytest
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _amax_groups():
    ps.initialize_model_parallel(tensor_model_parallel_size=2, context_parallel_size=1)
    try:
        assert ps.get_amax_reduction_group() is ps.get_tensor_and_data_parallel_group()
        assert ps.get_amax_reduction_group(
            with_context_parallel=True
        ) is ps.get_tensor_and_data_parallel_group(with_context_parallel=True)
        assert ps.get_amax_reduction_group(tp_only_amax_red=True) is (
            ps.get_tensor_model_parallel_group()
        )
        both = ps.get_amax_reduction_group(with_context_parallel=True, tp_only_amax_red=True)
        assert both is ps.get_tensor_and_context_parallel_group()
        # TP2 x DP2 on 4 ranks: tp+dp spans everyone, tp alone is a pair.
        sizes = (
            dist.get_world_size(ps.get_amax_reduction_group()),
            dist.get_world_size(ps.get_amax_reduction_group(tp_only_amax_red=True)),
        )
    finally:
        ps.destroy_model_parallel()
    return sizes


def test_amax_reduction_group_on_4_ranks():
    assert run_distributed(_amax_groups, 4) == [(4, 2)] * 4
