"""run_distributed's result unpickler: code-running payloads are refused before anything runs,
tensors / NumPy / plain data round-trip exactly, other classes need `safe_globals`."""

import dataclasses
import io
import os
import pickle

import numpy as np
import pytest
import torch

from gigatron.testing.distributed import _load_result


class _RunsCode:
    """Unpickling this calls os.system (the classic pickle attack)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _NestedInStorage:
    """A tensor-storage global whose bytes hide a code-running torch.save payload."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        buf = io.BytesIO()
        torch.save(_RunsCode(self.marker), buf)
        return torch.storage._load_from_bytes, (buf.getvalue(),)


@dataclasses.dataclass
class _Report:
    loss: float
    grads: dict


def test_os_system_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"ok": 1.0, "evil": _RunsCode(marker)})
    refused = r"refusing global 'posix\.system'.*safe_globals"
    with pytest.raises(pickle.UnpicklingError, match=refused):
        _load_result(data)
    assert not marker.exists()
    pickle.loads(data)  # control: unrestricted pickle really would have run it
    assert marker.exists()


def test_payload_hidden_in_tensor_storage_bytes_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(pickle.UnpicklingError, match=r"tensor storage bytes.*posix\.system"):
        _load_result(pickle.dumps([_NestedInStorage(marker)]))
    assert not marker.exists()


def test_tensor_dict_float_payload_round_trips():
    param = torch.nn.Parameter(torch.randn(3, 2))
    param.tensor_model_parallel = True  # Megatron-style attribute travels with the parameter
    tagged = torch.arange(4.0)
    tagged.note = "kept"
    value = {
        "loss": 2.5,
        "step": 7,
        "name": "rank0",
        "flags": (True, None, 1j, b"x"),
        "grad": torch.randn(4, 3),
        "bf16_view": torch.arange(6, dtype=torch.bfloat16)[2:],
        "leaf": torch.ones(2, requires_grad=True),
        "param": param,
        "tagged": tagged,
        "meta": [torch.float16, torch.Size([2, 3]), torch.device("cpu"), slice(1, 3), {3, 4}],
        "np": np.arange(5, dtype=np.float32),
        "np_scalar": np.float64(0.125),
        "np_dtype": np.dtype("int64"),
    }
    got = _load_result(pickle.dumps(value))
    assert got.keys() == value.keys()
    for key in ("loss", "step", "name", "flags", "meta", "np_scalar", "np_dtype"):
        assert got[key] == value[key], key
    for key in ("grad", "bf16_view", "leaf", "tagged"):
        torch.testing.assert_close(got[key], value[key], rtol=0, atol=0)
    assert got["bf16_view"].dtype == torch.bfloat16 and got["leaf"].requires_grad
    assert got["tagged"].note == "kept"
    assert isinstance(got["param"], torch.nn.Parameter) and got["param"].tensor_model_parallel
    torch.testing.assert_close(got["param"].data, param.data, rtol=0, atol=0)
    np.testing.assert_array_equal(got["np"], value["np"])
    assert got["np"].dtype == np.float32


def test_other_classes_need_safe_globals():
    data = pickle.dumps(_Report(loss=1.0, grads={"w": torch.ones(2)}))
    name = f"{__name__}._Report"
    with pytest.raises(pickle.UnpicklingError, match=rf"'{name}'.*safe_globals=\[{name}\]"):
        _load_result(data)
    got = _load_result(data, safe_globals=[_Report])
    assert got.loss == 1.0 and got.grads["w"].tolist() == [1.0, 1.0]


def test_a_result_cannot_set_state_on_an_allowed_function():
    fn = torch._utils._rebuild_tensor_v2
    name = b"\x8c\x0ctorch._utils\x8c\x12_rebuild_tensor_v2\x93"  # STACK_GLOBAL
    payload = b"\x80\x04" + name + b"}\x8c\x08poisonedK\x01sb."  # BUILD {"poisoned": 1}
    try:
        with pytest.raises(pickle.UnpicklingError, match="BUILD on the function"):
            _load_result(payload)
        assert not hasattr(fn, "poisoned")
    finally:
        fn.__dict__.pop("poisoned", None)
