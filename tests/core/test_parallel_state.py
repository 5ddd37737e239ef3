"""parallel_state on live gloo ranks: every getter on every rank agrees with the pure layout,
and every group really connects the ranks it claims (an all-reduce of global ranks over it)."""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core._rank_grid import dense_and_expert_generators
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _mine(groups, rank):
    return next(g for g in groups if rank in g)


def _check_group(group, expected_ranks):
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t, group=group)
    assert t.item() == float(sum(expected_ranks)), (t.item(), expected_ranks)
    assert dist.get_world_size(group) == len(expected_ranks)


def _every_getter(tp, pp, cp, ep, etp, vpp, order):
    rank, world = dist.get_rank(), dist.get_world_size()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        order=order,
    )
    assert ps.model_parallel_is_initialized() and ps.is_initialized()
    dense, expert = dense_and_expert_generators(
        world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, order=order
    )
    expect = {
        t: _mine(dense.get_ranks(t), rank)
        for t in ("tp", "pp", "cp", "dp", "dp-cp", "tp-pp", "tp-cp", "tp-dp", "tp-dp-cp")
    }
    expect_e = {
        t: _mine(expert.get_ranks(t), rank) for t in ("ep", "tp", "dp", "tp-ep", "tp-ep-pp")
    }

    groups = {
        "tp": ps.get_tensor_model_parallel_group(),
        "pp": ps.get_pipeline_model_parallel_group(),
        "cp": ps.get_context_parallel_group(),
        "dp": ps.get_data_parallel_group(),
        "dp-cp": ps.get_data_parallel_group(with_context_parallel=True),
        "tp-pp": ps.get_model_parallel_group(),
        "tp-cp": ps.get_tensor_and_context_parallel_group(),
        "tp-dp": ps.get_tensor_and_data_parallel_group(),
        "tp-dp-cp": ps.get_tensor_and_data_parallel_group(with_context_parallel=True),
    }
    for token, group in groups.items():
        _check_group(group, expect[token])
    groups_e = {
        "ep": ps.get_expert_model_parallel_group(),
        "tp": ps.get_expert_tensor_parallel_group(),
        "dp": ps.get_expert_data_parallel_group(),
        "tp-ep": ps.get_expert_tensor_and_model_parallel_group(),
        "tp-ep-pp": ps.get_expert_tensor_model_pipeline_parallel_group(),
    }
    for token, group in groups_e.items():
        _check_group(group, expect_e[token])
    _check_group(ps.get_data_parallel_group_gloo(), expect["dp"])
    _check_group(ps.get_data_parallel_group_gloo(with_context_parallel=True), expect["dp-cp"])

    sizes_ranks = [
        (ps.get_tensor_model_parallel_world_size, ps.get_tensor_model_parallel_rank, "tp"),
        (ps.get_pipeline_model_parallel_world_size, ps.get_pipeline_model_parallel_rank, "pp"),
        (ps.get_context_parallel_world_size, ps.get_context_parallel_rank, "cp"),
        (ps.get_data_parallel_world_size, ps.get_data_parallel_rank, "dp"),
        (
            ps.get_tensor_and_context_parallel_world_size,
            ps.get_tensor_and_context_parallel_rank,
            "tp-cp",
        ),
    ]
    for size_fn, rank_fn, token in sizes_ranks:
        assert size_fn() == len(expect[token]), token
        assert rank_fn() == expect[token].index(rank), token
    assert ps.get_data_parallel_world_size(with_context_parallel=True) == len(expect["dp-cp"])
    assert ps.get_data_parallel_rank(with_context_parallel=True) == expect["dp-cp"].index(rank)
    for size_fn, rank_fn, token in [
        (ps.get_expert_model_parallel_world_size, ps.get_expert_model_parallel_rank, "ep"),
        (ps.get_expert_tensor_parallel_world_size, ps.get_expert_tensor_parallel_rank, "tp"),
        (ps.get_expert_data_parallel_world_size, ps.get_expert_data_parallel_rank, "dp"),
        (
            ps.get_expert_tensor_and_model_parallel_world_size,
            ps.get_expert_tensor_and_model_parallel_rank,
            "tp-ep",
        ),
    ]:
        assert size_fn() == len(expect_e[token]), token
        assert rank_fn() == expect_e[token].index(rank), token

    pp_ranks = expect["pp"]
    pp_rank = pp_ranks.index(rank)
    assert ps.get_tensor_model_parallel_src_rank() == expect["tp"][0]
    assert ps.get_model_parallel_src_rank() == expect["tp-pp"][0]
    assert ps.get_data_parallel_src_rank() == expect["dp"][0]
    assert ps.get_data_parallel_src_rank(with_context_parallel=True) == expect["dp-cp"][0]
    assert ps.get_expert_model_parallel_src_rank() == expect_e["ep"][0]
    assert ps.get_pipeline_model_parallel_first_rank() == pp_ranks[0]
    assert ps.get_pipeline_model_parallel_last_rank() == pp_ranks[-1]
    assert ps.get_pipeline_model_parallel_next_rank() == pp_ranks[(pp_rank + 1) % pp]
    assert ps.get_pipeline_model_parallel_prev_rank() == pp_ranks[(pp_rank - 1) % pp]
    assert ps.is_pipeline_first_stage() == (pp_rank == 0)
    assert ps.is_pipeline_last_stage() == (pp_rank == pp - 1)

    in_embedding = rank in (pp_ranks[0], pp_ranks[-1])
    assert ps.is_rank_in_embedding_group() == in_embedding
    assert ps.is_rank_in_position_embedding_group() == (rank == pp_ranks[0])
    if in_embedding:
        _check_group(ps.get_embedding_group(), sorted({pp_ranks[0], pp_ranks[-1]}))
    if rank == pp_ranks[0]:
        _check_group(ps.get_position_embedding_group(), [pp_ranks[0]])

    if vpp is not None:
        assert ps.get_virtual_pipeline_model_parallel_world_size() == vpp
        assert ps.get_virtual_pipeline_model_parallel_rank() == 0
        for stage in range(vpp):
            first = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
            last = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
            assert first == (pp_rank == 0 and stage == 0)
            assert last == (pp_rank == pp - 1 and stage == vpp - 1)
            if rank == pp_ranks[-1]:
                assert ps.is_rank_in_embedding_group(ignore_virtual=False, vp_stage=stage) == (
                    stage == vpp - 1
                )
    with pytest.raises(RuntimeError, match="already initialized"):
        ps.initialize_model_parallel(tp)
    ps.destroy_model_parallel()
    assert not ps.model_parallel_is_initialized()
    assert ps.get_virtual_pipeline_model_parallel_world_size() is None
    return rank


