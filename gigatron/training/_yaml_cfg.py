"""`--yaml-cfg FILE`: flags as `key: value` lines, read through the same argparse actions.

Part of `gigatron.training.arguments`. gigatron's YAML is flat (Megatron-LM's `--yaml-cfg` reads
a nested layout of its own): a key is a flag name without the leading dashes (`lr`,
`num-layers`, `override-opt_param-scheduler`) or its destination (`num_layers`); a value is what
the flag takes. Each value becomes command-line tokens and goes through the parser, so it gets
the flag's type, choices, nargs and store_true/store_false meaning (`lr: 1e-3`, which PyYAML
reads as a string, becomes the float 0.001, and a bad value is refused naming the key).
A flag given on the command line wins over the file.
"""

from __future__ import annotations

import argparse
import difflib

from gigatron.core.untrusted_yaml import read_yaml as read_yaml_file


def _actions_by_key(parser) -> tuple[dict, dict]:
    by_flag = {s[2:]: a for a in parser._actions for s in a.option_strings if s.startswith("--")}
    by_dest: dict[str, list] = {}
    for action in parser._actions:
        if action.option_strings:
            by_dest.setdefault(action.dest, []).append(action)
    return by_flag, by_dest


def _scalar(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _tokens(action, value, key: str, where: str) -> list[str]:
    """Command-line tokens meaning `key: value` for `action` (empty: leave the default)."""
    flag = next(s for s in action.option_strings if s.startswith("--"))
    if action.nargs == 0:  # store_true / store_false / store_const
        if not isinstance(value, bool) and value != action.const:
            raise ValueError(f"{where}: {key}: {value!r} must be true or false")
        return [flag] if value == action.const else []
    if value is None:
        return []
    if isinstance(action, argparse._AppendAction):
        return [t for v in (value if isinstance(value, list) else [value]) for t in (flag, str(v))]
    if action.nargs is None or action.nargs == "?":
        return [flag, _scalar(value)]
    items = value if isinstance(value, list) else str(value).split()
    return [flag, *map(_scalar, items)]


def _action_for(key: str, value, by_flag: dict, by_dest: dict, where: str):
    """(action, the value its destination takes): a key naming a store_true/false flag whose
    name is not its destination (`no-x`) says whether the flag is given; a destination key
    (`x: false`) picks the flag of the two sharing it that sets that value."""
    key = str(key).lstrip("-")
    dest = key.replace("-", "_")
    found = by_flag.get(key) or by_flag.get(key.replace("_", "-"))
    if found is not None and found.nargs == 0 and found.dest != dest:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {key}: {value!r} must be true or false")
        return found, found.const if value else found.default
    if found is not None and found.nargs != 0:
        return found, value
    siblings = by_dest.get(dest, [])
    meaning = [a for a in siblings if a.nargs == 0 and a.const == value]
    if meaning or siblings:
        return (meaning or siblings)[0], value
    close = difflib.get_close_matches(dest, list(by_dest), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ValueError(f"{where}: unknown setting {key!r}{hint}")


def read_yaml(path: str) -> dict:
    """The mapping in `path` (ValueError when the file holds something else). The file is
    untrusted: a regular file within `LIMITS["yaml"]`, plain values only (no tags), aliases
    expanding to a bounded number of values (`gigatron.core.untrusted_yaml`)."""
    values = read_yaml_file(path, what="--yaml-cfg") or {}
    if not isinstance(values, dict):
        raise ValueError(f"--yaml-cfg {path}: expected a mapping of flag names to values")
    return values


def given_dests(parser, argv: list[str]) -> set[str]:
    """Destinations of the flags present in `argv` (`--flag value` or `--flag=value`)."""
    actions = parser._option_string_actions
    return {actions[a.split("=")[0]].dest for a in argv if a.split("=")[0] in actions}


def apply_yaml(parser, args: argparse.Namespace, argv: list[str]) -> None:
    """Set on `args` each setting of `args.yaml_cfg` whose flag `argv` does not give, parsed by
    `parser` exactly as the flag on the command line would be."""
    where = f"--yaml-cfg {args.yaml_cfg}"
    by_flag, by_dest = _actions_by_key(parser)
    given = given_dests(parser, argv)
    exit_on_error, parser.exit_on_error = parser.exit_on_error, False
    try:
        for key, value in read_yaml(args.yaml_cfg).items():
            action, value = _action_for(key, value, by_flag, by_dest, where)
            if action.dest in given or action.dest == "yaml_cfg":
                continue  # command-line flags win over the file
            tokens = _tokens(action, value, key, where)
            try:
                parsed, extra = parser.parse_known_args(tokens)
            except argparse.ArgumentError as err:
                raise ValueError(f"{where}: {key}: {value!r}: {err.message}") from None
            if extra:
                raise ValueError(f"{where}: {key}: {value!r} is not one value of {tokens[0]}")
            setattr(args, action.dest, getattr(parsed, action.dest))
    finally:
        parser.exit_on_error = exit_on_error
