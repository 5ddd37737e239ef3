"""`gigatron schedule`: a pipeline schedule drawn stage by stage, planned or measured.

    gigatron schedule --pp 4 --num-microbatches 8 [--vpp 2] --out 1f1b.svg
    gigatron schedule --from-timeline timeline.json --out measured.svg

Planned: the per-rank order comes from `schedule_plan`, the table `get_forward_backward_func`'s
schedules hand to the executor, timed as `_schedule_times.simulate` says (a forward 1 unit, a
backward 2, split over the V model chunks; communication free). Printed: each rank's bubble
(idle fraction of the step) next to the formula (P-1)/(V*M+P-1) (V = 1 without --vpp); with
this time model they agree. Measured: a `pretrain_gpt --timeline FILE` trace, one row per rank,
with the time each rank waited in receives; printed per stage: bubble and comm wait.
In SVG each compute box has the element id `F-s<row>-m<microbatch>-c<chunk>` (B- for backward).
"""

from __future__ import annotations

import argparse
import sys

from gigatron.core.pipeline_parallel.schedule_plan import BACKWARD, FORWARD, schedule_plan
from gigatron.tools import _plotting
from gigatron.tools import _schedule_times as times

PHASE_COLORS = {"warmup": "#fff3c4", "steady": "#e3f1e0", "cooldown": "#e4e9f7"}
# Above these sizes the tool refuses rather than grow for minutes: the forward and backward
# steps of a planned schedule (2 x pp x V x M) simulated, and the boxes of a picture (--out).
MAX_STEPS = 262_144
MAX_DRAWN = 8_192


