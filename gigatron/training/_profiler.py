"""`--profile`: Megatron's step-window profiling of the training loop, plus a kernel summary.

The iterations from `--profile-step-start` up to (not including) `--profile-step-end` are
profiled on the global ranks in `--profile-ranks`; an iteration's number is the count of
iterations done before it (a loaded checkpoint's included), as Megatron's nsys path counts
(Megatron's torch-profiler schedule counts from the start of the run, one iteration earlier;
gigatron uses one numbering for both). A run resumed past the window profiles nothing and says
so:

- with `--use-pytorch-profiler`, by `torch.profiler` (CPU + CUDA activities, shapes and stacks
  recorded), the trace written by `tensorboard_trace_handler` into `--tensorboard-dir`;
- without it, by `cudaProfilerStart` / `cudaProfilerStop` (for
  `nsys profile --capture-range=cudaProfilerApi`).

gigatron also prints, on each profiled rank, the device time per profiled iteration by kernel
category (GEMM, attention, communication, compiled Triton, optimizer, other) and the top kernels:
what Megatron users otherwise read off the trace by hand, and the GPU's idle time with its
largest gaps. On CPU the summary lists operators by CPU self time instead. Recording shapes and
Python stacks (as Megatron does) slows the host several-fold, which inflates the idle time;
`--no-profile-stacks` (gigatron only) records neither.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_FILE = "gigatron/training/_profiler.py"


def kernel_category(name: str) -> str:
    """Coarse class of a CUDA kernel from its name (the categories of the reports in bench/)."""
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if any(k in low for k in ("nvjet", "gemm", "cutlass", "xmma")):
        return "gemm"
    if any(k in low for k in ("sdpa", "flash", "fmha", "attention")):
        return "attention"
    if "multi_tensor_apply" in low or "adam" in low:
        return "optimizer"
    if low.startswith("triton_"):
        return "triton (compiled elementwise/norm/reduction)"
    return "other (eager elementwise, copies, embedding)"


def check_profile_args(args) -> None:
    """ValueError naming the flag and the rule (called by validate_args)."""
    if not getattr(args, "profile", False):
        return
    if args.profile_step_start < 0 or args.profile_step_end <= args.profile_step_start:
        raise ValueError(
            f"--profile-step-start ({args.profile_step_start}) must be >= 0 and below "
            f"--profile-step-end ({args.profile_step_end}) ({_FILE})"
        )
    if args.use_pytorch_profiler and not args.tensorboard_dir:
        raise ValueError(
            "--use-pytorch-profiler writes its trace into --tensorboard-dir (None): set it "
            f"({_FILE})"
        )


def _is_annotation(event) -> bool:
    """A profiler range shown on the GPU timeline, not a kernel: the loop's `iteration <i>`
    ranges, `## Call CompiledFxGraph ... ##`, `Optimizer.step#AdamW.step`. They span kernels:
    counting them would count time twice and hide every idle gap."""
    name = getattr(event, "key", None) or event.name
    return (
        bool(getattr(event, "is_user_annotation", False))
        or "#" in name
        or (name.startswith("iteration ") and name[10:].isdigit())
    )


def idle_gaps(prof, iterations: int, largest: int = 12, explained: int = 4) -> dict:
    """GPU time with no kernel running (ms per iteration) and the largest gaps with the kernels
    before and after them: where the GPU waits on the host (syncs, launch overhead, data).
    `host_us` names, for the `explained` largest gaps, what the host was running meanwhile."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == DeviceType.CUDA and not _is_annotation(e)
    )
    gaps, reach = [], None
    for (start, _end, name), prev in zip(spans[1:], spans[:-1]):
        reach = prev[1] if reach is None else max(reach, prev[1])
        if start > reach:
            gaps.append((start - reach, prev[2][:70], name[:70], reach, start))
    by_next: dict[str, float] = {}
    n = max(iterations, 1)
    for gap, _, after, _, _ in gaps:
        by_next[after] = by_next.get(after, 0.0) + gap / n / 1e3
    biggest = sorted(gaps)[-largest:]
    host = [e for e in events if e.device_type == DeviceType.CPU]
    return {
        "idle_ms_per_step": round(sum(g[0] for g in gaps) / n / 1e3, 2),
        "largest_us": [(round(g, 1), before, after) for g, before, after, _, _ in biggest],
        "host_us": [_host_during(host, a, b) for _, _, _, a, b in biggest[-explained:]],
        "by_next_kernel_ms": dict(sorted(by_next.items(), key=lambda x: -x[1])[:largest]),
    }


def _host_during(host_events, start: float, end: float, top: int = 5) -> list:
    """[(overlap_us, name)] of the host operators / ranges running in [start, end), most
    overlap first; ranges over 20x longer than the gap (the iteration) say nothing."""
    width = max(end - start, 1e-9)
    out = []
    for e in host_events:
        s, t = e.time_range.start, e.time_range.end
        overlap = min(t, end) - max(s, start)
        if overlap > 0 and t - s < 20 * width:
            out.append((round(overlap, 1), t - s, e.name[:60]))
    out.sort(key=lambda x: (-x[0], x[1]))
    return [(overlap, name) for overlap, _, name in out[:top]]


