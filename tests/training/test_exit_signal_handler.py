"""`--exit-signal-handler` end to end under torchrun with DataLoader workers (issue 28, item 4).

A SIGTERM sent to the launcher (torchrun passes it on to each rank's process group, DataLoader
workers included) or to every process of the job (as SLURM and Kubernetes do) must save a
checkpoint at the iteration reached on every rank and exit cleanly; a run resumed from it
continues exactly as an uninterrupted one (same logged losses, bitwise equal weights and
optimizer state at the next save). The exit reason logged is the signal on every rank, also when
only one rank was signalled.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from gigatron.testing import run_distributed
from tests._paths import REPO
from tests._ports import free_port
from tests.training._gpt_runs import ARGS, run_pretrain_gpt

pytestmark = pytest.mark.multirank


ROOT = str(REPO)

# ARGS with DataLoader workers (the default 2), a log line per iteration, dropout on (the resumed
# run must draw the same masks) and a schedule that does not depend on where a run stops
TRAIN = ARGS + [
    "--num-workers", "2",
    "--log-interval", "1",
    "--train-iters", "2000",
    "--lr-decay-iters", "2000",
    "--lr-decay-style", "cosine",
    "--lr-warmup-iters", "2",
    "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1",
    "--seed", "5",
    "--use-distributed-optimizer",
]  # fmt: skip
_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?lm loss: (\S+) .*?grad norm: (\S+)")
_REFERENCE_UNTIL = 20  # the uninterrupted run, shared by the tests while the signal lands before


def _launch(log_path, *extra):
    """torchrun (2 ranks) running `python -m gigatron.training.pretrain_gpt`, own session."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "gigatron.training.pretrain_gpt",
           *TRAIN, *extra]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["OMP_NUM_THREADS"] = "1"
    with open(log_path, "w") as log:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _logged(log_path) -> dict[int, tuple[str, str]]:
    """iteration -> (lm loss, grad norm) as printed (7 significant digits)."""
    with open(log_path) as f:
        return {int(m[1]): (m[2], m[3]) for m in _ITER.finditer(f.read())}


