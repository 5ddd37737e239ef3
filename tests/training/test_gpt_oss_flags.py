"""GPT-OSS's architecture flags as Megatron's examples/gptoss/02_train.sh passes them
(`--window-size 127,0 --window-attn-skip-freq 2 --softmax-type learnable --quick-geglu
--glu-linear-offset 1.0 --activation-func-clamp-value 7.0`): each reaches its TransformerConfig
field, the model they build trains on 2 TP ranks (loss falls), and bad combinations are one-line
errors."""

from __future__ import annotations

import pytest
import torch

from gigatron.core.activations import quick_gelu
from gigatron.testing import run_distributed
from gigatron.training import _config_from_args as cfa
from gigatron.training.arguments import parse_args, validate_args
from tests.training._gpt_runs import ARGS, run_pretrain_gpt

pytestmark = pytest.mark.multirank

GPT_OSS_FLAGS = (
    "--window-size 3,0 --window-attn-skip-freq 2 --softmax-type learnable --quick-geglu "
    "--glu-linear-offset 1.0 --activation-func-clamp-value 7.0 --num-experts 4 "
    "--moe-router-topk 2 --moe-ffn-hidden-size 32 --position-embedding-type rope "
    "--normalization RMSNorm"
).split()


def _args(*extra):
    return validate_args(parse_args(argv=[*ARGS, "--train-iters", "3", *extra]), world_size=1)


def test_gpt_oss_flags_reach_their_config_fields():
    config = cfa.core_transformer_config_from_args(_args(*GPT_OSS_FLAGS))
    assert config.window_size == (3, 0) and config.window_attn_skip_freq == 2
    assert config.softmax_type == "learnable"
    assert config.activation_func is quick_gelu and config.gated_linear_unit
    assert config.glu_linear_offset == 1.0 and config.activation_func_clamp_value == 7.0


def test_window_skip_pattern_flag_is_a_per_layer_list():
    args = _args("--window-size", "(8,0)", "--window-attn-skip-freq", "([1]+[0])*1")
    config = cfa.core_transformer_config_from_args(args)
    assert config.window_size == (8, 0) and config.window_attn_skip_freq == [1, 0]


def test_quick_geglu_with_swiglu_is_refused():
    with pytest.raises(ValueError, match="--quick-geglu excludes --swiglu"):
        _args("--quick-geglu", "--swiglu")


def _train():
    torch.set_num_threads(1)
    argv = [*ARGS, "--train-iters", "6", "--log-interval", "1", *GPT_OSS_FLAGS,
            "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--expert-tensor-parallel-size", "1"]  # fmt: skip
    result = run_pretrain_gpt(argv)
    return [h["losses"]["lm loss"] for h in result["history"]]


@pytest.mark.multirank
def test_gpt_oss_flags_train_on_two_tensor_parallel_ranks():
    losses = run_distributed(_train, 2, timeout=300)[0]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0], losses
