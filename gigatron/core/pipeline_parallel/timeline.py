"""Record when each forward, backward, send and receive of a pipeline schedule ran (gigatron).

Set `config.pipeline_timeline = PipelineTimeline()` on the model config the schedule reads
(`get_forward_backward_func(...)(..., model=...)`); the executor then stamps every step and every
p2p exchange while `recording` is True. Off (None, the default) costs one attribute read per
schedule call. `pretrain_gpt --timeline FILE --timeline-iters 1 2` does this for chosen training
iterations and writes one merged Chrome trace (Perfetto / chrome://tracing).

Events, per rank: "forward" / "backward" spans named `F<mb>.<chunk>` / `B<mb>.<chunk>` (track 0),
and the p2p exchanges on track 1: "recv" spans (the rank posts its pending sends and waits for
the receives its next steps need: the time it spends waiting on its neighbours) and "send" spans
(sends posted with nothing to receive; they complete in the background, as the executor leaves
them). Times are wall-clock microseconds (`time.time_ns`): comparable between the processes of one
host, only roughly between hosts. Under CUDA each stamp synchronizes the device first, so the
spans are the device's work, not the kernel launches (recorded iterations run slower for it).
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

__all__ = ["PipelineTimeline", "chrome_trace", "write_chrome_trace"]

COMPUTE_TRACK, COMM_TRACK = 0, 1


class PipelineTimeline:
    """Collects this rank's events: (category, name, start_us, end_us, args) tuples."""

    def __init__(self, *, synchronize: bool | None = None) -> None:
        self.recording = True
        self.iteration: int | None = None  # stamped on each event (the training loop sets it)
        self.events: list[tuple[str, str, float, float, dict[str, Any]]] = []
        self._sync = synchronize

    def now(self) -> float:
        """Microseconds; the CUDA device is synchronized first when it is in use."""
        sync = self._sync
        if sync is None:
            sync = torch.cuda.is_available() and torch.cuda.is_initialized()
        if sync:
            torch.cuda.synchronize()
        return time.time_ns() / 1e3

    def add(self, category: str, name: str, start_us: float, end_us: float, **args) -> None:
        if self.iteration is not None:
            args["iteration"] = self.iteration
        self.events.append((category, name, start_us, end_us, args))


def chrome_trace(ranks: list[dict]) -> dict:
    """The Chrome trace JSON object of several ranks' events.

    `ranks`: one dict per rank {"rank": int, "coords": {"pp": ..., ...}, "events": [...]}, events
    as `PipelineTimeline.events`. Each rank is a process (pid = rank) named with its
    coordinates; compute on thread 0, communication on thread 1. Times start at the earliest
    event.
    """
    starts = [e[2] for r in ranks for e in r["events"]]
    origin = min(starts) if starts else 0.0
    out = []
    for r in ranks:
        pid, coords = r["rank"], r.get("coords", {})
        label = " ".join(f"{k}{v}" for k, v in coords.items())
        out.append(
            _meta("process_name", pid, 0, f"rank {pid} ({label})" if label else f"rank {pid}")
        )
        out.append(_meta("process_sort_index", pid, 0, pid, key="sort_index"))
        out.append({"ph": "M", "name": "process_labels", "pid": pid, "args": {"labels": label}})
        out.append(_meta("thread_name", pid, COMPUTE_TRACK, "compute"))
        out.append(_meta("thread_name", pid, COMM_TRACK, "p2p"))
        for cat, name, start, end, args in r["events"]:
            tid = COMPUTE_TRACK if cat in ("forward", "backward") else COMM_TRACK
            out.append({
                "name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                "ts": round(start - origin, 3), "dur": round(max(end - start, 0.0), 3),
                "args": {**args, **{f"{k}_rank": v for k, v in coords.items()}},
            })  # fmt: skip
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def _meta(name: str, pid: int, tid: int, value, key: str = "name") -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


def write_chrome_trace(path: str, ranks: list[dict]) -> None:
    """`chrome_trace(ranks)` as a JSON file."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(ranks), f)
