"""ArgumentGroupFactory: one flag per dataclass field, typed by its annotation (Megatron 0.20)."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import pytest

from gigatron.training.argument_utils import ArgumentGroupFactory, TypeInferenceError


class Color(enum.Enum):
    red = 1
    blue = 2


@dataclass
class _Cfg:
    """A config for the tests."""

    count: int = 3
    """How many."""

    rate: float | None = None
    """A rate,
    on two lines."""

    on: bool = False
    """Switch on."""

    kept: bool = True
    """Switch off with --no-kept."""

    mode: Literal["a", "b"] = "a"
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    color: Color = Color.red
    renamed: int = field(default=0, metadata={"argparse_meta": {"arg_names": ["--other"]}})


def _parser(cls=_Cfg, **kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    ArgumentGroupFactory(cls, **kw).build_group(p, "cfg")
    return p


def test_each_field_becomes_a_flag_typed_by_its_annotation():
    args = _parser().parse_args(
        "--count 5 --rate 0.5 --on --no-kept --mode b --sizes 3 4 --color blue --other 7".split()
    )
    assert (args.count, args.rate, args.on, args.kept, args.mode) == (5, 0.5, True, False, "b")
    assert (args.sizes, args.color, args.renamed) == ([3, 4], Color.blue, 7)


def test_defaults_come_from_the_fields():
    args = _parser().parse_args([])
    assert (args.count, args.rate, args.on, args.kept, args.sizes) == (3, None, False, True, [1, 2])


def test_true_switch_has_no_and_disable_spellings():
    assert _parser().parse_args(["--disable-kept"]).kept is False


def test_help_is_the_string_under_the_field_on_one_line():
    p = _parser()
    helps = {a.dest: a.help for a in p._actions}
    assert helps["rate"] == "A rate, on two lines."
    assert p._action_groups[-1].description == "A config for the tests."


def test_literal_gives_choices_and_rejects_others():
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        _parser().parse_args(["--mode", "c"])


def test_excluded_fields_get_no_flag():
    assert "--count" not in _parser(exclude=["count"])._option_string_actions


def test_a_union_or_callable_without_metadata_is_a_type_inference_error():
    @dataclass
    class Bad:
        value: int | str = 1

    @dataclass
    class Fn:
        fn: Callable[[int], int] | None = None

    with pytest.raises(TypeInferenceError, match="Unions not supported"):
        _parser(Bad)
    with pytest.raises(TypeInferenceError, match="Unsupported type"):
        _parser(Fn)


def test_metadata_makes_an_uninferable_field_a_flag():
    @dataclass
    class Meta:
        value: int | str = field(default=1, metadata={"argparse_meta": {"type": str}})

    assert _parser(Meta).parse_args(["--value", "x"]).value == "x"
