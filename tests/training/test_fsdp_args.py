"""`--use-megatron-fsdp` / `--use-torch-fsdp2`: Megatron's rules and gigatron's limits refused
by validate_args in one line naming the flags, before any process group exists; accepted
combinations fill the DDP config Megatron's way (dtype names -> torch dtypes, the distributed
optimizer turned on for Megatron-FSDP)."""

import pytest
import torch

from gigatron.training._config_from_args import ddp_config_from_args
from gigatron.training.arguments import parse_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2",
        "--lr", "1e-3", "--mock-data", "--vocab-size", "100"]  # fmt: skip
MFSDP = ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]
TFSDP = ["--use-torch-fsdp2", "--untie-embeddings-and-output-weights"]


def _validate(extra, world_size=4):
    return validate_args(parse_args(argv=BASE + extra), world_size)


@pytest.mark.parametrize(
    "extra, message",
    [
        (MFSDP + TFSDP, "--use-megatron-fsdp and --use-torch-fsdp2 are mutually exclusive"),
        (["--use-megatron-fsdp"], "--use-megatron-fsdp requires --ckpt-format fsdp_dtensor"),
        (MFSDP + ["--pipeline-model-parallel-size", "2"], "--use-megatron-fsdp: --pipeline"),
        (MFSDP + ["--expert-model-parallel-size", "2", "--num-experts", "4"],
         "--use-megatron-fsdp: --expert-model-parallel-size 2"),
        (MFSDP + ["--fp16"], "--use-megatron-fsdp: --fp16 is not supported"),
        (MFSDP + ["--optimizer", "muon"], "--use-megatron-fsdp: --optimizer muon"),
        (["--use-torch-fsdp2"], "requires --untie-embeddings-and-output-weights"),
        (TFSDP + ["--use-distributed-optimizer"], "not supported with --use-distributed-opt"),
        (TFSDP + ["--ckpt-format", "fsdp_dtensor"], "--ckpt-format fsdp_dtensor needs --use-meg"),
        (TFSDP + ["--pipeline-model-parallel-size", "2"], "--use-torch-fsdp2: --pipeline"),
        (["--ckpt-format", "torch_dcp"], "--ckpt-format torch_dcp needs --use-torch-fsdp2"),
    ],
)  # fmt: skip
def test_fsdp_combination_is_refused_in_one_line(extra, message):
    with pytest.raises(ValueError, match=message) as err:
        _validate(extra)
    assert "\n" not in str(err.value)


def test_megatron_fsdp_flags_fill_the_ddp_config():
    args = _validate(MFSDP + ["--data-parallel-sharding-strategy", "optim", "--bf16",
                              "--megatron-fsdp-grad-comm-dtype", "bf16"])  # fmt: skip
    assert args.use_distributed_optimizer and args.use_custom_fsdp
    cfg = ddp_config_from_args(args)
    assert cfg.use_megatron_fsdp and cfg.data_parallel_sharding_strategy == "optim"
    assert cfg.megatron_fsdp_grad_comm_dtype is torch.bfloat16
    assert cfg.megatron_fsdp_main_grads_dtype is None  # "auto"
    assert cfg.grad_reduce_in_fp32  # --bf16 without --grad-reduce-in-bf16


def test_megatron_fsdp_fp16_grad_dtype_is_refused_before_any_process_group():
    with pytest.raises(ValueError, match="--megatron-fsdp-main-grads-dtype fp16 is not"):
        _validate(MFSDP + ["--megatron-fsdp-main-grads-dtype", "fp16"])
