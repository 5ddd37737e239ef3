"""`gigatron train`'s flags are pinned: the parser's flags (name, dest, default, type, choices,
nargs, action) equal the committed train_flags.json, and each flag of a training config class
takes its default from its field. Adding or changing a flag means updating the JSON on purpose."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gigatron.training._config_flags import CONFIG_GROUPS, HAND_DECLARED
from gigatron.training.arguments import build_parser

_PINNED = Path(__file__).with_name("train_flags.json")


def describe(parser) -> dict:
    """option string -> what argparse does with it."""
    out = {}
    for a in parser._actions:
        for opt in a.option_strings:
            out[opt] = dict(
                dest=a.dest,
                default=repr(a.default),
                type=getattr(a.type, "__name__", repr(a.type)) if a.type is not None else None,
                choices=[repr(c) for c in a.choices] if a.choices is not None else None,
                nargs=repr(a.nargs),
                action=type(a).__name__,
                const=repr(a.const),
                required=a.required,
            )
    return out


def test_parser_flags_equal_the_pinned_list():
    now, pinned = describe(build_parser()), json.loads(_PINNED.read_text())
    assert sorted(set(pinned) - set(now)) == [], "flags dropped"
    assert sorted(set(now) - set(pinned)) == [], "flags added (update train_flags.json)"
    changed = {k: (pinned[k], now[k]) for k in now if now[k] != pinned[k]}
    assert changed == {}


@pytest.mark.parametrize("cls", sorted(set(CONFIG_GROUPS.values()), key=lambda c: c.__name__))
def test_config_flags_take_their_default_from_their_field(cls):
    parser = build_parser()
    by_dest = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(cls):
        if f.name in HAND_DECLARED.get(cls, ()):
            continue
        meta = f.metadata.get("argparse_meta", {})
        action = by_dest[meta.get("dest", f.name)]
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        assert action.default == meta.get("default", default), f.name
        assert action.help, f"{cls.__name__}.{f.name} has no help string"
