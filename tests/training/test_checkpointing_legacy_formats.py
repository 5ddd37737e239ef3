"""Checkpoints gigatron wrote before `sharded_state_dict()` became megatron-core's still load.

The fixtures (tests/fixtures/legacy_ckpt, written by the code of commit 91b63fd; its README has
the command) hold a tiny Llama-style GPT trained 2 steps at TP 2 x DP 2:
- `train/`: the training checkpoint (stacked layers, `_extra_state` objects, Adam moments of the
  distributed optimizer). `load_checkpoint` at the same layout gives the saved logits and the
  two training steps that followed the save (same losses); at TP 1 x DP 1 the same logits.
- `per_layer/`: the three-line snippet's save of that time (per-layer keys, no `_extra_state`
  objects). It loads at TP 1 and TP 2 through Megatron's own switch for per-layer keys,
  `sharded_state_dict(metadata={"non_homogeneous_layers": True})`, with a strictness that lets
  the `_extra_state` objects it lacks be missing; the default (stacked) request fails on it.
- `moe/`, `moe_grouped/`: an MoE GPT (4 experts, SwiGLU) trained 1 step, with SequentialMLP at
  EP 2 (experts as `local_experts.{global e}`) and with GroupedMLP at TP 2 x EP 2 (its own
  `mlp.experts.weight1` [E, h, 2f] / `weight2` [E, f, h]); per-layer keys, Adam moments.
  `load_checkpoint` recognises the layout (`gigatron.training.legacy_moe_checkpoint`) and resumes
  at the saved layout and at others (EP 1 x TP 1; GroupedMLP also at expert-TP 2) with the saved
  logits and the losses of the two steps that followed the save (which a misplaced moment, e.g.
  swapped GLU gate/up halves, would change). The model tensors also load through
  `dist_checkpointing.load(legacy_moe_request(model.sharded_state_dict(metadata=PER_LAYER)))`.
"""

import os
import shutil

import pytest
import torch

from gigatron.testing import run_distributed
from tests._paths import FIXTURES as FIXTURE_ROOT
from tests.fixtures.legacy_ckpt import make_legacy_ckpt as fx

pytestmark = pytest.mark.multirank


FIXTURES = os.path.join(FIXTURE_ROOT, "legacy_ckpt")


def _reference() -> dict:
    return torch.load(os.path.join(FIXTURES, "reference.pt"), weights_only=True)


def _resume(root: str, tp: int):
    from gigatron.training import checkpointing

    ddp, opt = fx.build(tp)
    iteration, _ = checkpointing.load_checkpoint([ddp], opt, None, args=fx.args(None, root))
    logits = fx.full_logits(ddp.module)
    losses = [fx.step(ddp, opt, n) for n in (2, 3)] if tp == 2 else []
    return iteration, logits, losses


def test_training_checkpoint_resumes_at_its_layout_and_loads_at_tp1(tmp_path):
    root = str(tmp_path / "train")
    shutil.copytree(os.path.join(FIXTURES, "train"), root)
    ref = _reference()
    for world, tp in ((4, 2), (1, 1)):
        iteration, logits, losses = run_distributed(_resume, world, args=(root, tp), timeout=240)[0]
        assert iteration == 2
        torch.testing.assert_close(logits, ref["logits"], rtol=0, atol=1e-5)
        if losses:  # the same layout: the optimizer state came back too
            torch.testing.assert_close(torch.tensor(losses), ref["losses"], rtol=0, atol=1e-6)


def _load_per_layer(ckpt_dir: str, tp: int):
    from gigatron.core import dist_checkpointing

    ddp, _ = fx.build(tp)
    model = ddp.module
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    try:
        dist_checkpointing.load(model.sharded_state_dict(), ckpt_dir)
        stacked_failed = False
    except Exception:
        stacked_failed = True
    request = model.sharded_state_dict(metadata={"non_homogeneous_layers": True})
    loaded = dist_checkpointing.load(request, ckpt_dir, strict="log_unexpected")
    model.load_state_dict(loaded)
    return stacked_failed, fx.full_logits(model)


def test_per_layer_snippet_checkpoint_loads_at_tp1_and_tp2():
    ckpt_dir = os.path.join(FIXTURES, "per_layer")
    ref = _reference()
    for world in (1, 2):
        stacked_failed, logits = run_distributed(
            _load_per_layer, world, args=(ckpt_dir, world), timeout=240
        )[0]
        assert stacked_failed
        torch.testing.assert_close(logits, ref["logits"], rtol=0, atol=1e-5)


# (fixture, world size, build_moe kwargs): the saved layout, then others
MOE_CASES = {
    "moe-ep2": ("moe", 2, dict(ep=2)),  # as saved
    "moe-ep1": ("moe", 1, dict(ep=1)),
    "grouped-tp2ep2": ("moe_grouped", 4, dict(ep=2, tp=2, etp=1, grouped=True)),  # as saved
    "grouped-ep1": ("moe_grouped", 1, dict(ep=1, grouped=True)),
    "grouped-tp2etp2": ("moe_grouped", 2, dict(ep=1, tp=2, etp=2, grouped=True)),
}


def _moe_reference(name: str) -> dict:
    return torch.load(os.path.join(FIXTURES, f"{name}_reference.pt"), weights_only=True)


def _resume_moe(root: str, kw: dict):
    from gigatron.training import checkpointing

    ddp, opt = fx.build_moe(**kw)
    args = fx.args(None, root)
    args.no_load_rng = True  # saved without
    iteration, _ = checkpointing.load_checkpoint([ddp], opt, None, args=args)
    ddp.module.eval()
    logits = fx.full_logits(ddp.module)
    ddp.module.train()
    return iteration, logits, [fx.moe_step(ddp, opt, n) for n in (1, 2)]


@pytest.mark.parametrize("case", MOE_CASES)
def test_moe_training_checkpoint_of_the_old_layout_resumes(case, tmp_path):
    name, world, kw = MOE_CASES[case]
    root = str(tmp_path / name)
    shutil.copytree(os.path.join(FIXTURES, name), root)
    ref = _moe_reference(name)
    iteration, logits, losses = run_distributed(_resume_moe, world, args=(root, kw), timeout=240)[0]
    assert iteration == 1
    torch.testing.assert_close(logits, ref["logits"], rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(losses), ref["losses"], rtol=0, atol=1e-5)


def _load_moe_snippet(ckpt_dir: str, kw: dict):
    from gigatron.core import dist_checkpointing
    from gigatron.training.legacy_moe_checkpoint import PER_LAYER, legacy_moe_request

    model = fx.build_moe(**kw)[0].module.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    request = {"model": legacy_moe_request(model.sharded_state_dict(metadata=PER_LAYER))}
    loaded = dist_checkpointing.load(request, ckpt_dir, strict="log_unexpected")  # no optimizer
    model.load_state_dict(loaded["model"])
    return fx.full_logits(model)


@pytest.mark.parametrize("case", MOE_CASES)
def test_moe_checkpoint_of_the_old_layout_loads_through_dist_checkpointing(case):
    name, world, kw = MOE_CASES[case]
    ckpt_dir = os.path.join(FIXTURES, name, "iter_0000001")
    logits = run_distributed(_load_moe_snippet, world, args=(ckpt_dir, kw), timeout=240)[0]
    torch.testing.assert_close(logits, _moe_reference(name)["logits"], rtol=0, atol=1e-5)
