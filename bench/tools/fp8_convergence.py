"""Curves of the FP8 convergence run: bf16 and FP8 `pretrain_gpt` logs -> one `RESULT {json}`.

    python bench/tools/fp8_convergence.py BF16.log FP8.log

Reads each log's training loss per logged iteration, the validation loss at each evaluation and
the final evaluation (`validation loss at iteration N on validation set`), and prints both curves
and the relative difference of the final validation losses (issue 33: within 1%). Exits 1 when
a log has no final validation line (a run that failed or was cut short).
"""

from __future__ import annotations

import json
import re
import sys

_TRAIN = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.E+-]+)")
_TOKENS = re.compile(r"iteration\s+\d+/\s*\d+ \|.*?tokens/s: ([0-9.]+)")
_VALID = re.compile(
    r"validation loss at iteration (\d+)( on validation set)? \| lm loss value: ([0-9.E+-]+)"
)


def curves(text: str) -> dict:
    train = {int(i): float(x) for i, x in _TRAIN.findall(text)}
    valid, final = {}, None
    for it, last, value in _VALID.findall(text):
        if last:
            final = float(value)
        else:
            valid[int(it)] = float(value)
    tokens = [float(x) for x in _TOKENS.findall(text)][1:]  # the first window holds compilation
    return {
        "train_loss": train,
        "valid_loss": valid,
        "final_valid_loss": final,
        "tokens_per_s_median": sorted(tokens)[len(tokens) // 2] if tokens else None,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = {}
    for name, path in zip(("bf16", "fp8"), argv):
        with open(path, encoding="utf-8", errors="replace") as f:
            runs[name] = curves(f.read())
    if any(r["final_valid_loss"] is None for r in runs.values()):
        print(json.dumps({"failed": "fp8-convergence: a run has no final validation loss"}))
        return 1
    b, f = runs["bf16"]["final_valid_loss"], runs["fp8"]["final_valid_loss"]
    out = {"impl": "gigatron-fp8-convergence", "config": "gpt-125m-code", **runs}
    out["final_valid_rel_diff"] = round((f - b) / b, 5)
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
