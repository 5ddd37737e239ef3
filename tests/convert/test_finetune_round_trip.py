"""HF -> gigatron -> fine-tune on the command line -> HF keeps transformers' logits, per family.

A tiny random-weight model with a byte-level BPE `tokenizer.json` is saved by transformers and
converted with `gigatron convert`; `gigatron train --load OUT --finetune` runs 3 steps with only
data and schedule flags (the model shape, GELU variant, norms, RoPE, biases, MoE router and
tokenizer come from the checkpoint's saved args) and saves; `gigatron convert gigatron-to-hf
--load TUNED` exports it with no --hf-config (config.json from the saved args, tokenizer files
from the directory they name). transformers loads the export, and its logits equal, to 1e-5,
the logits gigatron computes from the fine-tuned checkpoint with the model its saved args
describe (`gigatron.tools.generate.load_model`, what `gigatron generate` runs). Every weight
moved (training happened) but by at most what 3 Adam steps of lr 1e-3 allow (training started
from the converted weights).

GPT-2 runs all three commands as subprocesses of `python -m gigatron.cli`; Llama fine-tunes at
TP 2 on 2 gloo ranks; the others run `pretrain` on one rank. Weights are drawn with std 0.1, so
GPT-2 trained with erf GELU (no `--openai-gelu`, before issue 30) misses transformers'
`gelu_new` by ~4e-4, and a fine-tune without model flags stopped at `--num-layers is required`.
"""

import os
import subprocess
import sys

import pytest
import torch

from gigatron.testing import run_distributed
from tests._paths import REPO
from tests.convert.test_hf_fixtures import FAMILIES, make_hf_model

pytestmark = pytest.mark.multirank


transformers = pytest.importorskip("transformers")
ROOT = str(REPO)
LR, STEPS, INIT_STD = 1e-3, 3, 0.1
TRAIN = [
    "--finetune", "--save-interval", str(STEPS), "--train-iters", str(STEPS),
    "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--lr", str(LR), "--min-lr", str(LR), "--weight-decay", "0", "--mock-data",
    "--log-interval", "1", "--eval-iters", "0", "--no-progress-bar", "--num-workers", "0",
]  # fmt: skip
RANKS = {"llama": 2}  # at TP 2; the rest on one rank


def _cli(args: list[str], cwd: str) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "gigatron.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, f"gigatron {' '.join(args)}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def _finetune(argv: list[str]):
    from tests.training._gpt_runs import run_pretrain_gpt

    return run_pretrain_gpt(argv)["iteration"]


def _gigatron_logits(load: str, ids: torch.Tensor) -> torch.Tensor:
    from gigatron.tools.generate import load_model

    model, args = load_model(["--load", load])
    with torch.no_grad():
        return model(ids, None, None)[..., : args.vocab_size]


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_finetune_on_cli_and_back_keeps_logits(family, tmp_path):
    from gigatron.cli import main as cli

    hf_dir, conv = str(tmp_path / "hf"), str(tmp_path / "conv")
    tuned, out = str(tmp_path / "tuned"), str(tmp_path / "out")
    seed = FAMILIES.index(family)
    make_hf_model(family, hf_dir, seed=seed, tokenizer=True, init_std=INIT_STD)
    train = ["train", "--load", conv, "--save", tuned, *TRAIN]
    export = ["convert", "gigatron-to-hf", "--load", tuned, "--save", out]
    if family == "gpt2":
        _cli(["convert", "--load", hf_dir, "--save", conv], str(tmp_path))
        printed = _cli(train, str(tmp_path))
        assert f"loading {conv}: a gpt2 checkpoint from Hugging Face" in printed
        assert "openai_gelu" in printed and "from the command line: seq_length" in printed
        _cli(export, str(tmp_path))
    else:
        assert cli(["convert", "--load", hf_dir, "--save", conv]) == 0
        ranks = RANKS.get(family, 1)
        argv = train[1:] + ["--tensor-model-parallel-size", str(ranks)]
        assert run_distributed(_finetune, ranks, args=(argv,), timeout=240) == [STEPS] * ranks
        assert cli(export) == 0
    _check_export(family, hf_dir, tuned, out)


def _check_export(family: str, hf_dir: str, tuned: str, out: str) -> None:
    """Same tensors as the original, each moved by training; transformers on the export gives
    the logits gigatron computes from the fine-tuned checkpoint."""
    from gigatron.convert.hf_io import HFReader

    assert os.path.exists(os.path.join(out, "tokenizer.json"))
    orig, new = HFReader(hf_dir), HFReader(out)
    assert sorted(orig.keys()) == sorted(new.keys())
    for name in orig.keys():
        a, b = orig.get(name), new.get(name)
        assert (a.shape, a.dtype) == (b.shape, b.dtype), name
        moved = (a - b).abs().max().item()
        assert 0 < moved <= STEPS * LR * 1.05, f"{name}: moved {moved}"

    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(
        0, hf.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        want = hf(input_ids=ids).logits
    (got,) = run_distributed(_gigatron_logits, 1, args=(tuned, ids), timeout=120)
    err = (got - want).abs().max().item()
    print(f"{family}: max |gigatron - transformers| logits after the fine-tune = {err:.2e}")
    assert got.shape == want.shape and err <= 1e-5, f"{family}: {err}"


def _finetune_printing(argv: list[str]):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        iteration = _finetune(argv)
    return iteration, out.getvalue()


def test_train_load_hf_dir_without_model_flags(tmp_path):
    """`gigatron train --load HF_DIR`: model, tokenizer and vocabulary (config.json's 400 rows,
    past the tokenizer's 300, as Qwen2's hub configs pad) come from the directory and one line
    says so; the saved checkpoint exports with no --hf-config and keeps transformers' logits."""
    hf_dir, tuned, out = str(tmp_path / "hf"), str(tmp_path / "tuned"), str(tmp_path / "out")
    make_hf_model("qwen2", hf_dir, seed=7, tokenizer=True, init_std=INIT_STD, vocab=400)
    argv = ["--load", hf_dir, "--save", tuned, *TRAIN]
    ((iteration, printed),) = run_distributed(_finetune_printing, 1, args=(argv,), timeout=240)
    assert iteration == STEPS
    line = next(x for x in printed.splitlines() if x.startswith(f"loading {hf_dir}"))
    assert "a Hugging Face qwen2 directory (from its config.json)" in line
    assert "add_qkv_bias" in line and "tokenizer_model" in line
    from gigatron.cli import main as cli

    assert cli(["convert", "gigatron-to-hf", "--load", tuned, "--save", out]) == 0
    _check_export("qwen2 from HF_DIR", hf_dir, tuned, out)
