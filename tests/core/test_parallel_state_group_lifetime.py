"""`destroy_model_parallel` releases the process groups `initialize_model_parallel` created.

On gloo every group a rank belongs to holds native threads (a run loop and TCP loops), so a
process that initializes and destroys model parallelism many times (a test session, a notebook,
a sweep) must not keep them: Megatron-LM's unit tests do this hundreds of times per file.
"""

import os

import pytest
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.testing.distributed import run_distributed

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc"),
]


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _cycle() -> None:
    ps.initialize_model_parallel(tensor_model_parallel_size=2, create_gloo_process_groups=True)
    dist.all_reduce(__import__("torch").ones(1), group=ps.get_tensor_model_parallel_group())
    ps.destroy_model_parallel()


def _init_destroy_many_times(cycles: int) -> tuple[int, int, bool]:
    _cycle()
    first = _threads()
    for _ in range(cycles):
        _cycle()
    # The world group still works after the model-parallel groups are gone.
    t = __import__("torch").ones(1)
    dist.all_reduce(t)
    return first, _threads(), bool(t.item() == dist.get_world_size())


def test_repeated_initialize_and_destroy_keeps_the_thread_count_flat():
    cycles = 3
    for first, last, world_ok in run_distributed(_init_destroy_many_times, 2, args=(cycles,)):
        assert world_ok
        # Without releasing, each cycle leaves its groups' threads (about 50 at TP=2).
        assert last - first <= 4, f"threads grew from {first} to {last} over {cycles} cycles"
