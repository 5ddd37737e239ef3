"""Small shared helpers, mirroring the parts of `megatron.core.utils` users call."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion

from gigatron.compat.errors import StateError
from gigatron.core import parallel_state
from gigatron.core import parallel_state as ps
from gigatron.core._experimental import (  # noqa: F401  (Megatron's names)
    ExperimentalNotEnabledError,
    experimental_cls,
    experimental_fn,
)
from gigatron.core._rank_utils import (  # noqa: F401  (log_single_rank: Megatron's name here)
    log_single_rank,
    safe_get_rank,
    safe_get_world_size,
)
from gigatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
from gigatron.core.packed_seq_params import PackedSeqParams


def ensure_divisibility(numerator: int, denominator: int) -> None:
    """Raise ValueError unless `denominator` divides `numerator`."""
    if denominator == 0 or numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")


def divide(numerator: int, denominator: int) -> int:
    """`numerator // denominator`, checking that the division is exact."""
    ensure_divisibility(numerator, denominator)
    return numerator // denominator


# ---------------------------------------------------------------- process groups
# Public Megatron-style entry points accept `group=None` / `tp_group=None` and resolve it once,
# at the edge, with `get_tensor_model_parallel_group_if_none`; everything below takes an explicit
# group and reads its size and rank through these helpers (which also work in one process
# without torch.distributed, so modules can be built and unit-tested there).


def get_tensor_model_parallel_group_if_none(group, is_expert: bool = False):
    """`group` if given, else parallel_state's TP group (expert TP group when `is_expert`)."""
    if group is not None:
        return group
    if is_expert:
        return parallel_state.get_expert_tensor_parallel_group()
    return parallel_state.get_tensor_model_parallel_group()


def group_size(group) -> int:
    """Number of ranks in `group` (1 when torch.distributed is not initialised)."""
    if not dist.is_initialized():
        return 1
    return dist.get_world_size(group=group)


def group_rank(group) -> int:
    """This process's rank inside `group` (0 when torch.distributed is not initialised)."""
    if not dist.is_initialized():
        return 0
    return dist.get_rank(group=group)


def group_src_rank(group) -> int:
    """Global rank of `group`'s rank 0 (the source of broadcasts inside the group)."""
    if not dist.is_initialized():
        return 0
    return dist.get_global_rank(group, 0) if group is not None else 0


def all_gather_into(out: torch.Tensor, inp: torch.Tensor, group, async_op: bool = False):
    """All-gather `inp` along dim 0 into `out` (torch >= 2.12 name, else the older alias)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def reduce_scatter_into(
    out: torch.Tensor, inp: torch.Tensor, group, async_op: bool = False, op=dist.ReduceOp.SUM
):
    """Reduce `inp` over ranks (`op`, a sum by default) and keep this rank's dim-0 chunk in
    `out` (torch >= 2.12 name, else the older alias)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, op=op, group=group, async_op=async_op)


def default_device() -> torch.device:
    """Where activations live: the current CUDA device if there is one, else the CPU; the meta
    device inside `with torch.device("meta")` (a model built for its shapes only)."""
    if torch.get_default_device().type == "meta":
        return torch.device("meta")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def parameter_device(config) -> torch.device:
    """Where layers create their parameters: the CPU under `use_cpu_initialization` (moved
    later, as in Megatron), else `default_device()`; always meta inside `torch.device("meta")`,
    so `gigatron estimate` builds a full-size rank's model without allocating it."""
    if config.use_cpu_initialization and torch.get_default_device().type != "meta":
        return torch.device("cpu")
    return default_device()


# ---------------------------------------------------------------- models
def get_attr_wrapped_model(
    model, attr: str, allow_none: bool = True, return_model_obj: bool = False
):
    """Find `attr` on `model` or on the modules it wraps (`.module` chains: DDP, Float16Module)."""
    if isinstance(model, list):
        raise RuntimeError("get_attr_wrapped_model given a list of models")
    while not hasattr(model, attr) or (not allow_none and getattr(model, attr) is None):
        if not hasattr(model, "module"):
            raise RuntimeError(f"couldn't find attribute {attr!r} on the model or its wrappers")
        model = model.module
    return model if return_model_obj else getattr(model, attr)


def get_model_config(model):
    """The `TransformerConfig` / `ModelParallelConfig` of a (possibly wrapped) model."""
    return get_attr_wrapped_model(model, "config", allow_none=False)


