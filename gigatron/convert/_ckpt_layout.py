"""Between a model's `sharded_state_dict()` / a checkpoint's tensors and the converters' names.

No counterpart in megatron.core. The HF recipes name one tensor per layer and per expert
(`decoder.layers.{i}.<name>`, `decoder.layers.{i}.mlp.experts.local_experts.{e}.<name>`, global
i and e). A checkpoint (and `sharded_state_dict()`) holds stacked tensors instead: key
`decoder.layers.<name>` with a leading layer axis, experts `...mlp.experts.experts.<name>` with
an expert axis after it (megatron-core's layout; per-layer keys `decoder.layers.{i}.<name>` for
layers that differ). `index_axes` says how many leading axes of a key index those names; the
rest of the module maps a ShardedTensor, or a checkpoint's global tensor, to the per-layer names
it covers. The importer builds the model once at TP = PP = EP = 1 on the meta device and fills
its own `sharded_state_dict()`, so the key rules are the model's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import tempfile

import torch

from gigatron.core import dist_checkpointing
from gigatron.core import parallel_state as ps
from gigatron.core.dist_checkpointing import ShardedObject, ShardedTensor

_LAYERS, _EXPERTS = "decoder.layers.", ".experts.experts."


@contextlib.contextmanager
def one_rank_world():
    """A one-process gloo group and TP = PP = 1 model parallel state, if none exists yet."""
    import torch.distributed as dist

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


def index_axes(key: str) -> int:
    """Leading axes of checkpoint tensor `key` that index layers / experts: 1 for a stacked
    `decoder.layers.<name>`, +1 for experts (`.experts.experts.`); 0 for the rest."""
    stacked = key.startswith(_LAYERS) and not key[len(_LAYERS) :].split(".", 1)[0].isdigit()
    return int(stacked) + int(_EXPERTS in key)


def per_layer_name(key: str, index: tuple[int, ...]) -> str:
    """The converters' name of slice `index` (over `index_axes(key)` axes) of tensor `key`."""
    index = list(index)
    if index_axes(key) > int(_EXPERTS in key):  # stacked: the layer index comes first
        key = f"{_LAYERS}{index.pop(0)}.{key[len(_LAYERS) :]}"
    if index:
        head, tail = key.split(_EXPERTS)
        key = f"{head}.experts.local_experts.{index.pop(0)}.{tail}"
    return key


def tensor_slices(sh):
    """(name, view of `sh.data`, box in that name's tensor) for each per-layer tensor a
    ShardedTensor holds part of (several experts for GroupedMLP's expert block)."""
    k, p = index_axes(sh.key), sh.prepend_axis_num
    ranges = [
        range(sh.global_offset[a], sh.global_offset[a] + (1 if a < p else sh.local_shape[a - p]))
        for a in range(k)
    ]
    box = tuple(slice(o, o + n) for o, n in zip(sh.global_offset[k:], sh.local_shape[k - p :]))
    for index in itertools.product(*ranges):
        local = tuple(i - sh.global_offset[a] for a, i in enumerate(index) if a >= p)
        yield per_layer_name(sh.key, index), sh.data[local] if local else sh.data, box


def _pieces(entry) -> list:
    """The ShardedTensors of a request entry (a factory's built pieces)."""

    if isinstance(entry, ShardedTensor):
        return [entry]
    built = entry.build()
    return built if isinstance(built, list) else [built]


def fill_from_parts(sharded_sd: dict, tensor_part) -> None:
    """Copy into a model's `sharded_state_dict()` tensors their part `tensor_part(name, box)`
    of each per-layer tensor (box: the TP / EP piece, by each entry's global offsets)."""

    with torch.no_grad():
        for entry in sharded_sd.values():
            if isinstance(entry, ShardedObject):
                continue
            pieces = _pieces(entry)
            for piece in pieces:
                for name, view, box in tensor_slices(piece):
                    view.copy_(tensor_part(name, box))
            if pieces[0] is not entry:  # a factory: pieces may be copies (GroupedMLP)
                entry.data.copy_(entry.merge_fn([p.data for p in pieces]))


def model_request(spec) -> dict:
    """`sharded_state_dict()` of a TP = PP = EP = 1 model of `spec` on the meta device (weights
    never initialised). Call inside `one_rank_world()`."""
    with torch.device("meta"):
        model = spec.build_model(use_cpu_initialization=False, perform_initialization=False)
    return model.sharded_state_dict()


def fill_request(request: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """`model_request`'s dict with every tensor replaced by `tensors[per-layer name]` (whole
    tensors at TP = EP = 1; a GLU fc1 factory takes its [gate; up] tensor)."""

    out, used = {}, set()
    for key, entry in request.items():
        if isinstance(entry, ShardedObject):
            out[key] = entry
            continue
        (name, view, box), *more = [s for piece in _pieces(entry) for s in tensor_slices(piece)]
        if any(n != name for n, _, _ in more):
            raise ValueError(f"{key}: one request entry for several HF tensors (not TP = EP = 1?)")
        if name not in tensors:
            raise ValueError(f"model tensor {name} has no HF source")
        t = tensors[name]
        if tuple(t.shape) != tuple(entry.data.shape):
            raise ValueError(
                f"{name}: HF-derived shape {tuple(t.shape)} != model {tuple(view.shape)}"
            )
        out[key] = dataclasses.replace(entry, data=t)
        if hasattr(entry, "dtype"):
            out[key] = dataclasses.replace(out[key], dtype=t.dtype)
        used.add(name)
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"HF-derived tensors the model does not have: {unused[:8]}")
    return out


def per_layer_entries(metadata: dict) -> dict:
    """{per-layer name: (checkpoint key, index, ShardedTensor metadata)} for a checkpoint's
    `load_tensors_metadata`: one entry per layer (and expert) of each stacked tensor."""
    out = {}
    for key, sh in metadata.items():
        shape = sh.global_shape
        for index in itertools.product(*(range(n) for n in shape[: index_axes(key)])):
            out[per_layer_name(key, index)] = (key, index, sh)
    return out


def entry_shape(entry) -> tuple[int, ...]:
    key, index, sh = entry
    return tuple(sh.global_shape[len(index) :])


def load_entry(entry, ckpt_dir: str) -> torch.Tensor:
    """One per-layer tensor: slice `index` of a stacked tensor, or a whole tensor."""
    import warnings

    key, index, sh = entry
    target = torch.empty(entry_shape(entry), dtype=sh.dtype)
    offsets = [(a, i, sh.global_shape[a]) for a, i in enumerate(index)]
    request = ShardedTensor.from_rank_offsets(
        key, target, *offsets, replica_id=0, prepend_axis_num=len(index)
    )
    with warnings.catch_warnings():  # one process without a process group is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        # One slice of a stacked tensor: a partial read, so no full-coverage check.
        return dist_checkpointing.load({"t": request}, ckpt_dir, validate_access_integrity=False)[
            "t"
        ]
