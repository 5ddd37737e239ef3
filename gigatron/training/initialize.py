"""Start a training process: torch.distributed, parallel groups, seeds, global objects.

Mirrors `megatron.training.initialize.initialize_megatron`. Launch with `torchrun` (RANK,
WORLD_SIZE, MASTER_ADDR, ... in the environment; multi-node through its rendezvous or SLURM) or
as a plain single process. Without GPUs the backend is gloo on CPU.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core import parallel_state as ps
from gigatron.core.timers import Timers
from gigatron.training import global_vars
from gigatron.training.arguments import build_parser, parse_args, validate_args
from gigatron.training.utils import PARALLEL_SIZE_FLAGS, args_by_name


def _slurm_env() -> None:
    """Map SLURM's variables to torchrun's when launched by `srun` without torchrun."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")


def _free_port() -> str:
    """A port nothing listens on, chosen by the kernel (as `torchrun --standalone` chooses one); a
    port derived from the pid could be another process's on the same machine (tests run side by
    side, a second run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def initialize_distributed(args) -> None:
    """init_process_group from the environment (torchrun / SLURM) or as a single process."""
    if dist.is_initialized():
        args.rank, args.world_size = dist.get_rank(), dist.get_world_size()
        return
    _slurm_env()
    backend = args.distributed_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    args.distributed_backend = backend
    args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(args.local_rank % torch.cuda.device_count())
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:  # one process, no torchrun
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = _free_port()
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    dist.init_process_group(
        backend,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(minutes=args.distributed_timeout_minutes),
    )
    global _OWNS_PROCESS_GROUP
    _OWNS_PROCESS_GROUP = True
    args.rank, args.world_size = dist.get_rank(), dist.get_world_size()


_OWNS_PROCESS_GROUP = False  # initialize_distributed created the default process group


def destroy_distributed() -> None:
    """End of a training entry point: tear down the model-parallel groups and the process group
    `initialize_distributed` created (after a barrier), so the process exits cleanly instead of
    leaving it to interpreter shutdown (a gloo group destroyed there can abort the process after
    a finished run). A process group created by the caller is left alone."""
    global _OWNS_PROCESS_GROUP
    if not (_OWNS_PROCESS_GROUP and dist.is_initialized()):
        return

    dist.barrier()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    _OWNS_PROCESS_GROUP = False


def set_random_seed(seed: int, data_parallel_random_init: bool = False) -> None:
    """Megatron's seeding: base seed + 100·pp_rank (+ 10·dp_rank), then the TP RNG tracker."""
    _set_random_seed(seed, data_parallel_random_init)


def _group_rank(group) -> int | None:
    return None if group is None else dist.get_rank(group)


def _set_random_seed(
    seed_: int,
    data_parallel_random_init: bool = False,
    te_rng_tracker: bool = False,
    inference_rng_tracker: bool = False,
    use_cudagraphable_rng: bool = False,
    pp_group=None,
    dp_group=None,
    tp_group=None,
    ep_group=None,
    etp_group=None,
    gtp_remat_group=None,
    egtp_remat_group=None,
) -> None:
    """Seed Python, NumPy and torch with `seed_` + 100·pp_rank (+ 10·dp_rank with
    `data_parallel_random_init`), then the model-parallel RNG tracker.

    Ranks come from the groups given, else from `parallel_state` (Megatron's signature, for
    callers without initialized groups). The tracker is seeded on CPU too: gigatron's tensor
    parallel RNG works without CUDA. A seed that is None or not positive is a ValueError."""
    from gigatron.core.layout_invariant_init import set_layout_invariant_init_seed
    from gigatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if seed_ is None or seed_ <= 0:
        raise ValueError(f"Seed ({seed_}) should be a positive integer.")
    # Weights built with use_cpu_initialization draw from (seed, component) streams, so every
    # layout starts from the same full model (gigatron addition; see
    # gigatron.core.layout_invariant_init).
    set_layout_invariant_init_seed(seed_)
    pp_rank = _group_rank(pp_group)
    seed = seed_ + 100 * (ps.get_pipeline_model_parallel_rank() if pp_rank is None else pp_rank)
    if data_parallel_random_init:
        dp_rank = _group_rank(dp_group)
        seed += 10 * (ps.get_data_parallel_rank() if dp_rank is None else dp_rank)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(
        seed,
        te_rng_tracker,
        inference_rng_tracker,
        use_cudagraphable_rng,
        tp_rank=_group_rank(tp_group),
        ep_rank=_group_rank(ep_group),
        etp_rank=_group_rank(etp_group),
        gtp_remat_rank=_group_rank(gtp_remat_group),
        egtp_remat_rank=_group_rank(egtp_remat_group),
        gtp_remat_world_size=None
        if gtp_remat_group is None
        else dist.get_world_size(gtp_remat_group),
        egtp_remat_world_size=None
        if egtp_remat_group is None
        else dist.get_world_size(egtp_remat_group),
    )


