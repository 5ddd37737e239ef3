"""Process groups of every parallel axis, and Megatron's getters over them.

Mirrors `megatron.core.parallel_state`: `initialize_model_parallel(...)` builds TP, PP, CP, DP,
DP×CP, model-parallel, embedding, expert (EP, expert-TP, expert-DP), combined and (singleton)
GTP weight-sharding groups from the pure layout in `_rank_grid`
(`_groups_from_rank_grid`), then installs them (`_install`); the getters (written in
`_parallel_state_getters`, re-exported here) read them. `rank_layout(...)` (gigatron) returns
the same groups as rank lists without creating any (what `gigatron layout` prints and draws).
All state lives in one immutable `_ParallelState` in `_parallel_state_store` (plus Megatron's
"fake init" overrides and the virtual-pipeline rank, which Megatron lets callers set).

Works with any torch.distributed backend: gloo on CPU, NCCL on GPU. The layout is validated
(ValueError with the numbers) before any group is created.
"""

from __future__ import annotations

import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from gigatron.compat.errors import StateError
from gigatron.core import _parallel_state_store as _store
from gigatron.core._parallel_state_getters import *  # noqa: F403
from gigatron.core._parallel_state_getters import __all__ as _getters_all
from gigatron.core._parallel_state_store import Axis as _Axis
from gigatron.core._parallel_state_store import ParallelState as _ParallelState
from gigatron.core._rank_grid import (
    RankGenerator,
    RankLayout,
    default_embedding_ranks,
    default_position_embedding_ranks,
    masked_orthogonal_rank_groups,
    rank_layout,
)

# Megatron's name for the pure rank-group function (same arguments and result).
generate_masked_orthogonal_rank_groups = masked_orthogonal_rank_groups

_GLOBAL_MEMORY_BUFFER = None
_ON_DESTROY: list = []
_OWNED_GROUPS: list = []  # groups this rank is in, created here; released by destroy_model_parallel


def _own(group):
    """Remember `group` (when this rank is a member) so `destroy_model_parallel` releases it."""
    if group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER:
        _OWNED_GROUPS.append(group)
    return group


def _new_group(ranks: list[int], timeout: timedelta, backend: str | None = None):
    return _own(dist.new_group(ranks, timeout=timeout, backend=backend))


def _build(layout: RankLayout, name: str, rank: int, timeout: timedelta) -> _Axis:
    """Create every group of kind `name` (all ranks must call this); keep the one holding `rank`."""
    return _build_groups(layout.groups[name], name, rank, timeout)


def _build_groups(groups: list[list[int]], name: str, rank: int, timeout: timedelta) -> _Axis:
    mine = None
    for ranks in groups:
        group = _new_group(ranks, timeout)
        if rank in ranks:
            mine = _Axis(group, tuple(ranks))
    assert mine is not None, f"rank {rank} is in no {name} group"
    return mine


def _build_gtp_singleton(generator: RankGenerator, rank: int, timeout: timedelta) -> _Axis:
    """This rank's GTP weight-sharding group, a singleton at gtp_remat size 1 (the only size
    built). Only its member creates it (local synchronization), so the world skips one barrier
    per rank that Megatron's loop over every singleton costs."""
    (ranks,) = [g for g in generator.get_gtp_ranks(1) if rank in g]
    group = _own(dist.new_group(ranks, timeout=timeout, use_local_synchronization=True))
    return _Axis(group, tuple(ranks))


