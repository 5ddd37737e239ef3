"""Megatron's parallel_state getters and "fake init" setters, re-exported by `parallel_state`.

Kept apart so `parallel_state.py` shows how groups are built and this file shows how they are
read. Sizes and ranks come from the groups recorded at initialisation (no collective calls).
"""

from __future__ import annotations

import warnings

import torch.distributed as dist

from gigatron.core import _parallel_state_store as _store

__all__: list[str] = []


def _public(fn):
    __all__.append(fn.__name__)
    return fn


def _override(name: str):
    return _store.OVERRIDES.get(name)


# ---------------------------------------------------------------- groups
@_public
def get_tensor_model_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.tp.group if s else None


@_public
def get_pipeline_model_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.pp.group if s else None


@_public
def get_model_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.mp.group if s else None


@_public
def get_context_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.cp.group if s else None


@_public
def get_context_parallel_global_ranks(check_initialized: bool = True) -> list[int] | None:
    s = _store.state(check_initialized)
    return list(s.cp.ranks) if s else None


@_public
def get_hierarchical_context_parallel_groups(check_initialized: bool = True):
    """Hierarchical CP groups are not built by gigatron (only flat CP)."""
    _store.state(check_initialized)
    return None


@_public
def get_embedding_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    if s is None:
        return None
    if s.embd is None:
        raise RuntimeError("this rank is not in an embedding group (not a first/last stage)")
    return s.embd.group


@_public
def get_position_embedding_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    if s is None:
        return None
    if s.pos_embd is None:
        raise RuntimeError("this rank is not in a position-embedding group (not a first stage)")
    return s.pos_embd.group


@_public
def get_tensor_and_context_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.tp_cp.group if s else None


@_public
def get_tensor_and_data_parallel_group(
    check_initialized: bool = True, with_context_parallel: bool = False
):
    s = _store.state(check_initialized)
    if s is None:
        return None
    return (s.tp_dp_cp if with_context_parallel else s.tp_dp).group


@_public
def get_amax_reduction_group(with_context_parallel: bool = False, tp_only_amax_red: bool = False):
    """The group FP8 amax statistics are reduced over: TP x DP (x CP with
    `with_context_parallel`), or TP only (x CP) with `tp_only_amax_red`."""
    if tp_only_amax_red:
        if with_context_parallel:
            return get_tensor_and_context_parallel_group()
        return get_tensor_model_parallel_group()
    return get_tensor_and_data_parallel_group(with_context_parallel=with_context_parallel)


@_public
def get_data_parallel_group(
    with_context_parallel: bool = False,
    with_gtp_remat: bool = True,
    partial_data_parallel: bool = False,
    independent_all_gather: bool = False,
):
    assert not partial_data_parallel or with_context_parallel, (
        "partial_data_parallel requires with_context_parallel"
    )
    if independent_all_gather:
        # megatron-core 0.16: the separate DP×CP all-gather group of create_all_gather_group.
        raise ValueError(
            "get_data_parallel_group(independent_all_gather=True): gigatron creates no separate "
            "all-gather group (initialize_model_parallel(create_all_gather_group=True) is "
            "refused)"
        )
    s = _store.state()
    return (s.dp_cp if with_context_parallel else s.dp).group


@_public
def get_data_parallel_group_gloo(
    with_context_parallel: bool = False, partial_data_parallel: bool = False
):
    s = _store.state()
    return s.dp_cp_gloo if with_context_parallel else s.dp_gloo


@_public
def get_expert_model_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.ep.group if s else None


@_public
def get_expert_tensor_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.expt_tp.group if s else None


@_public
def get_expert_tensor_and_model_parallel_group(check_initialized: bool = True):
    s = _store.state(check_initialized)
    return s.tp_ep.group if s else None


@_public
def get_expert_tensor_model_pipeline_parallel_group(
    check_initialized: bool = True, with_egtp_remat: bool = False
):
    """`with_egtp_remat`: the group merged across expert-GTP peers, which is the plain
    tensor-expert-pipeline group at expert_gtp_remat_size 1 (the only size gigatron builds)."""
    s = _store.state(check_initialized)
    return s.tp_ep_pp.group if s else None


@_public
def get_gtp_weight_remat_group(check_initialized: bool = True):
    """This rank's GTP weight-sharding group (a singleton: gtp_remat_size is 1)."""
    s = _store.state(check_initialized)
    return s.gtp_remat.group if s else None