def _run(log_path, *extra, timeout=240):
    proc = _launch(log_path, *extra)
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        _kill_job(proc)
    assert rc == 0, open(log_path).read()[-4000:]
    return _logged(log_path)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pids, grace: float) -> list[int]:
    """Those of `pids` still running after up to `grace` seconds."""
    deadline = time.monotonic() + grace
    while True:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _kill_job(proc) -> None:
    """Leave nothing behind: SIGKILL torchrun and everything under it (ranks, workers)."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _wait_for_iteration(proc, log_path, iteration: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if max(_logged(log_path), default=0) >= iteration:
            return
        if proc.poll() is not None:
            pytest.fail(f"run ended (rc {proc.returncode}):\n" + open(log_path).read()[-4000:])
        time.sleep(0.05)
    pytest.fail("no progress:\n" + open(log_path).read()[-4000:])


_references: dict[int, tuple[dict, str]] = {}


def _reference(tmp_path_factory, until: int):
    """The uninterrupted run to `until` (its losses and its checkpoint there), built once."""
    until = max(until, _REFERENCE_UNTIL)
    if until not in _references:
        d = tmp_path_factory.mktemp(f"reference{until}")
        logged = _run(d / "log.txt", "--save", str(d / "ckpt"), "--exit-interval", str(until))
        assert max(logged) == until
        _references[until] = (logged, str(d / "ckpt"))
    return _references[until]


def _tensors(ckpt_dir, iteration):
    from gigatron.core import dist_checkpointing as dc

    return dc.load_plain_tensors(os.path.join(ckpt_dir, f"iter_{iteration:07d}"))


def _signalled_run_then_resume(tmp_path, tmp_path_factory, every_process: bool):
    ckpt, log = str(tmp_path / "ckpt"), tmp_path / "signalled.txt"
    proc = _launch(log, "--save", ckpt, "--save-interval", "100000", "--exit-signal-handler")
    try:
        _wait_for_iteration(proc, log, 3)
        job = _descendants(proc.pid)  # the ranks and their DataLoader workers
        for pid in [proc.pid, *job] if every_process else [proc.pid]:
            os.kill(pid, signal.SIGTERM)
        start = time.monotonic()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - start
        left = _alive(job, grace=10)
    finally:
        _kill_job(proc)
    text = open(log).read()
    assert "killed by signal" not in text, text[-4000:]
    logged = _logged(log)
    stop = max(logged)
    # every rank saved the iteration it reached and said why it stopped
    with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")) as f:
        assert int(f.read().strip()) == stop, text[-4000:]
    assert f"exiting at iteration {stop}: SIGTERM received" in text, text[-4000:]
    assert "exit duration" not in text
    # the ranks stopped by themselves, well before torchrun's SIGKILL 30 s after its SIGTERM,
    # and left no worker behind; torchrun re-raises the signal it got (its own rc 1)
    assert "forcefully exiting" not in text and took < 30, (took, text[-4000:])
    assert left == [], left
    assert rc == 1 and "SignalException" in text, text[-4000:]
    # resume to a few iterations past the stop: the same run as one never interrupted
    until = stop + 3
    reference, reference_ckpt = _reference(tmp_path_factory, until)
    until = max(reference)
    resumed_ckpt = str(tmp_path / "resumed")
    resumed = _run(
        tmp_path / "resumed.txt", "--load", ckpt, "--save", resumed_ckpt,
        "--exit-interval", str(until),
    )  # fmt: skip
    assert min(resumed) == stop + 1 and max(resumed) == until
    assert {i: logged[i] for i in range(1, stop + 1)} == {
        i: reference[i] for i in range(1, stop + 1)
    }
    assert resumed == {i: reference[i] for i in range(stop + 1, until + 1)}
    ours, theirs = _tensors(resumed_ckpt, until), _tensors(reference_ckpt, until)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.slow
def test_sigterm_to_torchrun_saves_and_resumes_exactly(tmp_path, tmp_path_factory):
    _signalled_run_then_resume(tmp_path, tmp_path_factory, every_process=False)


@pytest.mark.slow
def test_sigterm_to_every_process_saves_and_resumes_exactly(tmp_path, tmp_path_factory):
    _signalled_run_then_resume(tmp_path, tmp_path_factory, every_process=True)


@pytest.mark.slow
def test_sigterm_to_a_rank_and_its_workers_saves_and_exits_0(tmp_path):
    """What torchrun does to each rank (signal its process group), seen without torchrun: the
    rank's own exit code is 0 after the save, as Megatron's sys.exit after its save."""
    log, ckpt = tmp_path / "log.txt", str(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    env.update(MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "gigatron.training.pretrain_gpt", *TRAIN, "--save", ckpt,
           "--exit-signal-handler"]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for_iteration(proc, log, 2)
        os.killpg(proc.pid, signal.SIGTERM)  # the rank and its DataLoader workers
        rc = proc.wait(timeout=60)
    finally:
        _kill_job(proc)
    text = open(log).read()
    stop = max(_logged(log))
    assert rc == 0, text[-4000:]
    assert f"saved checkpoint at iteration {stop}" in text, text[-4000:]
    assert f"exiting at iteration {stop}: SIGTERM received" in text, text[-4000:]


def _signal_one_rank(signalled_rank: int, name: str):
    import torch.distributed as dist

    from gigatron.training import pretrain_gpt
    from gigatron.training.global_vars import get_args

    def forward_step(data_iterator, model):
        if get_args().iteration + 1 == 2 and dist.get_rank() == signalled_rank:
            os.kill(os.getpid(), signal.Signals[name])  # the handler only records it
        return pretrain_gpt.forward_step(data_iterator, model)

    argv = ARGS + ["--train-iters", "6", "--exit-signal-handler", "--exit-signal", name]
    result = run_pretrain_gpt(argv, forward_step)
    return result["iteration"], get_args().train_exit_reason


@pytest.mark.parametrize("signalled_rank, name", [(0, "SIGTERM"), (1, "SIGUSR1")])
def test_exit_reason_is_the_signal_on_every_rank(signalled_rank, name):
    """Only one rank got the signal: every rank stops at the same step and names it (the others
    used to say 'exit duration reached'). In-process ranks: no DataLoader workers here. (Rank 0
    and rank 1 signalled, SIGTERM and another signal: the name comes from the configured signal
    and the stop is agreed across ranks, so a third pair, rank 1 with SIGTERM, adds nothing.)"""
    out = run_distributed(_signal_one_rank, 2, args=(signalled_rank, name), timeout=300)
    assert out == [(2, f"{name} received")] * 2
