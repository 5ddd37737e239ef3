"""Megatron-LM's resume contract through `gigatron train` on gloo ranks (issue 30, item 1).

Before: resuming a 3-iteration checkpoint with --train-iters 5 ran the 2 new steps at learning
rate 0 (the checkpoint's decay was over) and a different --lr kept the old one, both silently;
--override-opt_param-scheduler / --use-checkpoint-opt_param-scheduler were unknown flags; a
checkpoint of 4 heads with learned positions resumed with --num-attention-heads 8 or
--position-embedding-type rope loaded and trained; nothing said what was loaded. Now the
scheduler refuses the mismatch naming the value and both ways out, the model flags are checked
against the checkpoint's (Megatron's check_checkpoint_args) unless --finetune or
--use-checkpoint-args, and rank 0 prints one line per load.

Each rank runs `gigatron.cli.main` in-process and returns (exit status, stdout, stderr)."""

import re

import pytest

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "16"]  # fmt: skip
RUN = ["--micro-batch-size", "2", "--lr", "1e-3", "--mock-data", "--vocab-size", "100",
       "--log-interval", "1", "--eval-iters", "0", "--no-progress-bar", "--num-workers", "0",
       "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7"]  # fmt: skip


def _cli(runs):
    """Each argv of `runs` through `gigatron.cli.main` on this rank: [(rc, stdout, stderr)]."""
    import contextlib
    import io

    from gigatron import cli
    from gigatron.core import parallel_state as ps
    from gigatron.core.num_microbatches_calculator import unset_num_microbatches_calculator
    from gigatron.training import global_vars

    results = []
    for argv in runs:
        unset_num_microbatches_calculator()
        global_vars.destroy_global_vars()
        ps.destroy_model_parallel()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(["train", *argv])
            except SystemExit as e:
                rc = e.code
        results.append((rc, out.getvalue(), err.getvalue()))
    return results


def _lrs(stdout: str) -> dict[int, float]:
    """{iteration: learning rate} from the log lines."""
    found = re.findall(r"iteration\s+(\d+)/\s*\d+ \|.*?learning rate: (\S+) \|", stdout)
    return {int(i): float(lr) for i, lr in found}


