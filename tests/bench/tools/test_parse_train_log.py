"""bench/tools/parse_train_log.py: the runner's (bench/run.sh) RESULT line from a pretrain_gpt
log."""

import json
import os
import subprocess
import sys

from tests._paths import REPO

ROOT = str(REPO)
LINE = (
    " [2026-11-30 12:00:00] iteration       40/      40 | consumed samples:        160 | "
    "elapsed time per iteration (ms): 131.2 | learning rate: 1.000000E-04 | lm loss: "
    "7.512345E+00 | grad norm: 1.234 | num zeros: 0 | number of skipped iterations:   0 | "
    "number of nan iterations:   0 | tokens/s: 62439 | throughput per GPU (TFLOP/s/GPU): "
    "566.123 | MFU: 57.2% | max GPU memory 24.81 GiB"
)


def test_last_iteration_line_becomes_a_result(tmp_path):
    log = tmp_path / "train.log"
    first = LINE.replace("131.2", "400.0").replace("40/", "10/")
    log.write_text("setup noise\n" + first + "\nother\n" + LINE + "\nvalidation loss ...\n")
    script = os.path.join(ROOT, "bench", "tools", "parse_train_log.py")
    out = subprocess.run(
        [sys.executable, script, str(log), "--label", "flat"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    r = json.loads(line[len("RESULT ") :])
    assert r["impl"] == "gigatron-train-flat" and r["config"] == "gpt-1.3b-train"
    assert (r["iter_ms"], r["tokens_per_s"], r["tflops_per_gpu"]) == (131.2, 62439, 566.123)
    assert (r["peak_mem_gb"], r["lm_loss"], r["mfu"]) == (24.81, 7.512345, 0.5724)
    empty = tmp_path / "empty.log"
    empty.write_text("crashed\n")
    bad = subprocess.run([sys.executable, script, str(empty), "--label", "x"], capture_output=True)
    assert bad.returncode == 1
    warmup_only = tmp_path / "warmup.log"  # killed during compilation: no training speed yet
    warmup_only.write_text("setup noise\n" + first + "\n")
    bad = subprocess.run(
        [sys.executable, script, str(warmup_only), "--label", "x"], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "warm-up" in bad.stderr
