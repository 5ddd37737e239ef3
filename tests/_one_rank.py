"""Fixtures for process-free tests of modules that need parallel_state (megatron.core's
parallel_state with TP = PP = 1 on a one-process gloo world), shared by the unit tests."""

import tempfile

import pytest
import torch.distributed as dist

from gigatron.core import parallel_state, tensor_parallel


def one_rank_fixtures(cuda_seed: int | None = 1234):
    """Returns (gloo_world, single_rank), both autouse; bind them at a test module's top level.

    gloo_world: a one-process gloo world for the module, torn down after it (other tests expect
    none). single_rank: TP = PP = 1 per test, seeded with model_parallel_cuda_manual_seed(cuda_seed)
    as Megatron's tests set up, destroyed after the test."""

    @pytest.fixture(autouse=True, scope="module")
    def gloo_world():
        created = not dist.is_initialized()
        if created:
            dist.init_process_group(
                "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
            )
        yield
        if created:
            dist.destroy_process_group()

    @pytest.fixture(autouse=True)
    def single_rank():
        parallel_state.initialize_model_parallel(1, 1)
        if cuda_seed is not None:
            tensor_parallel.model_parallel_cuda_manual_seed(cuda_seed)
        yield
        parallel_state.destroy_model_parallel()

    return gloo_world, single_rank
