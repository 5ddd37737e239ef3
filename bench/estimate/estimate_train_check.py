"""`gigatron estimate` against `pretrain_gpt` itself: peak memory and step time of one rank.

    python3 bench/estimate/estimate_train_check.py --calibration h200           # one H200, ~1.5 min
    python3 bench/estimate/estimate_train_check.py --calibration h200 --shape mixtral-8l  # MoE
    python3 bench/estimate/estimate_train_check.py --device cpu --shape tiny    # CPU, ~6 s
    python3 bench/estimate/estimate_train_check.py --device cpu --shape tiny-moe  # CPU, ~17 s

The flags are `bench/run.sh`'s `train_one` recipe at gpt-1.3b's shape (or t_train_moe's
mixtral-8l, or a tiny one for the CPU; bf16 parameters with fp32
main params and grads, the distributed optimizer, the fused cross entropy, mock data, no
dropout), eager (`--torch-compile none`: what the estimate models; `--modes eager,compiled` adds
`--torch-compile model`, t_train's, for reference). The same flags go to `gigatron estimate
... --world-size 1 --json` and to `torchrun --nproc-per-node 1 -m gigatron.training.pretrain_gpt`
(30 iterations logged every 10: the last window is past every compile). Measured peak: on CUDA
the log's `max GPU memory` (`torch.cuda.max_memory_allocated` since the process started); on
the CPU the peak live tensor bytes of the same run (`bench/estimate/live_bytes_run.py
--cuda-kernels`, with `--flat-adam-step`, the distributed optimizer's default step on CUDA only).
Step time: the last log window's `elapsed time per iteration` against the estimate priced with
`--calibration` (CUDA only). One `RESULT {json}` line per mode: both, their ratios and issue 36's
targets (peak within 10%; time within 15%, the target the issue sets for bench_gpt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the repo root: gigatron and bench.* import without an install
from bench.tools.parse_train_log import parse  # noqa: E402

SHAPES = {
    "gpt-1.3b": "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
    "--max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 --vocab-size 50304",
    # bench/run.sh t_train_moe's shape: GroupedMLP, 8 experts, top-2, dropless on one GPU
    "mixtral-8l": "--num-layers 8 --hidden-size 2048 --num-attention-heads 16 "
    "--group-query-attention --num-query-groups 8 --ffn-hidden-size 4096 --seq-length 2048 "
    "--max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 --vocab-size 50304 "
    "--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear "
    "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 4096 --moe-grouped-gemm "
    "--moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2",
    "tiny": "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 256 "
    "--max-position-embeddings 256 --micro-batch-size 4 --global-batch-size 4 --vocab-size 1024",
    "tiny-moe": "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention "
    "--num-query-groups 2 --ffn-hidden-size 128 --seq-length 256 --max-position-embeddings 256 "
    "--micro-batch-size 4 --global-batch-size 4 --vocab-size 1024 --position-embedding-type rope "
    "--normalization RMSNorm --swiglu --disable-bias-linear --num-experts 8 --moe-router-topk 2 "
    "--moe-ffn-hidden-size 128 --moe-grouped-gemm --moe-token-dispatcher-type alltoall "
    "--moe-aux-loss-coeff 1e-2",
}
# bench/run.sh train_one's flags, $NODROP
RECIPE = (
    "--lr 1e-4 --min-lr 1e-5 --mock-data --bf16 --use-distributed-optimizer "
    "--accumulate-allreduce-grads-in-fp32 --cross-entropy-loss-fusion --clip-grad 1.0 "
    "--weight-decay 0.1 --eval-iters 0 --eval-interval 100000 --no-progress-bar "
    "--hidden-dropout 0 --attention-dropout 0"
)
MODES = {"eager": "--torch-compile none", "compiled": "--torch-compile model"}


def train_flags(shape: str, mode: str, device: str, iters: int, log_interval: int) -> list[str]:
    """pretrain_gpt's flags, the estimate's too."""
    flags = [*SHAPES.get(shape, shape).split(), *RECIPE.split(), *MODES[mode].split()]
    flags += ["--train-iters", str(iters), "--log-interval", str(log_interval)]
    if device == "cpu":  # CUDA's default step; off by default on the CPU
        flags.append("--flat-adam-step")
    return flags


def estimated(flags: list[str], calibration: str | None) -> dict:
    cmd = [sys.executable, "-m", "gigatron.cli", "estimate", *flags, "--world-size", "1", "--json"]
    if calibration and calibration != "none":
        cmd += ["--calibration", calibration]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    if proc.returncode:
        raise SystemExit(f"gigatron estimate failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout)["ranks"]["first"]
    out = {k: round(r[k] / 2**30, 6) for k in r if k.endswith("_bytes")}
    out["params"] = r["params"]
    out["flops_per_step"] = r.get("flops_per_step")
    if "time" in r:
        out["iter_ms"] = round(r["time"]["step_s"] * 1e3, 2)
        out["time_ms"] = {k: round(v * 1e3, 2) for k, v in r["time"].items() if k.endswith("_s")}
    return out


def measured(flags: list[str], device: str, timeout: int) -> dict | None:
    entry = ["-m", "gigatron.training.pretrain_gpt"]
    if device == "cpu":
        entry = ["bench/estimate/live_bytes_run.py", "--cuda-kernels", *entry]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
           "--master-port", "29941", *entry, *flags]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    text = proc.stdout + proc.stderr
    got = parse(text)
    if proc.returncode or got is None:
        print(text[-4000:], file=sys.stderr)
        return None
    if device == "cpu":
        m = re.search(r"live-bytes rank 0 peak (\d+)", text)
        got["peak_mem_gb"] = round(int(m.group(1)) / 2**30, 6) if m else None
        got["iter_ms"] = None  # a CPU time says nothing of the GPU's
    return {"peak_gib": got["peak_mem_gb"], "iter_ms": got["iter_ms"],
            "tflops_per_gpu": got["tflops_per_gpu"], "lm_loss": got["lm_loss"]}  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", default="gpt-1.3b", help=f"{' | '.join(SHAPES)} | 'FLAGS'")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if any")
    p.add_argument("--modes", default="eager", help="eager,compiled")
    p.add_argument("--calibration", default="h200", help="the estimate's table (none: no time)")
    p.add_argument("--iters", type=int, default=None, help="default: 30 on CUDA, 4 on the CPU")
    p.add_argument("--timeout", type=int, default=240, help="seconds for each pretrain_gpt run")
    p.add_argument("--print-flags", action="store_true", help="print the flags and exit")
    a = p.parse_args(argv)
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    iters = a.iters or (30 if a.device == "cuda" else 4)
    log_interval = max(1, iters // 3)
    for mode in a.modes.split(","):
        flags = train_flags(a.shape, mode, a.device, iters, log_interval)
        if a.print_flags:
            print(" ".join(flags))
            continue
        est = estimated(flags, a.calibration if a.device == "cuda" else None)
        got = measured(flags, a.device, a.timeout)
        out = {
            "impl": "estimate-train",
            "config": a.shape if a.shape in SHAPES else "custom",
            "mode": mode,
            "device": a.device,
            "estimate": est,
            "measured": got,
            "command": "gigatron estimate " + " ".join(flags) + " --world-size 1",
            "gigatron_commit": os.environ.get("GIGATRON_COMMIT"),
        }
        if got and got["peak_gib"]:
            out["memory_ratio"] = round(est["peak_bytes"] / got["peak_gib"], 4)
        if got and got["iter_ms"] and est.get("iter_ms"):
            out["time_ratio"] = round(est["iter_ms"] / got["iter_ms"], 4)
        out["targets"] = {
            "memory_within_10pct": abs(out.get("memory_ratio", 0) - 1) <= 0.10,
            "time_within_15pct": abs(out["time_ratio"] - 1) <= 0.15
            if "time_ratio" in out
            else None,
        }
        print("RESULT", json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
