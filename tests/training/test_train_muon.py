"""`pretrain_gpt` with `--optimizer muon` (and `lion`) on 2 gloo ranks at TP 2: the loss falls
over 12 iterations, and a run resumed from its iteration-3 checkpoint (Muon momentum buffers and
Adam moments in the optimizer state) continues with the uninterrupted run's losses."""

import pytest
import torch

from gigatron.testing import run_distributed
from tests.training._gpt_runs import run_pretrain_gpt

pytestmark = pytest.mark.multirank

ARGS = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--group-query-attention", "--num-query-groups", "2",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
    "--global-batch-size", "4", "--lr", "3e-3", "--mock-data", "--vocab-size", "100",
    "--log-interval", "100", "--eval-interval", "1000", "--eval-iters", "0",
    "--no-progress-bar", "--num-workers", "0", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--seed", "5", "--tensor-model-parallel-size", "2",
]  # fmt: skip


def _losses(extra):
    torch.set_num_threads(1)
    result = run_pretrain_gpt(ARGS + extra)
    return [h["losses"].get("lm loss") for h in result["history"]]


def _run(extra):
    return run_distributed(_losses, 2, args=(extra,), timeout=300)[0]


@pytest.mark.parametrize("optimizer", ["muon", "lion"])
def test_loss_falls(optimizer):
    extra = ["--optimizer", optimizer, "--train-iters", "12"]
    if optimizer == "lion":
        extra += ["--lr", "1e-3"]
    losses = _run(extra)
    assert len(losses) == 12 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses


def test_muon_checkpoint_resume_continues_identically(tmp_path):
    muon = ["--optimizer", "muon", "--muon-nesterov", "--train-iters", "6"]
    full = _run(muon)
    _run(muon + ["--save", str(tmp_path), "--save-interval", "3", "--exit-interval", "3"])
    resumed = _run(muon + ["--load", str(tmp_path)])
    assert len(resumed) == 3
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(full[3:]), rtol=0, atol=1e-6)
