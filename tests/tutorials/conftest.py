"""Run the tutorial programs as a learner does: through the `megatron.core` alias, on CPU ranks.

`launch(nproc, script, *args)` runs `torchrun --nproc-per-node N -m gigatron.compat.megatron
script ...` (nproc 0: plain `python -m gigatron.compat.megatron script ...`) from the repository
root with gloo on CPU and returns stdout + stderr. `wordpiece_corpus` is the BERT / T5 tutorial's
corpus, made and preprocessed once per session as docs/learn.md says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = "examples/tutorials"


def launch(nproc: int, script: str, *args: str, ok: bool = True, timeout: int = 150) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable]
    if nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "gigatron.compat.megatron", script, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == ok, f"exit status {proc.returncode}\n{out[-6000:]}"
    return out


def preprocess(jsonl: Path, prefix: Path, vocab: Path) -> str:
    """`gigatron preprocess ... --tokenizer-type BertWordPieceLowerCase`; the .bin/.idx prefix."""
    from gigatron.cli import main as cli_main

    argv = ["preprocess", "--input", str(jsonl), "--output-prefix", str(prefix),
            "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", str(vocab)]  # fmt: skip
    assert cli_main(argv) == 0
    return f"{prefix}_text_document"


@pytest.fixture(scope="session")
def wordpiece_corpus(tmp_path_factory) -> tuple[str, str]:
    """(preprocessed prefix, vocab.txt) of make_wordpiece_corpus.py's corpus."""
    out = tmp_path_factory.mktemp("wordpiece")
    script = ROOT / TUTORIALS / "make_wordpiece_corpus.py"
    subprocess.run([sys.executable, str(script), str(out)], check=True, capture_output=True)
    vocab = out / "vocab.txt"
    return preprocess(out / "corpus.jsonl", out / "corpus", vocab), str(vocab)