def _set_logging_level(args) -> None:
    """Megatron's order: --logging-level, else MEGATRON_LOGGING_LEVEL, else the root's own."""
    level = getattr(args, "logging_level", None)
    if level is None and os.environ.get("MEGATRON_LOGGING_LEVEL") is not None:
        level = int(os.environ["MEGATRON_LOGGING_LEVEL"])
    if level is not None:
        logging.getLogger().setLevel(level)


def _build_tokenizer(args) -> None:
    """Build the tokenizer named by the flags and pad the vocabulary (Megatron does it here)."""
    from gigatron.core.models.common.vocab_utils import vocab_size_with_padding

    if args.tokenizer_type is None:
        if args.vocab_size is None:
            if getattr(args, "padded_vocab_size", None) is None:
                raise ValueError(
                    "no tokenizer: pass --tokenizer-type with its files (--vocab-file / "
                    "--merge-file / --tokenizer-model), or --vocab-size N for "
                    "NullTokenizer (mock data)"
                )
            return  # the script brings its own vocabulary (padded_vocab_size set by it)
        args.tokenizer_type = "NullTokenizer"
    from gigatron.training.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(args)
    global_vars.set_tokenizer(tokenizer)
    args.padded_vocab_size = vocab_size_with_padding(
        tokenizer.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size
    )
    saved = _resumed_checkpoint_args(args)
    if saved is not None:
        _keep_saved_vocab_padding(args, tokenizer.vocab_size, saved)


def _keep_saved_vocab_padding(args, orig_vocab_size: int, saved) -> None:
    """Resuming: keep the checkpoint's padded vocabulary unless it cannot be (see
    `resume_vocab_size_with_padding`); say which on rank 0 when it differs from this layout's."""
    from gigatron.core.models.common.vocab_utils import resume_vocab_size_with_padding

    fresh, saved_padded = args.padded_vocab_size, getattr(saved, "padded_vocab_size", None)
    args.padded_vocab_size = resume_vocab_size_with_padding(
        orig_vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size,
        saved_padded, getattr(saved, "make_vocab_size_divisible_by", None),
    )  # fmt: skip
    if getattr(args, "rank", 0) != 0 or saved_padded in (None, fresh):
        return
    if args.padded_vocab_size == saved_padded:
        print(f" > padded vocab: keeping the checkpoint's {saved_padded} rows (TP "
              f"{args.tensor_model_parallel_size} alone pads to {fresh})", flush=True)  # fmt: skip
    else:
        print(f"WARNING: padded vocab changes from the checkpoint's {saved_padded} rows to "
              f"{fresh}: the load trims or zero-pads the vocabulary rows of the weights and "
              "the optimizer state, which changes the loss (padded logits are in the softmax)",
              flush=True)  # fmt: skip


def _resumed_checkpoint_args(args):
    """The args saved in the checkpoint `--load` will restore (None: nothing to restore)."""
    from gigatron.training.checkpoint_args import hf_dir_vocab, saved_args

    hf_vocab = hf_dir_vocab(args)  # --load HF_DIR: its config's vocabulary, padded
    if hf_vocab is not None:
        return hf_vocab
    return saved_args(args.load) if getattr(args, "load", None) else None


def initialize_megatron(
    extra_args_provider=None,
    args_defaults: dict | None = None,
    ignore_unknown_args: bool = False,
    allow_no_cuda: bool = True,
    skip_mpu_initialization: bool = False,
    get_embedding_ranks=None,
    get_position_embedding_ranks=None,
    argv: list[str] | None = None,
    parsed_args=None,
):
    """Parse and validate flags, start torch.distributed, build groups, seed. Returns args."""
    args = parsed_args or parse_args(
        extra_args_provider, ignore_unknown_args, argv=argv, args_defaults=args_defaults
    )
    if parsed_args is None:  # a HF directory or converted checkpoint describes the model
        from gigatron.training.checkpoint_args import (
            apply_checkpoint_model_args,
            command_line_dests,
        )

        argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(extra_args_provider)
        given = command_line_dests(parser, argv, getattr(args, "yaml_cfg", None))
        apply_checkpoint_model_args(args, given)
    if parsed_args is None and args.use_checkpoint_args and args.load:  # Megatron's order
        from gigatron.training.checkpointing import load_args_from_checkpoint

        load_args_from_checkpoint(args)  # the model flags, before validate_args derives from them
    world_size = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    validate_args(args, world_size)  # errors surface before any process group exists
    _set_logging_level(args)
    global_vars.set_args(args)
    global_vars.set_timers(Timers(log_level=0))
    _build_tokenizer(args)
    if getattr(args, "deterministic_mode", False):  # Megatron's flag; cuBLAS needs its workspace
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # set before any GEMM
        torch.use_deterministic_algorithms(True)
    if skip_mpu_initialization:
        return args
    initialize_distributed(args)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            **args_by_name(args, PARALLEL_SIZE_FLAGS),
            distributed_timeout_minutes=args.distributed_timeout_minutes,
            get_embedding_ranks=get_embedding_ranks,
            get_position_embedding_ranks=get_position_embedding_ranks,
        )
    set_random_seed(args.seed)
    return args
