"""P2PCommunicator on gloo ranks: Megatron's method names move the right tensors to the right
neighbour (ring-wise), batched and unbatched, with fixed and with exchanged (variable) shapes."""

from dataclasses import dataclass

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


SHAPE = (4, 2, 3)  # [s, b, h]


@dataclass(kw_only=True)
class _Config(ModelParallelConfig):
    hidden_size: int = 3


def _value(src, kind, shape=SHAPE):
    return torch.full(shape, float(100 * src + kind))


def _exchange(pp, batch, variable):
    ps.initialize_model_parallel(pipeline_model_parallel_size=pp)
    config = _Config(pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
                     batch_p2p_comm=batch, variable_seq_lengths=variable)  # fmt: skip
    comm = P2PCommunicator(ps.get_pipeline_model_parallel_group(), config)
    r, first, last = comm.current_stage, comm.is_pp_first_stage, comm.is_pp_last_stage
    assert comm.total_stages == pp and first == (r == 0) and last == (r == pp - 1)
    prev, nxt = (r - 1) % pp, (r + 1) % pp
    shape = (r + 2, 2, 3) if variable else SHAPE  # what rank r sends forward
    prev_shape = (prev + 2, 2, 3) if variable else SHAPE

    # warmup-like: send activations forward, receive from prev (None on the first stage)
    if r % 2 == 0:
        comm.send_forward(_value(r, 1, shape), last)
        got = comm.recv_forward(prev_shape, first)
    else:
        got = comm.recv_forward(prev_shape, first)
        comm.send_forward(_value(r, 1, shape), last)
    assert got is None if first else torch.equal(got, _value(prev, 1, prev_shape))
    assert got is None or (got.requires_grad and got.dtype == torch.float32)

    # steady 1F1B pairing: send_forward_recv_backward on r  <->  send_backward_recv_forward on r+1
    grad_from_next = comm.send_forward_recv_backward(_value(r, 2, shape), shape, last)
    act_from_prev = comm.send_backward_recv_forward(_value(r, 3, prev_shape), prev_shape, first)
    assert grad_from_next is None if last else torch.equal(grad_from_next, _value(nxt, 3, shape))
    want = None if first else _value(prev, 2, prev_shape)
    assert act_from_prev is None if first else torch.equal(act_from_prev, want)

    # cooldown-like: gradients backward; list form returns a list
    if r % 2 == 0:
        comm.send_backward([_value(r, 4, prev_shape)], first)
        got = comm.recv_backward([shape], last)
    else:
        got = comm.recv_backward([shape], last)
        comm.send_backward([_value(r, 4, prev_shape)], first)
    assert got == [None] if last else torch.equal(got[0], _value(nxt, 4, shape))

    # interleaved forms work ring-wise: the last rank sends to rank 0
    from_prev, from_next = comm.send_forward_backward_recv_forward_backward(
        _value(r, 5, shape), _value(r, 6, prev_shape), True, True, SHAPE if not variable else None
    )
    assert torch.equal(from_prev, _value(prev, 5, prev_shape))
    assert torch.equal(from_next, _value(nxt, 6, shape))
    got = comm.send_forward_recv_forward(_value(r, 7, shape), True, prev_shape)
    assert torch.equal(got, _value(prev, 7, prev_shape))
    got = comm.send_backward_recv_backward(_value(r, 8, prev_shape), True, shape)
    assert torch.equal(got, _value(nxt, 8, shape))
    return True


@pytest.mark.timeout(120)
def test_p2p_methods_on_2_and_4_ranks():
    for batch, variable in [(True, False), (False, True)]:
        assert all(run_distributed(_exchange, 2, args=(2, batch, variable), timeout=60))
    assert all(run_distributed(_exchange, 4, args=(4, True, True), timeout=60))
