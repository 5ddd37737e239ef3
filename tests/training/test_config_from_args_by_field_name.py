"""Core configs are filled from the flags by field name; TRANSFORMER_EXCEPTIONS maps the flags
whose name or meaning differs, and Megatron's no-op fusion flags never reach the config."""

from __future__ import annotations

import argparse

from gigatron.training import _config_from_args as cfa
from gigatron.training.arguments import parse_args, validate_args
from gigatron.training.utils import PARALLEL_SIZE_FLAGS, args_by_name

_ARGV = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
    "--micro-batch-size 2 --mock-data --lr 1e-3 --train-iters 3 --vocab-size 64 "
    "--tokenizer-type NullTokenizer"
).split()


def _args(*extra):
    return validate_args(parse_args(argv=[*_ARGV, *extra]), world_size=1)


def test_a_flag_named_like_a_field_sets_it():
    config = cfa.core_transformer_config_from_args(_args("--init-method-std", "0.05"))
    assert config.init_method_std == 0.05 and config.num_layers == 2


def test_renamed_flags_follow_the_exceptions_table():
    config = cfa.core_transformer_config_from_args(
        _args("--norm-epsilon", "1e-6", "--disable-bias-linear", "--swiglu")
    )
    assert config.layernorm_epsilon == 1e-6
    assert config.add_bias_linear is False and config.gated_linear_unit is True


def test_no_op_fusion_flags_do_not_reach_the_config():
    args = _args()
    assert args.masked_softmax_fusion is True  # the flag's default (--no-masked-softmax-fusion)
    assert cfa.core_transformer_config_from_args(args).masked_softmax_fusion is False


def test_optimizer_and_ddp_configs_by_field_name():
    args = _args("--adam-beta2", "0.95", "--overlap-grad-reduce", "--bf16")
    assert cfa.optimizer_config_from_args(args).adam_beta2 == 0.95
    ddp = cfa.ddp_config_from_args(args)
    assert ddp.overlap_grad_reduce is True and ddp.grad_reduce_in_fp32 is True


def test_args_by_name_takes_the_named_flags():
    ns = argparse.Namespace(**{n: i for i, n in enumerate(PARALLEL_SIZE_FLAGS)}, other=9)
    assert args_by_name(ns, PARALLEL_SIZE_FLAGS) == {
        n: i for i, n in enumerate(PARALLEL_SIZE_FLAGS)
    }
    assert args_by_name(ns, "other tensor_model_parallel_size") == {
        "other": 9,
        "tensor_model_parallel_size": 0,
    }