def make_viewless_tensor(inp: torch.Tensor, requires_grad: bool, keep_graph: bool) -> torch.Tensor:
    """Return a tensor that is not a view (so its `.data` can be freed safely). No copy of data."""
    if inp._base is None:
        return inp
    if keep_graph:
        return inp.view_as(inp)  # still a view for autograd, but a distinct tensor object
    out = torch.empty((1,), dtype=inp.dtype, device=inp.device, requires_grad=requires_grad)
    out.data = inp.data
    return out


# Batch entries that describe the packing and are never split along the sequence.
_CP_METADATA_KEYS = ("cu_seqlens", "cu_seqlens_padded", "max_seqlen", "local_cp_size")
_CP_METADATA_KEYS += ("hybrid_cp_group",)
# What the per-document split cuts (megatron-core's list); other entries pass through.
_CP_DOCUMENT_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


def get_batch_on_this_cp_rank(
    batch: dict,
    is_hybrid_cp: bool = False,
    cp_group=None,
    hybrid_cp_group_func=None,
    use_per_sequence_balancing: bool = False,
) -> dict:
    """Keep this context-parallel rank's part of every sequence (load-balanced for causal masks).

    Per sequence (no `cu_seqlens` in the batch, or `use_per_sequence_balancing`): each tensor is
    cut along its sequence dim (dim 1; dim 2 for `attention_mask` [b, 1, s, s]) into 2·cp chunks
    and rank r keeps chunks r and 2·cp−1−r, so every rank gets the same causal work. Packing
    metadata (`cu_seqlens*`, `max_seqlen`, ...) and None values pass through untouched.
    Per document (packed sequences, `cu_seqlens` given): the same zigzag inside every document
    of `cu_seqlens_padded` (else `cu_seqlens`), for tokens / labels / loss_mask / position_ids.
    `cp_group` None: parallel_state's CP group. `is_hybrid_cp` / `hybrid_cp_group_func`
    (megatron-core 0.19's hybrid CP, refused by initialize_model_parallel) only at False / None;
    megatron-core 0.19 inserted `is_hybrid_cp` before `cp_group`, so pass cp_group by keyword.
    """
    if not isinstance(is_hybrid_cp, bool):  # a 0.16-style call passing cp_group second
        raise TypeError(
            f"is_hybrid_cp must be a bool, got {type(is_hybrid_cp).__name__}: megatron-core 0.19 "
            "inserted it before cp_group; pass cp_group by keyword"
        )
    if is_hybrid_cp or hybrid_cp_group_func is not None:
        name, value = (
            ("is_hybrid_cp", is_hybrid_cp) if is_hybrid_cp else ("hybrid_cp_group_func", "set")
        )
        raise ValueError(
            f"{name}={value!r} is not supported by gigatron (hybrid context parallel is not "
            "implemented)"
        )
    import torch.distributed as dist

    cp = ps.get_context_parallel_world_size() if cp_group is None else dist.get_world_size(cp_group)
    if cp <= 1:
        return batch
    rank = ps.get_context_parallel_rank() if cp_group is None else dist.get_rank(cp_group)
    if use_per_sequence_balancing or batch.get("cu_seqlens") is None:
        return _split_per_sequence(batch, cp, rank)
    return _split_per_document(batch, cp, rank)


def _zigzag_check(what: str, length: int, cp: int) -> None:
    if length % (2 * cp):
        raise ValueError(
            f"{what} ({length}) must be divisible by 2 x context_parallel_size ({2 * cp})"
        )