@pytest.mark.parametrize(
    "tp,pp,cp,ep,etp,vpp,order",
    [
        (2, 2, 1, 2, 1, 2, "tp-cp-ep-dp-pp"),  # TP2 x PP2 x DP2, EP2 x expert-DP2, VPP2
        (2, 2, 2, 2, 1, None, "tp-cp-ep-dp-pp"),  # TP2 x CP2 x PP2
        (2, 2, 1, 1, 2, None, "tp-pp-dp"),
    ],
)
def test_every_getter_on_8_ranks(tp, pp, cp, ep, etp, vpp, order):
    assert run_distributed(_every_getter, 8, args=(tp, pp, cp, ep, etp, vpp, order)) == list(
        range(8)
    )


def _bad_layout_raises_before_groups():
    with pytest.raises(ValueError, match=r"world size \(4\) is not divisible"):
        ps.initialize_model_parallel(tensor_model_parallel_size=3)
    with pytest.raises(ValueError, match=r"requires pipeline_model_parallel_size > 1"):
        ps.initialize_model_parallel(2, 1, 2)
    assert not ps.model_parallel_is_initialized()
    ps.initialize_model_parallel(2)  # still possible: nothing was half-built
    assert ps.get_data_parallel_world_size() == 2


def test_bad_layouts_raise_value_error_on_4_ranks():
    run_distributed(_bad_layout_raises_before_groups, 4)


def _fake_init():
    ps.set_tensor_model_parallel_world_size(4)
    ps.set_tensor_model_parallel_rank(3)
    assert ps.get_tensor_model_parallel_world_size() == 4
    assert ps.get_tensor_model_parallel_rank() == 3
    ps.destroy_model_parallel()


def test_fake_init_setters():
    run_distributed(_fake_init, 1)


def test_single_process_without_distributed():
    assert not dist.is_initialized()
    assert ps.get_tensor_model_parallel_world_size() == 1
    assert ps.get_tensor_model_parallel_rank() == 0
    assert ps.get_pipeline_model_parallel_world_size() == 1
    with pytest.raises(RuntimeError, match="torch.distributed must be initialized") as err:
        ps.initialize_model_parallel()
    assert isinstance(err.value, AssertionError)  # what Megatron's own tests catch
    with pytest.raises(AssertionError, match="not initialized"):
        ps.get_tensor_model_parallel_group()


def _pg_collection():
    from gigatron.core.process_groups_config import ProcessGroupCollection

    ps.initialize_model_parallel(2, 2)
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    assert pgs.tp is ps.get_tensor_model_parallel_group()
    assert pgs.dp_cp is ps.get_data_parallel_group(with_context_parallel=True)
    assert ProcessGroupCollection(tp=pgs.tp).pp is None
    with pytest.raises(ValueError, match="unknown process group 'tpp'"):
        ProcessGroupCollection(tpp=pgs.tp)


def test_process_group_collection():
    run_distributed(_pg_collection, 4)
