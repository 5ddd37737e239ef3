"""Which torch_dist keys a gigatron model saves and loads, taken from the model itself.

No counterpart in megatron.core. Rather than re-deriving gigatron's checkpoint key rules (stacked
`decoder.layers.<name>` tensors with a leading num_layers axis for dense models, per-layer keys
for MoE, `_extra_state` objects, the tied output weight), the importer builds the model once at
TP = PP = 1 without initialising its weights and asks `model_sharded_state_dict` for the request;
its dict keys are per-layer global names (`decoder.layers.{i}.<name>`), the recipes' keys. The
exporter expands stacked keys of a checkpoint's metadata back to those per-layer names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile

import torch

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@contextlib.contextmanager
def one_rank_world():
    """A one-process gloo group and TP = PP = 1 model parallel state, if none exists yet."""
    import torch.distributed as dist

    from gigatron.core import parallel_state as ps

    made_pg = not dist.is_initialized()
    if made_pg:
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )
    elif dist.get_world_size() > 1:
        raise ValueError(
            f"the converter runs in one process (torch.distributed world size is "
            f"{dist.get_world_size()}); use load_hf_into_model inside a distributed job"
        )
    made_ps = not ps.model_parallel_is_initialized()
    if made_ps:
        ps.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        if made_ps:
            ps.destroy_model_parallel()
        if made_pg:
            dist.destroy_process_group()


def model_request(spec) -> dict:
    """{per-layer key: ShardedTensor | ShardedObject} a TP1/PP1 model of `spec` saves.

    Call inside `one_rank_world()`. Weights are left uninitialised (never touched).
    """
    from gigatron.training._checkpoint_state import model_sharded_state_dict

    with torch.device("meta"):
        model = spec.build_model(use_cpu_initialization=False, perform_initialization=False)
    return model_sharded_state_dict(model)


def fill_request(request: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """The request with every ShardedTensor's data replaced by `tensors[per-layer key]`."""
    from gigatron.core.dist_checkpointing import ShardedObject, ShardedTensor

    out = {}
    missing = sorted(
        k for k, v in request.items() if isinstance(v, ShardedTensor) and k not in tensors
    )
    unused = sorted(set(tensors) - set(request))
    if missing or unused:
        raise ValueError(
            f"model keys without HF source {missing[:8]}, HF-derived keys the model "
            f"does not have {unused[:8]} (gigatron/convert/_ckpt_layout.py)"
        )
    for key, sh in request.items():
        if isinstance(sh, ShardedObject):
            out[key] = sh
        elif isinstance(sh, ShardedTensor):
            t = tensors[key]
            if tuple(t.shape) != tuple(sh.local_shape):
                raise ValueError(
                    f"{key}: HF-derived shape {tuple(t.shape)} != model {tuple(sh.local_shape)}"
                )
            out[key] = dataclasses.replace(sh, data=t, dtype=t.dtype)
        else:
            raise ValueError(f"{key}: unexpected {type(sh).__name__} in a TP1 request")
    return out


def per_layer_entries(metadata: dict) -> dict:
    """{per-layer key: (checkpoint key, layer index or None, ShardedTensor metadata)}.

    Stacked `decoder.layers.<name>` (leading num_layers axis) expands to one entry per layer.
    """
    out = {}
    for key, sh in metadata.items():
        rest = key[len("decoder.layers.") :] if key.startswith("decoder.layers.") else None
        if rest is not None and not rest.split(".", 1)[0].isdigit():
            for i in range(sh.global_shape[0]):
                out[f"decoder.layers.{i}.{rest}"] = (key, i, sh)
        else:
            out[key] = (key, None, sh)
    return out


def entry_shape(entry) -> tuple[int, ...]:
    key, layer, sh = entry
    return tuple(sh.global_shape[1:] if layer is not None else sh.global_shape)


def load_entry(entry, ckpt_dir: str) -> torch.Tensor:
    """One per-layer tensor (a layer slice of a stacked key, or a whole tensor)."""
    import warnings

    from gigatron.core import dist_checkpointing
    from gigatron.core.dist_checkpointing import ShardedTensor

    key, layer, sh = entry
    target = torch.empty(entry_shape(entry), dtype=sh.dtype)
    if layer is None:
        request = ShardedTensor.from_rank_offsets(key, target, replica_id=0)
    else:
        request = ShardedTensor.from_rank_offsets(
            key, target, (0, layer, sh.global_shape[0]), replica_id=0, prepend_axis_num=1
        )
    with warnings.catch_warnings():  # one process without a process group is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        # One layer of a stacked tensor: a partial read, so no full-coverage check.
        return dist_checkpointing.load({"t": request}, ckpt_dir, validate_access_integrity=False)[
            "t"
        ]


def is_layer_key(key: str) -> bool:
    return _LAYER.match(key) is not None
