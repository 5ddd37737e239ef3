"""`--timeline FILE --timeline-iters I [I ...]`: the pipeline timeline of chosen iterations.

Sets a `PipelineTimeline` on the model config (`config.pipeline_timeline`), which the schedule
executor stamps while it records: only during the training steps numbered in `--timeline-iters`
(an iteration's number is the count of iterations done before it, as `--profile-step-start`
counts), never during evaluation. After the loop every rank's events are gathered to rank 0,
which writes one Chrome trace (pid = global rank; `gigatron schedule --from-timeline FILE`
draws it and measures the bubble). Off, nothing is set and nothing runs.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.pipeline_parallel.timeline import PipelineTimeline, write_chrome_trace
from gigatron.training.utils import print_rank_0


def check_timeline_args(args) -> None:
    """ValueError naming the flag and the rule (called by validate_args)."""
    iters = getattr(args, "timeline_iters", None) or []
    bad = [i for i in iters if i < 0]
    if bad:
        raise ValueError(f"--timeline-iters ({bad}) must be iteration numbers >= 0")


class TrainingTimeline:
    """`step(i)` before iteration i's train step, `after_step()` after it, `close()` once after
    the loop on every rank (it gathers)."""

    def __init__(self, args, config) -> None:
        self.path = getattr(args, "timeline", None)
        self.iters = set(getattr(args, "timeline_iters", None) or [])
        self.timeline = None
        if self.path:
            self.timeline = PipelineTimeline()
            self.timeline.recording = False
            config.pipeline_timeline = self.timeline

    def step(self, iteration: int) -> None:
        if self.timeline is not None:
            self.timeline.iteration = iteration
            self.timeline.recording = iteration in self.iters

    def after_step(self) -> None:
        if self.timeline is not None:
            self.timeline.recording = False

    def close(self) -> None:
        if self.timeline is None:
            return
        mine = {
            "rank": dist.get_rank() if dist.is_initialized() else 0,
            "coords": {
                "pp": ps.get_pipeline_model_parallel_rank(),
                "tp": ps.get_tensor_model_parallel_rank(),
                "cp": ps.get_context_parallel_rank(),
                "dp": ps.get_data_parallel_rank(),
            },
            "events": self.timeline.events,
        }
        ranks = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            ranks = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
            dist.gather_object(mine, ranks, dst=0)
        if not dist.is_initialized() or dist.get_rank() == 0:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            write_chrome_trace(self.path, ranks)
            n = sum(len(r["events"]) for r in ranks)
            print_rank_0(f"timeline: {n} events of iterations {sorted(self.iters)} -> {self.path}")
        self.timeline = None
