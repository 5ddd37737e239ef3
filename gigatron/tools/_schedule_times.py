"""Times of a pipeline schedule: planned (simulated from the executor's slots) or measured.

Planned: each pp rank runs its slots (`schedule_plan`) in order; a slot starts when the rank is
free and every activation / gradient it receives has been sent, which happens when the slot
that produced it ends (the executor sends after a slot's steps). A forward takes
`forward_time / chunks`, a backward `backward_time / chunks`; communication takes no time.

Rows are {"rank", "kind" ("forward"|"backward"|"wait"), "microbatch", "chunk", "start", "end"}.
The bubble of a rank is 1 - (its compute time) / (the whole schedule's span).
"""

from __future__ import annotations

import json

from gigatron.core.pipeline_parallel.schedule_plan import FORWARD, SchedulePlan
from gigatron.core.untrusted_files import read_text


def simulate(plan: SchedulePlan, forward_time: float = 1.0, backward_time: float = 2.0) -> list:
    """Rows of every step of every pp rank, in time order per rank."""
    chunks = plan.num_model_chunks
    t_f, t_b = forward_time / chunks, backward_time / chunks
    ready: dict = {}  # Transfer -> time it was sent
    pos = [0] * plan.pp_size
    free = [0.0] * plan.pp_size
    rows: list[dict] = []
    remaining = sum(len(s) for s in plan.slots)
    while remaining:
        progressed = False
        for rank, slots in enumerate(plan.slots):
            while pos[rank] < len(slots):
                slot = slots[pos[rank]]
                if any(t not in ready for t in slot.recvs):
                    break
                t = max([free[rank]] + [ready[x] for x in slot.recvs])
                for st in slot.steps:
                    dur = t_f if st.kind == FORWARD else t_b
                    rows.append({"rank": rank, "kind": st.kind, "microbatch": st.microbatch,
                                 "chunk": st.chunk, "start": t, "end": t + dur})  # fmt: skip
                    t += dur
                for x in slot.sends:
                    ready[x] = t
                free[rank] = t
                pos[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule plan waits in a circle (no slot can start)")
    return rows


def bubbles(rows: list, num_ranks: int) -> list[float]:
    """Per rank: the fraction of the span [first start, last end] of all rows with no compute."""
    compute = [r for r in rows if r["kind"] in ("forward", "backward")]
    span = max(r["end"] for r in compute) - min(r["start"] for r in compute)
    busy = [0.0] * num_ranks
    for r in compute:
        busy[r["rank"]] += r["end"] - r["start"]
    return [1.0 - b / span for b in busy]


def formula_bubble(pp_size: int, num_microbatches: int, chunks: int = 1) -> float:
    """Megatron paper: (P - 1) / (V*M + P - 1) of the step, V chunks per rank (1F1B: V = 1)."""
    return (pp_size - 1) / (chunks * num_microbatches + pp_size - 1)


def read_trace(path: str) -> list[dict]:
    """A `--timeline` Chrome trace -> rows {"rank", "pp", "iteration", "kind", "name",
    "microbatch", "chunk", "start", "end"} (ms), "kind" forward/backward/recv/send."""
    text = read_text(path, what="--from-timeline", max_bytes="calibration")  # regular files only
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--from-timeline {path}: not JSON ({e})") from None
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError(f"{path} holds no pipeline timeline events (pretrain --timeline FILE)")
    rows = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("forward", "backward", "recv", "send"):
            continue
        args = e.get("args", {})
        rows.append({
            "rank": int(e["pid"]), "pp": int(args.get("pp_rank", 0)),
            "iteration": args.get("iteration"), "kind": e["cat"], "name": e["name"],
            "microbatch": args.get("microbatch"), "chunk": args.get("chunk"),
            "start": float(e["ts"]) / 1e3, "end": (float(e["ts"]) + float(e["dur"])) / 1e3,
        })  # fmt: skip
    if not rows:
        raise ValueError(f"{path} holds no pipeline timeline events (pretrain --timeline FILE)")
    return rows


def measure(rows: list[dict]) -> dict:
    """One iteration's rows -> {"span_ms", "stages": {pp: {"bubble", "comm_wait_ms",
    "ranks"}}}: bubble = 1 - compute / span averaged over the stage's ranks; comm wait = time in
    receives (a rank waiting for its neighbours' activations or gradients)."""
    span0 = min(r["start"] for r in rows)
    span = max(r["end"] for r in rows) - span0
    per_rank: dict[int, dict] = {}
    for r in rows:
        d = per_rank.setdefault(r["rank"], {"pp": r["pp"], "busy": 0.0, "wait": 0.0})
        if r["kind"] in ("forward", "backward"):
            d["busy"] += r["end"] - r["start"]
        elif r["kind"] == "recv":
            d["wait"] += r["end"] - r["start"]
    stages: dict[int, dict] = {}
    for rank, d in sorted(per_rank.items()):
        s = stages.setdefault(d["pp"], {"bubble": 0.0, "comm_wait_ms": 0.0, "ranks": []})
        s["ranks"].append(rank)
        s["bubble"] += 1.0 - d["busy"] / span
        s["comm_wait_ms"] += d["wait"]
    for s in stages.values():
        s["bubble"] /= len(s["ranks"])
        s["comm_wait_ms"] /= len(s["ranks"])
    return {"span_ms": span, "stages": dict(sorted(stages.items()))}
