"""Rank layout as a pure function: parallel sizes + order string -> lists of global ranks.

No torch.distributed here. `parallel_state` builds its process groups from these lists and from
nothing else, so the layout is tested exhaustively without processes.

Semantics (Megatron Core's `RankGenerator`): the order string names the axes from fastest-varying
(stride 1, the most contiguous ranks) to slowest, e.g. "tp-cp-ep-dp-pp". A group for a set of
axes holds every rank that shares the coordinates of all other axes. Groups are listed with the
first non-member axis varying fastest; ranks inside a group are ascending along the member axes in
order-string order (first member axis fastest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

AXES = ("tp", "cp", "ep", "dp", "pp")


def _strides(sizes: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in sizes:
        out.append(acc)
        acc *= s
    return out


def _unravel(index: int, shape: Sequence[int]) -> list[int]:
    """Coordinates of `index` in a grid whose first axis varies fastest."""
    coords = []
    for s in shape:
        coords.append(index % s)
        index //= s
    return coords


def masked_orthogonal_rank_groups(
    world_size: int, parallel_size: Sequence[int], mask: Sequence[bool]
) -> list[list[int]]:
    """All groups spanning the axes where `mask` is True, over a grid of `parallel_size`.

    `parallel_size` is in order-string order (first = fastest). Mirrors Megatron's
    `generate_masked_orthogonal_rank_groups`.
    """
    if math.prod(parallel_size) != world_size:
        raise ValueError(
            f"grid {list(parallel_size)} has {math.prod(parallel_size)} ranks, not {world_size}"
        )
    strides = _strides(parallel_size)
    member_shape = [s for s, m in zip(parallel_size, mask) if m]
    member_stride = [d for d, m in zip(strides, mask) if m]
    other_shape = [s for s, m in zip(parallel_size, mask) if not m]
    other_stride = [d for d, m in zip(strides, mask) if not m]
    group_size = math.prod(member_shape)
    groups = []
    for g in range(world_size // group_size):
        base = sum(c * d for c, d in zip(_unravel(g, other_shape), other_stride))
        groups.append(
            [
                base + sum(c * d for c, d in zip(_unravel(r, member_shape), member_stride))
                for r in range(group_size)
            ]
        )
    return groups


class RankGenerator:
    """Megatron's `RankGenerator(tp, ep, dp, pp, cp, order, rank_offset=0, gtp_remat=1)`.

    `get_ranks("tp-dp")` returns the groups spanning TP and DP; token order in the argument does
    not matter. `gtp_remat` is megatron-core 0.19's GTP weight-sharding axis: one more grid axis
    (a token of `order`, appended when it has size 1, like every size-1 axis), so the world is
    `tp * ep * dp * pp * cp * gtp_remat` ranks and `get_gtp_ranks(n)` lists its groups
    (singletons at size 1). `initialize_model_parallel` builds only `gtp_remat_size=1`.
    """

    def __init__(
        self,
        tp: int,
        ep: int,
        dp: int,
        pp: int,
        cp: int,
        order: str,
        rank_offset: int = 0,
        gtp_remat: int = 1,
    ) -> None:
        self.tp, self.ep, self.dp, self.pp, self.cp = tp, ep, dp, pp, cp
        self.gtp_remat = gtp_remat
        self.rank_offset = rank_offset
        self.world_size = tp * ep * dp * pp * cp * gtp_remat
        self.name_to_size = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp}
        self.name_to_size["gtp_remat"] = gtp_remat
        self.order = normalize_order(order, self.name_to_size, axes=(*AXES, "gtp_remat"))
        self.ordered_size = [self.name_to_size[t] for t in self.order.split("-")]

    def get_mask(self, order: str, token: str) -> list[bool]:
        ordered = order.split("-")
        wanted = token.split("-")
        for t in wanted:
            if t not in ordered:
                raise ValueError(f"axis {t!r} in {token!r} is not in order {order!r}")
        return [t in wanted for t in ordered]

    def get_ranks(self, token: str) -> list[list[int]]:
        mask = self.get_mask(self.order, token)
        groups = masked_orthogonal_rank_groups(self.world_size, self.ordered_size, mask)
        if self.rank_offset:
            groups = [[r + self.rank_offset for r in g] for g in groups]
        return groups

    def get_gtp_ranks(self, gtp_remat_size: int) -> list[list[int]]:
        """The GTP weight-sharding groups (singletons when `gtp_remat_size == 1`)."""
        if gtp_remat_size != self.gtp_remat:
            raise ValueError(
                f"gtp_remat_size ({gtp_remat_size}) differs from this generator's gtp_remat axis "
                f"({self.gtp_remat})"
            )
        return self.get_ranks("gtp_remat")


def normalize_order(order: str, sizes: dict[str, int], axes: Sequence[str] = AXES) -> str:
    """Validate an order string and append the missing size-1 axes (Megatron's rule)."""
    tokens = order.lower().split("-")
    unknown = [t for t in tokens if t not in axes]
    if unknown:
        raise ValueError(f"order {order!r} has unknown axes {unknown}; allowed: {list(axes)}")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"order {order!r} names an axis twice")
    for name, size in sizes.items():
        if name not in tokens:
            if size != 1:
                raise ValueError(
                    f"order {order!r} is missing {name!r}, whose size is {size}; "
                    "every axis with size > 1 must appear in the order"
                )
            tokens.append(name)
    return "-".join(tokens)


