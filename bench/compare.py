"""Table and ratios from a results.jsonl written by bench/run_gpu.sh (one RESULT object a line).

    python bench/compare.py results.jsonl [more.jsonl ...]

Prints a markdown table of every run, then gigatron-fast against each anchor on the same config
(throughput ratio; the FLOP formula is shared, so TFLOP/s ratios are equal), then the issue's
targets (gpt-1.3b >= 620 TFLOP/s, gpt-125m >= 480, peak memory <= torch compile, DP=2 >= 1.9x the
one-GPU tokens/s, TP=2+SP >= 85% of the one-GPU TFLOP/s per GPU) with pass/fail.
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
        "| impl | config | GPUs | layout | tokens/s | TFLOP/s/GPU | MFU | peak GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            out.append(f"| FAILED: `{r['failed']}` (rc {r['rc']}) | | | | | | | |")
            continue
        if "tokens_per_s" not in r:
            continue  # a profile-only row (compare_profile.py)
        layout = f"tp{r.get('tp', r.get('gpus'))}" + ("+sp" if r.get("sp") else "")
        layout += f" dp{r.get('dp', 1)}"
        out.append(
            f"| {r['impl']} | {r['config']} | {r['gpus']} | {layout} | {r['tokens_per_s']:,} | "
            f"{r['tflops_per_gpu']} | {100 * r['mfu']:.1f}% | {r['peak_mem_gb']} |"
        )
    return out


def ratios(rows) -> list[str]:
    out = ["", "| config | gigatron-fast vs | ratio |", "|---|---|---|"]
    for config in ("gpt-125m", "gpt-1.3b"):
        fast = _find(rows, "gigatron-fast", config)
        for anchor in ANCHORS:
            ref = _find(rows, anchor, config)
            if fast and ref:
                out.append(
                    f"| {config} | {anchor} | {fast['tokens_per_s'] / ref['tokens_per_s']:.2f}x |"
                )
    return out


def targets(rows) -> list[str]:
    out = ["", "| target | measured | pass |", "|---|---|---|"]

    def add(name, value, ok):
        out.append(f"| {name} | {value} | {'yes' if ok else 'NO'} |")

    for config, goal in (("gpt-1.3b", 620.0), ("gpt-125m", 480.0)):
        fast = _find(rows, "gigatron-fast", config)
        if fast:
            add(
                f"{config} 1 GPU >= {goal:.0f} TFLOP/s",
                fast["tflops_per_gpu"],
                fast["tflops_per_gpu"] >= goal,
            )
            ref = _find(rows, "torch-sdpa-compile", config)
            if ref:
                add(
                    f"{config} peak mem <= torch compile ({ref['peak_mem_gb']} GB)",
                    fast["peak_mem_gb"],
                    fast["peak_mem_gb"] <= ref["peak_mem_gb"],
                )
    for config in ("gpt-125m", "gpt-1.3b"):
        one = _find(rows, "gigatron-fast-1gpu-here", config) or _find(rows, "gigatron-fast", config)
        for label in ("fast-dp2-overlap", "fast-dp2-no-overlap"):
            dp2 = _find(rows, "gigatron-" + label, config, gpus=2)
            if one and dp2:
                x = dp2["tokens_per_s"] / one["tokens_per_s"]
                add(f"{config} {label} >= 1.9x one GPU", f"{x:.2f}x", x >= 1.9)
    one = _find(rows, "gigatron-fast-1gpu-here", "gpt-1.3b") or _find(
        rows, "gigatron-fast", "gpt-1.3b"
    )
    for label in ("fast-tp2-sp", "fast-tp2-sp-eager"):
        tp2 = _find(rows, "gigatron-" + label, "gpt-1.3b", gpus=2)
        if one and tp2:
            x = tp2["tflops_per_gpu"] / one["tflops_per_gpu"]
            add(f"gpt-1.3b {label} >= 85% of one-GPU TFLOP/s", f"{100 * x:.0f}%", x >= 0.85)
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
