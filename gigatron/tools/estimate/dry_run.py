"""`gigatron estimate --dry-run`: every rank of the planned job checked in one process.

What runs, for a world of any size:

1. `initialize_model_parallel` on the fake backend (as rank 0): the layout's own checks
   (divisibility of world, TP x CP x PP, experts) raise here, with training's messages.
2. Every group of the rank grid (tp, cp, dp, pp, ep, expert-tp), computed from Megatron's
   `RankGenerator`: each rank's coordinates, and which groups cross a node boundary
   (`--gpus-per-node`). A TP or expert-TP group across nodes is an error (its collectives run
   on every layer, on NVLink); CP, EP and others across nodes are listed.
3. The pipeline schedule of every PP rank (`schedule_plan.rank_steps_and_slots`, the tables the
   schedules run): its interleaving rules, and that each send has its receive on the neighbour.
4. One rank per pipeline stage (ranks of a stage differ only in TP / CP / DP / EP coordinates,
   so they hold the same shapes): its model built on meta at its coordinates in a fake world,
   `sharded_state_dict()` checked (each sharded tensor's fragments tile its global shape; every
   layer 0..L-1 is held by exactly one (stage, virtual stage): no (layer, expert) offset
   twice), and its memory estimated; every
   rank then gets its stage's numbers.
"""

from __future__ import annotations

import time
from collections import defaultdict

from gigatron.core import parallel_state as ps
from gigatron.core.pipeline_parallel.schedule_plan import Transfer, rank_steps_and_slots
from gigatron.tools.estimate.memory import rank_memory
from gigatron.tools.estimate.report import dense_grid, num_microbatches
from gigatron.tools.estimate.world import build_chunks, fake_rank


def _expert_grid(args) -> ps.RankGenerator:
    tp, pp, ep = (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.expert_model_parallel_size,
    )
    etp = args.expert_tensor_parallel_size or tp
    dp = args.world_size // (etp * ep * pp)
    return ps.RankGenerator(tp=etp, ep=ep, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")


def check_groups(args, gpus_per_node: int) -> tuple[dict, list[str], dict[int, dict]]:
    """(groups crossing nodes per axis, errors, {rank: coordinates}); the expert axes only
    with --num-experts."""
    dense, expert = dense_grid(args), _expert_grid(args)
    axes = {
        "tp": dense.get_ranks("tp"),
        "cp": dense.get_ranks("cp"),
        "dp": dense.get_ranks("dp"),
        "pp": dense.get_ranks("pp"),
    }
    if args.num_experts:
        axes.update(ep=expert.get_ranks("ep"), expert_tp=expert.get_ranks("tp"))
    coords: dict[int, dict] = defaultdict(dict)
    crossing, errors = {}, []
    for axis, groups in axes.items():
        spanning = [g for g in groups if len({r // gpus_per_node for r in g}) > 1]
        for g in groups:
            for i, r in enumerate(g):
                coords[r][axis] = i
        crossing[axis] = {"groups": len(groups), "crossing_nodes": len(spanning)}
        if spanning and axis in ("tp", "expert_tp"):
            g = spanning[0]
            errors.append(
                f"{len(spanning)} {axis} groups span nodes of {gpus_per_node} ranks "
                f"(--gpus-per-node), e.g. {g[:4]}{'...' if len(g) > 4 else ''}: their per-layer "
                "collectives would leave NVLink; the TP size must divide the GPUs per node"
            )
    missing = [r for r in range(args.world_size) if len(coords[r]) != len(axes)]
    if missing:
        errors.append(f"ranks {missing[:8]} are missing from some group")
    return crossing, errors, dict(coords)


def check_schedule(args) -> dict:
    """Every PP rank's schedule built, and each send matched by the neighbour's receive."""
    pp = args.pipeline_model_parallel_size
    chunks = args.virtual_pipeline_model_parallel_size or 1
    m = num_microbatches(args)
    sends: dict[int, set[Transfer]] = defaultdict(set)
    recvs: dict[int, set[Transfer]] = defaultdict(set)
    steps_per_rank = {}
    for r in range(pp):
        steps, slots = rank_steps_and_slots(
            pp_size=pp, pp_rank=r, num_microbatches=m, num_model_chunks=chunks
        )
        steps_per_rank[r] = len(steps)
        for slot in slots:
            for t in slot.sends:
                sends[t.stage % pp].add(t)
            recvs[r].update(slot.recvs)
    unmatched = [(r, t) for r in range(pp) for t in sends[r] ^ recvs[r]]
    if unmatched:
        raise ValueError(f"pipeline plan: unmatched transfers {unmatched[:4]}")
    return {
        "microbatches": m,
        "steps_per_rank": steps_per_rank[0],
        "p2p_per_rank": {r: len(recvs[r]) for r in range(pp)},
    }


def _check_sharded_state_dict(chunks, layers_seen: dict[str, list[int]]) -> None:
    from gigatron.core.dist_checkpointing import ShardedTensor

    for chunk in chunks:
        for name, sh in chunk.sharded_state_dict().items():
            if not isinstance(sh, ShardedTensor):
                continue
            pre = len(sh.global_shape) - len(sh.local_shape)
            for i, size in enumerate(sh.local_shape):
                if size * sh.axis_fragmentations[pre + i] != sh.global_shape[pre + i]:
                    raise ValueError(
                        f"{name}: local {tuple(sh.local_shape)} x fragments "
                        f"{sh.axis_fragmentations} != global {tuple(sh.global_shape)}"
                    )
            if pre and sh.key.startswith("decoder.layers."):  # offsets: (layer[, expert])
                layers_seen[sh.key].append(tuple(sh.global_offset[:pre]))


def dry_run(args, gpus_per_node: int = 8) -> dict:
    """The checks of the module doc; raises ValueError on a broken layout, returns the report."""
    t0 = time.perf_counter()
    crossing, errors, coords = check_groups(args, gpus_per_node)
    schedule = check_schedule(args)
    stages = next(g for g in dense_grid(args).get_ranks("pp") if 0 in g)
    per_stage, layers_seen = {}, defaultdict(list)
    for pp_rank, rank in enumerate(stages):
        with fake_rank(args, rank):
            chunks = build_chunks(args)
            _check_sharded_state_dict(chunks, layers_seen)
            per_stage[pp_rank] = rank_memory(args, chunks)
    for key, offsets in layers_seen.items():
        layers = sorted({o[0] for o in offsets})
        if len(set(offsets)) != len(offsets) or layers != list(range(args.num_layers)):
            errors.append(
                f"{key}: (layer, expert) offsets {sorted(offsets)[:8]} held by the stages, want "
                f"each of layers 0..{args.num_layers - 1} once"
            )
            break
    ranks = [
        {"rank": r, **coords[r], "peak_gib": per_stage[coords[r]["pp"]]["peak_bytes"] / 2**30}
        for r in range(args.world_size)
    ]
    return {
        "world_size": args.world_size,
        "gpus_per_node": gpus_per_node,
        "groups": crossing,
        "errors": errors,
        "schedule": schedule,
        "stages": per_stage,
        "ranks": ranks,
        "models_built": len(stages),
        "seconds": round(time.perf_counter() - t0, 2),
    }
