"""P2PCommunicator's interleaved exchanges with Megatron's `overlap_p2p_comm=True` keyword: the
same tensors as without it, plus Megatron's wait-handle dict (empty: gigatron's exchange is
complete on return), so a schedule written for megatron-core can wait on it unchanged."""

from dataclasses import dataclass

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
from gigatron.testing import run_distributed

SHAPE = (4, 2, 3)  # [s, b, h]


@dataclass(kw_only=True)
class _Config(ModelParallelConfig):
    hidden_size: int = 3


def _overlap_forms(pp):
    ps.initialize_model_parallel(pipeline_model_parallel_size=pp)
    config = _Config(pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32)
    comm = P2PCommunicator(ps.get_pipeline_model_parallel_group(), config)
    r = comm.current_stage
    prev, nxt = (r - 1) % pp, (r + 1) % pp
    got, handles = comm.send_forward_recv_forward(
        torch.full(SHAPE, 10.0 + r), True, SHAPE, overlap_p2p_comm=True
    )
    for handle in handles.values():  # Megatron's schedules wait on these
        handle.wait()
    assert handles == {} and torch.equal(got, torch.full(SHAPE, 10.0 + prev))
    got, handles = comm.send_backward_recv_backward(
        torch.full(SHAPE, 20.0 + r), True, SHAPE, overlap_p2p_comm=True
    )
    assert handles == {} and torch.equal(got, torch.full(SHAPE, 20.0 + nxt))
    plain = comm.send_forward_recv_forward(torch.full(SHAPE, 30.0 + r), True, SHAPE)
    assert torch.equal(plain, torch.full(SHAPE, 30.0 + prev))
    return True


@pytest.mark.timeout(120)
def test_overlap_p2p_comm_keyword_returns_megatron_pair():
    assert all(run_distributed(_overlap_forms, 2, args=(2,), timeout=60))
