"""gigatron.core.safe_globals: Megatron's allow-list, registration and restricted loaders."""

from __future__ import annotations

import io
import os
import pickle
from argparse import Namespace
from collections import OrderedDict

import numpy as np
import pytest
import torch

from gigatron.core import safe_globals as sg
from gigatron.core.rerun_state_machine import RerunMode


class _Payload:
    def __reduce__(self):
        return (os.getcwd, ())


def test_safe_unpickler_loads_containers_tensors_and_arrays():
    data = {"k": [1, 2.0, True, b"x", "s"], "od": OrderedDict(a=1), "t": torch.arange(3.0)}
    data["a"] = np.arange(4, dtype=np.uint32)
    out = sg.SafeUnpickler(io.BytesIO(pickle.dumps(data))).load()
    assert out["k"] == data["k"] and out["od"] == data["od"]
    assert torch.equal(out["t"], data["t"])
    np.testing.assert_array_equal(out["a"], data["a"])


def test_safe_unpickler_refuses_other_globals():
    with pytest.raises(pickle.UnpicklingError, match="Refusing to unpickle.*posix.getcwd"):
        sg._safe_pickle_load(io.BytesIO(pickle.dumps(_Payload())))


def test_storage_bytes_are_read_weights_only():
    """A pickle naming torch's unrestricted `_load_from_bytes` gets the weights-only reader."""
    inner = io.BytesIO()
    torch.save(_Payload(), inner)  # a full (unsafe) torch pickle inside the storage bytes
    raw = pickle.dumps(_StorageBytes(inner.getvalue()))
    with pytest.raises(pickle.UnpicklingError, match="getcwd"):
        sg._safe_pickle_load(io.BytesIO(raw))


class _StorageBytes:
    def __init__(self, b):
        self.b = b

    def __reduce__(self):
        return (torch.storage._load_from_bytes, (self.b,))


def test_safe_numpy_load_npy_and_restores_pickle_load(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(3, dtype=np.float32))
    before = pickle.load
    np.testing.assert_array_equal(sg.safe_numpy_load(str(path), allow_pickle=True), np.arange(3))
    assert pickle.load is before


def test_safe_numpy_load_refuses_pickled_objects_also_in_npz(tmp_path):
    obj = np.empty(1, dtype=object)
    obj[0] = _Payload()
    np.save(tmp_path / "o.npy", obj, allow_pickle=True)
    np.savez(tmp_path / "o.npz", o=obj)
    with pytest.raises(pickle.UnpicklingError, match="Refusing"):
        sg.safe_numpy_load(str(tmp_path / "o.npy"), allow_pickle=True)
    with pytest.raises(pickle.UnpicklingError, match="Refusing"):
        sg.safe_numpy_load(str(tmp_path / "o.npz"), allow_pickle=True)
    np.savez(tmp_path / "p.npz", a=np.ones(2))
    assert sg.safe_numpy_load(str(tmp_path / "p.npz"))["a"].tolist() == [1.0, 1.0]


def test_register_safe_globals_allows_namespace_and_enum_members(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"args": Namespace(lr=0.1), "mode": RerunMode.DISABLED}, path)
    saved = list(torch.serialization.get_safe_globals())
    try:
        torch.serialization.clear_safe_globals()
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, weights_only=True)
        sg.register_safe_globals()
        out = torch.load(path, weights_only=True)
        assert out["args"].lr == 0.1 and out["mode"] is RerunMode.DISABLED
        # the enum class itself is not registered (BUILD on a member stays refused)
        assert RerunMode not in torch.serialization.get_safe_globals()
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(saved)


def test_gigatron_core_exports_megatrons_names():
    import gigatron.core

    assert gigatron.core.register_safe_globals is sg.register_safe_globals
    assert gigatron.core.safe_load_from_bytes is sg.safe_load_from_bytes