@_public
def get_expert_gtp_weight_remat_group(check_initialized: bool = True):
    """This rank's expert GTP weight-sharding group (a singleton: expert_gtp_remat_size is 1)."""
    s = _store.state(check_initialized)
    return s.expt_gtp_remat.group if s else None


@_public
def get_expert_data_parallel_group(
    check_initialized: bool = True,
    with_gtp_remat: bool = True,
    partial_expert_data_parallel: bool = False,
):
    s = _store.state(check_initialized)
    return s.expt_dp.group if s else None


@_public
def get_expert_data_parallel_group_gloo(partial_expert_data_parallel: bool = False):
    return _store.state().expt_dp_gloo


# ---------------------------------------------------------------- sizes and ranks
def _size(axis_name: str, override: str | None = None) -> int:
    """Group size; 1 in a single process without torch.distributed (so modules can be built)."""
    if override is not None and _override(override) is not None:
        return _override(override)
    if _store.STATE is None and not dist.is_initialized():
        return 1
    return getattr(_store.state(), axis_name).size


def _rank(axis_name: str, override: str | None = None) -> int:
    """Rank inside the group; 0 in a single process without torch.distributed."""
    if override is not None and _override(override) is not None:
        return _override(override)
    if _store.STATE is None and not dist.is_initialized():
        return 0
    return getattr(_store.state(), axis_name).rank_of(dist.get_rank())


@_public
def get_tensor_model_parallel_world_size() -> int:
    return _size("tp", "tp_size")


@_public
def get_tensor_model_parallel_rank() -> int:
    return _rank("tp", "tp_rank")


@_public
def get_pipeline_model_parallel_world_size() -> int:
    return _size("pp", "pp_size")


@_public
def get_pipeline_model_parallel_rank() -> int:
    return _rank("pp", "pp_rank")


@_public
def get_context_parallel_world_size() -> int:
    return _size("cp")


@_public
def get_context_parallel_rank() -> int:
    return _rank("cp")


@_public
def get_tensor_and_context_parallel_world_size() -> int:
    return _size("tp_cp")


@_public
def get_tensor_and_context_parallel_rank() -> int:
    return _rank("tp_cp")


@_public
def get_data_parallel_world_size(
    with_context_parallel: bool = False,
    with_gtp_remat: bool = True,
    partial_data_parallel: bool = False,
) -> int:
    if _override("dp_size") is not None and not with_context_parallel:
        return _override("dp_size")
    return _size("dp_cp" if with_context_parallel else "dp")


@_public
def get_data_parallel_rank(
    with_context_parallel: bool = False,
    with_gtp_remat: bool = True,
    partial_data_parallel: bool = False,
) -> int:
    if _override("dp_rank") is not None and not with_context_parallel:
        return _override("dp_rank")
    return _rank("dp_cp" if with_context_parallel else "dp")


@_public
def get_expert_model_parallel_world_size() -> int:
    return _size("ep", "ep_size")


@_public
def get_expert_model_parallel_rank() -> int:
    return _rank("ep", "ep_rank")


@_public
def get_expert_tensor_parallel_world_size() -> int:
    return _size("expt_tp", "etp_size")


@_public
def get_expert_tensor_parallel_rank() -> int:
    return _rank("expt_tp", "etp_rank")


@_public
def get_expert_tensor_and_model_parallel_world_size() -> int:
    return _size("tp_ep")


@_public
def get_expert_tensor_and_model_parallel_rank() -> int:
    return _rank("tp_ep")


@_public
def get_expert_data_parallel_world_size(
    with_gtp_remat: bool = True, partial_expert_data_parallel: bool = False
) -> int:
    return _size("expt_dp")


@_public
def get_expert_data_parallel_rank(
    with_gtp_remat: bool = True, partial_expert_data_parallel: bool = False
) -> int:
    return _rank("expt_dp")


# ---------------------------------------------------------------- virtual pipeline
@_public
def get_virtual_pipeline_model_parallel_world_size() -> int | None:
    return _store.VIRTUAL_PP_SIZE


@_public
def set_virtual_pipeline_model_parallel_world_size(world_size: int | None) -> None:
    _store.VIRTUAL_PP_SIZE = world_size


@_public
def get_virtual_pipeline_model_parallel_rank() -> int | None:
    return _store.VIRTUAL_PP_RANK


@_public
def set_virtual_pipeline_model_parallel_rank(rank: int | None) -> None:
    warnings.warn(
        "set_virtual_pipeline_model_parallel_rank is deprecated: pass vp_stage instead",
        DeprecationWarning,
        stacklevel=2,
    )
    _store.VIRTUAL_PP_RANK = rank


