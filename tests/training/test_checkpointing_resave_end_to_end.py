"""Issue 28, item 3, end to end: saves that re-save an iteration the save root already tracks.

`pretrain` on one gloo rank: a root tracking iteration 6, a run that `--load`s another root at
iteration 4 and saves into the first with `--save-interval 2`, SIGKILLed while writing iteration
6 (one `.distcp` left at 0 bytes); and a `--finetune` job restarted with the same `--save`,
killed the same way. Iteration 6 (2) still loads, byte for byte the old checkpoint. Then the
normal path on 2 ranks: sync and async re-saves agree on one staging dir and publish in place.
"""

import os

import pytest
import torch

from gigatron.core import dist_checkpointing as dc
from gigatron.testing import DistributedTestError, run_distributed
from gigatron.training import checkpointing as ckpt
from tests.training.test_checkpointing import Tiny, _args
from tests.training.test_checkpointing_resave import TRACKER, _arm, _bytes, _kill
from tests.training.test_final_eval import ARGS, _pretrain

pytestmark = pytest.mark.multirank


RUN = ARGS + ["--mock-data", "--eval-iters", "0"]
OTHER = ["--lr", "2e-3"]  # the --load source trains differently from the save root


def _setup_roots(work):
    """<work>/a tracks 6, <work>/b tracks 4, <work>/ft tracks 2 (a --finetune job from b)."""
    _pretrain(RUN + ["--train-iters", "6", "--save", f"{work}/a", "--save-interval", "6"])
    _pretrain(RUN + OTHER + ["--train-iters", "4", "--save", f"{work}/b", "--save-interval", "4"])
    _pretrain(RUN + _finetune_flags(work))


def _finetune_flags(work):
    return ["--load", f"{work}/b", "--finetune", "--save", f"{work}/ft", "--save-interval", "2",
            "--train-iters", "2"]  # fmt: skip


def _killed_run(argv):
    _arm("write", _kill)
    _pretrain(argv)


@pytest.mark.slow
def test_killed_resaves_leave_the_tracked_checkpoint_loadable(tmp_path):
    work = str(tmp_path)
    run_distributed(_setup_roots, 1, args=(work,))
    before = {
        r: _bytes(tmp_path / r / d) for r, d in (("a", "iter_0000006"), ("ft", "iter_0000002"))
    }
    resume = RUN + OTHER + ["--load", f"{work}/b", "--save", f"{work}/a", "--save-interval", "2",
                            "--train-iters", "8",
                            "--use-checkpoint-opt_param-scheduler"]  # fmt: skip
    for argv in (resume, RUN + _finetune_flags(work)):
        with pytest.raises(DistributedTestError, match="code -9"):
            run_distributed(_killed_run, 1, args=(argv,))
    for root, name, iteration in (("a", "iter_0000006", "6"), ("ft", "iter_0000002", "2")):
        assert (tmp_path / root / TRACKER).read_text() == iteration
        assert _bytes(tmp_path / root / name) == before[root]  # never modified
        (staging,) = (tmp_path / root).glob(f"{name}.tmp-*")  # where the killed run wrote
        assert any(p.stat().st_size == 0 for p in staging.glob("*.distcp"))
        dc.load_plain_tensors(str(tmp_path / root / name))


class _RowSharded(Tiny):
    """Tiny whose w1 / w2 are this rank's row block of a 2-rank global tensor."""

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        import torch.distributed as dist

        rank = dist.get_rank()
        return {
            k: dc.ShardedTensor.from_rank_offsets(k, p, (0, rank, 2))
            for k, p in (("layer.w1", self.w1), ("layer.w2", self.w2))
        }


def _two_rank_resaves(root):
    """Iteration 6 saved, re-saved, re-saved async (each time w1 moved); each loads back."""
    import torch.distributed as dist

    model = _RowSharded(seed=dist.get_rank())
    out = []
    for step, async_save in ((0, False), (1, False), (2, True)):
        with torch.no_grad():
            model.w1.add_(step)
        ckpt.save_checkpoint(6, model, None, None, args=_args(root, async_save=async_save))
        ckpt.maybe_finalize_async_save(blocking=True)
        out.append(sorted(n for n in os.listdir(root) if not n.startswith(".gigatron-save")))
        again = _RowSharded(seed=9)
        assert ckpt.load_checkpoint(again, None, None, args=_args(root, no_load_optim=True))[0] == 6
        out.append(torch.equal(again.w1, model.w1))
    return out


def test_two_ranks_resave_the_tracked_iteration_in_place(tmp_path):
    root = str(tmp_path / "ckpt")
    results = run_distributed(_two_rank_resaves, 2, args=(root,))
    assert results[0] == results[1]
    for i in range(3):
        assert results[0][2 * i] == ["iter_0000006", TRACKER]
        assert results[0][2 * i + 1] is True
    full = dc.load_plain_tensors(f"{root}/iter_0000006")["layer.w1"]
    rows = [Tiny(seed=r).w1.detach() + 0 + 1 + 2 for r in range(2)]  # the three moves
    assert torch.equal(full, torch.cat(rows))


def _publish_fails_on_rank0(root):
    """A re-save of the tracked iteration whose rename fails on rank 0: every rank raises
    (none waits in a collective) and the tracked copy still loads."""
    import torch.distributed as dist

    from gigatron.core.dist_checkpointing import checkpoint_files as commit

    model = _RowSharded(seed=dist.get_rank())
    ckpt.save_checkpoint(6, model, None, None, args=_args(root))
    saved = model.w1.detach().clone()
    with torch.no_grad():
        model.w1.add_(1.0)
    if dist.get_rank() == 0:

        def rename(src, dst):
            raise OSError("no space left on device")

        commit._rename = rename
    try:
        ckpt.save_checkpoint(6, model, None, None, args=_args(root))
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    again = _RowSharded(seed=9)
    ckpt.load_checkpoint(again, None, None, args=_args(root, no_load_optim=True))
    return error, torch.equal(again.w1, saved)


def test_a_publish_failing_on_rank0_raises_on_every_rank(tmp_path):
    (err0, ok0), (err1, ok1) = run_distributed(_publish_fails_on_rank0, 2, args=(str(tmp_path),))
    assert err0 == err1 and ok0 and ok1  # the same line on every rank
    assert err0.startswith("CheckpointingException: could not save iteration 6 into "), err0
    assert "rank 0 could not publish" in err0 and "OSError: no space left on device" in err0
