"""A checkpoint pickle cannot change objects that outlive the load.

The pickle BUILD opcode sets state on the object below it on the stack. Aimed at a global (an
allowed class such as `pathlib.PosixPath`, an allowed function such as
`torch.serialization._get_layout`) or at a shared singleton (an enum member), it would change
that object for the whole process: no code runs, but a later, trusted load could return values
from the file. Every loader of a checkpoint refuses such a pickle with one line, and the objects
are left as they were; state on objects the pickle itself created still loads.
"""

from __future__ import annotations

import enum
import io
import pathlib
import types
import zipfile

import pytest
import torch
from torch.distributed.checkpoint.planner import WriteItemType

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing._safe_load import restricted_pickle_load, safe_torch_load


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _global(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + b"\x93"  # STACK_GLOBAL


_EMPTY_DICT, _NONE, _TUPLE2, _SETITEM, _BUILD, _STOP = b"}", b"N", b"\x86", b"s", b"b", b"."


def _dict(key: str, value: bytes) -> bytes:
    return _EMPTY_DICT + _str(key) + value + _SETITEM


def _build_on_global(module: str, name: str, state: bytes) -> bytes:
    """PROTO 4, the global, its new state, BUILD: the pickle returns the mutated global."""
    return b"\x80\x04" + _global(module, name) + state + _BUILD + _STOP


def _slot_state(key: str, value: bytes) -> bytes:
    """(None, {key: value}): the slot-state form, which BUILD applies with setattr."""
    return _NONE + _dict(key, value) + _TUPLE2


def _build_on_enum_member(module: str, name: str, value: int, state: bytes) -> bytes:
    """Enum(value) returns the process-wide member; BUILD would then set its state."""
    return b"\x80\x04" + _global(module, name) + b"K" + bytes([value]) + b"\x85R" + state + b"b."


_POISONED_CACHE = _dict("cache", _dict("torch.strided", b"K\x07"))


class _Color(enum.Enum):
    RED = 1


@pytest.fixture
def layout_cache():
    """`_get_layout`'s attributes, restored even if a load poisoned them."""
    fn = torch.serialization._get_layout
    saved = dict(fn.__dict__)
    yield fn
    fn.__dict__.clear()
    fn.__dict__.update(saved)


def _metadata_cases():
    return {
        "class attribute (slot state)": (
            _build_on_global("pathlib", "PosixPath", _slot_state("poisoned", b"K\x01")),
            lambda: hasattr(pathlib.PosixPath, "poisoned"),
        ),
        "function cache": (
            _build_on_global("torch.serialization", "_get_layout", _POISONED_CACHE),
            lambda: torch.serialization._get_layout.__dict__.get("cache", {}).get("torch.strided")
            == 7,
        ),
        "enum member": (
            _build_on_enum_member(
                "torch.distributed.checkpoint.planner", "WriteItemType", 1,
                _dict("_name_", _str("POISONED")),
            ),
            lambda: WriteItemType(1).name == "POISONED",
        ),
    }  # fmt: skip


@pytest.mark.parametrize("case", sorted(_metadata_cases()))
def test_metadata_pickle_cannot_set_state_on_globals_or_singletons(case, layout_cache):
    payload, poisoned = _metadata_cases()[case]
    member_name = WriteItemType(1)._name_
    try:
        with pytest.raises(dc.CheckpointingException) as err:
            restricted_pickle_load(io.BytesIO(payload), what="DCP metadata ck/.metadata")
        assert not poisoned(), case
    finally:
        if hasattr(pathlib.PosixPath, "poisoned"):
            del pathlib.PosixPath.poisoned
        WriteItemType(1)._name_ = member_name
    msg = str(err.value)
    assert "\n" not in msg and "ck/.metadata" in msg and "refusing" in msg, msg


def test_torch_payload_cannot_set_state_on_an_allowed_enum_member():
    class _Poison:
        def __reduce__(self):  # _Color(1) -> the shared member, then BUILD sets its name
            return (_Color, (1,), {"_name_": "POISONED"})

    buf = io.BytesIO()
    torch.save({"x": _Poison()}, buf)
    dc.add_safe_globals([_Color])
    try:
        with pytest.raises(dc.CheckpointingException) as err:
            safe_torch_load(io.BytesIO(buf.getvalue()), what="ck/common.pt")
        assert _Color.RED.name == "RED"
    finally:
        _Color.RED._name_ = "RED"
        from gigatron.core.dist_checkpointing._safe_load import SAFE_GLOBALS

        SAFE_GLOBALS.remove(_Color)
    assert "\n" not in str(err.value) and "ck/common.pt" in str(err.value)
    # the enum itself still loads
    buf = io.BytesIO()
    torch.save({"c": _Color.RED}, buf)
    dc.add_safe_globals([_Color])
    try:
        assert safe_torch_load(io.BytesIO(buf.getvalue()), what="ok")["c"] is _Color.RED
    finally:
        SAFE_GLOBALS.remove(_Color)


def _as_torch_file(raw_pickle: bytes) -> bytes:
    """A torch.save zip whose `data.pkl` is replaced by `raw_pickle`."""
    buf = io.BytesIO()
    torch.save({"a": 1}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(
                info, raw_pickle if info.filename.endswith("/data.pkl") else src.read(info)
            )
    return out.getvalue()


_TORCH_TARGETS = {
    "PosixPath": ("pathlib", lambda: pathlib.PosixPath, _slot_state("poisoned", b"K\x01")),
    "SimpleNamespace": ("types", lambda: types.SimpleNamespace, _dict("poisoned", b"K\x01")),
    "BytesIO": ("io", lambda: io.BytesIO, _dict("poisoned", b"K\x01")),
    "_get_layout": (
        "torch.serialization",
        lambda: torch.serialization._get_layout,
        _POISONED_CACHE,
    ),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("name", sorted(_TORCH_TARGETS))
def test_torch_payload_cannot_set_state_on_allowed_globals(name, layout_cache):
    """torch's weights-only unpickler builds only objects of an allowed type; no allowed global
    is itself an instance of one, so BUILD on the global is refused (and must stay so)."""
    module, target, state = _TORCH_TARGETS[name]
    target = target()
    before = dict(vars(target))
    with pytest.raises(dc.CheckpointingException) as err:
        safe_torch_load(io.BytesIO(_as_torch_file(_build_on_global(module, name, state))), what="c")
    assert dict(vars(target)) == before
    assert "\n" not in str(err.value)


def test_state_on_objects_the_pickle_created_still_loads():
    ns = types.SimpleNamespace(a=1, p=pathlib.PurePosixPath("x/y"))
    buf = io.BytesIO()
    torch.save({"ns": ns, "b": io.BytesIO(b"abc")}, buf)
    out = safe_torch_load(io.BytesIO(buf.getvalue()), what="ok")
    assert out["ns"] == ns and out["b"].getvalue() == b"abc"