# ---------------------------------------------------------------- stages
@_public
def is_pipeline_first_stage(ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
    """First pipeline stage; with `ignore_virtual=False` under VPP, also virtual chunk 0."""
    if not ignore_virtual and get_virtual_pipeline_model_parallel_world_size() is not None:
        assert vp_stage is not None, "vp_stage must be passed when virtual pipelining is on"
        if vp_stage != 0:
            return False
    return get_pipeline_model_parallel_rank() == 0


@_public
def is_pipeline_last_stage(ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
    """Last pipeline stage; with `ignore_virtual=False` under VPP, also the last virtual chunk."""
    vp_size = get_virtual_pipeline_model_parallel_world_size()
    if not ignore_virtual and vp_size is not None:
        assert vp_stage is not None, "vp_stage must be passed when virtual pipelining is on"
        if vp_stage != vp_size - 1:
            return False
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


@_public
def is_rank_in_embedding_group(ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
    rank = dist.get_rank()
    ranks = _store.state().embedding_ranks
    if rank not in ranks:
        return False
    if ignore_virtual:
        return True
    if rank == ranks[0]:
        return is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    if rank == ranks[-1]:
        return is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    return True


@_public
def is_rank_in_position_embedding_group() -> bool:
    return dist.get_rank() in _store.state().position_embedding_ranks


# ---------------------------------------------------------------- source / neighbour ranks
@_public
def get_tensor_model_parallel_src_rank() -> int:
    """Global rank of TP-group member 0."""
    return _store.state().tp.ranks[0]


@_public
def get_model_parallel_src_rank() -> int:
    return _store.state().mp.ranks[0]


@_public
def get_data_parallel_src_rank(with_context_parallel: bool = False) -> int:
    s = _store.state()
    return (s.dp_cp if with_context_parallel else s.dp).ranks[0]


@_public
def get_expert_model_parallel_src_rank() -> int:
    return _store.state().ep.ranks[0]


@_public
def get_pipeline_model_parallel_first_rank() -> int:
    return _store.state().pp.ranks[0]


@_public
def get_pipeline_model_parallel_last_rank() -> int:
    return _store.state().pp.ranks[-1]


@_public
def get_pipeline_model_parallel_next_rank() -> int:
    ranks = _store.state().pp.ranks
    return ranks[(get_pipeline_model_parallel_rank() + 1) % len(ranks)]


@_public
def get_pipeline_model_parallel_prev_rank() -> int:
    ranks = _store.state().pp.ranks
    return ranks[(get_pipeline_model_parallel_rank() - 1) % len(ranks)]


@_public
def get_tensor_model_parallel_global_ranks() -> list[int]:
    return list(_store.state().tp.ranks)


@_public
def get_pipeline_model_parallel_global_ranks() -> list[int]:
    return list(_store.state().pp.ranks)


@_public
def get_data_parallel_global_ranks(with_context_parallel: bool = False) -> list[int]:
    s = _store.state()
    return list((s.dp_cp if with_context_parallel else s.dp).ranks)


@_public
def get_embedding_global_ranks() -> list[int]:
    return list(_store.state().embedding_ranks)


# ---------------------------------------------------------------- fake initialisation
def _setter(key: str):
    # Megatron's parameter names: `rank` for the *_rank setters, `world_size` for the others.
    if key.endswith("_rank"):

        def set_(rank: int | None) -> None:
            _store.OVERRIDES[key] = rank

    else:

        def set_(world_size: int | None) -> None:
            _store.OVERRIDES[key] = world_size

    return set_


for _name, _key in (
    ("set_tensor_model_parallel_world_size", "tp_size"),
    ("set_tensor_model_parallel_rank", "tp_rank"),
    ("set_pipeline_model_parallel_world_size", "pp_size"),
    ("set_pipeline_model_parallel_rank", "pp_rank"),
    ("set_data_parallel_rank", "dp_rank"),
    ("set_expert_model_parallel_world_size", "ep_size"),
    ("set_expert_model_parallel_rank", "ep_rank"),
    ("set_expert_tensor_parallel_world_size", "etp_size"),
    ("set_expert_tensor_parallel_rank", "etp_rank"),
):
    _fn = _setter(_key)
    _fn.__name__ = _fn.__qualname__ = _name
    _fn.__doc__ = f"Fake-init override read by the matching getter (Megatron's {_name})."
    globals()[_name] = _fn
    __all__.append(_name)
del _name, _key, _fn
