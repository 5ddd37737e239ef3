"""Optimizer state as reshardable ShardedTensors (Megatron's "fully_reshardable" idea).

Mirrors the role of `megatron.core.dist_checkpointing.optimizer` and the distributed optimizer's
`sharded_state_dict`. For every model parameter the optimizer steps (whole, or the contiguous
range [lo, hi) of its flattened TP-local tensor that a distributed-optimizer DP rank owns), each
per-element state tensor (Adam's `exp_avg`, `exp_avg_sq`; `fp32_param` for low-precision models)
is saved under `optimizer.state.<name>.<model key>` with the *model parameter's* global layout
and that flat range. The checkpoint therefore holds plain global tensors: any TP/PP/DP layout,
with or without the distributed optimizer, loads them. Each state tensor also takes the
parameter's `allow_shape_mismatch`, so a padded-vocabulary change trims or zero-pads the rows of
the moments and the fp32 main copy exactly as it does the weight's. Scalars (`step`, param-group
hyperparameters, loss scaler) go to the common state.

gigatron difference: Megatron's default (`dp_reshardable`) only allows DP changes; this format
allows every change and is what gigatron's training checkpoints use.
"""

from __future__ import annotations

import copy
import dataclasses
import logging

import torch
from torch.distributed.tensor import DTensor

from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.dist_checkpointing.mapping import (
    LocalNonpersistentObject,
    ShardedTensor,
    ShardedTensorFactory,
)

logger = logging.getLogger(__name__)

__all__ = ["load_optimizer_state_dict", "optimizer_sharded_state_dict"]


def _units(optimizer) -> tuple[list, bool]:
    """([(torch_opt, model_param, main_param, lo, hi)], distributed?) for a Megatron optimizer."""
    if hasattr(optimizer, "chained_optimizers"):
        out, dist = [], False
        for opt in optimizer.chained_optimizers:
            units, d = _units(opt)
            out += units
            dist = dist or d
        return out, dist
    inner = getattr(optimizer, "optimizer", None) or optimizer
    if hasattr(optimizer, "shard_groups"):  # DistributedOptimizer
        units = [(inner, p, m, lo, hi) for g in optimizer.shard_groups for p, m, lo, hi in g]
        return units, True
    if hasattr(optimizer, "float16_groups"):  # Float16OptimizerWithFloat16Params
        units = [
            (inner, p, m, 0, p.numel())
            for gp, gm in zip(optimizer.float16_groups, optimizer.fp32_from_float16_groups)
            for p, m in zip(gp, gm)
        ]
        units += [(inner, p, p, 0, p.numel()) for g in optimizer.fp32_from_fp32_groups for p in g]
        return units, False
    if getattr(optimizer, "steps_dtensor_shards", False):  # FSDP: this rank's shard of each
        units = [
            (inner, p, p, 0, _local(p).numel()) for g in inner.param_groups for p in g["params"]
        ]
        return [u for u in units if u[4]], False  # an empty shard has nothing to save
    return [(inner, p, p, 0, p.numel()) for g in inner.param_groups for p in g["params"]], False


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (an FSDP-sharded param or its Adam moment), else the tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


# torch.optim param-group keys that pick the kernel, not the update's math
_KERNEL_KEYS = ("fused", "foreach", "capturable", "differentiable")


def _step_tensor(torch_opt, main: torch.Tensor, value: float) -> torch.Tensor:
    """Adam's step count as torch keeps it: on `main`'s device (fp32) when its param group is
    fused or capturable (the fused CUDA kernel reads it there), else a CPU scalar, as torch's
    own `_init_group` / `load_state_dict` place it. A CPU count handed to the fused CUDA kernel
    is a host pointer dereferenced on the device (a resume under torch's fused Adam)."""
    group = next((g for g in torch_opt.param_groups if any(p is main for p in g["params"])), {})
    on_device = bool(group.get("fused") or group.get("capturable"))
    old = torch_opt.state[main].get("step")
    dtype = old.dtype if old is not None and not on_device else torch.float32
    return torch.tensor(value, dtype=dtype, device=main.device if on_device else "cpu")


