"""Balanced routing on meta: what a routed MoE layer's data-dependent steps need while traced.

An MoE layer reads token counts on the host (all-to-all split sizes, each expert's slice of the
permuted rows) and selects rows with boolean masks; meta tensors hold no data. `BalancedRouting`
answers as a perfectly balanced router would: each token's k experts spread evenly over the E
experts, so a routing map [T, E] (bool) has T·k/E tokens in every column and a k/E share of any
mask's entries set. It keeps concrete CPU values beside the few meta tensors whose values the
layer reads:

    sum(map, dim=0)     the balanced counts (the total T'·k·n/E spread over the n columns, so
                        split sizes add up to the permuted rows exactly)
    arange              its values (index permutations the dispatcher builds)
    any op whose meta inputs all have values (views, slices, casts, sums, ...): run on the
                        values too; an all-gather repeats this rank's values (every rank routes
                        alike)
    host reads          (.cpu(), .tolist(), .item()): the values
    nonzero, boolean-mask indexing of a bool meta tensor: k/E of its entries

With it the layers' own code runs on meta (SequentialMLP, GroupedMLP, both dispatchers, any EP /
expert-TP layout), each expert receiving its even share: the load pretrain_gpt's MFU formula
assumes (FLOPs of the active parameters, `gigatron.training.flops`). Not modelled: an
imbalanced router (a hot expert), and the expert capacity factor (dropped tokens under
`--moe-expert-capacity-factor`, padding under `--moe-pad-expert-input-to-capacity`): expert
GEMMs are priced as dropless.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary


@contextlib.contextmanager
def cuda_grouped_gemm():
    """GroupedMLP's GEMMs as a Hopper GPU runs them: `torch._grouped_mm` for bf16 operands with
    16-byte rows (`experts.grouped_mm_available` says no on meta, whose eager fallback loops
    over the experts and makes a full-size weight gradient per expert slice)."""
    from gigatron.core.transformer.moe import experts

    def available(x: torch.Tensor, w: torch.Tensor) -> bool:
        dims = (x.shape[-1], w.shape[-1], w.shape[-2])
        return x.dtype == w.dtype == torch.bfloat16 and all(d * 2 % 16 == 0 for d in dims)

    saved = experts.grouped_mm_available
    experts.grouped_mm_available = available
    try:
        yield
    finally:
        experts.grouped_mm_available = saved


_ALLGATHER = {"_allgather_base_", "all_gather_into_tensor", "allgather_into_tensor_coalesced_"}
_META = torch.device("meta")


class BalancedRouting(TorchDispatchMode):
    """Enter inside the tracer (`trace.trace_chunk` does for MoE models); `density` = k / E."""

    def __init__(self, density: float) -> None:
        super().__init__()
        self.density = density
        self.values = WeakTensorKeyDictionary()  # meta tensor -> its values (a CPU tensor)

    def _value(self, t: torch.Tensor) -> torch.Tensor:
        if t not in self.values:
            raise NotImplementedError(
                f"a host read of a meta tensor {tuple(t.shape)} that is no routing count "
                "(gigatron/tools/estimate/moe_trace.py)"
            )
        return self.values[t]

    def _selected(self, mask: torch.Tensor) -> int:
        return round(mask.numel() * self.density)

    def _counts(self, routing_map: torch.Tensor) -> torch.Tensor:
        """[T, n] bool -> [n] int64: the map's k/E share of True entries, spread evenly."""
        n = routing_map.shape[1]
        base, extra = divmod(self._selected(routing_map), max(n, 1))
        counts = torch.full((n,), base, dtype=torch.int64, device="cpu")
        counts[:extra] += 1
        return counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = func._schema.name.split("::")[-1]
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        meta = src is not None and src.is_meta
        if meta and op == "_to_copy" and kwargs.get("device", _META) != _META:
            return self._value(src).to(kwargs.get("dtype") or src.dtype)
        if meta and op == "_local_scalar_dense":
            return self._value(src).item()
        if meta and op == "nonzero":
            return src.new_empty((self._selected(src), src.dim()), dtype=torch.long)
        if meta and op == "index" and _bool_mask(args[1]):
            mask = args[1][0]
            return src.new_empty((self._selected(mask), *src.shape[mask.dim() :]))
        out = func(*args, **kwargs)
        if op == "arange" and isinstance(out, torch.Tensor) and out.is_meta:
            self.values[out] = func(*args, **{**kwargs, "device": torch.device("cpu")})
        elif not meta:
            return out
        elif op == "sum" and src.dtype == torch.bool and src.dim() == 2 and _dims(args) == [0]:
            self.values[out] = self._counts(src)  # tokens of each expert
        elif op in _ALLGATHER and args[1] in self.values:  # (output, input, group, ...)
            world = src.shape[0] // max(args[1].shape[0], 1)
            self.values[src] = self.values[args[1]].repeat(world, *[1] * (src.dim() - 1))
        elif isinstance(out, torch.Tensor) and out.is_meta and self._known(args, kwargs):
            self.values[out] = func(*self._on_cpu(args), **self._on_cpu(kwargs))
        return out

    def _known(self, args, kwargs) -> bool:
        metas = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        return bool(metas) and all(not t.is_meta or t in self.values for t in metas)

    def _on_cpu(self, tree):
        def cpu(x):
            if isinstance(x, torch.Tensor) and x.is_meta:
                return self.values[x]
            return torch.device("cpu") if isinstance(x, torch.device) else x

        return tree_map(cpu, tree)


def _dims(args) -> list[int] | None:
    if len(args) < 2 or args[1] is None:
        return None
    dims = [args[1]] if isinstance(args[1], int) else list(args[1])
    return [d % args[0].dim() for d in dims]


def _bool_mask(indices) -> bool:
    return (
        isinstance(indices, (list, tuple))
        and len(indices) == 1
        and isinstance(indices[0], torch.Tensor)
        and indices[0].dtype == torch.bool
    )
