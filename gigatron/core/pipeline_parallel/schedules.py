"""Forward/backward schedules over microbatches and pipeline stages.

Mirrors `megatron.core.pipeline_parallel.schedules`: `get_forward_backward_func` picks one of
`forward_backward_no_pipelining`, `forward_backward_pipelining_without_interleaving` (1F1B) or
`forward_backward_pipelining_with_interleaving` (interleaved 1F1B over virtual stages), all with
Megatron's keyword-only signature, forward_step_func contract, loss scaling and config hooks.
Each schedule validates its inputs, asks `schedule_plan.rank_schedule` for this rank's order of
steps and hands it to the one executor in `_executor`. Returns the per-microbatch loss reports on
the last pipeline stage and [] elsewhere, as a `list` subclass whose tensor methods
(`.backward()`, used by GradScaler tutorials) raise a helpful TypeError
(`gigatron.compat.loss_reports`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from gigatron.compat.loss_reports import LossReports
from gigatron.core import parallel_state
from gigatron.core.distributed.finalize_model_grads import check_tied_embedding_copies
from gigatron.core.pipeline_parallel._executor import RunSpec, run_table
from gigatron.core.pipeline_parallel._steps import (  # noqa: F401  (Megatron's public names)
    backward_step,
    custom_backward,
    deallocate_output_tensor,
    forward_step,
    forward_step_calc_loss,
    set_current_microbatch,
)
from gigatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
from gigatron.core.pipeline_parallel.schedule_plan import rank_schedule
from gigatron.core.utils import get_model_config


def get_forward_backward_func(
    pp_size: int | None = None, vp_size: int | None = None, schedule_pg_collection=None
):
    """The schedule for this layout: interleaved if pp > 1 and vp set, 1F1B if pp > 1, else none.

    With both arguments None they are read from parallel_state. `schedule_pg_collection`
    (Megatron 0.19+): a `MultiModuleProcessGroupCollection` selects Megatron's cross-grid bridge
    schedule, which gigatron does not implement (ValueError); any other value is ignored, as in
    Megatron.
    """
    if type(schedule_pg_collection).__name__ == "MultiModuleProcessGroupCollection":
        raise ValueError(
            "get_forward_backward_func: multi-module (cross-grid) pipeline schedules are not "
            "implemented by gigatron"
        )
    if pp_size is None and vp_size is None:
        pp_size = parallel_state.get_pipeline_model_parallel_world_size()
        vp_size = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    if pp_size is not None and pp_size > 1:
        if vp_size is not None:
            return forward_backward_pipelining_with_interleaving
        return forward_backward_pipelining_without_interleaving
    return forward_backward_no_pipelining


def get_tensor_shapes(
    *, seq_length: int, micro_batch_size: int, decoder_seq_length: int | None, config, tp_group,
    cp_group,
) -> list[tuple[int, int, int]]:  # fmt: skip
    """[(seq // cp [// tp with sequence_parallel], micro_batch_size, hidden_size)]."""
    seq = decoder_seq_length if decoder_seq_length is not None else seq_length
    seq //= cp_group.size()
    if config.sequence_parallel:
        seq //= tp_group.size()
    return [(seq, micro_batch_size, config.hidden_size)]


def _as_list(x, name: str, length: int | None) -> list:
    items = list(x) if isinstance(x, list) else [x]
    if length is not None and len(items) != length:
        raise ValueError(f"{name} has {len(items)} entries; this schedule needs {length}")
    return items


def _check_inputs(kind, model, data_iterator, num_microbatches, adjust_tensor_shapes_fn):
    """(model chunks, data iterators, config) after the checks that need no communication."""
    if kind == "interleaved":
        if not isinstance(model, list) or not isinstance(data_iterator, list):
            raise ValueError(
                "the interleaved schedule needs a list of model chunks and a list of data "
                f"iterators (got {type(model).__name__} and {type(data_iterator).__name__})"
            )
        models = model
        iterators = _as_list(data_iterator, "data_iterator", len(models))
    else:
        models = _as_list(model, "model", 1)
        iterators = _as_list(data_iterator, "data_iterator", 1)
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches ({num_microbatches}) must be >= 1")
    config = get_model_config(models[0])
    if getattr(config, "overlap_p2p_comm", False):
        raise ValueError("overlap_p2p_comm=True is not supported by gigatron's schedules")
    if adjust_tensor_shapes_fn is not None and kind != "1f1b":
        raise ValueError(f"adjust_tensor_shapes_fn is only supported by 1F1B (schedule: {kind})")
    return models, iterators, config


def _groups(pg_collection, p2p_communicator):
    """(pp_group, tp_group, cp_group), from pg_collection if given, else parallel_state."""
    if pg_collection is not None:
        return pg_collection.pp, pg_collection.tp, pg_collection.cp
    pp = p2p_communicator.pp_group if p2p_communicator is not None else None
    return (
        pp or parallel_state.get_pipeline_model_parallel_group(),
        parallel_state.get_tensor_model_parallel_group(),
        parallel_state.get_context_parallel_group(),
    )


def _table(kind, config, pp_size, pp_rank, num_microbatches, num_chunks, forward_only, *, nccl):
    """This rank's steps and warmup count; interleaving's extra rules checked first."""
    if kind == "interleaved":
        group = config.microbatch_group_size_per_vp_stage or pp_size
        if nccl and group != pp_size:
            raise ValueError(
                f"microbatch_group_size_per_vp_stage ({group}) other than "
                f"pipeline_model_parallel_size ({pp_size}) is only supported on gloo: its batches "
                "would wait on each other over NCCL"
            )
        if nccl and config.variable_seq_lengths and num_microbatches == pp_size > 2:
            raise ValueError(
                f"variable_seq_lengths with interleaving over NCCL needs num_microbatches "
                f"({num_microbatches}) != pipeline_model_parallel_size ({pp_size}) when it is "
                "> 2: the shapes-first exchange would wait in a circle"
            )
    else:
        group = None
    return rank_schedule(
        kind, pp_size=pp_size, pp_rank=pp_rank, num_microbatches=num_microbatches,
        num_model_chunks=num_chunks, microbatch_group_size_per_vp_stage=group,
        forward_only=forward_only,
    )  # fmt: skip


def _run(
    kind: str,
    *,
    forward_step_func,
    data_iterator,
    model,
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    decoder_seq_length,
    forward_only: bool,
    collect_non_loss_data: bool,
    first_val_step,
    adjust_tensor_shapes_fn,
    p2p_communicator,
    pg_collection,
    force_all_reduce: bool | None,
) -> list:
    """Validate (before any communication), build this rank's table, run it, finalize grads."""
    models, iterators, config = _check_inputs(
        kind, model, data_iterator, num_microbatches, adjust_tensor_shapes_fn
    )
    pp_group, tp_group, cp_group = _groups(pg_collection, p2p_communicator)
    pp_size, pp_rank = (1, 0) if kind == "none" else (pp_group.size(), pp_group.rank())
    comm, recv_shape, grad_shape = None, None, None
    if pp_size > 1:
        if config.pipeline_dtype is None:
            raise ValueError(
                f"config.pipeline_dtype must be set when pipeline_model_parallel_size "
                f"({pp_size}) > 1 (the dtype of tensors sent between stages)"
            )
        if not hasattr(config, "hidden_size"):
            raise ValueError("the model config needs hidden_size to size pipeline tensors")
        shapes = get_tensor_shapes(
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            decoder_seq_length=decoder_seq_length,
            config=config,
            tp_group=tp_group,
            cp_group=cp_group,
        )
        recv_shapes, send_shapes = shapes, shapes
        if adjust_tensor_shapes_fn is not None:
            recv_shapes, send_shapes = adjust_tensor_shapes_fn(recv_shapes, send_shapes)
        recv_shape, grad_shape = tuple(recv_shapes[0]), tuple(send_shapes[0])
        comm = p2p_communicator or P2PCommunicator(pp_group, config)
        if not forward_only and pg_collection is None:  # tied copies that drift: one warning
            check_tied_embedding_copies(models)

    steps, warmup = _table(
        kind, config, pp_size, pp_rank, num_microbatches, len(models), forward_only,
        nccl=comm is not None and comm.device.type != "cpu",
    )  # fmt: skip

    if config.timers is not None:
        config.timers("forward-backward", log_level=1).start(
            barrier=getattr(config, "barrier_with_L1_time", False)
        )
    spec = RunSpec(
        forward_step_func=forward_step_func,
        data_iterators=iterators,
        models=models,
        num_microbatches=num_microbatches,
        config=config,
        pp_rank=pp_rank,
        pp_size=pp_size,
        cp_size=cp_group.size(),
        recv_shape=recv_shape,
        grad_shape=grad_shape,
        forward_only=forward_only,
        collect_non_loss_data=collect_non_loss_data,
        first_val_step=first_val_step,
        warmup=warmup,
        sync_hooks=kind != "none",
        interleaved=kind == "interleaved",
        comm=comm,
    )
    store, total_num_tokens = run_table(spec, steps)
    if config.finalize_model_grads_func is not None and not forward_only:
        per_token = getattr(config, "calculate_per_token_loss", False)
        kwargs = {} if pg_collection is None else {"pg_collection": pg_collection}
        if force_all_reduce:
            kwargs["force_all_reduce"] = True
        config.finalize_model_grads_func(models, total_num_tokens if per_token else None, **kwargs)
    if config.timers is not None:
        config.timers("forward-backward").stop()
    return LossReports(store)


def forward_backward_no_pipelining(
    *,
    forward_step_func: Callable,
    data_iterator: Iterator | list[Iterator],
    model: torch.nn.Module | list[torch.nn.Module],
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    decoder_seq_length: int | None = None,
    forward_only: bool = False,
    collect_non_loss_data: bool = False,
    first_val_step: bool | None = None,
    adjust_tensor_shapes_fn: Callable | None = None,
    p2p_communicator: P2PCommunicator | None = None,
    pg_collection=None,
    force_all_reduce: bool | None = False,
) -> list:
    """Run forward (and backward) of every microbatch on one stage, accumulating gradients.

    Microbatches 0..M-2 run under config.no_sync_func(); the last one lets gradient sync fire.
    `seq_length` / `micro_batch_size` are unused. Returns the loss reports of all microbatches.
    """
    return _run("none", **locals())


def forward_backward_pipelining_without_interleaving(
    *,
    forward_step_func: Callable,
    data_iterator: Iterator | list[Iterator],
    model: torch.nn.Module | list[torch.nn.Module],
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    decoder_seq_length: int | None = None,
    forward_only: bool = False,
    collect_non_loss_data: bool = False,
    first_val_step: bool | None = None,
    adjust_tensor_shapes_fn: Callable | None = None,
    p2p_communicator: P2PCommunicator | None = None,
    pg_collection=None,
    force_all_reduce: bool | None = False,
) -> list:
    """1F1B over pipeline stages: warmup min(pp - rank - 1, M) forwards, steady 1F1B, cooldown.

    model / data_iterator: one module / iterator (or a list of one). Returns the loss reports
    on the last stage, [] elsewhere.
    """
    return _run("1f1b", **locals())


def forward_backward_pipelining_with_interleaving(
    *,
    forward_step_func: Callable,
    data_iterator: Iterator | list[Iterator],
    model: torch.nn.Module | list[torch.nn.Module],
    num_microbatches: int,
    seq_length: int,
    micro_batch_size: int,
    decoder_seq_length: int | None = None,
    forward_only: bool = False,
    collect_non_loss_data: bool = False,
    first_val_step: bool | None = None,
    adjust_tensor_shapes_fn: Callable | None = None,
    p2p_communicator: P2PCommunicator | None = None,
    pg_collection=None,
    force_all_reduce: bool | None = False,
) -> list:
    """Interleaved 1F1B: model and data_iterator are lists with one chunk / iterator per virtual
    stage; chunk c on rank r is virtual stage c * pp + r of the model.

    Needs microbatch_group_size_per_vp_stage (default pp) in [pp, M] and a final group of 0 or
    >= pp microbatches. Returns the loss reports on the last stage, [] elsewhere.
    """
    return _run("interleaved", **locals())
