"""`--profile` (Megatron's flags): the torch profiler covers iterations start .. end - 1 on the
ranks in --profile-ranks only, writes its trace into --tensorboard-dir and prints the summary;
a window the run does not finish is closed at the end; bad windows are refused by name."""

import glob
import os
from types import SimpleNamespace

import pytest

from gigatron.testing import run_distributed
from gigatron.training._profiler import check_profile_args
from tests.training._gpt_runs import ARGS, run_pretrain_gpt

pytestmark = pytest.mark.multirank


def _profiled_run(tb_dir: str, extra: list[str]):
    import contextlib
    import io

    import torch.distributed as dist

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_pretrain_gpt(
            ARGS
            + ["--train-iters", "6", "--tensorboard-dir", f"{tb_dir}/{dist.get_rank()}"]
            + ["--profile", "--use-pytorch-profiler"]
            + extra
        )
    return out.getvalue()


def _summary(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("profile: ")]


def test_pytorch_profiler_window_on_the_chosen_rank(tmp_path):
    outs = run_distributed(
        _profiled_run,
        2,
        args=(
            str(tmp_path),
            ["--profile-step-start", "2", "--profile-step-end", "4", "--profile-ranks", "1"],
        ),
        timeout=300,
    )
    assert _summary(outs[0]) == []  # rank 0 is not in --profile-ranks
    lines = _summary(outs[1])
    assert lines[0].startswith("profile: CPU self time of operators per iteration")
    assert lines[0].endswith("over 2 iterations")
    assert "aten::mm" in outs[1] or "aten::addmm" in outs[1]  # the model's GEMMs are listed
    (trace,) = glob.glob(os.path.join(tmp_path, "1", "*.pt.trace.json"))
    assert not glob.glob(os.path.join(tmp_path, "0", "*.pt.trace.json"))
    text = open(trace).read()
    assert '"python_function"' in text  # Megatron's settings: Python stacks
    # exactly iterations 2 and 3 (numbered by the iterations done before them) were recorded
    assert '"iteration 2"' in text and '"iteration 3"' in text
    assert '"iteration 1"' not in text and '"iteration 4"' not in text


def test_window_past_the_last_iteration_is_closed_at_the_end(tmp_path):
    """Also the light profile (--no-profile-stacks): no Python stacks in the trace."""
    (out,) = run_distributed(
        _profiled_run,
        1,
        args=(
            str(tmp_path),
            ["--profile-step-start", "4", "--profile-step-end", "100", "--no-profile-stacks"],
        ),
        timeout=300,
    )
    assert _summary(out)[0].endswith("over 2 iterations")  # iterations 4 and 5 of 6
    (trace,) = glob.glob(os.path.join(tmp_path, "0", "*.pt.trace.json"))
    assert '"python_function"' not in open(trace).read()


@pytest.mark.parametrize(
    "start, end, tb, message",
    [
        (3, 3, "tb", "--profile-step-start (3) must be >= 0 and below --profile-step-end (3)"),
        (-1, 3, "tb", "--profile-step-start (-1)"),
        (1, 3, None, "--use-pytorch-profiler writes its trace into --tensorboard-dir (None)"),
    ],
)
def test_bad_profile_flags_are_refused_by_name(start, end, tb, message):
    args = SimpleNamespace(
        profile=True,
        profile_step_start=start,
        profile_step_end=end,
        use_pytorch_profiler=True,
        tensorboard_dir=tb,
    )
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_profile_args(args)


def _args(**kw):
    base = dict(
        profile=True,
        profile_ranks=[0],
        profile_step_start=2,
        profile_step_end=4,
        use_pytorch_profiler=True,
        tensorboard_dir=None,
    )
    return SimpleNamespace(**{**base, **kw})


def test_resumed_past_the_window_profiles_nothing_and_says_so(capsys, tmp_path):
    from gigatron.training._profiler import StepProfiler

    prof = StepProfiler(_args(tensorboard_dir=str(tmp_path)), start_iteration=3)
    assert "lies before the first iteration of this run (3, resumed)" in capsys.readouterr().out
    for i in range(3, 6):
        prof.step(i)
    prof.close()
    assert prof.profiled == [] and not os.listdir(tmp_path)


def test_a_failing_summary_is_raised_once_and_the_window_is_closed(monkeypatch, tmp_path):
    from gigatron.training import _profiler

    def broken(*_):
        raise RuntimeError("summary failed")

    monkeypatch.setattr(_profiler, "summarize", broken)
    prof = _profiler.StepProfiler(_args(tensorboard_dir=str(tmp_path)))
    for i in range(3):
        prof.step(i)
    assert prof.active and prof.profiled == [2]
    with pytest.raises(RuntimeError, match="summary failed"):
        prof.close()
    assert not prof.active and prof.done
    prof.close()  # nothing left to finish: no second error
