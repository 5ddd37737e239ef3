"""Compare the structure of two sharded state dicts (gigatron's and megatron-core's).

`describe(sd)` turns every entry into plain tuples: a ShardedTensor into its key, local and
global shape, global offset, prepended axes, replica id, axis fragmentations, shape-mismatch
flag and flat range; a ShardedObject into its key, grid shape, offset and replica id; a
ShardedTensorFactory into its key, replica id and what it builds. Works on either library's
classes (compared by class name), so the two dicts can be compared with ==.
"""

from __future__ import annotations


def _tensor(sh) -> tuple:
    return (
        "ShardedTensor",
        sh.key,
        tuple(sh.local_shape),
        tuple(sh.global_shape),
        tuple(sh.global_offset),
        sh.prepend_axis_num,
        tuple(sh.replica_id) if isinstance(sh.replica_id, (tuple, list)) else sh.replica_id,
        tuple(sh.axis_fragmentations) if sh.axis_fragmentations is not None else None,
        bool(sh.allow_shape_mismatch),
        sh.flattened_range,
    )


def _leaf(value) -> tuple:
    kind = type(value).__name__
    if kind == "ShardedTensor":
        return _tensor(value)
    if kind == "ShardedObject":
        rid = value.replica_id
        return (kind, value.key, tuple(value.global_shape), tuple(value.global_offset),
                tuple(rid) if isinstance(rid, (tuple, list)) else rid)  # fmt: skip
    if kind == "ShardedTensorFactory":
        built = value.build()
        built = built if isinstance(built, list) else [built]
        rid = value.replica_id
        rid = tuple(rid) if isinstance(rid, (tuple, list)) else rid
        return (kind, value.key, rid, tuple(_leaf(b) for b in built))
    raise AssertionError(f"unexpected {kind} in a sharded state dict")


def describe(sd: dict) -> dict:
    """{dict key: plain description} (see module docstring)."""
    return {k: _leaf(v) for k, v in sd.items()}


def differences(ours: dict, theirs: dict) -> list[str]:
    """Readable differences between two `describe` results (empty when equal)."""
    out = [f"only ours: {k}" for k in sorted(set(ours) - set(theirs))]
    out += [f"only theirs: {k}" for k in sorted(set(theirs) - set(ours))]
    out += [
        f"{k}:\n  ours   {ours[k]}\n  theirs {theirs[k]}"
        for k in sorted(set(ours) & set(theirs))
        if ours[k] != theirs[k]
    ]
    return out