def _one_error_line(rc, stderr, *parts):
    assert rc == 2, (rc, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gigatron train: error: "), stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


def _saved(tmp_path, world=1, extra=()):
    ckpt = str(tmp_path / "ckpt")
    save = MODEL + RUN + ["--train-iters", "3", "--save", ckpt, *extra]
    assert all(r[0][0] == 0 for r in run_distributed(_cli, world, args=([save],), timeout=120))
    return ckpt


def test_a_longer_run_is_refused_naming_the_schedule_on_every_rank(tmp_path):
    """TP 2 on 2 ranks: --train-iters 5 against a 3-iteration checkpoint stops both ranks with
    status 2; rank 0 prints the one line (the decay length in samples and iterations, both
    flags), rank 1 nothing. Before: both trained 2 steps at learning rate 0."""
    tp2 = ["--tensor-model-parallel-size", "2"]
    ckpt = _saved(tmp_path, 2, tp2)
    resume = MODEL + RUN + tp2 + ["--train-iters", "5", "--load", ckpt]
    (r0,), (r1,) = run_distributed(_cli, 2, args=([resume],), timeout=120)
    _one_error_line(
        *r0[::2],
        "--lr-decay-iters (default --train-iters): the learning-rate schedule differs from the "
        f"checkpoint {ckpt}/iter_0000003: lr_decay_steps is 10 samples (5 iterations of 2) "
        "with these flags, 6 samples (3 iterations of 2) in the checkpoint; pass "
        "--override-opt_param-scheduler to continue on the flags' schedule, or "
        "--use-checkpoint-opt_param-scheduler to keep the checkpoint's",
    )
    assert r1[0] == 2 and r1[2] == "", r1
    assert "Traceback" not in r0[2] + r1[2]


def test_override_takes_the_flags_and_use_checkpoint_keeps_the_checkpoints(tmp_path):
    """From the 3-iteration checkpoint, 2 more steps: with --override-opt_param-scheduler (or
    its all-dash spelling) at the learning rates of an uninterrupted 5-iteration run, also with
    a new --lr (2e-3); with --use-checkpoint-opt_param-scheduler (either spelling) at the
    checkpoint's (its decay is over: 0, as Megatron). Both flags at once: refused."""
    ckpt = _saved(tmp_path)
    five = MODEL + RUN + ["--train-iters", "5"]
    runs = [
        five,
        five + ["--lr", "2e-3"],
        five + ["--load", ckpt, "--override-opt_param-scheduler"],
        five + ["--load", ckpt, "--override-opt-param-scheduler", "--lr", "2e-3"],
        five + ["--load", ckpt, "--use-checkpoint-opt_param-scheduler"],
        five + ["--load", ckpt, "--use-checkpoint-opt-param-scheduler", "--lr", "2e-3"],
        five + ["--load", ckpt, "--lr", "2e-3"],
        five + ["--load", ckpt, "--override-opt_param-scheduler",
                "--use-checkpoint-opt_param-scheduler"],
    ]  # fmt: skip
    ((ref, ref_lr, over, over_lr, keep, keep_lr, lr_err, both),) = run_distributed(
        _cli, 1, args=(runs,), timeout=180
    )
    assert all(r[0] == 0 for r in (ref, ref_lr, over, over_lr, keep, keep_lr)), over[2]
    for resumed, fresh in ((over, ref), (over_lr, ref_lr)):
        assert list(_lrs(resumed[1])) == [4, 5], resumed[1]
        assert _lrs(resumed[1]) == {i: _lrs(fresh[1])[i] for i in (4, 5)}
        assert _lrs(resumed[1])[4] > 0
    assert _lrs(over_lr[1])[4] == 2 * _lrs(over[1])[4]
    assert _lrs(keep[1]) == _lrs(keep_lr[1]) == {4: 0.0, 5: 0.0}
    assert (
        f"loaded {ckpt}/iter_0000003: iteration 3, consumed samples 6; model, optimizer, "
        "scheduler on the flags' values (--override-opt_param-scheduler), RNG\n"
    ) in over[1]
    assert "scheduler on the checkpoint's values (--use-checkpoint-opt_param-scheduler)" in keep[1]
    _one_error_line(*lr_err[::2], "--lr: ", "max_lr is 0.002 with these flags, 0.001 in the ")
    _one_error_line(*both[::2], "are mutually exclusive")


def test_a_different_model_is_refused_unless_finetune_or_use_checkpoint_args(tmp_path):
    """A 4-head, learned-position checkpoint: --num-attention-heads 8 and --position-embedding
    -type rope are refused naming both values (before: loaded and trained); --finetune loads the
    weights into the rope model from iteration 0; --use-checkpoint-args takes the model flags
    from the checkpoint (none given here; its forced fields replace --position-embedding-type
    rope, as Megatron's load_args_from_checkpoint does)."""
    ckpt = _saved(tmp_path)
    resume = RUN + ["--train-iters", "4", "--load", ckpt]
    runs = [
        MODEL + resume + ["--num-attention-heads", "8"],
        MODEL + resume + ["--position-embedding-type", "rope"],
        MODEL + resume + ["--position-embedding-type", "rope", "--finetune",
                          "--train-iters", "1"],
        resume + ["--use-checkpoint-args", "--position-embedding-type", "rope",
                  "--use-checkpoint-opt_param-scheduler"],
    ]  # fmt: skip
    ((heads, rope, finetune, from_ckpt),) = run_distributed(_cli, 1, args=(runs,), timeout=180)
    hint = "or --finetune to load only its weights into this model"
    _one_error_line(*heads[::2], "num_attention_heads 8 (checkpoint: 4)", hint)
    assert "num_query_groups" not in heads[2]  # derived from the heads without GQA
    _one_error_line(*rope[::2], "position_embedding_type rope (checkpoint: learned_absolute)")
    assert finetune[0] == 0 and list(_lrs(finetune[1])) == [1], finetune[2]
    loaded = (f"loaded the weights of {ckpt}/iter_0000003 (saved at iteration 3): iteration 0, "
              "fresh optimizer, scheduler and RNG (--finetune)")  # fmt: skip
    assert loaded in finetune[1]
    assert from_ckpt[0] == 0 and list(_lrs(from_ckpt[1])) == [4], from_ckpt[2]
    line = next(s for s in from_ckpt[1].splitlines() if s.startswith("--use-checkpoint-args"))
    assert f"model flags from {ckpt}/iter_0000003: set num_layers=2, hidden_size=32" in line
    assert "replacing the command line's position_embedding_type rope -> learned_absolute" in line


def test_no_load_optim_and_no_load_rng_say_what_starts_fresh(tmp_path):
    """--no-load-optim leaves the optimizer and the scheduler fresh (so a longer run is no
    schedule mismatch, as in Megatron); --no-load-rng the RNG. The load line says which."""
    ckpt = _saved(tmp_path)
    resume = MODEL + RUN + ["--load", ckpt]
    runs = [resume + ["--train-iters", "5", "--no-load-optim"],
            resume + ["--train-iters", "3", "--no-load-rng"]]  # fmt: skip
    ((optim, rng),) = run_distributed(_cli, 1, args=(runs,), timeout=120)
    assert optim[0] == rng[0] == 0, optim[2] + rng[2]
    assert (
        f"loaded {ckpt}/iter_0000003: iteration 3, consumed samples 6; model, RNG; "
        "fresh: optimizer and scheduler (--no-load-optim)\n"
    ) in optim[1]
    assert "; model, optimizer, scheduler (same values as the flags); fresh: RNG\n" in rng[1]