def _build_subset(groups_of_ranks: list[list[int]], rank: int, timeout: timedelta) -> _Axis | None:
    mine = None
    seen = set()
    for ranks in groups_of_ranks:
        key = tuple(ranks)
        if key in seen:
            continue
        seen.add(key)
        group = _new_group(ranks, timeout)
        if rank in ranks:
            mine = _Axis(group, key)
    return mine


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    virtual_pipeline_model_parallel_size: int | None = None,
    pipeline_model_parallel_comm_backend: str | None = None,
    use_sharp: bool = False,
    context_parallel_size: int = 1,
    hierarchical_context_parallel_sizes: list[int] | None = None,
    hybrid_context_parallel: bool = False,
    expert_model_parallel_size: int = 1,
    gtp_remat_size: int = 1,
    expert_gtp_remat_size: int = 1,
    num_distributed_optimizer_instances: int = 1,
    expert_tensor_parallel_size: int | None = None,
    nccl_communicator_config_path: str | None = None,
    distributed_timeout_minutes: int = 30,
    order: str = "tp-cp-ep-dp-pp",
    get_embedding_ranks=None,
    get_position_embedding_ranks=None,
    create_gloo_process_groups: bool = True,
    high_priority_stream_groups: list[str] | None = None,
    sharp_enabled_group: str | None = None,
    rank_offset: int = 0,
    local_world_size: int | None = None,
    create_all_gather_group: bool = False,
) -> None:
    """Create the process groups of a TP × CP × DP × PP layout (plus the EP × expert-TP grid).

    `torch.distributed` must be initialised. The world is split by `order` (leftmost axis =
    contiguous ranks). Raises ValueError, before creating any group, when the layout is
    impossible; StateError (an AssertionError, as Megatron asserts, and a RuntimeError) when
    torch.distributed is not, or the groups already are, initialised. `create_all_gather_group`
    (megatron-core 0.16's separate DP×CP all-gather group) is accepted only as False.
    """
    _check_can_initialize()
    _reject_unsupported(
        gtp_remat_size=(gtp_remat_size, 1),
        expert_gtp_remat_size=(expert_gtp_remat_size, 1),
        num_distributed_optimizer_instances=(num_distributed_optimizer_instances, 1),
        hierarchical_context_parallel_sizes=(hierarchical_context_parallel_sizes, None),
        hybrid_context_parallel=(hybrid_context_parallel, False),
        create_all_gather_group=(create_all_gather_group, False),
        pipeline_model_parallel_comm_backend=(
            pipeline_model_parallel_comm_backend,
            pipeline_model_parallel_comm_backend
            if pipeline_model_parallel_comm_backend in (None, "nccl", "gloo")
            else None,
        ),
    )
    _check_virtual_pipeline(virtual_pipeline_model_parallel_size, pipeline_model_parallel_size)
    tp = tensor_model_parallel_size
    etp = tp if expert_tensor_parallel_size is None else expert_tensor_parallel_size
    layout = rank_layout(
        local_world_size if local_world_size is not None else dist.get_world_size(),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        context_parallel_size=context_parallel_size,
        expert_model_parallel_size=expert_model_parallel_size,
        expert_tensor_parallel_size=etp,
        order=order,
        rank_offset=rank_offset,
        get_embedding_ranks=get_embedding_ranks,
        get_position_embedding_ranks=get_position_embedding_ranks,
    )
    if nccl_communicator_config_path is not None and dist.get_backend() == "nccl":
        warnings.warn(
            "nccl_communicator_config_path is not applied by gigatron; groups use NCCL defaults",
            stacklevel=2,
        )
    state = _groups_from_rank_grid(
        layout,
        timeout=timedelta(minutes=distributed_timeout_minutes),
        create_gloo_process_groups=create_gloo_process_groups,
        embedding_of=get_embedding_ranks or default_embedding_ranks,
        pos_embedding_of=get_position_embedding_ranks or default_position_embedding_ranks,
    )
    _install(state, virtual_pipeline_model_parallel_size)


def _check_can_initialize() -> None:
    if not dist.is_initialized():
        raise StateError(
            "torch.distributed must be initialized (init_process_group) before "
            "initialize_model_parallel"
        )
    if _store.STATE is not None:
        raise StateError(
            "model parallel groups are already initialized; call destroy_model_parallel() first"
        )


def _check_virtual_pipeline(vpp: int | None, pp: int) -> None:
    if vpp is None:
        return
    if pp <= 1:
        raise ValueError(
            f"virtual_pipeline_model_parallel_size ({vpp}) requires "
            f"pipeline_model_parallel_size > 1 (got {pp})"
        )
    if vpp < 1:
        raise ValueError(f"virtual_pipeline_model_parallel_size ({vpp}) must be >= 1")


