"""`gigatron estimate` against bench_gpt.py on this GPU: step time and peak memory.

    python3 bench/estimate/calibrate.py --out $OUT/h200.json --trace-config "..."  # run.sh: both
    python3 bench/estimate/estimate_check.py --calibration $OUT/h200.json

For gpt-1.3b and gpt-125m: the estimate of bench_gpt's one-GPU step (its model as `gigatron
train` flags; its precision: bf16 parameters, bf16 fused-AdamW moments, no main copy, gradients
freed between steps), then bench_gpt.py measured eager (`--compile none`, what the estimate
models) and compiled (its best path, for reference: Inductor keeps other tensors). One
`RESULT {json}` line per config with both, their ratios and the targets (time within 15%,
peak memory within 10%).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench._lib.args import CONFIGS  # noqa: E402

EAGER = ["--compile", "none", "--no-input-checks"]
COMPILED = ["--no-input-checks", "--gelu", "tanh", "--compile", "model", "--ce", "chunked"]


def train_flags(config: str) -> list[str]:
    """bench_gpt's model for `config` as `gigatron train` flags (bench_gpt.build_model)."""
    c = CONFIGS[config]
    return [
        "--num-layers", str(c["layers"]), "--hidden-size", str(c["hidden"]),
        "--num-attention-heads", str(c["heads"]), "--seq-length", str(c["seq"]),
        "--max-position-embeddings", str(c["seq"]), "--micro-batch-size", str(c["mbs"]),
        # gigatron train's NullTokenizer adds the EOD id: vocab - 1 + 1 = bench_gpt's V
        "--vocab-size", str(c["vocab"] - 1), "--make-vocab-size-divisible-by", "1", "--bf16",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--cross-entropy-loss-fusion",
    ]  # fmt: skip


def estimated(config: str, calibration: dict) -> dict:
    from gigatron.tools.estimate.args import estimate_args
    from gigatron.tools.estimate.memory import Precision
    from gigatron.tools.estimate.report import estimate_rank

    args = estimate_args([*train_flags(config), "--world-size", "1"])
    # bench_gpt: zero_grad(set_to_none) frees the grads and there is no DDP buffer at DP 1;
    # they come back as backward frees activations, so the peak (backward's start) has none
    precision = Precision(param=2, grad=0, master=0, moment=2)
    r = estimate_rank(args, 0, calibration=calibration, precision=precision)
    t = r["time"]
    t["optimizer_s"] += r["params"] * 2 / (calibration["memory_gbps"] * 1e9)  # grads read
    t["step_s"] += r["params"] * 2 / (calibration["memory_gbps"] * 1e9)
    return {"iter_s": t["step_s"], "peak_gib": r["peak_bytes"] / 2**30, "time": t}


def measured(config: str, extra: list[str]) -> dict | None:
    cmd = [sys.executable, "bench/gpt/bench_gpt.py", "--config", config, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return None
    res = json.loads(lines[-1][len("RESULT ") :])
    return {"iter_s": res["iter_s"], "peak_gib": res["peak_mem_gb"]}  # bench_gpt: GiB (2**30)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calibration", help="the table bench/estimate/calibrate.py wrote")
    p.add_argument("--configs", nargs="+", default=["gpt-1.3b", "gpt-125m"])
    p.add_argument(
        "--print-flags", metavar="CONFIG", help="print CONFIG's `gigatron train` flags and exit"
    )
    p.add_argument(
        "--modes", default="eager,compiled", help="bench_gpt runs to compare: eager,compiled"
    )
    a = p.parse_args(argv)
    if a.print_flags:
        print(" ".join(train_flags(a.print_flags)))
        return
    if not a.calibration:
        p.error("--calibration is required")
    from gigatron.tools.estimate.timing import load_calibration

    table = load_calibration(a.calibration)
    for config in a.configs:
        est = estimated(config, table)
        out = {"impl": "estimate-check", "config": config, "estimate": est}
        for label, extra in (("eager", EAGER), ("compiled", COMPILED)):
            if label not in a.modes.split(","):
                continue
            got = measured(config, extra)
            out[label] = got
            if got:
                out[f"{label}_time_ratio"] = round(est["iter_s"] / got["iter_s"], 3)
                out[f"{label}_memory_ratio"] = round(est["peak_gib"] / got["peak_gib"], 3)
        out["targets"] = {
            "time_within_15pct": abs(out.get("eager_time_ratio", 0) - 1) <= 0.15,
            "memory_within_10pct": abs(out.get("eager_memory_ratio", 0) - 1) <= 0.10,
        }
        print("RESULT", json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