def summarize(prof, iterations: int, top: int = 15) -> str:
    """Device (or, without CUDA events, CPU self) time per iteration: by category and top names;
    on CUDA also the GPU's idle time and its largest gaps."""
    from torch.autograd import DeviceType

    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and not _is_annotation(e)]
    if kernels:
        rows = [(e.key, e.self_device_time_total, e.count) for e in kernels]
        what = "CUDA kernel time"
    else:
        python = (".py(", "<built-in", "<method")  # with_stack's Python frames: not operators
        rows = [
            (e.key, e.self_cpu_time_total, e.count)
            for e in events
            if not any(k in e.key for k in python)
        ]
        what = "CPU self time of operators"
    n = max(iterations, 1)
    total = sum(r[1] for r in rows) / n / 1e3
    lines = [f"profile: {what} per iteration {total:.2f} ms over {iterations} iterations"]
    if kernels:
        by_cat: dict[str, float] = {}
        for name, us, _ in rows:
            by_cat[kernel_category(name)] = by_cat.get(kernel_category(name), 0.0) + us / n / 1e3
        for cat, ms in sorted(by_cat.items(), key=lambda x: -x[1]):
            lines.append(f"  {ms:9.2f} ms  {cat}")
        gaps = idle_gaps(prof, iterations)
        lines.append(f"  GPU idle (no kernel running): {gaps['idle_ms_per_step']:.2f} ms")
        lines.append("  largest idle gaps (us, kernel before -> kernel after):")
        host = gaps["host_us"][::-1]  # by position: the largest gaps first, as the rows below
        for i, (us, before, after) in enumerate(reversed(gaps["largest_us"])):
            lines.append(f"  {us:9.1f} us  {before[:50]} -> {after[:50]}")
            if i < len(host) and host[i]:
                ops = ", ".join(f"{name} {o:.0f}" for o, name in host[i])
                lines.append(f"               host meanwhile (us): {ops}")
    lines.append("  top:")
    for name, us, count in sorted(rows, key=lambda r: -r[1])[:top]:
        lines.append(f"  {us / n / 1e3:9.3f} ms  {count // n:5d} calls  {name[:110]}")
    return "\n".join(lines)


class StepProfiler:
    """Call `step(i)` at the start of every iteration (i = iterations done before it) and
    `close()` once after the loop (also on error). Each profiled iteration is a range named
    `iteration <i>` in the trace."""

    def __init__(self, args, start_iteration: int = 0):
        self.args = args
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.enabled = bool(getattr(args, "profile", False)) and rank in args.profile_ranks
        self.start, self.end = (
            getattr(args, "profile_step_start", 0),
            getattr(args, "profile_step_end", 0),
        )
        self.prof = None
        self.active = False
        self.done = False
        self.last = -1
        self.profiled: list[int] = []  # iterations inside the window so far
        self._range = None
        if self.enabled and start_iteration > self.start:
            print(
                f"WARNING: --profile-step-start ({self.start}) lies before the first iteration "
                f"of this run ({start_iteration}, resumed): nothing is profiled ({_FILE})",
                flush=True,
            )
            self.done = True

    def step(self, i: int) -> None:
        if not self.enabled or self.done:
            return
        self.last = i
        if i == self.start:
            self._begin()
        elif i == self.end and self.active:
            self._finish()
            return
        if self.active:
            self._end_range()
            self._range = torch.profiler.record_function(f"iteration {i}")
            self._range.__enter__()
            self.profiled.append(i)

    def _end_range(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def _begin(self) -> None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self.args.use_pytorch_profiler:
            from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            # --no-profile-stacks: no shapes / Python stacks (Megatron records both): far less
            # host overhead, so the GPU idle time in the summary is the run's, not the profiler's
            detail = not getattr(self.args, "no_profile_stacks", False)
            self.prof = profile(
                activities=activities,
                on_trace_ready=tensorboard_trace_handler(self.args.tensorboard_dir),
                record_shapes=detail,
                with_stack=detail,
            )
            self.prof.start()
        elif cuda:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        self.active = True

    def _finish(self) -> None:
        self.active, self.done = False, True  # first: a failure below must not run it again
        self._end_range()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        if self.prof is not None:
            self.prof.stop()  # runs on_trace_ready: the trace file
            print(summarize(self.prof, len(self.profiled)), flush=True)
            print(f"profile: trace written to {self.args.tensorboard_dir}", flush=True)
        elif torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.cudart().cudaProfilerStop()

    def close(self) -> None:
        """End a window the loop left open (fewer iterations than --profile-step-end)."""
        if self.active:
            self._finish()
