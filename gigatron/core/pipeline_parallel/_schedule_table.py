"""Pipeline schedule order as data: which (microbatch, chunk, forward|backward) steps a rank runs.

Pure functions, no torch.distributed. They reproduce the order of Megatron Core's
`megatron.core.pipeline_parallel.schedules` (`get_pp_rank_microbatches`, `get_schedule_table` and
the warmup / steady 1F1B / cooldown loops of the three schedules), so one executor
(`_executor.run_table`) can run any of them.

Order on one rank, with W warmup steps and T = num_microbatches * num_model_chunks:

    F(0) .. F(W-1)                           warmup: forwards only
    F(W) B(0)  F(W+1) B(1) .. F(T-1) B(T-W-1)  steady: one forward, one backward
    B(T-W) .. B(T-1)                         cooldown: backwards only

F(k) is forward virtual microbatch k and B(k) backward virtual microbatch k; both are looked up in
the same (microbatch, chunk) table, backward with the chunk order reversed.

`slot_plan` adds the communication: steps go in slots (1F1B: one step each; interleaved: each
warmup forward, each steady forward+backward pair, each cooldown backward) and before a slot one
batch carries the sends of the previous slot and every receive this slot needs - Megatron's
pairings (send_forward_recv_backward, send_forward_backward_recv_forward_backward, ...). With that
grouping the plan completes even when every batch waits for all of its sends and receives
(NCCL's grouped p2p), not only when sends are asynchronous
(tests/core/pipeline_parallel/test_schedule_table.py).
"""

from __future__ import annotations

from typing import NamedTuple

FORWARD = "forward"
BACKWARD = "backward"


class Step(NamedTuple):
    """One compute step of a rank: run `kind` for `microbatch` on model chunk `chunk`."""

    microbatch: int
    chunk: int
    kind: str  # FORWARD or BACKWARD

    def __repr__(self) -> str:
        return f"{self.kind[0].upper()}{self.microbatch}.{self.chunk}"


class Transfer(NamedTuple):
    """One tensor between ranks: activation (FORWARD) or gradient (BACKWARD) of `microbatch`,
    consumed by virtual stage `stage` (= chunk * pp + rank) and produced by its neighbour."""

    kind: str
    microbatch: int
    stage: int


class Slot(NamedTuple):
    """Receive `recvs` (together with the previous slot's sends), run `steps`, then `sends`."""

    recvs: list[Transfer]
    steps: list[Step]
    sends: list[Transfer]
    separate: bool = False  # previous slot's sends go out in a batch of their own first


def slot_plan(
    steps: list[Step],
    warmup: int,
    pp_size: int,
    pp_rank: int,
    num_model_chunks: int,
    *,
    pair_steady: bool,
) -> list[Slot]:
    """Group a rank's steps into slots and list what each slot receives and sends.

    pair_steady=True (interleaved, as Megatron's combined send_forward_backward_recv_forward_
    backward): a steady-state forward and backward share a slot. False (1F1B): one step per
    slot, so the batch after a forward pairs its send with the next backward's receive
    (send_forward_recv_backward) and vice versa.
    """
    last = pp_size * num_model_chunks - 1
    num_forwards = sum(st.kind == FORWARD for st in steps)
    plan, i = [], 0
    while i < len(steps):
        pair = (
            pair_steady
            and i >= warmup
            and i + 1 < len(steps)
            and steps[i].kind == FORWARD
            and steps[i + 1].kind == BACKWARD
        )
        group = steps[i : i + 2] if pair else steps[i : i + 1]
        i += len(group)
        recvs, sends = [], []
        for st in group:
            stage = st.chunk * pp_size + pp_rank
            if st.kind == FORWARD:
                if stage > 0:
                    recvs.append(Transfer(FORWARD, st.microbatch, stage))
                if stage < last:
                    sends.append(Transfer(FORWARD, st.microbatch, stage + 1))
            else:
                if stage < last:
                    recvs.append(Transfer(BACKWARD, st.microbatch, stage))
                if stage > 0:
                    sends.append(Transfer(BACKWARD, st.microbatch, stage - 1))
        # 1F1B with every forward in warmup (M < pp - rank): like Megatron's separate
        # send_forward / recv_backward, so a shapes-first exchange cannot wait in a circle
        separate = not pair_steady and 0 < warmup == i - len(group) == num_forwards
        plan.append(Slot(recvs, group, sends, separate))
    return plan


def get_schedule_table(
    num_microbatches: int, num_model_chunks: int, microbatch_group_size_per_vp_stage: int
) -> list[tuple[int, int]]:
    """Megatron's forward (microbatch, chunk) order for interleaving.

    Microbatches go in groups of `microbatch_group_size_per_vp_stage`; each group runs through
    chunk 0, then chunk 1, ... The last group takes whatever microbatches remain. Example,
    M=5, 2 chunks, group 3: (0,0)(1,0)(2,0)(0,1)(1,1)(2,1)(3,0)(4,0)(3,1)(4,1).
    """
    table = []
    for first in range(0, num_microbatches, microbatch_group_size_per_vp_stage):
        last = min(first + microbatch_group_size_per_vp_stage, num_microbatches)
        table.extend((mb, chunk) for chunk in range(num_model_chunks) for mb in range(first, last))
    return table


