"""A resumed run whose --seed or optimizer hyperparameters differ from the checkpoint's.

The checkpoint's param groups replace the flags' Adam betas / epsilon and SGD momentum on load,
and the data order is drawn from --seed: each difference is refused naming both values and the
way out; --override-opt_param-scheduler runs the flags' values and
--use-checkpoint-opt_param-scheduler the checkpoint's, and the load line says which won.
"""

import argparse

import pytest
import torch

from gigatron.core.utils import make_tp_sharded_tensor_for_checkpoint
from gigatron.testing import run_distributed
from gigatron.training import checkpointing as ckpt
from tests.training.test_resume_contract import MODEL, RUN, _cli, _one_error_line, _saved

pytestmark = pytest.mark.multirank


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, 4))

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return {f"{prefix}w": make_tp_sharded_tensor_for_checkpoint(self.w, "w", 0)}


def _adam(beta2):
    """A Tiny model and its Adam after one step (so the optimizer has state to save)."""
    model = Tiny()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, beta2))
    model.w.grad = torch.ones(4, 4)
    opt.step()
    return model, opt


def _args(tmp_path, **kw):
    base = dict(save=str(tmp_path), load=str(tmp_path), consumed_train_samples=0,
                optimizer="adam", adam_beta1=0.9, adam_eps=1e-8, clip_grad=1.0, seed=7)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.multirank
def test_another_adam_beta2_is_refused_unless_one_side_is_chosen(tmp_path):
    """Saved with --adam-beta2 0.999; resumed with 0.95: refused naming both values and both
    flags (before: the checkpoint's 0.999 ran, silently). With --override-opt_param-scheduler
    the step runs with 0.95, with --use-checkpoint-opt_param-scheduler with 0.999; the load line
    says which."""
    ckpt_dir = _saved(tmp_path, extra=["--adam-beta2", "0.999"])
    resume = MODEL + RUN + ["--train-iters", "3", "--load", ckpt_dir, "--adam-beta2", "0.95"]
    runs = [resume, resume + ["--override-opt_param-scheduler"],
            resume + ["--use-checkpoint-opt_param-scheduler"]]  # fmt: skip
    ((err, over, keep),) = run_distributed(_cli, 1, args=(runs,), timeout=180)
    _one_error_line(
        *err[::2],
        f"--adam-beta2: the optimizer hyperparameters differ from the checkpoint {ckpt_dir}/"
        "iter_0000003: adam_beta2 0.95 with these flags, 0.999 in the checkpoint; pass "
        "--override-opt_param-scheduler to continue on the flags' values, or "
        "--use-checkpoint-opt_param-scheduler to keep the checkpoint's",
    )
    assert over[0] == keep[0] == 0, over[2] + keep[2]
    assert (
        "optimizer hyperparameters on the flags' values (--override-opt_param-scheduler): "
        "adam_beta2 0.95 (checkpoint: 0.999)"
    ) in over[1]
    assert (
        "optimizer hyperparameters on the checkpoint's values "
        "(--use-checkpoint-opt_param-scheduler): adam_beta2 0.999 (flags: 0.95)"
    ) in keep[1]


@pytest.mark.multirank
def test_another_seed_is_refused_unless_override_seed(tmp_path):
    """Saved with --seed 7; resumed with --seed 8: refused naming both values (before: the rest
    of the epoch was drawn in another order, silently); --override-seed resumes and says so;
    another --optimizer or --sgd-momentum is refused the same way."""
    ckpt_dir = _saved(tmp_path)
    resume = MODEL + RUN + ["--train-iters", "3", "--load", ckpt_dir]
    runs = [resume + ["--seed", "8"], resume + ["--seed", "8", "--override-seed"],
            resume + ["--optimizer", "sgd"]]  # fmt: skip
    ((seed, forced, sgd),) = run_distributed(_cli, 1, args=(runs,), timeout=180)
    _one_error_line(
        *seed[::2],
        f"--seed 8 differs from the checkpoint {ckpt_dir}/iter_0000003's 7: the data order",
        "pass --seed 7 to continue the checkpoint's order, or --override-seed to draw a new one",
    )
    assert forced[0] == 0, forced[2]
    assert "seed 8 (checkpoint: 7; --override-seed: the data in a new order)" in forced[1]
    _one_error_line(*sgd[::2], "--optimizer sgd differs from the checkpoint", "--no-load-optim")


def test_the_chosen_side_is_what_the_param_groups_hold(tmp_path):
    """Through the Python API (torch.optim.Adam, no scheduler): the flags' beta2 after an
    override, the checkpoint's (in the args too) after use-checkpoint, refused without either."""
    m, opt = _adam(0.999)
    ckpt.save_checkpoint(1, m, opt, None, args=_args(tmp_path, adam_beta2=0.999))
    m, opt = _adam(0.95)
    with pytest.raises(ValueError, match=r"adam_beta2 0.95 with these flags, 0.999 in the"):
        ckpt.load_checkpoint(m, opt, None, args=_args(tmp_path, adam_beta2=0.95))
    args = _args(tmp_path, adam_beta2=0.95, override_opt_param_scheduler=True)
    ckpt.load_checkpoint(m, opt, None, args=args)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    m, opt = _adam(0.95)
    args = _args(tmp_path, adam_beta2=0.95, use_checkpoint_opt_param_scheduler=True)
    ckpt.load_checkpoint(m, opt, None, args=args)
    assert tuple(opt.param_groups[0]["betas"]) == (0.9, 0.999) and args.adam_beta2 == 0.999


def test_another_clip_grad_runs_with_a_note_but_adam_eps_is_refused():
    """--clip-grad is no optimizer state: a different value needs no side chosen; the load
    line names both values. Adam's eps still needs one."""
    from gigatron.training import _resume_checks as ca

    saved = argparse.Namespace(optimizer="adam", adam_eps=1e-8, clip_grad=1.0)
    flags = argparse.Namespace(optimizer="adam", adam_eps=1e-8, clip_grad=2.0)
    assert ca.optimizer_drift(saved, flags, None, "ck") == ([], "")
    assert (
        ca.clip_grad_note(saved, flags)
        == "--clip-grad 2.0 (checkpoint: 1.0): the flag's value runs"
    )
    assert ca.clip_grad_note(saved, saved) == ""
    flags.adam_eps = 1e-6
    with pytest.raises(ValueError, match="--adam-eps"):
        ca.optimizer_drift(saved, flags, None, "ck")
