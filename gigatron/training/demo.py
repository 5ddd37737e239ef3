"""`make train`: the end-to-end demo on a corpus every machine has offline.

1. Corpus: the Python standard library's own source files (a few MB of real text), as JSON lines.
2. Tokenizer: a byte-level BPE trained on that corpus (`gigatron train-tokenizer`).
3. Data: tokenized to Megatron's .bin/.idx format (`gigatron preprocess`).
4. Training: a small GPT with TP = 2 over 2 ranks (`torchrun`; gloo on CPU, NCCL on GPUs), with
   validation every few dozen steps and a checkpoint at the end.
5. A sample generated from the checkpoint.
6. The run's curves (`gigatron plot`: loss, learning rate, grad norm, throughput) in
   DEMO_DIR/curves.png, when tensorboard and matplotlib are installed (`make setup` installs both).

Every step is skipped when its output already exists, so a second `make train` resumes training
from the checkpoint instead of starting over; when the checkpoint already holds DEMO_ITERS
iterations it says so in one line and only samples (`DEMO_ITERS=800 make train` trains on,
`make train-fresh` starts over). Settings: environment variables DEMO_ITERS, DEMO_DIR,
DEMO_NPROC.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

CORPUS_BYTES = 6_000_000  # enough text for a few hundred steps without repeating much
VOCAB = 4096


def _log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_corpus(out: Path) -> Path:
    """Python standard library sources -> JSON lines {"text": ...}, in a fixed order."""
    path = out / "stdlib.jsonl"
    if path.exists():
        return path
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    total = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for p in files:
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) < 200:
                continue
            f.write(json.dumps({"text": text}) + "\n")
            total += len(text)
            if total >= CORPUS_BYTES:
                break
    tmp.rename(path)
    _log(f"corpus: {total / 1e6:.1f} MB of Python standard library source from {root}")
    return path


def _run(cmd: list[str], env=None) -> None:
    _log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, env=env)


def _model_flags(prefix: Path, tokenizer: Path, ckpt: Path, out: Path, iters: int, nproc: int):
    tp = min(2, nproc)
    return shlex.split(
        f"--tensor-model-parallel-size {tp} --num-layers 4 --hidden-size 128 "
        "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
        "--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear "
        "--hidden-dropout 0.0 --attention-dropout 0.0 "
        f"--micro-batch-size 8 --global-batch-size {8 * max(1, nproc // tp)} "
        f"--train-iters {iters} --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine "
        "--lr-warmup-iters 20 --weight-decay 0.1 --clip-grad 1.0 --seed 1234 "
        f"--data-path {prefix}_text_document --split 98,2,0 "
        f"--tokenizer-type HuggingFaceTokenizer --tokenizer-model {tokenizer} "
        "--make-vocab-size-divisible-by 64 --log-interval 20 --eval-interval 100 --eval-iters 4 "
        f"--save {ckpt} --load {ckpt} --save-interval 100 --num-workers 0 "
        f"--data-cache-path {out / 'cache'} "
        # a raised DEMO_ITERS continues on this run's schedule (Megatron refuses a schedule that
        # differs from the checkpoint's unless told which one wins)
        "--override-opt_param-scheduler"
    )


def trained_iterations(ckpt: Path) -> int | None:
    """The iteration of the demo's last checkpoint (Megatron's tracker file), None without one.

    The tracker is read as the small regular file it is (a damaged one: CheckpointingException)."""
    from gigatron.core.dist_checkpointing.checkpoint_files import read_tracker

    found = read_tracker(str(ckpt))
    return None if found is None or found[1] else found[0]


def _can_plot() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("tensorboard", "matplotlib"))


def main(argv: list[str] | None = None) -> int:
    out = Path(os.environ.get("DEMO_DIR", "runs/demo"))
    out.mkdir(parents=True, exist_ok=True)
    iters = int(os.environ.get("DEMO_ITERS", "400"))
    nproc = int(os.environ.get("DEMO_NPROC", "2"))
    cli = [sys.executable, "-m", "gigatron.cli"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}"]  # fmt: skip
    corpus = build_corpus(out)
    tokenizer = out / "tokenizer"
    if not (tokenizer / "tokenizer.json").exists():
        _run(cli + shlex.split(
            f"train-tokenizer --input {corpus} --vocab-size {VOCAB} --output-dir {tokenizer}"
        ))  # fmt: skip
    prefix = out / "stdlib"
    if not Path(f"{prefix}_text_document.idx").exists():
        _run(cli + shlex.split(
            f"preprocess --input {corpus} --output-prefix {prefix} --tokenizer-type "
            f"HuggingFaceTokenizer --tokenizer-model {tokenizer} --append-eod --workers 2"
        ))  # fmt: skip
    ckpt = out / "checkpoints"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    flags = _model_flags(prefix, tokenizer, ckpt, out, iters, nproc)
    curves = _can_plot()
    if curves:
        flags += ["--tensorboard-dir", str(out / "tensorboard")]
    done = trained_iterations(ckpt)
    if done is not None and done >= iters:
        _log(
            f"{ckpt} already holds iteration {done} (DEMO_ITERS={iters}): no training this time. "
            f"`DEMO_ITERS={done + iters} make train` trains on from it, `make train-fresh` starts "
            "over"
        )
    else:
        _run(torchrun + ["-m", "gigatron.training.pretrain_gpt", *flags], env=env)
    prompt = "def read_config(path):\n"
    _run(torchrun + ["-m", "gigatron.cli", "generate", "--load", str(ckpt),
                     "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                     str(tokenizer), "--prompt", prompt, "--max-new-tokens", "80",
                     "--top-k", "20", "--temperature", "0.8", "--seed", "7"], env=env)  # fmt: skip
    if curves:
        _run(cli + ["plot", str(out / "tensorboard"), "--out", str(out / "curves.png")])
    _log(f"done: checkpoint in {ckpt}; `DEMO_ITERS=<more> make train` trains on from it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
