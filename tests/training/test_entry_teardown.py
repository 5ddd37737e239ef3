"""Training entry points end cleanly: `pretrain_gpt` under torchrun (2 gloo ranks, mock data)
destroys the model-parallel groups and the process group it created before exiting, while a
process group the caller created (the test harness's) is left alone."""

import os
import subprocess
import sys

import pytest

from gigatron.testing import run_distributed
from tests._paths import REPO
from tests.training._gpt_runs import ARGS, reset_globals

pytestmark = pytest.mark.multirank


ROOT = str(REPO)

_CHILD = """
import sys
import torch.distributed as dist
from gigatron.core import parallel_state
from gigatron.training import pretrain_gpt
assert pretrain_gpt.main(sys.argv[1:]) == 0
assert not dist.is_initialized() and not parallel_state.model_parallel_is_initialized()
print("CLEAN EXIT", flush=True)
"""


def test_pretrain_gpt_main_destroys_the_process_group_it_created(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(script), *ARGS, "--train-iters", "2"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("CLEAN EXIT") == 2, out.stdout[-2000:]


def _main_keeps_the_callers_group():
    import torch.distributed as dist

    from gigatron.training import pretrain_gpt

    reset_globals()
    assert pretrain_gpt.main(ARGS + ["--train-iters", "1"]) == 0
    still = dist.is_initialized()
    dist.barrier()  # the harness's group still works
    reset_globals()
    return still


def test_pretrain_gpt_main_keeps_a_process_group_the_caller_created():
    assert run_distributed(_main_keeps_the_callers_group, 2, timeout=300) == [True, True]
