"""Flag combinations pretrain_gpt ran while silently ignoring one of them (QA audit,
session 9): --reset-attention-mask under context parallelism (CP attention is causal over the
whole sequence; the run's losses equalled those without the flag)."""

import pytest

from gigatron.training.arguments import parse_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2",
        "--lr", "1e-3", "--mock-data", "--vocab-size", "100"]  # fmt: skip


def test_reset_attention_mask_refused_under_context_parallelism():
    argv = BASE + ["--reset-attention-mask", "--context-parallel-size", "2"]
    with pytest.raises(ValueError, match="--reset-attention-mask with --context-parallel-size 2"):
        validate_args(parse_args(argv=argv), 2)


def test_reset_flags_still_accepted_where_they_work():
    args = validate_args(parse_args(argv=BASE + ["--reset-attention-mask"]), 2)
    assert args.reset_attention_mask and args.data_parallel_size == 2
    argv = BASE + "--reset-position-ids --context-parallel-size 2 --attention-dropout 0".split()
    assert validate_args(parse_args(argv=argv), 2).reset_position_ids


def test_moe_router_flags_reach_the_transformer_config():
    """Megatron's --moe-router-load-balancing-type / --moe-z-loss-coeff /
    --moe-router-pre-softmax were unknown flags though TransformerConfig implements them."""
    from gigatron.training._config_from_args import core_transformer_config_from_args

    moe = ["--num-experts", "4", "--moe-router-topk", "2"]
    default = core_transformer_config_from_args(validate_args(parse_args(argv=BASE + moe), 1))
    assert default.moe_router_load_balancing_type == "aux_loss"
    assert default.moe_z_loss_coeff is None and not default.moe_router_pre_softmax
    argv = BASE + moe + ["--moe-router-load-balancing-type", "seq_aux_loss",
                         "--moe-z-loss-coeff", "1e-3", "--moe-router-pre-softmax"]  # fmt: skip
    config = core_transformer_config_from_args(validate_args(parse_args(argv=argv), 1))
    assert config.moe_router_load_balancing_type == "seq_aux_loss"
    assert config.moe_z_loss_coeff == 1e-3 and config.moe_router_pre_softmax
