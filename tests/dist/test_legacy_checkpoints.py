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
- `moe/`: an MoE GPT (SequentialMLP, 4 experts) trained 1 step at EP 2 (per-layer keys, experts
  as `local_experts.{global e}`, Adam moments): `load_checkpoint` recognises the layout
  (`gigatron.compat.legacy_moe_checkpoint`) and resumes at EP 2 and at EP 1 with the saved
  logits and the losses of the two steps that followed the save.
"""

import os
import shutil

import torch

from gigatron.testing import run_distributed
from tests.fixtures.legacy_ckpt import make_legacy_ckpt as fx

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "legacy_ckpt")


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


def _resume_moe(root: str, ep: int):
    from gigatron.training import checkpointing

    ddp, opt = fx.build_moe(ep)
    args = fx.args(None, root)
    args.no_load_rng = True  # saved without
    iteration, _ = checkpointing.load_checkpoint([ddp], opt, None, args=args)
    ddp.module.eval()
    logits = fx.full_logits(ddp.module)
    ddp.module.train()
    return iteration, logits, [fx.moe_step(ddp, opt, n) for n in (1, 2)]


def test_moe_training_checkpoint_of_the_old_layout_resumes_at_ep2_and_ep1(tmp_path):
    root = str(tmp_path / "moe")
    shutil.copytree(os.path.join(FIXTURES, "moe"), root)
    ref = torch.load(os.path.join(FIXTURES, "moe_reference.pt"), weights_only=True)
    for world, ep in ((2, 2), (1, 1)):
        iteration, logits, losses = run_distributed(
            _resume_moe, world, args=(root, ep), timeout=240
        )[0]
        assert iteration == 1
        torch.testing.assert_close(logits, ref["logits"], rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.tensor(losses), ref["losses"], rtol=0, atol=1e-5)
