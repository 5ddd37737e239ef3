"""Small shared helpers, mirroring the parts of `megatron.core.utils` users call."""

from __future__ import annotations

import torch


def ensure_divisibility(numerator: int, denominator: int) -> None:
    """Raise ValueError unless `denominator` divides `numerator`."""
    if denominator == 0 or numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")


def divide(numerator: int, denominator: int) -> int:
    """`numerator // denominator`, checking that the division is exact."""
    ensure_divisibility(numerator, denominator)
    return numerator // denominator


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


def get_batch_on_this_cp_rank(batch: dict, cp_group=None) -> dict:
    """Keep this context-parallel rank's part of every sequence (load-balanced for causal masks).

    Each tensor is cut along its sequence dim (dim 1; dim 2 for `attention_mask` [b, 1, s, s]) into
    2·cp chunks and rank r keeps chunks r and 2·cp−1−r, so every rank gets the same causal work.
    `cu_seqlens*`/`max_seqlen` entries and None values pass through untouched.
    """
    import torch.distributed as dist

    from gigatron.core import parallel_state as ps

    cp = ps.get_context_parallel_world_size() if cp_group is None else dist.get_world_size(cp_group)
    if cp <= 1:
        return batch
    rank = ps.get_context_parallel_rank() if cp_group is None else dist.get_rank(cp_group)
    out = {}
    for key, value in batch.items():
        if value is None or key.startswith("cu_seqlens") or key == "max_seqlen":
            out[key] = value
            continue
        dim = 2 if key == "attention_mask" else 1
        seq = value.shape[dim]
        if seq % (2 * cp):
            raise ValueError(
                f"sequence length of {key!r} ({seq}) must be divisible by 2 x "
                f"context_parallel_size ({2 * cp})"
            )
        chunks = value.view(*value.shape[:dim], 2 * cp, seq // (2 * cp), *value.shape[dim + 1 :])
        index = torch.tensor([rank, 2 * cp - 1 - rank], device=value.device)
        kept = chunks.index_select(dim, index)
        out[key] = kept.view(*value.shape[:dim], -1, *value.shape[dim + 1 :])
    return out
