"""Multi-rank checks of the signature fixes found by tests/api_surface/test_names_and_signatures.py.

- P2PCommunicator's interleaved exchanges with Megatron's `overlap_p2p_comm=True`: the same
  tensors as without it, plus Megatron's wait-handle dict (empty: gigatron's exchange is complete
  on return), so a schedule written for megatron-core can wait on it unchanged.
- RotaryEmbedding.forward(..., cp_group=): the zigzag rows of the given CP group.
- HyperCommGrid.create_pg / get_pg: this rank's group over the named axes; with a registered
  view (megatron-core 0.19), a shared dim's group is the base view's and a view's own dims get
  their own groups; destroy() tears them down.
- megatron-core 0.19's GTP weight-sharding groups at size 1 (singletons) in
  ProcessGroupCollection, and get_batch_on_this_cp_rank's per-document split of packed
  sequences on live CP groups.
"""

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


def _rope_cp_group(world):
    from gigatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    ps.initialize_model_parallel(1, 1)  # CP = 1: the constructor keeps no CP group
    rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0)
    full = rope(8)  # [8, 1, 1, 8]
    group = ps.get_data_parallel_group()  # a 2-rank group standing in for a CP group
    local = rope(8, cp_group=group)  # [4, 1, 1, 8]: chunks r and 2*cp-1-r of 4 chunks of 2
    r = group.rank()
    want = torch.cat([full[2 * r : 2 * r + 2], full[2 * (3 - r) : 2 * (3 - r) + 2]])
    assert local.shape == (4, 1, 1, 8) and torch.equal(local, want)
    assert torch.equal(rope(8, packed_seq=True, cp_group=group), full)  # packed: not split
    return True


@pytest.mark.timeout(120)
def test_rotary_forward_cp_group_keyword():
    assert all(run_distributed(_rope_cp_group, 2, args=(2,), timeout=60))


def _grid_groups(world):
    import torch.distributed as dist

    from gigatron.core.hyper_comm_grid import HyperCommGrid

    grid = HyperCommGrid([2, 2], ["tp", "dp"])  # order "tp-dp": tp groups [0,1] [2,3]
    tp, dp = grid.create_pg("tp"), grid.create_pg(["dp"])
    assert grid.get_pg("tp") is tp and grid.get_pg("dp") is dp
    rank = dist.get_rank()
    assert dist.get_process_group_ranks(tp) == [rank - rank % 2, rank - rank % 2 + 1]
    assert dist.get_process_group_ranks(dp) == [rank % 2, rank % 2 + 2]
    both = grid.create_pg(["dp", "tp"])
    assert sorted(dist.get_process_group_ranks(both)) == [0, 1, 2, 3]
    try:
        grid.create_pg("tp")
    except KeyError:
        return True
    return False


@pytest.mark.timeout(120)
def test_hyper_comm_grid_groups_on_4_ranks():
    assert all(run_distributed(_grid_groups, 4, args=(4,), timeout=60))


def _grid_views():
    import torch.distributed as dist

    from gigatron.core.hyper_comm_grid import HyperCommGrid

    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    grid.register_view("expert", [2, 2], ["tp", "ep"], shared_dims=["tp"])
    tp = grid.create_pg("tp", view="expert")  # a shared dim: the base view's group
    assert grid.get_pg("tp") is tp and dist.get_process_group_ranks(tp) == [
        rank - rank % 2, rank - rank % 2 + 1
    ]  # fmt: skip
    ep = grid.create_pg("ep", view="expert")
    assert grid.get_pg(["ep"], view="expert") is ep
    assert dist.get_process_group_ranks(ep) == [rank % 2, rank % 2 + 2]
    refused = []
    for dims, view in (("tp", None), ("ep", "expert")):
        try:
            grid.create_pg(dims, view=view)
        except KeyError:
            refused.append(dims)
    total = torch.ones(1)
    dist.all_reduce(total, group=ep)
    assert grid.is_current_rank_in_grid()
    grid.destroy()
    return refused, total.item(), len(grid._pgs)


@pytest.mark.timeout(120)
def test_hyper_comm_grid_views_on_4_ranks():
    assert run_distributed(_grid_views, 4, timeout=60) == [(["tp", "ep"], 2.0, 0)] * 4


def _gtp_groups_and_cp_documents():
    import torch.distributed as dist

    from gigatron.core.process_groups_config import ProcessGroupCollection
    from gigatron.core.utils import get_batch_on_this_cp_rank

    ps.initialize_model_parallel(tensor_model_parallel_size=2, context_parallel_size=2)
    rank = dist.get_rank()
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    gtp_ranks = dist.get_process_group_ranks(pgs.gtp_remat)
    assert dist.get_process_group_ranks(pgs.expt_gtp_remat) == gtp_ranks == [rank]
    assert pgs.dp_cp_gtp_remat is pgs.dp_cp and pgs.tp_ep_pp_with_egtp_remat is pgs.tp_ep_pp
    one = torch.ones(1)
    dist.all_reduce(one, group=pgs.gtp_remat)  # a working (singleton) group
    # packed documents [0, 8) and [8, 12) over this rank's CP group (ranks r, r + 2)
    tokens = torch.arange(12).view(1, 12)
    batch = {"tokens": tokens, "cu_seqlens": torch.tensor([[0, 8, 12]])}
    mine = get_batch_on_this_cp_rank(batch, cp_group=ps.get_context_parallel_group())
    per_seq = get_batch_on_this_cp_rank(batch, use_per_sequence_balancing=True)
    ps.destroy_model_parallel()
    return one.item(), mine["tokens"].tolist(), per_seq["tokens"].tolist()


@pytest.mark.timeout(120)
def test_gtp_groups_and_cp_document_split_on_4_ranks():
    """GTP weight-sharding groups at size 1 (singletons, megatron-core 0.19's collection fields)
    and the per-document CP split on live CP groups: CP rank 0 = ranks 0, 1; rank 1 = 2, 3."""
    got = run_distributed(_gtp_groups_and_cp_documents, 4, timeout=60)
    cp0 = (1.0, [[0, 1, 6, 7, 8, 11]], [[0, 1, 2, 9, 10, 11]])
    cp1 = (1.0, [[2, 3, 4, 5, 9, 10]], [[3, 4, 5, 6, 7, 8]])
    assert got == [cp0, cp0, cp1, cp1]
