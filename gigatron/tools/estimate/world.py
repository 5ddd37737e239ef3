"""One process, any rank of any world size: torch.distributed's fake backend.

`fake_rank(args, rank)` starts a process group of `args.world_size` ranks in which this process
is `rank` (backend "fake": collectives return at once, nothing is spawned or connected), builds
gigatron's model-parallel groups there, sets the training args, and tears everything down on
exit. Inside, `build_chunks(args)` is the rank's model exactly as `gigatron train` builds it
(`model_provider` over `gpt_builder`, one chunk per virtual stage), on the meta device: every
shape and buffer, no memory.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from functools import partial

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from gigatron.core import parallel_state as ps
from gigatron.training import global_vars
from gigatron.training.gpt_builders import gpt_builder
from gigatron.training.model_provider import model_provider
from gigatron.training.training import get_model
from gigatron.training.utils import PARALLEL_SIZE_FLAGS, args_by_name


@contextlib.contextmanager
def _quiet_fd2():
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def fake_rank(args, rank: int):
    """Be `rank` of a fake `args.world_size`-rank world with the flags' groups (see module)."""
    if dist.is_initialized():
        raise RuntimeError("gigatron estimate needs a process without a process group")
    excepthook = sys.excepthook  # init_process_group wraps it with a "[rank N]:" prefix
    dist.init_process_group(
        "cpu:fake,meta:fake", store=FakeStore(), rank=rank, world_size=args.world_size
    )
    try:
        ps.initialize_model_parallel(
            **args_by_name(args, PARALLEL_SIZE_FLAGS),
            create_gloo_process_groups=False,
        )
        global_vars.set_args(args)
        yield
    finally:
        global_vars.set_args(None)
        ps.destroy_model_parallel()
        with _quiet_fd2():  # c10d warns (C++) that the meta backend registered no hooks
            dist.destroy_process_group()
        sys.excepthook = excepthook


def build_chunks(args) -> list[torch.nn.Module]:
    """This rank's model chunks (one per virtual stage) on the meta device, not DDP-wrapped."""
    args.perform_initialization = False
    with torch.device("meta"), contextlib.redirect_stdout(io.StringIO()):  # its count line
        return get_model(partial(model_provider, gpt_builder), wrap_with_ddp=False)
