"""The order of work of a pipeline schedule on every rank, as data (gigatron; no Megatron twin).

`rank_schedule(kind, ...)` is the table one rank's schedule runs: `schedules.py` calls it for
`get_forward_backward_func`'s three schedules and hands the result to the executor. It reads
`_schedule_table` (Megatron's warmup / steady 1F1B / cooldown order; see that module).
`schedule_plan(...)` collects it for every pipeline rank together with the executor's grouping of
steps into slots (which receives a slot waits for, which sends follow it), so tools can draw and
time the plan without processes (`gigatron schedule`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gigatron.core.pipeline_parallel._schedule_table import (
    BACKWARD,
    FORWARD,
    Slot,
    Step,
    Transfer,
    check_interleaving,
    interleaved_table,
    no_pipelining_table,
    num_warmup_microbatches,
    one_f_one_b_table,
    slot_plan,
)

__all__ = [
    "BACKWARD",
    "FORWARD",
    "SchedulePlan",
    "Slot",
    "Step",
    "Transfer",
    "peak_in_flight",
    "rank_schedule",
    "rank_steps_and_slots",
    "schedule_plan",
]

KINDS = ("none", "1f1b", "interleaved")


def rank_schedule(
    kind: str,
    *,
    pp_size: int,
    pp_rank: int,
    num_microbatches: int,
    num_model_chunks: int = 1,
    microbatch_group_size_per_vp_stage: int | None = None,
    forward_only: bool = False,
) -> tuple[list[Step], int]:
    """(steps, warmup) of one rank: its (microbatch, chunk, forward|backward) order and the
    number of forwards before its first backward. `kind`: "none", "1f1b" or "interleaved"."""
    if kind == "interleaved":
        group = microbatch_group_size_per_vp_stage or pp_size
        steps = interleaved_table(
            pp_size, pp_rank, num_microbatches, num_model_chunks,
            microbatch_group_size_per_vp_stage=group, forward_only=forward_only,
        )  # fmt: skip
        warmup = num_warmup_microbatches(
            pp_size=pp_size, pp_rank=pp_rank, num_microbatches=num_microbatches,
            num_model_chunks=num_model_chunks, microbatch_group_size_per_vp_stage=group,
            interleaved=True,
        )  # fmt: skip
        return steps, warmup
    if kind == "1f1b":
        steps = one_f_one_b_table(pp_size, pp_rank, num_microbatches, forward_only=forward_only)
        warmup = num_warmup_microbatches(
            pp_size=pp_size, pp_rank=pp_rank, num_microbatches=num_microbatches
        )
        return steps, warmup
    if kind == "none":
        return no_pipelining_table(num_microbatches, forward_only=forward_only), 0
    raise ValueError(f"schedule kind {kind!r} is not one of {KINDS}")


@dataclass(frozen=True)
class SchedulePlan:
    """Every pipeline rank's plan. Index lists by pp rank."""

    kind: str
    pp_size: int
    num_microbatches: int
    num_model_chunks: int
    steps: list[list[Step]]
    warmup: list[int]
    slots: list[list[Slot]]


def schedule_plan(
    pp_size: int,
    num_microbatches: int,
    *,
    virtual_pipeline_model_parallel_size: int | None = None,
    microbatch_group_size_per_vp_stage: int | None = None,
    forward_only: bool = False,
) -> SchedulePlan:
    """What `get_forward_backward_func(pp_size, vp_size)`'s schedule runs on each pp rank.

    The schedule is picked as `get_forward_backward_func` picks it: interleaved when
    `virtual_pipeline_model_parallel_size` is set and pp_size > 1, 1F1B when pp_size > 1, else
    no pipelining. Raises ValueError (or Megatron's RuntimeError for a stalling final
    interleaving group) for a layout the schedule refuses.
    """
    if pp_size < 1:
        raise ValueError(f"pipeline_model_parallel_size ({pp_size}) must be >= 1")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches ({num_microbatches}) must be >= 1")
    vp = virtual_pipeline_model_parallel_size
    if vp is not None and vp < 1:
        raise ValueError(f"virtual_pipeline_model_parallel_size ({vp}) must be >= 1")
    if pp_size == 1:
        kind, chunks = "none", 1
    elif vp is not None:
        kind, chunks = "interleaved", vp
    else:
        kind, chunks = "1f1b", 1
    steps, warmup, slots = [], [], []
    for rank in range(pp_size):
        st, w = rank_schedule(
            kind, pp_size=pp_size, pp_rank=rank, num_microbatches=num_microbatches,
            num_model_chunks=chunks, microbatch_group_size_per_vp_stage=(
                microbatch_group_size_per_vp_stage), forward_only=forward_only,
        )  # fmt: skip
        steps.append(st)
        warmup.append(w)
        slots.append(slot_plan(st, w, pp_size, rank, chunks, pair_steady=kind == "interleaved"))
    return SchedulePlan(kind, pp_size, num_microbatches, chunks, steps, warmup, slots)


def rank_steps_and_slots(
    *, pp_size: int, pp_rank: int, num_microbatches: int, num_model_chunks: int = 1
) -> tuple[list[Step], list[Slot]]:
    """(steps, slots) of `pp_rank` for planners (`gigatron estimate`): the order Megatron's
    schedule for this layout runs (no pipelining at pp_size 1, 1F1B, interleaved with several
    chunks) and its p2p transfers. Raises ValueError / RuntimeError where the interleaved
    schedule refuses the layout."""
    if pp_size == 1:
        return rank_schedule("none", pp_size=1, pp_rank=0, num_microbatches=num_microbatches)[0], []
    interleaved = num_model_chunks > 1
    if interleaved:
        check_interleaving(
            pp_size=pp_size, num_microbatches=num_microbatches,
            microbatch_group_size_per_vp_stage=pp_size,
        )  # fmt: skip
    steps, warmup = rank_schedule(
        "interleaved" if interleaved else "1f1b", pp_size=pp_size, pp_rank=pp_rank,
        num_microbatches=num_microbatches, num_model_chunks=num_model_chunks,
    )  # fmt: skip
    slots = slot_plan(steps, warmup, pp_size, pp_rank, num_model_chunks, pair_steady=interleaved)
    return steps, slots


def peak_in_flight(steps: list[Step], chunk_bytes: list[int]) -> int:
    """Most activation bytes alive at once: a forward adds its chunk's `chunk_bytes`, the
    matching backward frees them."""
    alive = peak = 0
    for st in steps:
        alive += chunk_bytes[st.chunk] if st.kind == FORWARD else -chunk_bytes[st.chunk]
        peak = max(peak, alive)
    return peak
