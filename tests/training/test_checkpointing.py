"""Training checkpoints in one process: resume, flags, async bytes, crashes, unsafe payloads."""

import argparse
import os
import pickle
import random

import numpy as np
import pytest
import torch

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing.strategies import torch as torch_strategy
from gigatron.core.utils import (
    make_sharded_tensor_for_checkpoint,
    make_tp_sharded_tensor_for_checkpoint,
)
from gigatron.training import checkpointing as ckpt
from tests._paths import REPO


class Tiny(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.nn.Parameter(torch.randn(8, 4, generator=g))
        self.w2 = torch.nn.Parameter(torch.randn(4, 8, generator=g))

    def forward(self, x):
        return torch.tanh(x @ self.w1.t()) @ self.w2.t()

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return {  # as Megatron's modules: own state-dict keys -> global checkpoint keys
            f"{prefix}w1": make_tp_sharded_tensor_for_checkpoint(self.w1, "layer.w1", 0),
            f"{prefix}w2": make_tp_sharded_tensor_for_checkpoint(self.w2, "layer.w2", 1),
        }


class Sched:
    def __init__(self):
        self.num_steps = 0

    def step(self):
        self.num_steps += 1

    def state_dict(self):
        return {"num_steps": self.num_steps}

    def load_state_dict(self, sd):
        self.num_steps = sd["num_steps"]


def _setup(seed=0):
    model = Tiny(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt, Sched()


def _step(model, opt, sched):
    # Inputs come from every RNG a checkpoint restores.
    x = torch.randn(3, 4) + float(np.random.rand()) + random.random()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def _args(tmp_path, **kw):
    base = dict(save=str(tmp_path), load=str(tmp_path), consumed_train_samples=0)
    base.update(kw)
    return argparse.Namespace(**base)


def test_resume_is_bitwise_exact(tmp_path):
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    model, opt, sched = _setup()
    for _ in range(3):
        _step(model, opt, sched)
    args = _args(tmp_path, consumed_train_samples=12)
    ckpt.save_checkpoint(3, model, opt, sched, 123.0, args=args)
    assert open(tmp_path / "latest_checkpointed_iteration.txt").read() == "3"
    assert sorted(os.listdir(tmp_path / "iter_0000003"))[-2:] == ["common.pt", "metadata.json"]
    ref = [_step(model, opt, sched) for _ in range(3)]
    ref_w = model.w1.detach().clone()

    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    model2, opt2, sched2 = _setup(seed=5)
    args2 = _args(tmp_path)
    assert ckpt.load_checkpoint(model2, opt2, sched2, args=args2) == (3, 123.0)
    assert args2.consumed_train_samples == 12 and sched2.num_steps == 3
    got = [_step(model2, opt2, sched2) for _ in range(3)]
    assert got == ref and torch.equal(model2.w1, ref_w)


def test_finetune_and_no_load_optim(tmp_path):
    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(1, model, opt, sched, args=_args(tmp_path))
    for flags, expect_iter in (({"finetune": True}, 0), ({"no_load_optim": True}, 1)):
        m2, o2, s2 = _setup(seed=3)
        it, _ = ckpt.load_checkpoint(m2, o2, s2, args=_args(tmp_path, **flags))
        assert it == expect_iter and torch.equal(m2.w1, model.w1)
        assert not o2.state and s2.num_steps == 0  # weights only


def test_no_tracker_starts_from_scratch_and_damage_is_reported(tmp_path):
    model, opt, sched = _setup()
    assert ckpt.load_checkpoint(model, opt, sched, args=_args(tmp_path)) == (0, 0)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12x")
    with pytest.raises(dc.CheckpointingException, match="damaged"):
        ckpt.load_checkpoint(model, opt, sched, args=_args(tmp_path))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("40")
    with pytest.raises(dc.CheckpointingException, match="iter_0000040"):
        ckpt.load_checkpoint(model, opt, sched, args=_args(tmp_path))


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(1, model, opt, sched, args=_args(tmp_path))
    saved_w = model.w1.detach().clone()
    _step(model, opt, sched)
    real_write = torch_strategy.PendingSave.write

    def crash(self):
        real_write(self)  # data files are on disk ...
        raise OSError("disk full")  # ... but the save never finishes

    monkeypatch.setattr(torch_strategy.PendingSave, "write", crash)
    with pytest.raises(dc.CheckpointingException, match="OSError: disk full"):
        ckpt.save_checkpoint(2, model, opt, sched, args=_args(tmp_path))
    monkeypatch.undo()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert not (tmp_path / "iter_0000002" / "metadata.json").exists()
    m2, o2, s2 = _setup(seed=4)
    assert ckpt.load_checkpoint(m2, o2, s2, args=_args(tmp_path))[0] == 1
    assert torch.equal(m2.w1, saved_w)
    ckpt.save_checkpoint(2, model, opt, sched, args=_args(tmp_path))  # retry succeeds
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"


def _files(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d) if n != ".metadata"}


def test_async_save_writes_the_same_bytes(tmp_path):
    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(5, model, opt, sched, args=_args(tmp_path / "sync"))
    torch.manual_seed(0)  # RNG state is part of the checkpoint: make both saves see the same
    state = torch.get_rng_state()
    torch.set_rng_state(state)
    ckpt.save_checkpoint(5, model, opt, sched, args=_args(tmp_path / "sync"))
    torch.set_rng_state(state)
    ckpt.save_checkpoint(5, model, opt, sched, args=_args(tmp_path / "async", async_save=True))
    before = model.w1.detach().clone()
    with torch.no_grad():
        model.w1.add_(1.0)  # training goes on while the write runs
    ckpt.maybe_finalize_async_save(blocking=True)
    assert (tmp_path / "async" / "latest_checkpointed_iteration.txt").read_text() == "5"
    sync, asyn = (
        _files(tmp_path / "sync" / "iter_0000005"),
        _files(tmp_path / "async" / "iter_0000005"),
    )
    common = [n for n in sync if n not in ("common.pt",)]
    assert sorted(sync) == sorted(asyn) and all(sync[n] == asyn[n] for n in common)
    full = dc.load_plain_tensors(str(tmp_path / "async" / "iter_0000005"))
    assert torch.equal(full["layer.w1"], before)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/gigatron_pwned_marker",))


def test_code_running_pickles_are_rejected(tmp_path):
    marker = "/tmp/gigatron_pwned_marker"
    if os.path.exists(marker):
        os.remove(marker)
    model, opt, sched = _setup()
    ckpt.save_checkpoint(1, model, opt, sched, args=_args(tmp_path))
    d = tmp_path / "iter_0000001"
    torch.save({"iteration": 1, "evil": _Evil()}, d / "common.pt")
    with pytest.raises(dc.CheckpointingException, match="allow-list"):
        ckpt.load_checkpoint(model, opt, sched, args=_args(tmp_path))
    with open(d / ".metadata", "wb") as f:
        pickle.dump(_Evil(), f)
    with pytest.raises(dc.CheckpointingException, match="forbidden"):
        dc.load_tensors_metadata(str(d))
    assert not os.path.exists(marker)


def test_integrity_manifest_detects_a_flipped_byte(tmp_path):
    model, opt, sched = _setup()
    args = _args(tmp_path, ckpt_verify_integrity=True)
    ckpt.save_checkpoint(1, model, opt, sched, args=args)
    d = tmp_path / "iter_0000001"
    assert (d / "integrity_sha256.json").exists()
    ckpt.load_checkpoint(*_setup(seed=2), args=args)
    data = next(p for p in d.iterdir() if p.suffix == ".distcp")
    raw = bytearray(data.read_bytes())
    raw[-20] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(dc.CheckpointingException, match="SHA-256"):
        ckpt.load_checkpoint(*_setup(seed=2), args=args)


def _save_then_die(root):
    """Child process: save iteration 1, then get SIGKILLed in the middle of saving iteration 2."""
    import signal

    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(1, model, opt, sched, args=_args(root))
    torch.save(model.w1.detach(), os.path.join(root, "w1_at_1.pt"))
    _step(model, opt, sched)
    real_write = torch_strategy.PendingSave.write

    def write_then_die(self):
        real_write(self)
        os.kill(os.getpid(), signal.SIGKILL)

    torch_strategy.PendingSave.write = write_then_die
    ckpt.save_checkpoint(2, model, opt, sched, args=_args(root))


def test_process_killed_during_save_resumes_from_last_complete(tmp_path):
    import subprocess
    import sys

    root = str(REPO)
    code = (
        "import sys; from tests.training.test_checkpointing import _save_then_die as f; "
        "f(sys.argv[1])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=root, capture_output=True
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    # The killed save got as far as its data files, in its own staging dir, never in iter_N/.
    (staging,) = tmp_path.glob("iter_0000002.tmp-*")
    assert any(p.suffix == ".distcp" for p in staging.iterdir())
    assert not (tmp_path / "iter_0000002").exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    model, opt, sched = _setup(seed=7)
    assert ckpt.load_checkpoint(model, opt, sched, args=_args(tmp_path))[0] == 1
    assert torch.equal(model.w1.detach(), torch.load(tmp_path / "w1_at_1.pt"))


def test_strict_and_non_strict_load_of_a_model_with_a_new_tensor(tmp_path):
    model, opt, sched = _setup()
    ckpt.save_checkpoint(1, model, opt, sched, args=_args(tmp_path))
    grown = Tiny(seed=9)
    grown.w3 = torch.nn.Parameter(torch.ones(2))
    entries = grown.sharded_state_dict()
    w3 = make_sharded_tensor_for_checkpoint(grown.w3, "layer.w3")
    grown.sharded_state_dict = lambda **kw: {**entries, "w3": w3}
    with pytest.raises(dc.CheckpointingException, match="layer.w3"):
        ckpt.load_checkpoint(grown, None, None, args=_args(tmp_path))
    ckpt.load_checkpoint(grown, None, None, strict=False, args=_args(tmp_path))
    assert torch.equal(grown.w1, model.w1) and torch.equal(grown.w3, torch.ones(2))


def test_load_fills_the_given_tensors_in_place(tmp_path):
    """dist_checkpointing.load writes into the caller's tensors (also non-contiguous ones) and
    returns views of their storage: no staging copy replaces them."""
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    saved = {"w": dc.ShardedTensor.from_rank_offsets("w", full.clone())}
    dc.save(saved, str(tmp_path))
    dest = torch.full((6, 4), float("nan")).t()  # [4, 6], non-contiguous
    plain = torch.full((4, 6), float("nan"))
    for target in (dest, plain):
        loaded = dc.load({"w": dc.ShardedTensor.from_rank_offsets("w", target)}, str(tmp_path))
        assert loaded["w"].data_ptr() == target.data_ptr()
        assert torch.equal(target, full)