def _groups_from_rank_grid(
    layout: RankLayout,
    *,
    timeout: timedelta,
    create_gloo_process_groups: bool,
    embedding_of,
    pos_embedding_of,
) -> _ParallelState:
    """Create every process group of `layout` (a collective: all ranks call it, and create the
    groups in the same order) and return this rank's view of them; installs nothing."""
    dense, expert = layout.dense, layout.expert
    rank = dist.get_rank()
    # Same creation order on every rank (a torch.distributed requirement): GROUP_TOKENS' order,
    # the embedding groups after "pp".
    dp_cp, dp, cp_axis, mp, tp_axis, pp_axis = (
        _build(layout, name, rank, timeout) for name in ("dp-cp", "dp", "cp", "mp", "tp", "pp")
    )
    embd = _build_subset(layout.groups["embd"], rank, timeout)
    pos_embd = _build_subset(layout.groups["pos-embd"], rank, timeout)
    tp_dp_cp, tp_dp, tp_cp, ep_axis, expt_tp, tp_ep, tp_ep_pp, expt_dp = (
        _build(layout, name, rank, timeout)
        for name in ("tp-dp-cp", "tp-dp", "tp-cp", "ep", "expt-tp", "tp-ep", "tp-ep-pp", "expt-dp")
    )
    gtp_remat = _build_gtp_singleton(dense, rank, timeout)
    expt_gtp_remat = _build_gtp_singleton(expert, rank, timeout)

    if create_gloo_process_groups and dist.get_backend() != "gloo":
        dp_gloo = _build_gloo(dense, "dp", rank, timeout)
        dp_cp_gloo = _build_gloo(dense, "dp-cp", rank, timeout)
        expt_dp_gloo = _build_gloo(expert, "dp", rank, timeout)
    elif create_gloo_process_groups:
        dp_gloo, dp_cp_gloo, expt_dp_gloo = dp.group, dp_cp.group, expt_dp.group
    else:
        dp_gloo = dp_cp_gloo = expt_dp_gloo = None

    pp_ranks = list(pp_axis.ranks)
    return _ParallelState(
        tp=tp_axis,
        pp=pp_axis,
        cp=cp_axis,
        dp=dp,
        dp_cp=dp_cp,
        mp=mp,
        tp_cp=tp_cp,
        tp_dp=tp_dp,
        tp_dp_cp=tp_dp_cp,
        embd=embd,
        pos_embd=pos_embd,
        embedding_ranks=tuple(embedding_of(pp_ranks)),
        position_embedding_ranks=tuple(pos_embedding_of(pp_ranks)),
        ep=ep_axis,
        expt_tp=expt_tp,
        tp_ep=tp_ep,
        tp_ep_pp=tp_ep_pp,
        expt_dp=expt_dp,
        dp_gloo=dp_gloo,
        dp_cp_gloo=dp_cp_gloo,
        expt_dp_gloo=expt_dp_gloo,
        gtp_remat=gtp_remat,
        expt_gtp_remat=expt_gtp_remat,
        dense=dense,
        expert=expert,
    )


def _install(state: _ParallelState, virtual_pipeline_model_parallel_size: int | None) -> None:
    """Make `state` the process-wide parallel state (with the virtual-pipeline size and the
    scratch buffer); `destroy_model_parallel` undoes it."""
    global _GLOBAL_MEMORY_BUFFER
    _store.STATE = state
    if virtual_pipeline_model_parallel_size is not None:
        _store.VIRTUAL_PP_RANK = 0
        _store.VIRTUAL_PP_SIZE = virtual_pipeline_model_parallel_size
    _GLOBAL_MEMORY_BUFFER = GlobalMemoryBuffer()