def _split_per_sequence(batch: dict, cp: int, rank: int) -> dict:
    out = {}
    for key, value in batch.items():
        if value is None or key in _CP_METADATA_KEYS:
            out[key] = value
            continue
        dim = 2 if key == "attention_mask" else 1
        seq = value.shape[dim]
        _zigzag_check(f"sequence length of {key!r}", seq, cp)
        chunks = value.view(*value.shape[:dim], 2 * cp, seq // (2 * cp), *value.shape[dim + 1 :])
        index = torch.tensor([rank, 2 * cp - 1 - rank], device=value.device)
        kept = chunks.index_select(dim, index)
        out[key] = kept.view(*value.shape[:dim], -1, *value.shape[dim + 1 :])
    return out


def _document_zigzag_index(bounds: torch.Tensor, seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Transformer Engine's `thd_get_partitioned_indices` (what megatron-core calls), in
    PyTorch: document [start, end) of length L keeps its chunks r and 2·cp−1−r of L/(2·cp).
    Returns this rank's token positions [seq_len / cp] (int64, on the CPU)."""
    values = bounds.reshape(-1).tolist()  # [1, n] in megatron-core's batches
    if values[0] != 0 or values[-1] != seq_len:
        raise ValueError(f"cu_seqlens {values} must run from 0 to the sequence length ({seq_len})")
    pieces = []
    for start, end in zip(values[:-1], values[1:]):
        _zigzag_check(f"document length [{start}, {end})", end - start, cp)
        chunk = (end - start) // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank):
            pieces.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
    return torch.cat(pieces)


def _split_per_document(batch: dict, cp: int, rank: int) -> dict:
    bounds = batch.get("cu_seqlens_padded")
    bounds = batch["cu_seqlens"] if bounds is None else bounds
    seq_key = "tokens" if batch.get("tokens") is not None else "labels"
    index = _document_zigzag_index(bounds, batch[seq_key].shape[1], cp, rank)
    out = dict(batch)
    for key in _CP_DOCUMENT_KEYS:
        if batch.get(key) is not None:
            out[key] = batch[key].index_select(1, index.to(batch[key].device))
    return out


def get_thd_batch_on_this_cp_rank(
    batch: dict,
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded: torch.Tensor | None,
    max_seqlen: torch.Tensor,
    cp_size: int | None = None,
    cp_rank: int | None = None,
) -> tuple[dict, PackedSeqParams]:
    """megatron-core's: this CP rank's per-document chunks of a packed batch (every entry but
    attention_mask / cu_seqlens* / max_seqlen cut along dim 1, in place, at the bounds
    `cu_seqlens_padded`, else `cu_seqlens`), and the batch's PackedSeqParams (thd; max_seqlen
    [1] read on the host). cp_size / cp_rank default to parallel_state's."""
    max_len = int(max_seqlen.reshape(-1)[0])
    packed_seq_params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens_padded, cu_seqlens_kv_padded=cu_seqlens_padded,
        max_seqlen_q=max_len, max_seqlen_kv=max_len,
    )  # fmt: skip
    cp_size = ps.get_context_parallel_world_size() if cp_size is None else cp_size
    cp_rank = ps.get_context_parallel_rank() if cp_rank is None else cp_rank
    if cp_size > 1:
        bounds = cu_seqlens if cu_seqlens_padded is None else cu_seqlens_padded
        index = _document_zigzag_index(bounds, batch["tokens"].size(1), cp_size, cp_rank)
        for key, data in batch.items():
            if data is None or key in ("attention_mask", *_CP_METADATA_KEYS):
                continue
            batch[key] = data.index_select(1, index.to(data.device))
    return batch, packed_seq_params


def flatten_batch_for_packed_sequences(batch: dict) -> dict:
    """A micro-batch of b packed samples as one packed row (megatron-core 0.19+).

    tokens / labels / loss_mask / position_ids [b, s] -> [1, b*s]; cu_seqlens (and
    cu_seqlens_padded) [b, n+1], each row 0 .. s and right-filled with s, -> [1, m+1]: the rows'
    bounds offset by i*s and joined; max_seqlen -> its max [1]. Without cu_seqlens the batch is
    returned as it is. Reads the bounds on the host (call it on the dataloader's CPU batch).
    """
    if batch.get("cu_seqlens") is None:
        return batch
    seq_key = next(k for k in _CP_DOCUMENT_KEYS if batch.get(k) is not None)
    seq_len = batch[seq_key].shape[1]

    def merge(cu: torch.Tensor) -> torch.Tensor:
        bounds = [0]
        for i, row in enumerate(cu.reshape(cu.shape[0], -1).tolist()):
            end = row.index(seq_len) if seq_len in row else len(row) - 1  # drop the fill
            bounds += [b + i * seq_len for b in row[1 : end + 1]]
        return torch.tensor(bounds, dtype=cu.dtype, device=cu.device)[None]

    out = dict(batch)
    out["cu_seqlens"] = merge(batch["cu_seqlens"])
    if batch.get("cu_seqlens_padded") is not None:
        out["cu_seqlens_padded"] = merge(batch["cu_seqlens_padded"])
    if batch.get("max_seqlen") is not None:
        out["max_seqlen"] = batch["max_seqlen"].max().reshape(1)
    for key in _CP_DOCUMENT_KEYS:
        if batch.get(key) is not None:
            out[key] = batch[key].reshape(1, -1)
    return out


# ---- sharded-state-dict helpers (megatron.core.utils / megatron.core.transformer.utils)
#
# Replica ids follow Megatron: (0, tp_rank, dp_rank) for a tensor every TP rank holds whole and
# (0, 0, dp_rank) for a TP-split one (dp over DP x CP), so exactly one rank writes each element.
# Without parallel_state (a model built in one process) every rank id is 0.


def _group_rank_size(group) -> tuple[int, int]:
    if group is None or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _tp_dp_groups(tp_group=None, dp_cp_group=None) -> tuple:
    """The given groups, else parallel_state's TP and DP x CP groups (None without it)."""
    if parallel_state.model_parallel_is_initialized():
        if tp_group is None:
            tp_group = parallel_state.get_tensor_model_parallel_group()
        if dp_cp_group is None:
            dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    return tp_group, dp_cp_group


def make_sharded_tensor_for_checkpoint(
    tensor: torch.Tensor, key: str, prepend_offsets=(), replica_id=None, **kwargs
):
    """A ShardedTensor for a tensor every TP rank holds whole (main replica: TP rank 0 of DP
    rank 0). `prepend_offsets`: (axis, offset, size) triples of prepended axes (e.g. the layer
    axis of a stacked layer). `tp_group` / `dp_cp_group` may be passed as keywords."""
    tp_group, dp_cp_group = _tp_dp_groups(
        kwargs.pop("tp_group", None), kwargs.pop("dp_cp_group", None)
    )
    if replica_id is None:
        replica_id = (0, _group_rank_size(tp_group)[0], _group_rank_size(dp_cp_group)[0])
    return ShardedTensor.from_rank_offsets(
        key, tensor, *prepend_offsets, replica_id=replica_id,
        prepend_axis_num=len(prepend_offsets), **kwargs,
    )  # fmt: skip


def make_tp_sharded_tensor_for_checkpoint(
    tensor: torch.Tensor, key: str, tp_axis: int = 0, replica_id=None, prepend_offsets=(), **kwargs
):
    """A ShardedTensor for a tensor split in TP-size equal pieces along `tp_axis` (of the local
    tensor); this rank's piece is number tp_rank (main replica: DP rank 0)."""
    tp_group, dp_cp_group = _tp_dp_groups(
        kwargs.pop("tp_group", None), kwargs.pop("dp_cp_group", None)
    )
    tp_rank, tp_size = _group_rank_size(tp_group)
    if replica_id is None:
        replica_id = (0, 0, _group_rank_size(dp_cp_group)[0])
    p = len(prepend_offsets)
    return ShardedTensor.from_rank_offsets(
        key, tensor, *prepend_offsets, (tp_axis + p, tp_rank, tp_size), replica_id=replica_id,
        prepend_axis_num=p, **kwargs,
    )  # fmt: skip


def make_sharded_object_for_checkpoint(
    obj, key: str, sharded_offsets=(), replica_id=None, **kwargs
):
    """A ShardedObject every TP and DP rank holds (e.g. a linear layer's `_extra_state`): its
    grid is the prepended axes of `sharded_offsets` ((0, i, L) for layer i of L), else (1,)."""
    tp_group, dp_cp_group = _tp_dp_groups(
        kwargs.pop("tp_group", None), kwargs.pop("dp_cp_group", None)
    )
    if replica_id is None:
        replica_id = (0, _group_rank_size(tp_group)[0], _group_rank_size(dp_cp_group)[0])
    offsets = sorted(sharded_offsets, key=lambda o: o[0])
    if [axis for axis, _, _ in offsets] != list(range(len(offsets))):
        raise ValueError(f"{key}: sharded_offsets {sharded_offsets} must cover axes 0, 1, ...")
    shape = tuple(size for _, _, size in offsets) or (1,)
    offset = tuple(off for _, off, _ in offsets) or (0,)
    return ShardedObject(key, obj, shape, offset, replica_id, **kwargs)


def make_sharded_tensors_for_checkpoint(
    state_dict: dict,
    prefix: str,
    tensor_parallel_layers_axis_map: dict[str, int] | None = None,
    sharded_offsets=(),
    extra_state_suffix: str = "_extra_state",
    tp_group=None,
    dp_cp_group=None,
) -> dict:
    """{prefix + name: ShardedTensor | ShardedObject} for a module's own `state_dict` entries:
    `*_extra_state` become ShardedObjects, names in `tensor_parallel_layers_axis_map` are split
    over TP along the given axis, the rest are TP-replicated. The ShardedTensor keys equal the
    dict keys (callers rename them, e.g. TransformerBlock's stacked-layer keys)."""
    axis_map = tensor_parallel_layers_axis_map or {}
    groups = dict(tp_group=tp_group, dp_cp_group=dp_cp_group)
    out = {}
    for name, tensor in state_dict.items():
        key = f"{prefix}{name}"
        if name.endswith(extra_state_suffix):
            out[key] = make_sharded_object_for_checkpoint(tensor, key, sharded_offsets, **groups)
        elif name in axis_map:
            out[key] = make_tp_sharded_tensor_for_checkpoint(
                tensor, key, axis_map[name], prepend_offsets=sharded_offsets, **groups
            )
        else:
            out[key] = make_sharded_tensor_for_checkpoint(
                tensor, key, prepend_offsets=sharded_offsets, **groups
            )
    return out


def unwrap_model(model, module_instances=None):
    """The model inside its wrappers (Megatron's `unwrap_model`); a list gives a list.

    Follows `.module` while the module is an instance of `module_instances`; by default the
    wrappers gigatron has (DistributedDataParallel, Float16Module: classes that declare
    `wraps_model = True`, so this floor needs no import of theirs) and torch's FSDP.
    """
    is_list = isinstance(model, list)
    out = []
    for chunk in model if is_list else [model]:
        while _is_wrapper(chunk, module_instances):
            chunk = chunk.module
        out.append(chunk)
    return out if is_list else out[0]


def _is_wrapper(module, module_instances) -> bool:
    if module_instances is not None:
        return isinstance(module, module_instances)
    from torch.distributed.fsdp import FullyShardedDataParallel

    return getattr(type(module), "wraps_model", False) or isinstance(
        module, FullyShardedDataParallel
    )


def get_torch_version() -> TorchVersion:
    """The installed torch's version, comparable with strings (`>= "2.4"`)."""
    return TorchVersion(torch.__version__)


def is_torch_min_version(version: str, check_equality: bool = True) -> bool:
    """True when torch is at least `version` (strictly newer when check_equality=False)."""
    if check_equality:
        return get_torch_version() >= version
    return get_torch_version() > version


def get_te_version() -> TorchVersion:
    """0.0.0: gigatron never uses Transformer Engine, installed or not (Megatron reports 0.0.0
    when TE is absent), so every `is_te_min_version` check takes its non-TE branch."""
    return TorchVersion("0.0.0")


def is_te_min_version(version: str, check_equality: bool = True) -> bool:
    """False for every real version: gigatron runs without Transformer Engine (`get_te_version`)."""
    if check_equality:
        return get_te_version() >= version
    return get_te_version() > version


def log_on_each_pipeline_stage(
    logger, level: int, msg: object, *args, tp_group=None, dp_cp_group=None, **kwargs
) -> None:
    """Log on the first rank (TP rank 0, DP x CP rank 0) of each pipeline stage.

    Needs torch.distributed; `tp_group` and `dp_cp_group` come together or not at all (then
    parallel_state's groups answer). Nothing is asked when `level` is disabled."""
    if not dist.is_initialized():
        raise StateError("log_on_each_pipeline_stage needs torch.distributed initialised")
    if (tp_group is None) != (dp_cp_group is None):
        raise ValueError("tp_group and dp_cp_group must be provided or not provided together")
    if not logger.isEnabledFor(level):
        return
    if tp_group is None:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        dp_cp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    else:
        tp_rank, dp_cp_rank = tp_group.rank(), dp_cp_group.rank()
    if tp_rank == 0 and dp_cp_rank == 0:
        logger.log(level, msg, *args, **kwargs)


# ---------------------------------------------------------------- process-group queries
def get_pg_size(group=None) -> int:
    """World size of `group`; 1 without torch.distributed or without a group (Megatron's rule)."""
    if not dist.is_initialized() or group is None:
        return 1
    return group.size()


def get_pg_rank(group=None) -> int:
    """This rank's index in `group`; 0 without torch.distributed or without a group."""
    if not dist.is_initialized() or group is None:
        return 0
    return group.rank()


def get_pg_src_rank(group=None) -> int:
    """The global rank of `group`'s first member; 0 without torch.distributed or a group."""
    if not dist.is_initialized() or group is None:
        return 0
    return dist.get_process_group_ranks(group)[0]
