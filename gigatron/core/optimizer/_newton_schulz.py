"""Newton-Schulz orthogonalisation for Muon, whole-matrix or tensor-parallel.

The numerics of NVIDIA's `emerging_optimizers` (`orthogonalized_optimizers.muon_utils`, the
reference Megatron's `--optimizer muon` calls), written from its definition:

    X = G / max(||G||_F, eps)                      (transposed first if rows > cols)
    repeat steps times, (a, b, c) from the coefficient set:
        A = X X^T                                  [m, m], m = min(rows, cols)
        X = a X + (b A + c A A) X
    return X (transposed back)

With the fp32 matmul precision "medium" the iteration runs on a bf16 copy of X (the reference
casts explicitly: PyTorch has no fp32-in / bf16-compute kernels), on any device.

Tensor parallel (`newton_schulz_tp`), for a weight split along `partition_dim` over `tp_group`:
- "duplicated": all-gather the shards, orthogonalise the whole matrix on every rank, keep this
  rank's slice (results do not depend on TP);
- "distributed": keep the shards, orient them so the split dim is the long one, and all-reduce
  the partial Gram matrices `X_r X_r^T` and the squared norm (same results, less compute).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain, cycle, islice, repeat

import torch
import torch.distributed as dist

# (a, b, c) per step; values as published by the reference (rounded to fp32).
COEFFICIENT_SETS: dict[str, list[tuple[float, float, float]]] = {
    "simple": [(3.4445, -4.7750, 2.0315)],
    "quintic": [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ],
    "polar_express": [
        (8.2051, -22.9019, 16.4607),
        (4.0664, -2.8612, 0.5184),
        (3.9096, -2.8234, 0.5250),
        (3.2856, -2.4153, 0.4853),
        (2.2779, -1.6198, 0.3985),
        (1.8726, -1.2307, 0.3585),
        (1.8564, -1.2132, 0.3568),
        (1.8750, -1.2500, 0.3750),
    ],
    "cans": [
        (8.4703, -25.1081, 18.6293),
        (4.1828, -3.1087, 0.5806),
        (3.9619, -2.9541, 0.5630),
        (3.2866, -2.4647, 0.5074),
        (2.2737, -1.6447, 0.4162),
    ],
    "aol": [
        (4.0098, -7.0585, 2.4635),
        (3.4585, -5.5479, 2.5959),
        (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169),
    ],
    "deepseekv4": [(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2,
}
# Sets whose last entry repeats past their length; the others cycle.
_REPEAT_LAST = ("polar_express", "cans", "deepseekv4")

SCALE_MODES = ("spectral", "unit_rms_norm", "shape_scaling")
TP_MODES = ("blockwise", "duplicated", "distributed")
FP32_MATMUL_PRECISIONS = ("highest", "high", "medium")


def get_coefficient_iterator(steps: int, coefficient_type: str) -> Iterator[tuple]:
    """`steps` (a, b, c) triples of `coefficient_type` (cycled, or last one repeated)."""
    sets = COEFFICIENT_SETS[coefficient_type]
    base = chain(sets, repeat(sets[-1])) if coefficient_type in _REPEAT_LAST else cycle(sets)
    return islice(base, steps)


def get_muon_scale_factor(size_out: int, size_in: int, mode: str = "spectral") -> float:
    """Scale of the orthogonalised update of a [size_out, size_in] weight.

    spectral: sqrt(max(out, in)); unit_rms_norm: sqrt(out / in); shape_scaling:
    sqrt(max(1, out / in)).
    """
    if mode == "spectral":
        return max(size_out, size_in) ** 0.5
    if mode == "unit_rms_norm":
        return (size_out / size_in) ** 0.5
    if mode == "shape_scaling":
        return max(1, size_out / size_in) ** 0.5
    raise ValueError(f"muon scale mode {mode!r} must be one of {SCALE_MODES}")


def _step(x: torch.Tensor, a: float, b: float, c: float, group) -> torch.Tensor:
    """X <- a X + (b A + c A A) X with A = X X^T summed over `group` (row-sharded X)."""
    gram = x @ x.mT  # [m, m]
    if group is not None:
        dist.all_reduce(gram, group=group)
    poly = torch.addmm(gram, gram, gram, alpha=c, beta=b)
    return torch.addmm(x, poly, x, alpha=1.0, beta=a)


def newton_schulz(
    x: torch.Tensor,
    steps: int,
    coefficient_type: str = "quintic",
    *,
    eps: float = 1e-7,
    transpose: bool | None = None,
    tp_group=None,
) -> torch.Tensor:
    """Orthogonalise fp32 `x` [m, n] (approximately U V^T of its SVD); same shape out.

    `tp_group`: `x` is this rank's block of a matrix split along its long dim (after the
    transpose); the norm and Gram matrices are summed over the group.
    """
    if x.ndim != 2:
        raise ValueError(f"newton_schulz needs a 2-D tensor, got shape {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise ValueError(f"newton_schulz needs float32 input, got {x.dtype}")
    if coefficient_type not in COEFFICIENT_SETS:
        raise ValueError(
            f"muon coefficient type {coefficient_type!r} must be one of {tuple(COEFFICIENT_SETS)}"
        )
    if transpose is None:
        transpose = x.size(0) > x.size(1)
    if transpose:
        x = x.mT
    if tp_group is None:
        x = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=eps)
    else:
        sq = (x * x).sum()
        dist.all_reduce(sq, group=tp_group)
        x = x / sq.sqrt().clamp_min(eps)
    if torch.get_float32_matmul_precision() == "medium":
        x = x.to(torch.bfloat16)
    for a, b, c in get_coefficient_iterator(steps, coefficient_type):
        x = _step(x, a, b, c, tp_group)
    x = x.to(torch.float32)
    return x.mT if transpose else x


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    shards = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, x.contiguous(), group=group)
    return torch.cat(shards, dim=dim)


def newton_schulz_tp(
    x: torch.Tensor,
    steps: int,
    coefficient_type: str,
    tp_group,
    partition_dim: int | None = None,
    tp_mode: str = "duplicated",
) -> torch.Tensor:
    """`newton_schulz` of the whole matrix whose shard along `partition_dim` is `x` [m, n]
    (this rank's shard of the result back); `partition_dim` None: `x` is the whole matrix."""
    if partition_dim is None or tp_group is None or dist.get_world_size(tp_group) == 1:
        return newton_schulz(x, steps, coefficient_type)
    if tp_mode == "duplicated":
        full = _all_gather(x, tp_group, partition_dim)
        out = newton_schulz(full, steps, coefficient_type)
        return out.chunk(dist.get_world_size(tp_group), dim=partition_dim)[dist.get_rank(tp_group)]
    if tp_mode == "distributed":
        if partition_dim not in (0, 1):
            raise ValueError(f"partition_dim must be 0 or 1, got {partition_dim}")
        # Sharded rows become columns: the Gram matrix X X^T is then a sum over ranks.
        return newton_schulz(
            x, steps, coefficient_type, transpose=partition_dim == 0, tp_group=tp_group
        )
    raise ValueError(f"muon_tp_mode {tp_mode!r} must be 'duplicated' or 'distributed' here")
