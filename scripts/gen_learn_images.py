"""Draw the pictures of docs/learn.md and docs/visualize.md into docs/img/ (one command).

    python scripts/gen_learn_images.py

Planned pictures (layouts, schedules) are the same file on every run. The measured timeline
comes from a real 4-rank CPU run (PP 2 x DP 2, tiny GPT) and the curves from a 40-iteration
one-process run, so those two change from run to run. Takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMG = REPO / "docs" / "img"
CLI = [sys.executable, "-m", "gigatron.cli"]
TINY = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--micro-batch-size 2 --lr 1e-3 --mock-data --vocab-size 100 "
    "--make-vocab-size-divisible-by 64 --eval-iters 2 --no-progress-bar --num-workers 0 "
    "--hidden-dropout 0 --attention-dropout 0"
).split()


def _run(cmd: list[str], **kw) -> None:
    print("$", " ".join(str(c) for c in cmd), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([str(c) for c in cmd], check=True, cwd=REPO, env=env, **kw)


def main() -> int:
    IMG.mkdir(parents=True, exist_ok=True)
    _run(CLI + ["layout", "--world-size", "8", "--tp", "2", "--pp", "2", "--gpus-per-node",
                "4", "--no-table", "--out", IMG / "layout-tp2-pp2-dp2.svg"])  # fmt: skip
    _run(CLI + ["layout", "--world-size", "8", "--tp", "2", "--pp", "2", "--gpus-per-node",
                "4", "--order", "tp-pp-dp", "--no-table", "--out",
                IMG / "layout-tp2-pp2-dp2-order-tp-pp-dp.svg"])  # fmt: skip
    _run(CLI + ["layout", "--world-size", "4", "--pp", "4", "--vpp", "2", "--num-layers", "16",
                "--no-table", "--out", IMG / "layout-pp4-vpp2-chunks.svg"])  # fmt: skip
    _run(CLI + ["schedule", "--pp", "4", "--num-microbatches", "8", "--out",
                IMG / "schedule-1f1b-pp4-m8.svg"])  # fmt: skip
    _run(CLI + ["schedule", "--pp", "4", "--num-microbatches", "8", "--vpp", "2", "--out",
                IMG / "schedule-interleaved-pp4-m8-v2.svg"])  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "timeline.json"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=4"]  # fmt: skip
        _run(torchrun + ["-m", "gigatron.training.pretrain_gpt", *TINY,
                         "--pipeline-model-parallel-size", "2", "--global-batch-size", "16",
                         "--train-iters", "3", "--timeline", trace, "--timeline-iters", "2"],
             stdout=subprocess.DEVNULL)  # fmt: skip
        _run(CLI + ["schedule", "--from-timeline", trace, "--out", IMG / "timeline-pp2-dp2.svg"])
        tb = Path(tmp) / "tb"
        _run([sys.executable, "-m", "gigatron.training.pretrain_gpt", *TINY,
              "--global-batch-size", "8", "--train-iters", "40", "--log-interval", "2",
              "--eval-interval", "10", "--tensorboard-dir", tb],
             stdout=subprocess.DEVNULL)  # fmt: skip
        _run(CLI + ["plot", tb, "--out", IMG / "curves.png"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
