"""--yaml-cfg values go through the flags' own argparse actions (issue 30, item 3): for every
flag of `gigatron train`, `train-bert`, `train-t5` and `generate`, a YAML file and the same flag
on the command line give identical args. Before, YAML values were set as PyYAML read them:
`lr: 1e-3` stayed the string '1e-3' (the run crashed after the model was built, comparing a
float with a str), a bad choice or an int flag given 'abc' was accepted, `bf16: false` set a
store_true flag to False the same way but `bf16: "yes"` set it to a string."""

import argparse

import pytest
import yaml

from gigatron.tools.generate import add_text_generation_args
from gigatron.training.arguments import build_parser, parse_args
from gigatron.training.pretrain_bert import add_bert_args
from gigatron.training.pretrain_t5 import add_t5_args

PROVIDERS = {"train": None, "train-bert": add_bert_args, "train-t5": add_t5_args,
             "generate": add_text_generation_args}  # fmt: skip
SPECIAL = {
    "--moe-layer-freq": ("[1, 0]", "[1, 0]"),
    "--rampup-batch-size": (["2", "2", "8"],),
    "--window-size": ("4,0",),
    "--window-attn-skip-freq": ("[1, 0]",),
}


def _value(action):
    """A value for `action` other than its default: (YAML value, command-line tokens)."""
    flag = action.option_strings[-1]
    if action.nargs == 0:  # keyed by the flag's name: true gives the flag
        return True, [flag]
    if flag in SPECIAL:
        value = SPECIAL[flag][0]
        return value, [flag, *(value if isinstance(value, list) else [value])]
    if action.choices:
        value = next(c for c in action.choices if c != action.default)
        return value, [flag, str(value)]
    one = {int: 3, float: "1e-3", str: "abc", None: "abc"}[action.type]
    if action.nargs in ("*", "+") or isinstance(action.nargs, int):
        count = action.nargs if isinstance(action.nargs, int) else 2
        return [one] * count, [flag, *[str(one)] * count]
    if isinstance(action, argparse._AppendAction):
        return [one, one], [flag, str(one), flag, str(one)]
    return one, [flag, str(one)]


def _flags(provider):
    """Every flag action of the command's parser, one per destination (a destination two flags
    share, --x / --no-x, is covered by `test_flags_sharing_a_destination`)."""
    actions = [a for a in build_parser(provider)._actions if a.option_strings]
    actions = [a for a in actions if a.dest not in ("help", "yaml_cfg")]
    counts = {}
    for a in actions:
        counts[a.dest] = counts.get(a.dest, 0) + 1
    return [a for a in actions if counts[a.dest] == 1]


def _yaml_args(tmp_path, provider, values: dict):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(values))
    return vars(parse_args(provider, argv=["--yaml-cfg", str(cfg)]))


@pytest.mark.parametrize("command", list(PROVIDERS))
def test_every_flag_gives_the_same_args_from_yaml_and_the_command_line(tmp_path, command):
    provider = PROVIDERS[command]
    values, argv = {}, []
    for action in _flags(provider):
        value, tokens = _value(action)
        values[action.option_strings[-1].lstrip("-")] = value
        argv += tokens
    cli = vars(parse_args(provider, argv=argv))
    from_yaml = _yaml_args(tmp_path, provider, values)
    from_yaml.pop("yaml_cfg"), cli.pop("yaml_cfg")
    assert from_yaml == cli
    assert len(values) > 200, len(values)  # every flag of the command


def test_keys_may_be_destinations_with_underscores(tmp_path):
    values = {"num_attention_heads": 8, "lr": "3e-4", "bf16": True, "data_path": ["a", "b"],
              "override_opt_param_scheduler": True, "moe_layer_freq": 2}  # fmt: skip
    args = _yaml_args(tmp_path, None, values)
    assert args["num_attention_heads"] == 8 and args["lr"] == 3e-4 and args["bf16"] is True
    assert args["data_path"] == ["a", "b"] and args["override_opt_param_scheduler"] is True
    assert args["moe_layer_freq"] == 2


def test_flags_sharing_a_destination(tmp_path):
    """--check-for-nan-in-loss-and-grad / --no-check-for-nan-in-loss-and-grad: the key names the
    flag, or the destination with the value it should take."""
    for values in ({"no-check-for-nan-in-loss-and-grad": True},
                   {"check_for_nan_in_loss_and_grad": False}):  # fmt: skip
        assert _yaml_args(tmp_path, None, values)["check_for_nan_in_loss_and_grad"] is False
    assert _yaml_args(tmp_path, None, {"check_for_nan_in_loss_and_grad": True})[
        "check_for_nan_in_loss_and_grad"
    ]


def test_a_float_written_as_yaml_text_is_a_float(tmp_path):
    """PyYAML reads 1e-3 (no dot) as a string: it crashed the run after the model was built."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("lr: 1e-3\nmin-lr: 1.0e-5\ntrain-iters: 10\nbf16: true\n")
    args = parse_args(argv=["--yaml-cfg", str(cfg)])
    assert args.lr == 1e-3 and isinstance(args.lr, float) and args.min_lr == 1e-5
    assert args.train_iters == 10 and args.bf16 is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("lr: fast\n", "lr: 'fast': invalid float value: 'fast'"),
        ("lr-decay-style: cosinus\n", "lr-decay-style: 'cosinus': invalid choice: 'cosinus'"),
        ("bf16: 'yes'\n", "bf16: 'yes' must be true or false"),
        ("num-layers: 2.5\n", "num-layers: 2.5: invalid int value: '2.5'"),
        ("rampup-batch-size: 2 2\n", "rampup-batch-size: '2 2': expected 3 arguments"),
        ("hiden_size: 128\n", "unknown setting 'hiden_size'; did you mean hidden_size?"),
    ],
)
def test_bad_values_are_refused_naming_the_file_and_key(tmp_path, text, message):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    with pytest.raises(ValueError) as err:
        parse_args(argv=["--yaml-cfg", str(cfg)])
    assert str(err.value).startswith(f"--yaml-cfg {cfg}: ") and message in str(err.value), err


def test_command_line_wins_over_the_file(tmp_path):
    """By destination: `gradient_accumulation_fusion: true` in the file does not undo
    --no-gradient-accumulation-fusion on the command line (it did: the file's key was matched
    against the flag spelled from it, --gradient-accumulation-fusion, which was not given)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("lr: 1e-3\nbf16: true\nnum-layers: 4\ngradient_accumulation_fusion: true\n")
    argv = ["--yaml-cfg", str(cfg), "--lr=2e-3", "--num-layers", "2",
            "--no-gradient-accumulation-fusion"]  # fmt: skip
    args = parse_args(argv=argv)
    assert (args.lr, args.num_layers, args.bf16) == (2e-3, 2, True)
    assert args.gradient_accumulation_fusion is False
