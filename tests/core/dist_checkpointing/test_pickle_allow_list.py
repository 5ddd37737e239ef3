"""Checkpoint pickles from elsewhere cannot run code.

Every loader a checkpoint reaches (DCP `.metadata`, `common.pt`, objects inside `.distcp`, and the
CLI commands that read them) is fed hand-built pickles that try the known ways out of an
allow-list: dotted names walking out of an allowed module or class (protocol 4/5), `builtins`
eval/exec/getattr/__import__, `__reduce_ex__` payloads, copyreg, functools.partial, the INST /
OBJ / EXT opcodes and nesting inside legitimate DCP objects. Each must be refused with a
`CheckpointingException` naming the file, and the payload's command must never run.
"""

from __future__ import annotations

import argparse
import copyreg
import importlib
import io
import json
import os
import pickle
import subprocess
import sys
import zipfile

import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing._safe_load import restricted_pickle_load, safe_torch_load
from gigatron.training import checkpointing as ckpt


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "a checkpoint payload ran a shell command"


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _call_stack_global(module: str, name: str, arg: str, proto: int = 4) -> bytes:
    """protocol 4/5: STACK_GLOBAL(module, name)(arg) — the opcode that resolves dotted names."""
    return bytes([0x80, proto]) + _str(module) + _str(name) + b"\x93" + _str(arg) + b"\x85R."


def _call_global(module: str, name: str, arg: str) -> bytes:
    """protocol 2: GLOBAL 'module\\nname'(arg)."""
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + _str(arg) + b"\x85R."


def _inst(module: str, name: str, arg: str) -> bytes:
    """protocol 0: MARK arg INST 'module\\nname' — calls the global without REDUCE."""
    return b"(V" + arg.encode() + b"\ni" + f"{module}\n{name}\n".encode() + b"."


def _obj(module: str, name: str, arg: str) -> bytes:
    """protocol 1: MARK GLOBAL arg OBJ."""
    return b"(c" + f"{module}\n{name}\n".encode() + b"V" + arg.encode() + b"\no."


class _ReduceEx:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce_ex__(self, protocol):
        return (os.system, (self.cmd,))


class _Partial:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        import functools

        return (functools.partial(os.system, self.cmd), ())


# every module an allow-list here names (or named before exact pairs)
_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner", "torch.distributed.checkpoint._extension",
    "torch", "torch.serialization", "collections", "pathlib", "argparse", "types", "io",
    "numpy", "numpy._core.multiarray",
)  # fmt: skip


def _modules_with_os() -> list[tuple[str, str]]:
    """(module, dotted name) for every allowed module that has `os` (or `_os`) as attribute."""
    out = []
    for m in _ALLOWED_MODULES:
        try:
            mod = importlib.import_module(m)
        except ImportError:
            continue
        out += [(m, f"{a}.system") for a in ("os", "_os") if hasattr(mod, a)]
    return out


def _payloads(cmd: str) -> list[tuple[str, bytes]]:
    """(label, pickle bytes): every one would run `cmd` through an unrestricted unpickler."""
    out = []
    for module, dotted in _modules_with_os():
        for proto in (4, 5):
            out.append(
                (f"p{proto} {module}.{dotted}", _call_stack_global(module, dotted, cmd, proto))
            )
    # walking out of an allowed class to its module's globals
    out.append(
        ("class walk", _call_stack_global(f"{Metadata.__module__}", "Metadata.__class__", cmd))
    )
    py = f"__import__('os').system({cmd!r})"
    for name, arg in (("eval", py), ("exec", py), ("__import__", "os"), ("getattr", "x")):
        out.append((f"builtins.{name}", _call_global("builtins", name, arg)))
    for mod in ("posix", "os", "subprocess", "copyreg", "functools", "torch", "nt"):
        name = {"subprocess": "getoutput", "copyreg": "_reconstructor", "functools": "partial",
                "torch": "load"}.get(mod, "system")  # fmt: skip
        out.append((f"{mod}.{name}", _call_global(mod, name, cmd)))
    out.append(("INST", _inst("posix", "system", cmd)))
    out.append(("OBJ", _obj("posix", "system", cmd)))
    for proto in (2, 4, 5):
        out.append((f"__reduce_ex__ p{proto}", pickle.dumps(_ReduceEx(cmd), protocol=proto)))
    out.append(("functools.partial", pickle.dumps(_Partial(cmd), protocol=4)))
    nested = Metadata(state_dict_metadata={"w": [{"x": _ReduceEx(cmd)}]})
    for proto in (2, 4, 5):
        out.append((f"nested in DCP Metadata p{proto}", pickle.dumps(nested, protocol=proto)))
    out.append(("persistent id", b"\x80\x02Px\n."))
    return out


def _ext_payload(cmd: str) -> bytes:
    """EXT1 240 -> (posix, system) through copyreg's extension registry."""
    return b"\x80\x02\x82\xf0" + _str(cmd) + b"\x85R."


