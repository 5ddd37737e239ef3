"""A --yaml-cfg file is untrusted input: nothing in it runs code, its size and alias expansion
are bounded, and every refusal is one line naming the file and the rule."""

import os
import time

import pytest

from gigatron.training.arguments import build_parser, parse_args
from gigatron.training.checkpoint_args import command_line_dests

# Nine levels of nine aliases under one flag: 9**9 (387 million) strings once expanded.
_LEVELS = ["&a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"&{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")
]
BILLION_LAUGHS = "seed: 1\nlr: [" + ", ".join(_LEVELS) + "]\n"


def _refusal(tmp_path, text: str) -> tuple[str, str]:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        parse_args(argv=["--yaml-cfg", str(cfg)])
    assert time.perf_counter() - start < 10
    message = str(err.value)
    assert "\n" not in message and str(cfg) in message, message
    return str(cfg), message


def test_alias_bomb_is_refused_quickly(tmp_path):
    _, message = _refusal(tmp_path, BILLION_LAUGHS)
    assert "alias" in message and "expand" in message, message


def test_recursive_alias_is_refused(tmp_path):
    _, message = _refusal(tmp_path, "lr: &x [1, *x]\n")
    assert "refers to itself" in message, message


@pytest.mark.parametrize(
    "text",
    [
        "lr: !!python/object/apply:os.system ['echo ran']\n",
        "lr: !!python/name:os.system\n",
        "lr: !custom 3\n",
    ],
)
def test_tags_that_construct_objects_are_refused(tmp_path, text):
    _, message = _refusal(tmp_path, text)
    assert "tag" in message and "line 1" in message, message


def test_syntax_error_is_one_line_with_its_line(tmp_path):
    _, message = _refusal(tmp_path, "lr: 1\nseed: [1, 2\n")
    assert "not valid YAML" in message and "line" in message, message


def test_bad_utf8_is_one_line_with_its_offset(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_bytes(b"lr: 1\nseed: \xff\n")
    with pytest.raises(ValueError, match=r"cfg\.yaml is not valid UTF-8 .*offset 12"):
        parse_args(argv=["--yaml-cfg", str(cfg)])


def test_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is a FIFO; only a regular file is read"):
        parse_args(argv=["--yaml-cfg", str(fifo)])


def test_generate_reads_the_file_by_the_same_rules(tmp_path):
    """`gigatron generate` reads the YAML keys a second time (which flags were given)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(BILLION_LAUGHS)
    with pytest.raises(ValueError, match="alias"):
        command_line_dests(build_parser(), [], str(cfg))
    cfg.write_text("lr: !!python/object/apply:os.system ['echo ran']\n")
    with pytest.raises(ValueError, match="tag"):
        command_line_dests(build_parser(), [], str(cfg))


def test_a_few_aliases_still_work(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("lr: &lr 0.001\nmin-lr: *lr\n")
    args = parse_args(argv=["--yaml-cfg", str(cfg)])
    assert args.lr == args.min_lr == 0.001


@pytest.mark.parametrize(
    "text, rule",
    [
        ("seed: " + ":".join(["59"] * 20000) + "\n", "number of"),
        ("seed: " + "9" * 5000 + "\n", "number of"),
        ("lr: " + "1" * 5000 + ".5\n", "number of"),
        ("seed: 2001-13-45\n", "month"),
    ],
    ids=["sexagesimal", "long_int", "long_float", "bad_date"],
)
def test_values_that_fail_to_construct_are_one_line_with_their_line(tmp_path, text, rule):
    _, message = _refusal(tmp_path, text)
    assert rule in message and "line 1" in message, message
