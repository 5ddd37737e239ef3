"""Megatron-style flags: parsing, derived values, nearest-flag errors, YAML, validation."""

import pytest
import torch

from gigatron.training.arguments import parse_args, validate_args

BASE = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "32",
    "--micro-batch-size",
    "2",
    "--train-iters",
    "10",
    "--lr",
    "1e-3",
    "--mock-data",
    "--vocab-size",
    "100",
]


def test_derived_values():
    args = validate_args(parse_args(argv=BASE + ["--tensor-model-parallel-size", "2"]), 8)
    assert args.data_parallel_size == 4
    assert args.global_batch_size == 8
    assert args.ffn_hidden_size == 256 and args.kv_channels == 16
    assert args.num_query_groups == 4 and args.max_position_embeddings == 32
    assert args.params_dtype == torch.float32 and args.lr_decay_iters == 10


def test_swiglu_ffn_and_gqa():
    argv = BASE + ["--swiglu", "--group-query-attention", "--num-query-groups", "2", "--bf16"]
    args = validate_args(parse_args(argv=argv), 1)
    assert args.ffn_hidden_size == int(4 * 64 * 2 / 3 / 64) * 64 or args.ffn_hidden_size == 256
    assert args.num_query_groups == 2 and args.params_dtype == torch.bfloat16


def test_unknown_flag_names_nearest(capsys):
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + ["--tensor-model-paralel-size", "2"])
    assert "did you mean --tensor-model-parallel-size" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra,world,message",
    [
        (["--tensor-model-parallel-size", "3"], 4, r"world size \(4\) is not divisible"),
        (["--global-batch-size", "3"], 2, r"--global-batch-size \(3\) must be divisible"),
        (["--fp16", "--bf16"], 1, "mutually exclusive"),
        (["--seq-length", "64", "--max-position-embeddings", "32"], 1, "exceeds"),
    ],
)
def test_bad_combinations(extra, world, message):
    with pytest.raises(ValueError, match=message):
        validate_args(parse_args(argv=BASE + extra), world)


def test_yaml_config_and_command_line_precedence(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("hidden-size: 128\nnum_attention_heads: 8\nlr: 0.5\n")
    args = parse_args(argv=BASE + ["--yaml-cfg", str(cfg), "--lr", "0.25"])
    assert args.hidden_size == 64  # given on the command line in BASE: the flag wins
    assert args.num_attention_heads == 4
    assert args.lr == 0.25
    cfg.write_text("hiden_size: 128\n")
    with pytest.raises(ValueError, match="did you mean hidden_size"):
        parse_args(argv=BASE + ["--yaml-cfg", str(cfg)])


def test_yaml_fills_unset_values(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("init-method-std: 0.01\nsave-interval: 7\n")
    args = parse_args(argv=BASE + ["--yaml-cfg", str(cfg)])
    assert args.init_method_std == 0.01 and args.save_interval == 7