def _check_drawn(out: str | None, boxes: int, what: str) -> None:
    if out and boxes > MAX_DRAWN:
        raise ValueError(
            f"--out {out}: {what} has {boxes:,} forward / backward boxes, above the "
            f"{MAX_DRAWN:,} drawn; leave out --out for the printed bubbles, or draw fewer "
            "microbatches"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gigatron schedule", description=__doc__.split("\n\n")[0])
    p.add_argument("--pp", type=int, help="pipeline model parallel size")
    p.add_argument("--num-microbatches", type=int, help="microbatches per step")
    p.add_argument("--vpp", type=int, default=None, help="virtual stages (model chunks) per rank")
    p.add_argument("--microbatch-group-size-per-vp-stage", type=int, default=None,
                   help="interleaving's microbatch group (default: --pp)")  # fmt: skip
    p.add_argument("--from-timeline", default=None, help="a pretrain --timeline trace to draw")
    p.add_argument("--iteration", type=int, default=None,
                   help="--from-timeline: recorded iteration to draw (default: last)")  # fmt: skip
    p.add_argument("--out", default=None, help="picture file (.svg, .png or .pdf)")
    return p


def phases(steps, warmup: int) -> list[str]:
    """warmup / steady / cooldown of each step of a rank's order: the first `warmup` forwards,
    the forward-backward pairs, the last `warmup` backwards."""
    n = len(steps)
    return ["warmup" if i < warmup else "cooldown" if i >= n - warmup else "steady"
            for i in range(n)]  # fmt: skip


def planned(args) -> int:
    if args.pp is None or args.num_microbatches is None:
        raise ValueError("give --pp and --num-microbatches (or --from-timeline FILE)")
    steps = 2 * args.pp * args.num_microbatches * (args.vpp or 1)
    if steps > MAX_STEPS:  # (sizes below 1: schedule_plan names them)
        raise ValueError(
            f"--pp {args.pp} x --num-microbatches {args.num_microbatches} x --vpp "
            f"{args.vpp or 1}: {steps:,} forward / backward steps, above gigatron schedule's "
            f"{MAX_STEPS:,} (each is simulated and listed)"
        )
    _check_drawn(args.out, steps, "the schedule")
    plan = schedule_plan(
        args.pp, args.num_microbatches, virtual_pipeline_model_parallel_size=args.vpp,
        microbatch_group_size_per_vp_stage=args.microbatch_group_size_per_vp_stage,
    )  # fmt: skip
    rows = times.simulate(plan)
    bubble = times.bubbles(rows, plan.pp_size)
    v = plan.num_model_chunks
    formula = times.formula_bubble(plan.pp_size, plan.num_microbatches, v)
    print(
        f"schedule: {plan.kind}, pp {plan.pp_size}, {plan.num_microbatches} microbatches, "
        f"{v} chunk(s) per rank; time model: forward 1, backward 2 per microbatch (/{v} per "
        "chunk), communication free"
    )
    for rank in range(plan.pp_size):
        steps = plan.steps[rank]
        n_f = sum(s.kind == FORWARD for s in steps)
        print(
            f"  pp rank {rank}: warmup {plan.warmup[rank]} forwards, {n_f} forwards, "
            f"{len(steps) - n_f} backwards, bubble {bubble[rank]:.4f}"
        )
    print(
        f"bubble (idle fraction of the step): {sum(bubble) / len(bubble):.4f}; formula "
        f"(P-1)/(V*M+P-1) = ({plan.pp_size}-1)/({v}*{plan.num_microbatches}+{plan.pp_size}-1) "
        f"= {formula:.4f}"
    )
    if args.out:
        for rank in range(plan.pp_size):
            mine = [r for r in rows if r["rank"] == rank]
            for r, phase in zip(mine, phases(plan.steps[rank], plan.warmup[rank])):
                r["phase"] = phase
        title = (f"{plan.kind} pp={plan.pp_size} M={plan.num_microbatches} V={v}: "
                 f"bubble {sum(bubble) / len(bubble):.3f} (formula {formula:.3f})")  # fmt: skip
        draw(rows, args.out, title=title, row_label="pp rank", unit="time units")
        print(f"picture: {args.out}")
    return 0


def measured(args) -> int:
    rows = times.read_trace(args.from_timeline)
    iters = sorted({r["iteration"] for r in rows if r["iteration"] is not None})
    it = args.iteration if args.iteration is not None else (iters[-1] if iters else None)
    if it is not None:
        if it not in iters:
            raise ValueError(f"--iteration {it} is not in {args.from_timeline} (has {iters})")
        rows = [r for r in rows if r["iteration"] == it]
    _check_drawn(args.out, sum(r["kind"] in ("forward", "backward") for r in rows), "the trace")
    m = times.measure(rows)
    print(f"timeline {args.from_timeline}, iteration {it}: step span {m['span_ms']:.2f} ms")
    for pp, s in m["stages"].items():
        print(f"  pp stage {pp} (ranks {s['ranks']}): bubble {s['bubble']:.3f}, comm wait "
              f"{s['comm_wait_ms']:.2f} ms")  # fmt: skip
    if args.out:
        t0 = min(r["start"] for r in rows)
        ranks = sorted({(r["pp"], r["rank"]) for r in rows})
        row_of = {rank: i for i, (_, rank) in enumerate(ranks)}
        for r in rows:
            r["start"], r["end"] = r["start"] - t0, r["end"] - t0
            r["row"] = row_of[r["rank"]]
        labels = [f"rank {rank} (pp {pp})" for pp, rank in ranks]
        draw(rows, args.out, title=f"measured, iteration {it}", row_label="",
             unit="ms", labels=labels)  # fmt: skip
        print(f"picture: {args.out}")
    return 0


def draw(rows, out, *, title, row_label, unit, labels=None) -> None:
    """Rows as boxes: forwards blue, backwards orange (lighter per chunk), receive waits grey;
    planned rows carry a "phase" shaded behind them."""
    plt = _plotting.pyplot()
    from matplotlib.patches import Patch, Rectangle

    n_rows = 1 + max(r.get("row", r["rank"]) for r in rows)
    end = max(r["end"] for r in rows)
    fig, ax = plt.subplots(figsize=(min(24, 4 + end * (0.45 if unit != "ms" else 0.05)),
                                    0.6 * n_rows + 1.2))  # fmt: skip
    if unit == "ms":
        fig.set_size_inches(14, 0.6 * n_rows + 1.2)
    label_boxes = len(rows) <= 400
    for r in rows:
        y = r.get("row", r["rank"])
        x, w = r["start"], r["end"] - r["start"]
        if "phase" in r:
            ax.add_patch(Rectangle((x, y - 0.5), w, 1.0, fc=PHASE_COLORS[r["phase"]], lw=0,
                                   zorder=0, gid=f"phase-{r['phase']}-s{y}"))  # fmt: skip
        if r["kind"] in (FORWARD, BACKWARD):
            shade = 1.0 - 0.35 * (r["chunk"] or 0) / max(1, 1 + (r["chunk"] or 0))
            base = (0.25, 0.5, 0.85) if r["kind"] == FORWARD else (0.95, 0.55, 0.2)
            color = tuple(min(1.0, c * shade + (1 - shade)) for c in base)
            k = "F" if r["kind"] == FORWARD else "B"
            ax.add_patch(Rectangle((x, y - 0.4), w, 0.8, fc=color, ec="0.15", lw=0.5, zorder=2,
                                   gid=f"{k}-s{y}-m{r['microbatch']}-c{r['chunk']}"))  # fmt: skip
            if label_boxes:
                ax.text(x + w / 2, y, str(r["microbatch"]), ha="center", va="center",
                        fontsize=6, zorder=3)  # fmt: skip
        elif r["kind"] == "recv":
            ax.add_patch(Rectangle((x, y - 0.15), w, 0.3, fc="0.75", ec="none", zorder=1,
                                   gid=f"wait-s{y}"))  # fmt: skip
    ax.set_xlim(0, end * 1.01)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(labels or [f"{row_label} {i}" for i in range(n_rows)], fontsize=8)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    handles = [Patch(fc=(0.25, 0.5, 0.85), label="forward (number: microbatch)"),
               Patch(fc=(0.95, 0.55, 0.2), label="backward")]  # fmt: skip
    if any("phase" in r for r in rows):
        handles += [Patch(fc=c, label=p) for p, c in PHASE_COLORS.items()]
    if any(r["kind"] == "recv" for r in rows):
        handles.append(Patch(fc="0.75", label="waiting in a receive"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / n_rows),
              ncol=len(handles), fontsize=7, frameon=False)  # fmt: skip
    _plotting.save(fig, out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    _plotting.check_out(args.out)
    return measured(args) if args.from_timeline else planned(args)


if __name__ == "__main__":
    sys.exit(main())