def _ensure_state(torch_opt, main: torch.Tensor) -> dict:
    state = torch_opt.state[main]
    names = getattr(torch_opt, "state_names", None)  # Muon, Lion: no step count
    if not state and names is not None:
        for name in names:
            state[name] = torch.zeros_like(main, memory_format=torch.preserve_format)
    if not state:  # before the first step: Adam's zero state, so a load has somewhere to go
        state["step"] = _step_tensor(torch_opt, main, 0.0)
        state["exp_avg"] = torch.zeros_like(main, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(main, memory_format=torch.preserve_format)
    return state


def _model_layouts(model_sharded_sd: dict) -> dict:
    """{(data_ptr, shape): (parameter, ShardedTensor pieces viewing it)} for every model tensor.

    A factory's pieces are what it builds (GLU fc1: two row blocks), or, for factories that
    save a transformed copy (GroupedMLP's transposed experts), its `parameter_layout()`."""
    out = {}
    for entry in model_sharded_sd.values():
        if isinstance(entry, ShardedTensorFactory):
            layout = getattr(entry, "parameter_layout", None)
            pieces = layout() if layout is not None else entry.build()
            pieces = pieces if isinstance(pieces, list) else [pieces]
        elif isinstance(entry, ShardedTensor):
            pieces = [entry]
        else:
            continue  # ShardedObjects (`_extra_state`)
        out[(entry.data.data_ptr(), tuple(entry.data.shape))] = (entry.data, pieces)
    return out


def _flat_pieces(key_prefix, flat, base, pieces, lo, hi, replica_id):
    """ShardedTensors `key_prefix + piece.key` for flat state `flat` = base.view(-1)[lo:hi] laid
    out like `pieces` (a factory's pieces may have keys of their own: Mamba's in_proj parts)."""
    out = []
    for piece in pieces:
        shares = piece.data.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        if not piece.data.is_contiguous() or not shares:
            raise CheckpointingException(
                f"{piece.key}: optimizer state needs the model's ShardedTensors to be "
                "contiguous views of the parameter (a strided TP split along a non-leading "
                "axis, or a factory saving a copy without `parameter_layout`, is not)"
            )
        start = piece.data.storage_offset() - base.storage_offset()
        stop = start + piece.data.numel()
        a, b = max(lo, start), min(hi, stop)
        if a >= b:
            continue
        out.append(
            ShardedTensor(
                f"{key_prefix}{piece.key}",
                flat[a - lo : b - lo],
                flat.dtype,
                piece.local_shape,
                piece.global_shape,
                piece.global_offset,
                piece.axis_fragmentations,
                replica_id,
                piece.prepend_axis_num,
                piece.allow_shape_mismatch,  # padded vocab rows: trimmed / zeroed as the weight
                flattened_range=slice(a - start, b - start),
            )  # fmt: skip
        )
    return out


def _replica(model_replica, distributed: bool):
    if not distributed:
        return model_replica
    if isinstance(model_replica, tuple) and len(model_replica) == 3:
        return (model_replica[0], model_replica[1], 0)  # DP ranks own disjoint ranges
    return model_replica


def optimizer_sharded_state_dict(
    optimizer, model_sharded_sd: dict, prefix: str = "optimizer."
) -> dict:
    """Reshardable sharded state dict of `optimizer` for the model described by the sharded sd.

    `model_sharded_sd`: the model's `sharded_state_dict()` ({key: ShardedTensor |
    ShardedTensorFactory | ShardedObject}), whose data tensors are the parameters the optimizer
    steps.
    """
    units, distributed = _units(optimizer)
    layouts = _model_layouts(model_sharded_sd)
    tensors, steps = {}, set()
    for n, (torch_opt, param, main, lo, hi) in enumerate(units):
        local = _local(param)
        found = layouts.get((local.data_ptr(), tuple(local.shape)))
        if found is None:
            raise CheckpointingException(
                f"optimizer parameter of shape {tuple(param.shape)} is not in the model's "
                "sharded_state_dict"
            )
        base, pieces = found
        state = _ensure_state(torch_opt, main)
        if getattr(torch_opt, "state_names", None) is None:  # step-counting (Adam) state
            steps.add(float(state["step"]) if "step" in state else 0.0)
        named = {
            k: _local(v) for k, v in state.items() if torch.is_tensor(v) and v.shape == main.shape
        }
        if param.dtype != torch.float32:
            named["fp32_param"] = _local(main.detach())
        for name, value in sorted(named.items()):
            replica = _replica(pieces[0].replica_id, distributed)
            key = f"{prefix}state.{name}.{pieces[0].key}"
            if not distributed and lo == 0 and hi == param.numel():
                flat = value.detach().reshape(-1)
            else:
                flat = value.detach().view(-1)
            key_prefix = f"{prefix}state.{name}."
            for i, sh in enumerate(_flat_pieces(key_prefix, flat, base, pieces, lo, hi, replica)):
                tensors[f"{key}#{n}.{i}"] = sh  # stacked layers share a key
    if len(steps) > 1:
        raise CheckpointingException(f"optimizer params disagree on 'step': {sorted(steps)}")
    common = {
        "step": steps.pop() if steps else 0.0,
        "param_groups": [
            {k: v for k, v in g.items() if k != "params"}
            for g in (optimizer.param_groups if hasattr(optimizer, "param_groups") else [])
        ],
    }
    scaler = getattr(optimizer, "grad_scaler", None)
    if scaler is not None:
        common["grad_scaler"] = scaler.state_dict()
    return {"sharded": tensors, "common": common}


def load_optimizer_state_dict(optimizer, request: dict, loaded: dict) -> None:
    """Copy what `load` returned for `optimizer_sharded_state_dict` into the optimizer."""
    with torch.no_grad():
        for name, sh in request["sharded"].items():
            got = loaded.get("sharded", {}).get(name)
            if got is None:  # not in the checkpoint (non-strict load)
                continue
            if got.data_ptr() != sh.data.data_ptr():
                sh.data.copy_(got)
    units, _ = _units(optimizer)
    step = float(loaded["common"]["step"])
    for torch_opt, param, main, _, _ in units:
        state = torch_opt.state[main]
        if "step" in state:  # torch's fused Adam keeps its step counts on the GPU
            state["step"] = _step_tensor(torch_opt, main, step)
        if param.dtype != torch.float32:
            pass  # fp32_param was loaded in place into `main`
    groups = loaded["common"].get("param_groups", [])
    if hasattr(optimizer, "param_groups") and len(groups) == len(optimizer.param_groups):
        for group, saved in zip(optimizer.param_groups, groups):
            # hyperparameters only: which kernel runs (fused / foreach ...) is this process's
            # choice (a CPU-saved fused=False would put a GPU resume on the slower foreach
            # kernel, which the sync-free step refuses)
            group.update({k: v for k, v in saved.items() if k not in _KERNEL_KEYS})
    scaler = getattr(optimizer, "grad_scaler", None)
    if scaler is not None and loaded["common"].get("grad_scaler") is not None:
        scaler.load_state_dict(loaded["common"]["grad_scaler"])
    if hasattr(optimizer, "_copy_main_params_to_model_params"):
        optimizer._copy_main_params_to_model_params()


# ---- Megatron's helpers for a plain torch.optim optimizer's state dict ---------------------
def get_optim_param_to_id_map(optim_params_iter) -> dict[int, int]:
    """{id(param): its index in the optimizer's state dict} (first occurrence wins)."""
    out: dict[int, int] = {}
    for i, param in enumerate(optim_params_iter):
        out.setdefault(id(param), i)
    return out


def get_param_id_to_sharded_param_map(model_sharded_state_dict, optim_params_iter) -> dict:
    """{optimizer state id: the model's ShardedTensor / ShardedTensorFactory of that param},
    matched by tensor identity (build the model's sharded state dict with `keep_vars=True`);
    params the optimizer does not track are left out. `optim_params_iter` must follow the
    optimizer's param order."""
    from gigatron.core.dist_checkpointing.dict_utils import nested_values
    from gigatron.core.dist_checkpointing.utils import extract_sharded_tensors_and_factories

    sharded, _ = extract_sharded_tensors_and_factories(model_sharded_state_dict)
    param_to_id = get_optim_param_to_id_map(optim_params_iter)
    out = {}
    for ten in nested_values(sharded):
        if id(ten.data) in param_to_id:
            out[param_to_id[id(ten.data)]] = ten
    if not out:
        logger.warning(
            "get_param_id_to_sharded_param_map: no model sharded tensor is an optimizer param "
            "(build the model's state dict with keep_vars=True)"
        )
    return out


def make_sharded_optimizer_tensor(model_param, optim_param: torch.Tensor, prefix: str):
    """`model_param`'s sharding for an optimizer tensor of the same local shape, keyed
    `{prefix}.{model key}` (a factory keeps its build / merge functions)."""
    if isinstance(model_param, ShardedTensorFactory):
        return dataclasses.replace(model_param, key=f"{prefix}.{model_param.key}", data=optim_param)
    if tuple(optim_param.shape) != tuple(model_param.local_shape):
        raise CheckpointingException(
            f"{model_param.key}: optimizer tensor shape {tuple(optim_param.shape)} != model "
            f"local shape {tuple(model_param.local_shape)}"
        )
    return dataclasses.replace(
        model_param, key=f"{prefix}.{model_param.key}", data=optim_param, dtype=optim_param.dtype
    )


def optim_state_to_sharding_state(optim_state_dict: dict, id_to_sharded_param_map: dict,
                                  exclude_keys: tuple = ()) -> None:  # fmt: skip
    """In place: each `optim_state_dict['state'][id][name]` tensor becomes a ShardedTensor
    `optimizer.state.{name}.{model key}` laid out like its param; `exclude_keys` are dropped;
    each param group's `params` becomes a LocalNonpersistentObject (rebuilt on load). A state
    id with no model param raises ValueError."""
    sharded_state = {}
    for param_id, param_state in optim_state_dict["state"].items():
        if param_id not in id_to_sharded_param_map:
            raise ValueError(f"optimizer param id {param_id} matches no model sharded param")
        model_param = id_to_sharded_param_map[param_id]
        sharded_state[param_id] = {
            name: make_sharded_optimizer_tensor(model_param, value, f"optimizer.state.{name}")
            for name, value in param_state.items()
            if name not in exclude_keys
        }
    optim_state_dict["param_groups"] = copy.deepcopy(optim_state_dict["param_groups"])
    for group in optim_state_dict["param_groups"]:
        group["params"] = LocalNonpersistentObject(group["params"])
    optim_state_dict["state"] = sharded_state
