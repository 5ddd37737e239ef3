"""pretrain_gpt with `--mtp-num-layers`: the log line and history carry `mtp_{k} loss` beside the
LM loss; PP = 2 (MTP block on the last stage) reproduces the one-rank run step by step; a
checkpoint saved at PP = 2 holds Megatron's MTP keys (`mtp.layers.0.enorm.weight`,
`mtp.layers.0.transformer_layer....`) and resumes on one rank to the uninterrupted curve."""

import pytest
from torch.distributed.checkpoint import FileSystemReader

from gigatron.testing import run_distributed
from tests.training._gpt_runs import ARGS, run_pretrain_gpt

pytestmark = pytest.mark.multirank

MTP = ["--mtp-num-layers", "2", "--position-embedding-type", "rope", "--seed", "5"]


def _run(extra):
    result = run_pretrain_gpt(ARGS + MTP + extra)
    return [h["losses"] for h in result["history"]]


def test_mtp_losses_logged_and_pp2_matches_one_rank():
    (reference,) = run_distributed(_run, 1, args=(["--train-iters", "4"],), timeout=300)
    assert all(set(e) == {"lm loss", "mtp_1 loss", "mtp_2 loss"} for e in reference), reference
    assert all(isinstance(v, float) and v > 0 for e in reference for v in e.values())
    layout = run_distributed(
        _run, 2, args=(["--train-iters", "4", "--pipeline-model-parallel-size", "2"],), timeout=300
    )
    last = layout[1]
    for step, (got, want) in enumerate(zip(last, reference, strict=True)):
        for key, value in want.items():
            assert abs(got[key] - value) <= 1e-5 * max(1.0, abs(value)), (step, key, got, want)


def test_checkpoint_has_megatrons_mtp_keys_and_resumes_on_another_layout(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    (full,) = run_distributed(_run, 1, args=(["--train-iters", "4"],), timeout=300)
    save = ["--train-iters", "4", "--exit-interval", "2", "--pipeline-model-parallel-size", "2"]
    save += ["--save", ckpt]
    run_distributed(_run, 2, args=(save + ["--save-interval", "2"],), timeout=300)
    keys = set(FileSystemReader(f"{ckpt}/iter_0000002").read_metadata().state_dict_metadata)
    for k in range(2):
        for suffix in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight",
                       "transformer_layer.self_attention.linear_qkv.weight"):  # fmt: skip
            assert f"model.mtp.layers.{k}.{suffix}" in keys or f"mtp.layers.{k}.{suffix}" in keys
    assert not any("mtp_model_layer" in key for key in keys)
    (resumed,) = run_distributed(
        _run, 1, args=(["--train-iters", "4", "--load", ckpt],), timeout=300
    )
    assert len(resumed) == 2
    for got, want in zip(resumed, full[2:], strict=True):
        for key, value in want.items():
            assert abs(got[key] - value) <= 1e-5 * max(1.0, abs(value)), (key, got, want)
