"""One `RESULT {json}` line from a `pretrain_gpt` log (the training loop's own throughput), for
the device scripts' results.jsonl:

    python bench/tools/parse_train_log.py LOG --label L --config gpt-1.3b-train --gpus 1

Reads the last iteration log line (Megatron's format: `elapsed time per iteration (ms): ...`,
`tokens/s: ...`, `throughput per GPU (TFLOP/s/GPU): ...`, `max GPU memory` on GPU) and
prints impl `gigatron-train-<label>`; exits 1 when the log has fewer than two iteration lines
(the first window holds the warm-up and compilation).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

PEAK = 989e12  # bench/anchors/gpt_flops.py's H200 dense bf16 figure
_FIELDS = {
    "iter_ms": r"elapsed time per iteration \(ms\): ([0-9.]+)",
    "tokens_per_s": r"tokens/s: ([0-9.]+)",
    "tflops_per_gpu": r"throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+)",
    "lm_loss": r"lm loss: ([0-9.E+-]+)",
    "peak_mem_gb": r"max GPU memory ([0-9.]+) GiB",
}


def parse(text: str) -> dict | None:
    """The last iteration line's figures (None when there is none, or only the first one: its
    window holds the warm-up and compilation, not the training speed)."""
    lines = [line for line in text.splitlines() if "elapsed time per iteration" in line]
    if len(lines) < 2:
        return None
    out = {}
    for key, pattern in _FIELDS.items():
        m = re.search(pattern, lines[-1])
        out[key] = float(m.group(1)) if m else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--label", required=True)
    ap.add_argument("--config", default="gpt-1.3b-train")
    ap.add_argument("--gpus", type=int, default=1)
    a = ap.parse_args(argv)
    with open(a.log, errors="replace") as f:
        got = parse(f.read())
    if got is None:
        print(f"fewer than two iteration lines in {a.log} (the first is warm-up)", file=sys.stderr)
        return 1
    tf = got["tflops_per_gpu"]
    result = {
        "impl": f"gigatron-train-{a.label}",
        "config": a.config,
        "gpus": a.gpus,
        "tp": 1,
        "dp": a.gpus,
        "tokens_per_s": round(got["tokens_per_s"] or 0),
        "tflops_per_gpu": tf,
        "mfu": round(tf * 1e12 / PEAK, 4) if tf is not None else None,
        "peak_mem_gb": got["peak_mem_gb"],
        "iter_ms": got["iter_ms"],
        "lm_loss": got["lm_loss"],
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
