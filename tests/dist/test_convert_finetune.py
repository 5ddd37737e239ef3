"""A converted HF Llama fine-tunes with `gigatron train` (TP2, 2 gloo ranks) and exports to HF.

`gigatron convert` (CLI) turns a transformers-saved Llama into a release checkpoint; `pretrain`
runs 3 steps with `--load <converted> --finetune` and the flags the converter wrote, saving at
the end; `gigatron convert gigatron-to-hf` exports the fine-tuned checkpoint. The export has the
original names, shapes and dtypes, every weight moved (training happened) but by at most what
3 Adam steps of lr 1e-3 allow (so training started from the converted weights, not a random
init), and transformers loads it.
"""

import os

import pytest
import torch

from gigatron.testing import run_distributed
from tests.unit.test_convert_fixtures import make_hf_model

transformers = pytest.importorskip("transformers")
LR, STEPS = 1e-3, 3


def _finetune(converted: str, save: str):
    from gigatron.core import parallel_state as ps
    from gigatron.core.num_microbatches_calculator import unset_num_microbatches_calculator
    from gigatron.training import global_vars, pretrain_gpt
    from gigatron.training.training import pretrain

    unset_num_microbatches_calculator()
    global_vars.destroy_global_vars()
    ps.destroy_model_parallel()
    with open(os.path.join(converted, "gigatron_flags.txt")) as f:
        model_flags = f.read().split()
    argv = model_flags + [
        "--load", converted, "--finetune", "--save", save, "--save-interval", str(STEPS),
        "--train-iters", str(STEPS), "--tensor-model-parallel-size", "2",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--lr", str(LR), "--min-lr", str(LR), "--weight-decay", "0", "--mock-data",
        "--vocab-size", "100", "--make-vocab-size-divisible-by", "64", "--log-interval", "100",
        "--eval-interval", "1000", "--eval-iters", "1", "--no-progress-bar", "--num-workers", "0",
    ]  # fmt: skip
    result = pretrain(
        pretrain_gpt.train_valid_test_datasets_provider,
        pretrain_gpt.model_provider,
        None,
        pretrain_gpt.forward_step,
        argv=argv,
    )
    return result["iteration"], [h["losses"].get("lm loss") for h in result["history"]]


def test_converted_llama_finetunes_and_exports(tmp_path):
    from gigatron.cli import main as cli
    from gigatron.convert.hf_io import HFReader

    hf_dir, conv = str(tmp_path / "hf"), str(tmp_path / "conv")
    tuned, out = str(tmp_path / "tuned"), str(tmp_path / "out")
    make_hf_model("llama", hf_dir)
    assert cli(["convert", "--load", hf_dir, "--save", conv, "--target-tensor-parallel-size", "2",
                "--make-vocab-size-divisible-by", "64"]) == 0  # fmt: skip
    assert os.path.exists(os.path.join(conv, "tokenizer_config.json"))
    results = run_distributed(_finetune, 2, args=(conv, tuned), timeout=300)
    assert all(it == STEPS for it, _ in results)
    losses = results[0][1]
    assert len(losses) == STEPS and all(torch.isfinite(torch.as_tensor(x)).all() for x in losses)

    assert cli(["convert", "gigatron-to-hf", "--load", tuned, "--save", out,
                "--hf-config", conv]) == 0  # fmt: skip
    assert os.path.exists(os.path.join(out, "tokenizer_config.json"))
    orig, new = HFReader(hf_dir), HFReader(out)
    assert sorted(orig.keys()) == sorted(new.keys())
    for name in orig.keys():
        a, b = orig.get(name), new.get(name)
        assert (a.shape, a.dtype) == (b.shape, b.dtype), name
        moved = (a - b).abs().max().item()
        assert 0 < moved <= STEPS * LR * 1.05, f"{name}: moved {moved}"
    model = transformers.LlamaForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.arange(8)[None]).logits).all()
