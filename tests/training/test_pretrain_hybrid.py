"""pretrain_hybrid: Megatron-LM's examples/mamba/train.sh flags, scaled down (tiny hybrid
"M*M-", mock data, fp32 instead of --bf16), train on one rank and at TP 2 (sequence parallel,
distributed optimizer) x PP 2 (the pattern split by '|') with equal losses (1e-5); the TP2 x PP2
run's torch_dist checkpoint resumes on one rank and gives the one-rank run's next loss."""

import pytest
import torch.distributed as dist

from gigatron.testing import run_distributed
from tests.training._gpt_runs import reset_globals

pytestmark = pytest.mark.multirank

# examples/mamba/train.sh's options, shapes shrunk (no --bf16 / --tensorboard-dir on CPU)
TRAIN_SH = [
    "--sequence-parallel", "--use-distributed-optimizer", "--overlap-param-gather",
    "--overlap-grad-reduce", "--untie-embeddings-and-output-weights", "--init-method-std", "0.02",
    "--position-embedding-type", "none", "--hidden-size", "32", "--num-attention-heads", "4",
    "--group-query-attention", "--num-query-groups", "2", "--seq-length", "16",
    "--max-position-embeddings", "16", "--split", "99,1,0", "--micro-batch-size", "2",
    "--global-batch-size", "4", "--lr", "2.5e-3", "--min-lr", "2.5e-4",
    "--lr-decay-style", "cosine", "--lr-warmup-samples", "4", "--lr-decay-samples", "20",
    "--weight-decay", "0.1",
    "--clip-grad", "1.0", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--disable-bias-linear", "--normalization", "RMSNorm", "--adam-beta1", "0.9",
    "--adam-beta2", "0.95", "--log-interval", "100", "--eval-interval", "1000", "--eval-iters", "0",
    "--use-mcore-models", "--no-create-attention-mask-in-dataloader",
    "--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec",
    # tiny Mamba layers, mock data, a fixed seed
    "--mamba-num-heads", "8", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
    "--mamba-state-dim", "16", "--mock-data", "--vocab-size", "100",
    "--make-vocab-size-divisible-by", "64", "--no-progress-bar", "--num-workers", "0",
    "--seed", "5",
]  # fmt: skip


def _losses(extra):
    from gigatron.training import pretrain_hybrid
    from gigatron.training.training import pretrain

    reset_globals()
    result = pretrain(
        pretrain_hybrid.train_valid_test_datasets_provider, pretrain_hybrid.model_provider, None,
        pretrain_hybrid.forward_step, argv=TRAIN_SH + extra,
    )  # fmt: skip
    losses = [h["losses"].get("lm loss") for h in result["history"]]
    return losses if dist.get_rank() == dist.get_world_size() - 1 else None


def test_train_sh_flags_train_at_tp2_pp2_equal_one_rank_and_resume_on_one_rank(tmp_path):
    one = ["--hybrid-layer-pattern", "M*M-", "--train-samples", "20"]
    (reference,) = run_distributed(_losses, 1, args=(one,), timeout=300)
    layout = ["--hybrid-layer-pattern", "M*|M-", "--train-samples", "16",
              "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
              "--save", str(tmp_path), "--save-interval", "1000"]  # fmt: skip
    (sharded,) = [r for r in run_distributed(_losses, 4, args=(layout,), timeout=300) if r]
    assert len(reference) == 5 and len(sharded) == 4
    for step, (a, b) in enumerate(zip(sharded, reference[:4])):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (step, a, b)
    # the TP2 x PP2 run stopped at 16 samples: continue on the flags' 20-sample schedule
    resumed = one + ["--load", str(tmp_path), "--override-opt_param-scheduler"]
    ((last,),) = run_distributed(_losses, 1, args=(resumed,), timeout=300)
    assert abs(last - reference[4]) <= 1e-5 * max(1.0, abs(reference[4])), (last, reference)