def num_warmup_microbatches(
    *,
    pp_size: int,
    pp_rank: int,
    num_microbatches: int,
    num_model_chunks: int = 1,
    microbatch_group_size_per_vp_stage: int | None = None,
    interleaved: bool = False,
    forward_only: bool = False,
) -> int:
    """Forward steps a rank runs before its first backward (Megatron's rule).

    - forward_only: every step.
    - 1F1B: pp - rank - 1.
    - interleaved: 2 * (pp - rank - 1) + (chunks - 1) * microbatch_group_size_per_vp_stage.
    Capped at num_microbatches * num_model_chunks.
    """
    total = num_microbatches * num_model_chunks
    if forward_only:
        return total
    if pp_size == 1:
        warmup = 0
    elif interleaved:
        group = (
            pp_size
            if microbatch_group_size_per_vp_stage is None
            else (microbatch_group_size_per_vp_stage)
        )
        warmup = 2 * (pp_size - pp_rank - 1) + (num_model_chunks - 1) * group
    else:
        warmup = pp_size - pp_rank - 1
    return min(warmup, total)


def check_interleaving(
    *, pp_size: int, num_microbatches: int, microbatch_group_size_per_vp_stage: int
) -> None:
    """Megatron's preconditions of the interleaved schedule (raised before any communication)."""
    group = microbatch_group_size_per_vp_stage
    if not pp_size <= group <= num_microbatches:
        raise ValueError(
            f"microbatch_group_size_per_vp_stage ({group}) must lie in "
            f"[pipeline_model_parallel_size ({pp_size}), num_microbatches ({num_microbatches})] "
            "for the interleaved schedule (so num_microbatches >= pipeline_model_parallel_size)"
        )
    remainder = num_microbatches % group
    if 0 < remainder < pp_size:
        raise RuntimeError(
            f"num_microbatches ({num_microbatches}) % microbatch_group_size_per_vp_stage "
            f"({group}) = {remainder} must be 0 or >= pipeline_model_parallel_size ({pp_size}): "
            "a smaller final group stalls the interleaved pipeline"
        )


def _ordered_steps(
    forward_order: list[tuple[int, int]], num_model_chunks: int, warmup: int, forward_only: bool
) -> list[Step]:
    """Warmup / steady 1F1B / cooldown over a forward (microbatch, chunk) order."""

    def fwd(k: int) -> Step:
        mb, chunk = forward_order[k]
        return Step(mb, chunk, FORWARD)

    def bwd(k: int) -> Step:
        mb, chunk = forward_order[k]
        return Step(mb, num_model_chunks - 1 - chunk, BACKWARD)

    total = len(forward_order)
    if forward_only:
        return [fwd(k) for k in range(total)]
    steps = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [fwd(warmup + k), bwd(k)]
    steps += [bwd(k) for k in range(total - warmup, total)]
    return steps


def no_pipelining_table(num_microbatches: int, *, forward_only: bool = False) -> list[Step]:
    """F0 B0 F1 B1 ... (forward_only: F0 F1 ...). One chunk, no communication."""
    order = [(mb, 0) for mb in range(num_microbatches)]
    return _ordered_steps(order, 1, 0, forward_only)


def one_f_one_b_table(
    pp_size: int, pp_rank: int, num_microbatches: int, *, forward_only: bool = False
) -> list[Step]:
    """Non-interleaved 1F1B on `pp_rank`: warmup min(pp - rank - 1, M) forwards, then 1F1B."""
    order = [(mb, 0) for mb in range(num_microbatches)]
    warmup = num_warmup_microbatches(
        pp_size=pp_size, pp_rank=pp_rank, num_microbatches=num_microbatches
    )
    return _ordered_steps(order, 1, warmup, forward_only)


def interleaved_table(
    pp_size: int,
    pp_rank: int,
    num_microbatches: int,
    num_model_chunks: int,
    *,
    microbatch_group_size_per_vp_stage: int | None = None,
    forward_only: bool = False,
) -> list[Step]:
    """Interleaved 1F1B on `pp_rank` with `num_model_chunks` virtual stages per rank.

    `microbatch_group_size_per_vp_stage` defaults to pp_size (Megatron's default) and must lie in
    [pp_size, num_microbatches]; a final partial group smaller than pp_size is an error.
    """
    group = (
        pp_size
        if microbatch_group_size_per_vp_stage is None
        else (microbatch_group_size_per_vp_stage)
    )
    check_interleaving(
        pp_size=pp_size,
        num_microbatches=num_microbatches,
        microbatch_group_size_per_vp_stage=group,
    )
    order = get_schedule_table(num_microbatches, num_model_chunks, group)
    warmup = num_warmup_microbatches(
        pp_size=pp_size,
        pp_rank=pp_rank,
        num_microbatches=num_microbatches,
        num_model_chunks=num_model_chunks,
        microbatch_group_size_per_vp_stage=group,
        interleaved=True,
    )
    return _ordered_steps(order, num_model_chunks, warmup, forward_only)
