"""pretrain_cfg_container_from_args: each training config from the parsed flags by field name,
with Megatron's renamed / inverted flags mapped."""

from __future__ import annotations

from gigatron.training.argument_utils import (
    _default_config_from_args,
    pretrain_cfg_container_from_args,
)
from gigatron.training.arguments import parse_args, validate_args
from gigatron.training.config import PretrainConfigContainer, TrainingConfig

_ARGV = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--micro-batch-size 2 --mock-data --lr 1e-3 --train-iters 7 --vocab-size 64 "
    "--tokenizer-type NullTokenizer"
).split()


def _args(*extra):
    return validate_args(parse_args(argv=[*_ARGV, *extra]), world_size=1)


def test_config_takes_the_fields_args_has_and_defaults_the_rest():
    cfg = _default_config_from_args(TrainingConfig, _args())
    assert (cfg.train_iters, cfg.micro_batch_size, cfg.global_batch_size) == (7, 2, 2)


def test_container_maps_inverted_and_renamed_flags():
    args = _args(
        "--no-save-optim", "--no-load-rng", "--profile", "--no-check-for-nan-in-loss-and-grad"
    )
    cfg = pretrain_cfg_container_from_args(args, model_cfg="model")
    assert isinstance(cfg, PretrainConfigContainer)
    assert (cfg.checkpoint.save_optim, cfg.checkpoint.load_rng) == (False, False)
    assert (cfg.checkpoint.save_rng, cfg.checkpoint.load_optim) == (True, True)
    assert cfg.profiling.use_nsys_profiler is True
    assert cfg.rerun_state_machine.check_for_nan_in_loss is False
    assert cfg.optimizer.lr == 1e-3 and cfg.train.train_iters == 7
    assert cfg.model == "model" and cfg.straggler is None
