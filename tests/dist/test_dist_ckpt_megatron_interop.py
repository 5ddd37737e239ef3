"""Interop with megatron-core's own `dist_checkpointing` (0.16, installed), both directions.

Two plain gloo processes (megatron-core's writer starts worker processes, which the forkserver
harness's daemonic ranks may not): megatron-core saves a sharded state dict (row-split tensor,
stacked layers with a prepended axis, a ShardedObject, common state with an argparse.Namespace);
gigatron loads it at another sharding, and the reverse. Every loaded tensor must equal the
source bitwise. On a CPU-only torch the test stubs what megatron-core's writer needs from CUDA
(`torch.cuda.synchronize`, `torch.cuda.current_device` -> "cpu") and, without psutil, its
memory logging.
"""

import os
import subprocess
import sys
import tempfile

import pytest
import torch

megatron_dc = pytest.importorskip("megatron.core.dist_checkpointing")


def _state(lib, rank, world, *, request=False):
    import argparse

    full = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    stack = torch.arange(3 * 4 * 6, dtype=torch.float32).view(3, 4, 6) / 7
    ST, SO = lib.ShardedTensor, lib.ShardedObject
    if request:  # columns instead of rows; the whole stack, replicated
        return {
            "a": ST.from_rank_offsets("a", torch.zeros(8, 6 // world), (1, rank, world)),
            "layers": ST.from_rank_offsets("stack", torch.zeros(3, 4, 6), replica_id=rank),
            "obj": SO("obj", None, (world,), (rank,)),
        }, (full.chunk(world, 1)[rank], stack)
    return {
        "a": ST.from_rank_offsets("a", full.chunk(world, 0)[rank].clone(), (0, rank, world)),
        "layers": [
            ST.from_rank_offsets(
                "stack",
                stack[i].chunk(world, 1)[rank].clone(),
                (0, i, 3),
                (2, rank, world),
                prepend_axis_num=1,
            )
            for i in range(3)
        ],  # fmt: skip
        "obj": SO("obj", {"rank": rank, "t": torch.ones(2) * rank}, (world,), (rank,)),
        "common": {"iteration": 5, "args": argparse.Namespace(lr=0.1, name="x")},
    }, None


def _check(lib, ckpt_dir, rank, world):
    req, (want_a, want_stack) = _state(lib, rank, world, request=True)
    got = lib.load(req, ckpt_dir, validate_access_integrity=False)
    assert torch.equal(got["a"], want_a) and torch.equal(got["layers"], want_stack)
    assert got["obj"]["rank"] == rank and torch.equal(got["obj"]["t"], torch.ones(2) * rank)
    assert got["common"]["iteration"] == 5 and got["common"]["args"].lr == 0.1


def _worker(rank, world, init_file, m_dir, g_dir):
    import torch.distributed as dist

    from gigatron.core import dist_checkpointing as gdc

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    if not torch.cuda.is_available():  # megatron-core's writer syncs CUDA before copying; no-op
        torch.cuda.synchronize = lambda *args, **kwargs: None
        torch.cuda.current_device = lambda: "cpu"  # its finalize builds a flag tensor there
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    try:
        import psutil  # noqa: F401
    except ImportError:  # megatron-core's writer logs its memory use through psutil
        filesystem_async._process_memory = lambda: 0
    mdc = megatron_dc
    mdc.save(_state(mdc, rank, world)[0], m_dir)
    gdc.save(_state(gdc, rank, world)[0], g_dir)
    dist.barrier()
    _check(gdc, m_dir, rank, world)  # megatron-core wrote it, gigatron reads
    _check(mdc, g_dir, rank, world)  # gigatron wrote it, megatron-core reads
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_megatron_core_and_gigatron_read_each_others_checkpoints(tmp_path):
    world = 2
    init_file = str(tmp_path / "init")
    dirs = [str(tmp_path / "megatron"), str(tmp_path / "gigatron")]
    for d in dirs:
        os.makedirs(d)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        "import sys; from tests.dist.test_dist_ckpt_megatron_interop import _worker; "
        "_worker(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    logs = [tempfile.TemporaryFile() for _ in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), str(world), init_file, *dirs],
            cwd=root,
            env=env,
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for r in range(world)
    ]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=150))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    for r, log in enumerate(logs):
        log.seek(0)
        assert codes[r] == 0, f"rank {r} exit {codes[r]}:\n{log.read().decode()[-3000:]}"
    import json

    configs = [json.load(open(os.path.join(d, "metadata.json"))) for d in dirs]
    assert configs[0] == configs[1] and configs[1]["sharded_backend"] == "torch_dist"
    for d in dirs:  # same file kinds (megatron-core writes 2 files per rank, gigatron 1)
        names = set(os.listdir(d))
        assert {".metadata", "common.pt", "metadata.json", "__0_0.distcp", "__1_0.distcp"} <= names
