"""`gigatron estimate`: plan a run before it starts.

    gigatron estimate --num-layers 80 --hidden-size 8192 ... --world-size 1024 [--dry-run]

Takes `gigatron train`'s flags (Megatron's pretrain_gpt flags) and `--world-size`; prints per
representative rank (first / middle / last pipeline stage) parameters, gradients, optimizer
state, activations and peak memory, FLOPs and bytes sent per group per step, and with
`--calibration h200` the step time. `--dry-run` checks every rank's layout on fake process
groups instead (docs/estimate.md). Megatron has no such command; its flags are reused as is.
"""

from __future__ import annotations

import json
import sys

_GIB = 2**30


def _table(report: dict) -> str:
    lay = report["layout"]
    lines = [
        f"world {report['world_size']}: " + ", ".join(f"{k} {v}" for k, v in lay.items()),
        "",
        f"{'rank':<14}{'params':>10}{'param':>8}{'grad':>8}{'optim':>8}{'activ':>8}"
        f"{'transient':>10}{'peak':>8}  GiB",
    ]
    for label, r in report["ranks"].items():
        experts = (
            f"  ({r['expert_params'] / 1e6:.1f}M of them expert)" if r["expert_params"] else ""
        )
        lines.append(
            f"{label + ' ' + str(r['rank']):<14}{r['params'] / 1e6:>9.1f}M"
            + "".join(
                f"{r[k] / _GIB:>{w}.2f}"
                for k, w in (
                    ("param_bytes", 8),
                    ("grad_bytes", 8),
                    ("optimizer_bytes", 8),
                    ("activation_bytes", 8),
                    ("transient_bytes", 10),
                    ("peak_bytes", 8),
                )
            )
            + experts
        )
    lines.append("")
    for label, r in report["ranks"].items():
        if "trace_error" in r:
            lines.append(f"{label}: no trace ({r['trace_error']})")
            continue
        comm = ", ".join(f"{g} {b / 1e9:.2f} GB" for g, b in r["comm_bytes_per_step"].items())
        lines.append(
            f"{label}: {r['flops_per_step'] / 1e12:.1f} TFLOP/step; sent per step: {comm or '-'}"
        )
        if "time" in r:
            t = r["time"]
            note = (
                f" ({t['uncalibrated_collectives']} collectives uncalibrated, priced 0)"
                if t["uncalibrated_collectives"]
                else ""
            )
            lines.append(
                f"  step {t['step_s'] * 1e3:.1f} ms = gemm {t['gemm_s'] * 1e3:.1f} + attention "
                f"{t['attention_s'] * 1e3:.1f} + other {t['other_s'] * 1e3:.1f} + comm "
                f"{t['comm_s'] * 1e3:.1f} + bubble {t['bubble_s'] * 1e3:.1f} + optimizer "
                f"{t['optimizer_s'] * 1e3:.1f} + grad buffer {t['grad_buffer_s'] * 1e3:.1f} "
                f"(host floor {t['host_s'] * 1e3:.1f}){note}"
            )
    return "\n".join(lines)


def _dry_run_text(rep: dict, limit_gib: float | None) -> str:
    lines = [
        f"dry run: {rep['world_size']} ranks, {rep['models_built']} models built on meta (one "
        f"per pipeline stage: ranks of a stage differ only in TP/CP/DP/EP coordinates and share "
        f"its numbers), {rep['seconds']} s",
        "groups (crossing nodes of "
        f"{rep['gpus_per_node']}): "
        + ", ".join(f"{a} {g['crossing_nodes']}/{g['groups']}" for a, g in rep["groups"].items()),
        f"schedule: {rep['schedule']['microbatches']} microbatches, "
        f"{rep['schedule']['steps_per_rank']} steps per rank, p2p receives per PP rank "
        f"{rep['schedule']['p2p_per_rank']}",
    ]
    for pp_rank, mem in rep["stages"].items():
        n = sum(1 for r in rep["ranks"] if r["pp"] == pp_rank)
        lines.append(
            f"  pp {pp_rank}: {n} ranks, {mem['params'] / 1e6:.1f}M params, peak "
            f"{mem['peak_bytes'] / _GIB:.2f} GiB"
        )
    if limit_gib is not None:
        over = [r["rank"] for r in rep["ranks"] if r["peak_gib"] > limit_gib]
        lines.append(f"ranks over {limit_gib} GiB: {len(over)} {over[:16]}")
    lines += [f"error: {e}" for e in rep["errors"]] or ["layout ok"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from gigatron.tools.estimate.args import estimate_args

    args = estimate_args(list(sys.argv[1:] if argv is None else argv))
    if args.dry_run:
        from gigatron.tools.estimate.dry_run import dry_run

        rep = dry_run(args, args.gpus_per_node)
        if args.json:
            print(json.dumps(rep))
        else:
            print(_dry_run_text(rep, args.gpu_memory_gib))
        return 1 if rep["errors"] else 0
    from gigatron.tools.estimate.report import estimate
    from gigatron.tools.estimate.timing import load_calibration

    report = estimate(args, calibration=load_calibration(args.calibration))
    print(json.dumps(report) if args.json else _table(report))
    return 0