def create_all_gather_groups(
    for_expert_parallelism: bool = False, timeout: timedelta | None = None, nccl_comm_cfgs=None
):
    """(dp_cp_ag, expt_dp_ag): new communicators over the same ranks as the DP×CP group (and,
    with `for_expert_parallelism` and EP > 1, the expert-DP group; else None), for overlapping
    parameter all-gathers with gradient reduce-scatters. Collective on every rank; after
    `initialize_model_parallel` (StateError before). Megatron stores them on a
    ProcessGroupCollection (`pg_collection.dp_cp_ag = ...`), not in parallel_state.
    nccl_comm_cfgs is accepted and not applied (NCCL defaults), as in initialize_model_parallel.
    """
    st = _store.state()
    rank = dist.get_rank()
    timeout = timeout or timedelta(minutes=30)
    dp_cp_ag = _build_groups(st.dense.get_ranks("dp-cp"), "dp-cp", rank, timeout).group
    expt_dp_ag = None
    if for_expert_parallelism and st.ep.size > 1:
        expt_dp_ag = _build_groups(st.expert.get_ranks("dp"), "expt-dp", rank, timeout).group
    return dp_cp_ag, expt_dp_ag


def _build_gloo(generator: RankGenerator, token: str, rank: int, timeout: timedelta):
    mine = None
    for ranks in generator.get_ranks(token):
        group = _new_group(ranks, timeout, backend="gloo")
        if rank in ranks:
            mine = group
    return mine


def _reject_unsupported(**settings) -> None:
    for name, (value, default) in settings.items():
        if value != default:
            raise ValueError(
                f"{name}={value!r} is not supported by gigatron's initialize_model_parallel "
                f"(only {default!r})"
            )


def destroy_model_parallel() -> None:
    """Forget every group and override, and release the process groups
    `initialize_model_parallel` created (on gloo each holds native threads, so a process that
    initializes many times would keep them all). Every rank calls it, as it called initialize.
    Does not destroy torch.distributed itself (the default group stays)."""
    global _GLOBAL_MEMORY_BUFFER
    _release_owned_groups()
    _store.STATE = None
    _store.OVERRIDES.clear()
    _store.VIRTUAL_PP_RANK = None
    _store.VIRTUAL_PP_SIZE = None
    _GLOBAL_MEMORY_BUFFER = None
    for fn in _ON_DESTROY:  # state above keyed by group names, which the next init may reuse
        fn()


def _release_owned_groups() -> None:
    groups, _OWNED_GROUPS[:] = list(_OWNED_GROUPS), []
    if not dist.is_initialized():
        return  # the default group is gone, and with it every subgroup
    for group in groups:
        if group in dist.distributed_c10d._world.pg_map:
            dist.destroy_process_group(group)


def _on_destroy(fn) -> None:
    """Call `fn()` at every `destroy_model_parallel` (modules above that cache per-group state)."""
    if fn not in _ON_DESTROY:
        _ON_DESTROY.append(fn)


def model_parallel_is_initialized() -> bool:
    """True once TP, PP and DP groups exist."""
    return _store.STATE is not None


def is_initialized() -> bool:
    """True once the data-parallel group exists (Megatron's definition)."""
    return _store.STATE is not None


def is_unitialized() -> bool:
    """Megatron's (misspelled) inverse of `is_initialized`."""
    return _store.STATE is None


class GlobalMemoryBuffer:
    """Reusable scratch tensors keyed by (name, dtype) for sequence-parallel gathers."""

    def __init__(self) -> None:
        self.buffer: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get_tensor(self, tensor_shape, dtype: torch.dtype, name: str, mem_alloc_context=None):
        numel = 1
        for s in tensor_shape:
            numel *= s
        key = (name, dtype)
        buf = self.buffer.get(key)
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device, requires_grad=False)
            self.buffer[key] = buf
        return buf[:numel].view(*tensor_shape)


def get_global_memory_buffer() -> GlobalMemoryBuffer:
    """The scratch buffer allocated by `initialize_model_parallel`."""
    if _GLOBAL_MEMORY_BUFFER is None:
        raise RuntimeError("global memory buffer is not initialized")
    return _GLOBAL_MEMORY_BUFFER


__all__ = [
    "RankGenerator",
    "RankLayout",
    "rank_layout",
    "initialize_model_parallel",
    "create_all_gather_groups",
    "destroy_model_parallel",
    "model_parallel_is_initialized",
    "is_initialized",
    "is_unitialized",
    "GlobalMemoryBuffer",
    "get_global_memory_buffer",
    "default_embedding_ranks",
    "default_position_embedding_ranks",
    "generate_masked_orthogonal_rank_groups",
    *_getters_all,
]
