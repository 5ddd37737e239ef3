"""Table and ratios from a results.jsonl written by bench/run.sh (one RESULT object a line).

    python bench/tools/compare.py results.jsonl [more.jsonl ...]

Prints a markdown table of every run, then, per device call (`device_call`, absent in a fresh
results.jsonl), the best one-GPU gigatron run against each anchor of the same config (throughput
ratio; the FLOP formula is shared), then the issue's targets (gpt-1.3b >= 620 TFLOP/s, gpt-125m
>= 480, peak memory <= torch compile, DP=2 >= 1.9x the one-GPU tokens/s, TP=2+SP >= 85% of the
one-GPU TFLOP/s per GPU) with pass/fail; each two-GPU run is compared with the one-GPU run of
the same call with the same per-GPU flags, and with the best one.
"""

from __future__ import annotations

import json
import sys

ANCHORS = ("megatron-core-0.19.2-local", "torch-sdpa", "torch-sdpa-compile")


def load(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _find(rows, impl, config, gpus=1):
    hits = [r for r in rows if r.get("impl") == impl and r.get("config") == config]
    hits = [r for r in hits if r.get("gpus", 1) == gpus]
    return hits[-1] if hits else None


def table(rows) -> list[str]:
    out = [
        "| impl | config | GPUs | layout | tokens/s | TFLOP/s/GPU | MFU | peak GB | SM MHz / W |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            out.append(f"| FAILED: `{r['failed']}` (rc {r['rc']}) | | | | | | | | |")
            continue
        if "tokens_per_s" not in r or "tflops_per_gpu" not in r:
            continue  # a profile-only row (compare_profile.py), an MoE anchor (compare_moe.py)
        layout = f"tp{r.get('tp', r.get('gpus'))}" + ("+sp" if r.get("sp") else "")
        layout += f" dp{r.get('dp', 1)}"
        power = r.get("gpu_power") or {}  # bench_gpt.py's nvidia-smi samples (rank 0's GPU)
        clock = f"{power['sm_clock_mhz_mean']} / {power['power_w_mean']}" if power else ""
        out.append(
            f"| {r['impl']} | {r['config']} | {r['gpus']} | {layout} | {r['tokens_per_s']:,} | "
            f"{r['tflops_per_gpu']} | {100 * r['mfu']:.1f}% | {r['peak_mem_gb']} | {clock} |"
        )
    return out


# Switches that describe the layout, not the per-GPU kernels: ignored when a multi-GPU run is
# paired with the one-GPU run "with the same flags".
_LAYOUT_SWITCHES = {
    "ddp", "overlap_grad_reduce", "bucket_size", "tp_comm_overlap", "tp_comm_ce", "async_tp",
    "comm_reorder", "sm_carveout", "nccl_high_priority", "nccl_env", "memory_reorder",
    "grad_acc_fusion",
}  # fmt: skip


def _runs(rows, config, gpus=1, impl_prefix="gigatron", call=None, anchor_init=False):
    """gigatron's bench_gpt runs of one config / GPU count / call (rows with a throughput: a
    results file may also hold bench_ckpt's rows, impl 'gigatron' too). `--anchor-init` runs (the
    anchor's initial values, not Megatron's: an experiment, session 7 found GEMM speed depends on
    them) only with anchor_init=True: they never stand for gigatron in the targets."""
    return [
        r
        for r in rows
        if str(r.get("impl", "")).startswith(impl_prefix)
        and "tflops_per_gpu" in r
        and r.get("config") == config
        and r.get("gpus", 1) == gpus
        and r.get("device_call") == call
        and bool((r.get("switches") or {}).get("anchor_init")) == anchor_init
    ]


def _flags(run) -> dict:
    return {k: v for k, v in run.get("switches", {}).items() if k not in _LAYOUT_SWITCHES}


def _calls(rows) -> list:
    return list(dict.fromkeys(r.get("device_call") for r in rows if "impl" in r))


def ratios(rows) -> list[str]:
    """The best one-GPU gigatron run against each anchor of the same config and device call
    (and, in a row of its own, the best `--anchor-init` run)."""
    out = ["", "| call | config | best gigatron (1 GPU) | vs | ratio |", "|---|---|---|---|---|"]
    for call in _calls(rows):
        for config in ("gpt-125m", "gpt-1.3b"):
            for anchor_init in (False, True):
                ones = _runs(rows, config, call=call, anchor_init=anchor_init)
                if not ones:
                    continue
                best = max(ones, key=lambda r: r["tflops_per_gpu"])
                for anchor in ANCHORS:
                    ref = _find([r for r in rows if r.get("device_call") == call], anchor, config)
                    if ref:
                        x = best["tokens_per_s"] / ref["tokens_per_s"]
                        out.append(f"| {call} | {config} | {best['impl']} | {anchor} | {x:.3f}x |")
    return out


def targets(rows) -> list[str]:
    """The issue's targets, per device call: best one-GPU TFLOP/s and memory, and every DP=2 /
    TP=2+SP run against the one-GPU run with the same flags (and against the best one)."""
    out = ["", "| call | target | run | measured | pass |", "|---|---|---|---|---|"]

    def add(call, name, run, value, ok):
        out.append(f"| {call} | {name} | {run} | {value} | {'yes' if ok else 'NO'} |")

    for call in _calls(rows):
        here = [r for r in rows if r.get("device_call") == call]
        for config, goal in (("gpt-1.3b", 620.0), ("gpt-125m", 480.0)):
            ones = _runs(rows, config, call=call)
            if not ones:
                continue
            best = max(ones, key=lambda r: r["tflops_per_gpu"])
            tf = best["tflops_per_gpu"]
            add(call, f"{config} 1 GPU >= {goal:.0f} TFLOP/s", best["impl"], tf, tf >= goal)
            ref = _find(here, "torch-sdpa-compile", config)
            if ref:
                mem = best["peak_mem_gb"]
                add(call, f"{config} peak mem <= torch compile ({ref['peak_mem_gb']} GB)",
                    best["impl"], mem, mem <= ref["peak_mem_gb"])  # fmt: skip
            for multi in _runs(rows, config, gpus=2, call=call):
                same = [r for r in ones if _flags(r) == _flags(multi)]
                pairs = [("same flags", same[-1])] if same else []
                pairs.append(("best", best))
                for what, one in pairs:
                    if multi.get("dp") == 2:
                        x = multi["tokens_per_s"] / one["tokens_per_s"]
                        add(call, f"{config} DP=2 >= 1.9x one GPU ({what})", multi["impl"],
                            f"{x:.3f}x", x >= 1.9)  # fmt: skip
                    elif multi.get("tp") == 2 and multi.get("sp"):
                        x = multi["tflops_per_gpu"] / one["tflops_per_gpu"]
                        add(call, f"{config} TP=2+SP >= 85% of one GPU ({what})", multi["impl"],
                            f"{100 * x:.1f}%", x >= 0.85)  # fmt: skip
    return out


def profiles(rows) -> list[str]:
    out = ["", "| profiled run | config | step ms | kernel ms | busy | by category (ms) |"]
    out.append("|---|---|---|---|---|---|")
    for r in rows:
        prof = r.get("profile") if "profile" in r else (r if "by_category_ms" in r else None)
        if prof:
            cats = ", ".join(f"{k.split(' ')[0]} {v}" for k, v in prof["by_category_ms"].items())
            out.append(
                f"| {r['impl']} | {r['config']} | {prof['step_ms']} | "
                f"{prof['kernel_ms_per_step']} | {prof['busy']} | {cats} |"
            )
    return out


def main(paths: list[str]) -> None:
    rows = load(paths)
    print("\n".join(table(rows) + ratios(rows) + targets(rows) + profiles(rows)))


if __name__ == "__main__":
    main(sys.argv[1:])
