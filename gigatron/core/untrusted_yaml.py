"""Reading a YAML file that came from elsewhere: plain values only, bounded size and expansion.

The rules of `untrusted_files` (a regular file, a size limit, UTF-8) hold first; then:

- **Nothing in the file constructs objects or runs code.** Only the plain YAML types load
  (mappings, lists, strings, numbers, booleans, null, timestamps); a tag such as
  `!!python/object/apply:...` is refused, naming the tag and its line.
- **Anchors and aliases expand to a bounded number of values** (`max_values`). An alias is a
  reference, so a few lines of nested aliases ("billion laughs") stand for hundreds of millions
  of values; whoever then prints or walks the result never returns. The composed document is
  measured (each alias counted at its full size) before anything is built from it, and an alias
  that refers to itself is refused.
- **Numbers are short.** A scalar that reads as an int or a float may be at most
  `MAX_NUMBER_CHARS` characters: YAML 1.1's base-60 ints (`1:2:3:...`) take quadratic time to
  build, and Python refuses a decimal int of over 4300 digits with an error that names no file.
  Any other value that fails to build (a date with month 13) is refused naming its line.

Each refusal is an `UntrustedFileError` (a `ValueError`) on one line naming the file and the rule.
"""

from __future__ import annotations

import os

from gigatron.core.untrusted_files import UntrustedFileError, read_text

__all__ = ["MAX_NUMBER_CHARS", "MAX_YAML_VALUES", "read_yaml"]

MAX_YAML_VALUES = 100_000
"""Values (scalars, lists, mappings) a YAML file may expand to, aliases counted in full."""

MAX_NUMBER_CHARS = 100
"""Characters of a scalar that YAML resolves to an int or a float."""

_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _where(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


def _expanded_size(root, what: str, path: str, max_values: int) -> int:
    """Values in the node graph `root` with every alias expanded; refuses past `max_values`."""
    import yaml

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise UntrustedFileError(
                f"{what} {path}: an anchor at {_where(node.start_mark)} refers to itself "
                "(a recursive alias); only plain values are read"
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
            if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
                raise UntrustedFileError(
                    f"{what} {path}: a number of {len(node.value)} characters at "
                    f"{_where(node.start_mark)}, over the {MAX_NUMBER_CHARS}-character limit "
                    "for a number; a setting is a short number"
                )
        for child in children:
            total += size(child)
            if total > max_values:
                raise UntrustedFileError(
                    f"{what} {path}: anchors and aliases expand to more than {max_values} values "
                    f"(at {_where(child.start_mark)}); a file of settings holds few values"
                )
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)


def read_yaml(
    path: str | os.PathLike, *, what: str, max_bytes="yaml", max_values: int = MAX_YAML_VALUES
):
    """The plain data in the YAML file `path` (None for an empty file).

    `what` names the file in errors (e.g. "--yaml-cfg"). Raises UntrustedFileError for a file
    that is not a regular file, too large, not UTF-8, not YAML, tagged with a non-plain type,
    or whose aliases expand past `max_values` values.
    """
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - pyyaml is in the test/train extras
        raise RuntimeError(f"reading {what} needs PyYAML: pip install pyyaml") from e
    path = os.fspath(path)
    text = read_text(path, what=what, max_bytes=max_bytes)
    loader = yaml.SafeLoader(text)
    last = [None]
    construct_object = loader.construct_object

    def construct_noting_where(node, deep=False):
        last[0] = node.start_mark  # on a ValueError: the value whose building failed
        return construct_object(node, deep=deep)

    loader.construct_object = construct_noting_where
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _expanded_size(root, what, path, max_values)
        return loader.construct_document(root)
    except yaml.constructor.ConstructorError as e:
        problem = str(e.problem).replace("could not determine a constructor for the", "refused")
        raise UntrustedFileError(
            f"{what} {path}: {problem} at {_where(e.problem_mark)}; only plain YAML values "
            "(no tags that construct objects) are read"
        ) from None
    except UntrustedFileError:
        raise
    except ValueError as e:  # a value that failed to build (int digits limit, a bad date)
        raise UntrustedFileError(
            f"{what} {path}: a value at {_where(last[0])} could not be read: "
            f"{str(e).splitlines()[0]}"
        ) from None
    except RecursionError:
        raise UntrustedFileError(
            f"{what} {path}: values nested too deeply; a file of settings is shallow"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UntrustedFileError(
            f"{what} {path} is not valid YAML: {problem} at {_where(mark)}"
        ) from None
    finally:
        loader.dispose()
