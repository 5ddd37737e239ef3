"""A pipeline rank's schedule as data, for planners (`gigatron estimate`): which (microbatch,
chunk, forward|backward) steps it runs, what it sends and receives, how many microbatches'
activations it holds at once. The tables the schedules run (`forward_backward_func`); no
processes.
"""

from __future__ import annotations

from gigatron.core.pipeline_parallel import _schedule_table as table
from gigatron.core.pipeline_parallel._schedule_table import FORWARD, Slot, Step, Transfer

__all__ = ["FORWARD", "Slot", "Step", "Transfer", "rank_schedule", "peak_in_flight"]


def rank_schedule(
    *, pp_size: int, pp_rank: int, num_microbatches: int, num_model_chunks: int = 1
) -> tuple[list[Step], list[Slot]]:
    """(steps, slots) of `pp_rank`: the order Megatron's schedule for this layout runs (no
    pipelining at pp_size 1, 1F1B, interleaved with several chunks) and its p2p transfers.
    Raises ValueError / RuntimeError where the interleaved schedule refuses the layout."""
    if pp_size == 1:
        steps = table.no_pipelining_table(num_microbatches)
        return steps, []
    if num_model_chunks > 1:
        table.check_interleaving(
            pp_size=pp_size,
            num_microbatches=num_microbatches,
            microbatch_group_size_per_vp_stage=pp_size,
        )
        steps = table.interleaved_table(pp_size, pp_rank, num_microbatches, num_model_chunks)
        warmup = table.num_warmup_microbatches(
            pp_size=pp_size, pp_rank=pp_rank, num_microbatches=num_microbatches,
            num_model_chunks=num_model_chunks, interleaved=True,
        )  # fmt: skip
    else:
        steps = table.one_f_one_b_table(pp_size, pp_rank, num_microbatches)
        warmup = table.num_warmup_microbatches(
            pp_size=pp_size, pp_rank=pp_rank, num_microbatches=num_microbatches
        )
    slots = table.slot_plan(
        steps, warmup, pp_size, pp_rank, num_model_chunks, pair_steady=num_model_chunks > 1
    )
    return steps, slots


def peak_in_flight(steps: list[Step], chunk_bytes: list[int]) -> int:
    """Most activation bytes alive at once: a forward adds its chunk's `chunk_bytes`, the
    matching backward frees them."""
    alive = peak = 0
    for st in steps:
        alive += chunk_bytes[st.chunk] if st.kind == FORWARD else -chunk_bytes[st.chunk]
        peak = max(peak, alive)
    return peak