def default_embedding_ranks(pp_ranks: list[int]) -> list[int]:
    """First and last stage of a pipeline group (just the first when PP = 1)."""
    return [pp_ranks[0]] if len(pp_ranks) == 1 else [pp_ranks[0], pp_ranks[-1]]


def default_position_embedding_ranks(pp_ranks: list[int]) -> list[int]:
    """Learned position embeddings live on the first stage only."""
    return [pp_ranks[0]]


def dense_and_expert_generators(
    world_size: int,
    *,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    etp: int,
    order: str,
    rank_offset: int = 0,
) -> tuple[RankGenerator, RankGenerator]:
    """The two grids of a layout, validated. Raises ValueError with the numbers if impossible.

    Dense grid: tp, cp, dp, pp (ep = 1). Expert grid: etp in the tp slot, ep, expert-dp in the
    dp slot, cp = 1; both share the pipeline groups.
    """
    for name, value in (("tensor", tp), ("pipeline", pp), ("context", cp), ("expert", ep)):
        if value < 1:
            raise ValueError(f"{name} model parallel size ({value}) must be >= 1")
    if etp < 1:
        raise ValueError(f"expert tensor parallel size ({etp}) must be >= 1")
    model_size = tp * pp * cp
    if world_size % model_size:
        raise ValueError(
            f"world size ({world_size}) is not divisible by tensor ({tp}) x pipeline ({pp}) "
            f"x context ({cp}) model parallel size ({model_size})"
        )
    dp = world_size // model_size
    expert_model_size = etp * ep * pp
    if world_size % expert_model_size:
        raise ValueError(
            f"world size ({world_size}) is not divisible by expert tensor ({etp}) x expert "
            f"model ({ep}) x pipeline ({pp}) parallel size ({expert_model_size})"
        )
    expert_dp = world_size // expert_model_size
    # Validate the order string for both grids before anything is built.
    normalize_order(order, {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep})
    if pp > 1 and not order.lower().endswith("pp") and expert_dp != dp:
        raise ValueError(
            f"order {order!r} does not end with 'pp', which requires expert data parallel size "
            f"({expert_dp}) to equal data parallel size ({dp})"
        )
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order, rank_offset=rank_offset)
    expert = RankGenerator(
        tp=etp, ep=ep, dp=expert_dp, pp=pp, cp=1, order=order, rank_offset=rank_offset
    )
    if dense.get_ranks("pp") != expert.get_ranks("pp"):
        raise ValueError(
            f"order {order!r} gives different pipeline groups for the dense grid and the expert "
            "grid; put 'pp' last or make the expert layout match"
        )
    return dense, expert