def _as_torch_file(raw_pickle: bytes) -> bytes:
    """A torch.save zip whose `data.pkl` is replaced by `raw_pickle`."""
    buf = io.BytesIO()
    torch.save({"a": 1}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = raw_pickle if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info, data)
    return out.getvalue()


def test_bypass_family_is_listed_as_expected(marker):
    labels = [label for label, _ in _payloads(f"touch {marker}")]
    # the reported bypass: a dotted name through DCP's filesystem module
    assert "p4 torch.distributed.checkpoint.filesystem.os.system" in labels
    assert len(labels) > 25


@pytest.mark.parametrize("proto", [4, 5])
def test_metadata_unpickler_refuses_every_bypass(marker, proto):
    for label, payload in _payloads(f"touch {marker}"):
        if label.startswith("p") and not label.startswith(f"p{proto}"):
            continue
        with pytest.raises(dc.CheckpointingException, match="DCP metadata") as err:
            restricted_pickle_load(io.BytesIO(payload), what="DCP metadata x/.metadata")
        assert not marker.exists(), label
        assert "x/.metadata" in str(err.value), label


def test_metadata_unpickler_refuses_extension_opcodes(marker):
    copyreg.add_extension("posix", "system", 240)
    try:
        with pytest.raises(dc.CheckpointingException, match="forbidden"):
            restricted_pickle_load(io.BytesIO(_ext_payload(f"touch {marker}")), what="m")
    finally:
        copyreg.remove_extension("posix", "system", 240)


def test_metadata_unpickler_still_reads_real_metadata(tmp_path):
    sd = {"w": dc.ShardedTensor.from_rank_offsets("w", torch.arange(6.0).view(2, 3))}
    (tmp_path / "c").mkdir()
    dc.save(sd, str(tmp_path / "c"))
    with open(tmp_path / "c" / ".metadata", "rb") as f:
        md = restricted_pickle_load(f, what="real")
    assert tuple(md.state_dict_metadata["w"].size) == (2, 3)


def test_torch_payload_loader_refuses_every_bypass(marker):
    for label, payload in _payloads(f"touch {marker}"):
        with pytest.raises(dc.CheckpointingException) as err:
            safe_torch_load(io.BytesIO(_as_torch_file(payload)), what="ckpt/common.pt")
        assert "ckpt/common.pt" in str(err.value), label
        assert "weights_only` set to `False" not in str(err.value), label  # no unsafe advice
        assert not marker.exists(), label


def _saved_checkpoint(root) -> str:
    model = torch.nn.Linear(4, 4)
    args = argparse.Namespace(save=str(root), load=str(root), consumed_train_samples=8)
    ckpt.save_checkpoint(3, model, torch.optim.Adam(model.parameters()), None, args=args)
    return os.path.join(root, "iter_0000003")


def _evil_metadata(ckpt_dir: str, marker) -> None:
    payload = _call_stack_global(
        "torch.distributed.checkpoint.filesystem", "os.system", f"touch {marker}"
    )
    with open(os.path.join(ckpt_dir, ".metadata"), "wb") as f:
        f.write(payload)


def test_library_entry_points_refuse_a_crafted_metadata(tmp_path, marker):
    d = _saved_checkpoint(tmp_path / "ckpt")
    _evil_metadata(d, marker)
    for fn in (dc.load_tensors_metadata, dc.load_plain_tensors):
        with pytest.raises(dc.CheckpointingException, match="forbidden"):
            fn(d)
    model = torch.nn.Linear(4, 4)
    args = argparse.Namespace(load=str(tmp_path / "ckpt"))
    with pytest.raises(dc.CheckpointingException, match="forbidden"):
        ckpt.load_checkpoint(model, None, None, args=args)


def test_library_entry_points_refuse_a_crafted_common_state(tmp_path, marker):
    d = _saved_checkpoint(tmp_path / "ckpt")
    payload = _call_stack_global("pathlib", "os.system", f"touch {marker}")
    with open(os.path.join(d, "common.pt"), "wb") as f:
        f.write(_as_torch_file(payload))
    with pytest.raises(dc.CheckpointingException, match="common.pt"):
        dc.load_common_state_dict(d)


_GPT2_CONFIG = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 64, "n_embd": 32,
    "n_layer": 2, "n_head": 4, "n_positions": 16, "n_inner": None,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
}  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "--load", "{ckpt}", "--prompt", "1 2", "--max-new-tokens", "1",
         "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "16", "--max-position-embeddings", "16",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"],
        ["convert", "gigatron-to-hf", "--load", "{ckpt}", "--save", "{out}",
         "--hf-config", "{hf}"],
    ],
    ids=["generate", "convert"],
)  # fmt: skip
def test_cli_refuses_a_crafted_metadata(tmp_path, marker, command):
    root = tmp_path / "ckpt"
    _evil_metadata(_saved_checkpoint(root), marker)
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps(_GPT2_CONFIG))
    argv = [a.format(ckpt=root, out=tmp_path / "out", hf=hf) for a in command]
    proc = subprocess.run(
        [sys.executable, "-m", "gigatron.cli", *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "forbidden" in proc.stderr + proc.stdout, proc.stderr[-2000:]
