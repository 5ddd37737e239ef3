"""Walk, split and merge nested dict/list state dicts.

Mirrors `megatron.core.dist_checkpointing.dict_utils` (the parts save/load need).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = [
    "diff",
    "dict_list_map_inplace",
    "dict_list_map_outplace",
    "extract_matching_values",
    "merge",
    "nested_items_with_path",
    "nested_values",
    "set_at_path",
]


def nested_values(x: Any) -> Iterator[Any]:
    """Every leaf of a nested dict/list, depth first."""
    values = x.values() if isinstance(x, dict) else x if isinstance(x, list) else None
    if values is None:
        yield x
        return
    for v in values:
        yield from nested_values(v)


def nested_items_with_path(x: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, leaf) pairs; the path is the tuple of dict keys / list indices."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from nested_items_with_path(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from nested_items_with_path(v, path + (i,))
    else:
        yield path, x


def dict_list_map_inplace(f: Callable[[Any], Any], x: Any) -> Any:
    """Replace every leaf `v` by `f(v)` in place; returns `x` (or `f(x)` for a leaf)."""
    if isinstance(x, dict):
        for k, v in x.items():
            x[k] = dict_list_map_inplace(f, v)
        return x
    if isinstance(x, list):
        x[:] = [dict_list_map_inplace(f, v) for v in x]
        return x
    return f(x)


def dict_list_map_outplace(f: Callable[[Any], Any], x: Any) -> Any:
    """A new nested dict/list with every leaf `v` replaced by `f(v)` (`x` is unchanged)."""
    if isinstance(x, dict):
        return {k: dict_list_map_outplace(f, v) for k, v in x.items()}
    if isinstance(x, list):
        return [dict_list_map_outplace(f, v) for v in x]
    return f(x)


def extract_matching_values(
    x: Any, predicate: Callable[[Any], bool], return_lists_as_dicts: bool = False
) -> tuple[Any, Any]:
    """Split `x` into (leaves matching `predicate`, the rest), both keeping the nesting.

    Containers left empty by the split are dropped from that side (an originally empty
    container stays on the "rest" side); list items are compacted, as in Megatron, or with
    `return_lists_as_dicts` kept as `{index: item}` dicts so the original positions survive.
    """
    if isinstance(x, dict):
        hit, miss = {}, {}
        for k, v in x.items():
            h, m = extract_matching_values(v, predicate, return_lists_as_dicts)
            if _keep(v, h, predicate, hit_side=True):
                hit[k] = h
            if _keep(v, m, predicate, hit_side=False):
                miss[k] = m
        return hit, miss
    if isinstance(x, list):
        hit, miss = ({}, {}) if return_lists_as_dicts else ([], [])
        for i, v in enumerate(x):
            h, m = extract_matching_values(v, predicate, return_lists_as_dicts)
            for side, part, keep in ((hit, h, True), (miss, m, False)):
                if _keep(v, part, predicate, hit_side=keep):
                    if return_lists_as_dicts:
                        side[i] = part
                    else:
                        side.append(part)
        return hit, miss
    return (x, None) if predicate(x) else (None, x)


def _keep(original: Any, part: Any, predicate, *, hit_side: bool) -> bool:
    if isinstance(original, (dict, list)):
        return bool(part) or (not hit_side and not original)
    return predicate(original) == hit_side


def set_at_path(root: Any, path: tuple, value: Any) -> None:
    """`root[path[0]][path[1]]... = value`, creating dicts (or growing lists) on the way."""
    node = root
    for i, k in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            while len(node) <= k:
                node.append(None)
            if last:
                node[k] = value
            elif not isinstance(node[k], (dict, list)):
                node[k] = [] if isinstance(path[i + 1], int) else {}
            node = node[k]
        else:
            if last:
                node[k] = value
            elif not isinstance(node.get(k), (dict, list)):
                node[k] = [] if isinstance(path[i + 1], int) else {}
            node = node[k] if not last else node


def merge(x1: Any, x2: Any, key: tuple = ()) -> Any:
    """Merge `x2` into `x1` in place (dicts by key, lists by position); returns `x1`."""
    if isinstance(x1, dict) and isinstance(x2, dict):
        for k, v2 in x2.items():
            x1[k] = merge(x1[k], v2, key + (k,)) if k in x1 else v2
        return x1
    if isinstance(x1, list) and isinstance(x2, list):
        if len(x1) != len(x2):
            raise ValueError(f"cannot merge lists of lengths {len(x1)} and {len(x2)} at key {key}")
        for i, v2 in enumerate(x2):
            x1[i] = merge(x1[i], v2, key + (i,))
        return x1
    if isinstance(x1, list) and isinstance(x2, dict):
        for k, v2 in x2.items():
            if not isinstance(k, int) or not 0 <= k < len(x1):
                raise ValueError(f"cannot merge dict key {k!r} into a list at key {key}")
            x1[k] = merge(x1[k], v2, key + (k,))
        return x1
    raise ValueError(f"cannot merge {type(x1).__name__} with {type(x2).__name__} at key {key}")


def diff(x1: Any, x2: Any, prefix: tuple = ()) -> tuple[list, list, list]:
    """Recursive diff of two nested dicts / lists: (only_left, only_right, mismatch).

    only_left / only_right: paths present on one side only (for lists, the extra indices);
    mismatch: `(path, type(left), type(right), ...)` per differing leaf; tensors are equal when
    every element is (shape or dtype errors count as a mismatch). Sharded leaves
    (anything with `replica_id`) compare their `data`. Megatron's semantics.
    """
    if isinstance(x1, dict) and isinstance(x2, dict):
        left = [prefix + (k,) for k in x1.keys() - x2.keys()]
        right = [prefix + (k,) for k in x2.keys() - x1.keys()]
        mismatch: list = []
        for k in x1.keys() & x2.keys():
            _extend((left, right, mismatch), diff(x1[k], x2[k], prefix + (k,)))
        return left, right, mismatch
    if isinstance(x1, (list, tuple)) and type(x1) is type(x2):
        left = list(range(len(x1) - 1, len(x2) - 1, -1))
        right = list(range(len(x2) - 1, len(x1) - 1, -1))
        mismatch = []
        for i, (v1, v2) in enumerate(zip(x1, x2)):
            _extend((left, right, mismatch), diff(v1, v2, prefix + (i,)))
        return left, right, mismatch
    if hasattr(x1, "replica_id") and hasattr(x2, "replica_id") and type(x1) is type(x2):
        return diff(x1.data, x2.data, prefix + (type(x1),))
    info: list = [prefix, type(x1), type(x2)]
    if isinstance(x1, torch.Tensor) and isinstance(x2, torch.Tensor):
        try:
            ne = x1.cpu() != x2.cpu()
            differs = bool(ne.any())
            info += [ne.sum(), ne.shape, ne.nonzero().tolist()]
        except (RuntimeError, TypeError, ValueError):
            differs = True
            info += [x1.shape, x2.shape]
    else:
        try:
            differs = bool(x1 != x2)
        except (RuntimeError, TypeError, ValueError):
            differs = True
    return [], [], [tuple(info)] if differs else []


def _extend(acc: tuple[list, list, list], part: tuple[list, list, list]) -> None:
    for a, p in zip(acc, part):
        a.extend(p)


def map_reduce(
    xs: Iterable,
    key_fn: Callable = lambda x: x,
    value_fn: Callable = lambda x: x,
    reduce_fn: Callable = lambda x: x,
) -> dict:
    """Group `xs` by `key_fn`, then reduce each group's `value_fn` values with `reduce_fn`
    (the `more_itertools.map_reduce` contract): {key: reduce_fn([value_fn(x), ...])}, keys in
    first-seen order."""
    groups: dict = {}
    for x in xs:
        groups.setdefault(key_fn(x), []).append(value_fn(x))
    return {k: reduce_fn(v) for k, v in groups.items()}
