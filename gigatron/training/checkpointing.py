"""Training checkpoints: `<save>/iter_0000100/` (torch_dist) + `latest_checkpointed_iteration.txt`.

Mirrors `megatron.training.checkpointing` (save_checkpoint, load_checkpoint,
maybe_finalize_async_save, get_checkpoint_tracker_filename, read_metadata). The order that makes
a crash harmless (`checkpoint_files` has the details): every rank writes its part into a fresh
`iter_N.tmp-<token>/`, DCP's `.metadata` and then `metadata.json` are written, all ranks meet at a
barrier, and only then rank 0 fsyncs it, renames it to `iter_N/` (an existing `iter_N/` is first
renamed aside, deleted after the tracker moved) and replaces the tracker file atomically (temp
file, fsync, rename). No save writes into a directory the tracker can name, so a save killed at
any point leaves a complete checkpoint under the tracked iteration. One job saves into a root
at a time: rank 0 holds `<save>/.gigatron-save.lock` (`lock_save_dir`), a second job is refused.

Flags (read from the args object, or passed as keyword overrides): `save`, `load`,
`async_save`, `no_save_optim` / `no_save_rng` (the optimizer + scheduler / RNG states are left
out of the save), `no_load_optim`, `no_load_rng`, `finetune`, `exit_on_missing_checkpoint`,
`dist_ckpt_strictness`, `ckpt_verify_integrity` (gigatron: SHA-256 manifest written on save,
checked on load). Loading a checkpoint saved without optimizer (RNG) state needs
`no_load_optim` (`no_load_rng`) or `finetune`, as in Megatron.

`--ckpt-format fsdp_dtensor` (Megatron-FSDP) and `torch_dcp` (FSDP2) are written and read by this
same save, in torch_dist's layout: an FSDP rank saves the rows of each global tensor it holds
(`core.distributed.fsdp.sharded_state_dict`), so FSDP and DDP checkpoints load into each other
at any DP size (not Megatron's fsdp_dtensor key layout).

gigatron differences: optimizer state is saved in the fully reshardable form of
`dist_checkpointing.optimizer` (per-parameter global tensors, flat ranges for the distributed
optimizer), so model and optimizer load at any TP/PP/DP layout; the async writer is a thread,
not a persistent process.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil

import torch.distributed as dist

from gigatron.core import dist_checkpointing
from gigatron.core.dist_checkpointing import CheckpointingException, DamagedCheckpointError
from gigatron.core.dist_checkpointing import checkpoint_files as commit
from gigatron.core.dist_checkpointing.core import describe_write_error
from gigatron.core.dist_checkpointing.optimizer import (
    load_optimizer_state_dict,
    optimizer_sharded_state_dict,
)
from gigatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
from gigatron.core.optimizer_param_scheduler import ScheduleMismatchError
from gigatron.core.transformer.utils import sharded_state_dict_default
from gigatron.training import _checkpoint_assets as assets
from gigatron.training import _checkpoint_state as cs
from gigatron.training import _resume_checks as ca
from gigatron.training import legacy_moe_checkpoint as legacy_moe
from gigatron.training._resume_checks import (  # noqa: F401  (Megatron's public names)
    check_checkpoint_args,
    load_args_from_checkpoint,
)

__all__ = [
    "check_checkpoint_args",
    "get_checkpoint_name",
    "get_checkpoint_tracker_filename",
    "load_args_from_checkpoint",
    "lock_save_dir",
    "load_checkpoint",
    "maybe_finalize_async_save",
    "read_metadata",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

# Megatron's subdirectory of --non-persistent-global-ckpt-dir / --save for non-persistent saves.
_NON_PERSISTENT_CKPT_SUBDIR = "non_persistent"

_ASYNC_QUEUE: AsyncCallsQueue | None = None
_IN_FLIGHT: list = []  # (root, iteration, staging) of the async save not yet finalized


def get_checkpoint_tracker_filename(checkpoints_path: str) -> str:
    return os.path.join(checkpoints_path, cs.TRACKER_FNAME)


def get_checkpoint_name(checkpoints_path: str, iteration: int, release: bool = False) -> str:
    return cs.checkpoint_dir(checkpoints_path, iteration, release)


def read_metadata(tracker_filename: str) -> tuple[int, bool]:
    """(iteration, release) from a tracker file; CheckpointingException if damaged or absent."""
    found = cs.read_tracker(os.path.dirname(tracker_filename))
    if found is None:
        raise CheckpointingException(f"{tracker_filename} does not exist")
    return found


def read_frozen_resume_iteration(save_dir: str | None) -> int:
    """Iteration a --freeze-all-layers run resumes at: the one in `save_dir`'s tracker file
    (a release tracker reads 0), or 0 when there is no tracker (a first run)."""
    tracker = None if save_dir is None else get_checkpoint_tracker_filename(save_dir)
    if tracker is None or not os.path.isfile(tracker):
        return 0
    iteration, _release = read_metadata(tracker)
    return iteration


def save_tokenizer_assets(tokenizer, config, checkpoint_path: str) -> None:
    """Copy the tokenizer's files into `<checkpoint_path>/tokenizer/` (rank 0; errors logged)."""
    assets.save_tokenizer_assets(tokenizer, config, checkpoint_path, logger)


save_grads = assets.save_grads
_fp8_extra_state_is_persistent = cs.fp8_extra_state_is_persistent
_localize_redundant_extra_states = cs.localize_redundant_extra_states


def _args(args):
    if args is not None:
        return args
    from gigatron.training.global_vars import get_args

    return get_args()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _on_rank0(fn, what: str):
    """`fn()` on rank 0; every rank returns its result, or raises when it failed (so no rank is
    left waiting in a collective). Also a barrier: other ranks return after rank 0's `fn`.

    A CheckpointingException of rank 0, or an OSError (disk full, permissions), is raised on
    every rank as the same one-line CheckpointingException; any other error (a bug) is raised
    as is on rank 0 and named on the others."""
    result, error, line = None, None, None
    if _rank() == 0:
        try:
            result = fn()
        except Exception as e:
            error, line = e, _user_line(e, what)
    if dist.is_initialized() and dist.get_world_size() > 1:
        failure = None if error is None else (line, f"{type(error).__name__}: {error}")
        box = [result, failure]
        dist.broadcast_object_list(box, src=0)
        result, failure = box
        if failure is not None and error is None:
            raise CheckpointingException(failure[0] or f"rank 0 failed to {what}: {failure[1]}")
    if error is not None and line is not None:
        raise CheckpointingException(line) from error
    if error is not None:
        raise error
    return result


def _user_line(err: Exception, what: str) -> str | None:
    """The one line every rank raises for rank 0's `err`; None for a bug (traceback)."""
    if isinstance(err, CheckpointingException):
        return str(err)
    if isinstance(err, OSError):
        return f"rank 0 could not {what}: {describe_write_error(err)}"
    return None


def lock_save_dir(root: str) -> None:
    """Collective: rank 0 takes `<root>/.gigatron-save.lock` for this job's life, or every rank
    raises the same one-line refusal naming the job that holds it (`checkpoint_files`)."""
    _on_rank0(lambda: commit.lock_save_dir(root), f"lock {root}")


def _prepare_staging(root: str, iteration: int) -> str:
    """Rank 0 repairs leftovers under `root` and makes an empty staging dir; its token for all."""

    def prepare():
        token = secrets.token_hex(6)
        commit.prepare(root, iteration, token)
        return token

    return _on_rank0(prepare, f"prepare a save in {root}")


def _unwrap(model) -> list:
    return model if isinstance(model, list) else [model]


def _sharded_state(
    model,
    optimizer,
    opt_param_scheduler,
    *,
    with_optim: bool,
    with_rng: bool,
    legacy_moe_layout=False,
):
    state = {}
    for key, module in zip(cs.model_keys(_unwrap(model)), _unwrap(model)):
        if legacy_moe_layout:  # an MoE checkpoint of gigatron's older layout (gigatron.compat)
            sharded = sharded_state_dict_default(module, "", (), legacy_moe.PER_LAYER)
            state[key] = legacy_moe.legacy_moe_request(sharded)
        else:
            state[key] = sharded_state_dict_default(module)  # (plain torch modules too)
    if with_optim and optimizer is not None:
        if _reshardable(optimizer):
            model_sd = {
                f"{k}/{n}": v for k in cs.model_keys(_unwrap(model)) for n, v in state[k].items()
            }
            state["optimizer"] = optimizer_sharded_state_dict(optimizer, model_sd)
        else:  # unknown optimizer: its own state_dict, per rank, same layout only
            state["optimizer"] = cs.per_rank_object("optimizer", optimizer.state_dict())
    if with_optim and opt_param_scheduler is not None:
        state["opt_param_scheduler"] = opt_param_scheduler.state_dict()
    if with_rng:
        state["rng_state"] = cs.per_rank_object("rng_state", [cs.get_rng_state()])
    return state


def _reshardable(optimizer) -> bool:
    return hasattr(optimizer, "chained_optimizers") or hasattr(optimizer, "param_groups")


def maybe_finalize_async_save(blocking: bool = False, terminate: bool = False) -> None:
    """Finish background saves whose writes completed on all ranks (all of them if blocking).

    Call it now and then during training and with `blocking=True` before exiting; a save's
    tracker update happens here, and rank 0 prints `published checkpoint at iteration N`.
    """
    if _ASYNC_QUEUE is None or not _IN_FLIGHT:
        return
    try:
        done = _ASYNC_QUEUE.maybe_finalize_async_calls(blocking=blocking or terminate)
    except CheckpointingException as err:  # every rank: the write or the publish failed
        raise _save_failed(*_IN_FLIGHT.pop(0), err) from err
    for _ in done:
        root, iteration, _staging = _IN_FLIGHT.pop(0)
        _say(f"published checkpoint at iteration {iteration} to {root}")


def _save_failed(root: str, iteration: int, staging: str, err: Exception):
    """Every rank's one line for a save that failed after its staging dir was made. Rank 0
    removes the partial staging dir (every rank is done with it: the failure was agreed)."""
    if _rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    return CheckpointingException(
        f"could not save iteration {iteration} into {root}: {err}; the partial "
        f"{os.path.basename(staging)}/ was removed and the checkpoints already published "
        "there are untouched"
    )


def save_checkpoint(
    iteration: int,
    model,
    optimizer,
    opt_param_scheduler,
    num_floating_point_operations_so_far: float = 0,
    checkpointing_context=None,
    *,
    args=None,
    **_unused,
) -> None:
    """Write `iter_{iteration:07d}/` under `args.save` and then move the tracker to it.

    With `async_save` the files are written in the background and the checkpoint is only
    published (renamed into place, tracker moved) by a later `maybe_finalize_async_save`.
    A write that fails on any rank (disk full, quota, permissions) raises the same one-line
    CheckpointingException on every rank, naming the directory and the cause; nothing
    published is touched.
    """
    global _ASYNC_QUEUE
    args = _args(args)
    if not getattr(args, "save", None):
        raise ValueError("args.save (None) must name a directory to save a checkpoint")
    maybe_finalize_async_save(blocking=True)  # one save in flight at a time
    root = args.save
    token = _prepare_staging(root, iteration)  # the dir exists when any rank gets the token
    staging = commit.staging_dir(root, iteration, token)
    try:
        request = _write(iteration, model, optimizer, opt_param_scheduler, args, staging,
                         num_floating_point_operations_so_far)  # fmt: skip
    except CheckpointingException as err:
        raise _save_failed(root, iteration, staging, err) from err

    def update_tracker():
        _barrier()  # every rank's files and metadata.json are complete
        _on_rank0(  # rename into place, tracker last
            lambda: commit.publish(root, iteration, token), f"publish {staging} as {iteration}"
        )

    if request is None:
        try:
            update_tracker()
        except CheckpointingException as err:
            raise _save_failed(root, iteration, staging, err) from err
        return
    request.add_finalize_fn(update_tracker)
    if _ASYNC_QUEUE is None:
        _ASYNC_QUEUE = AsyncCallsQueue()
    _ASYNC_QUEUE.schedule_async_request(request)
    _IN_FLIGHT.append((root, iteration, staging))


def _write(iteration, model, optimizer, opt_param_scheduler, args, staging, flops):
    """Every rank writes its part of the checkpoint into `staging` (the data files in the
    background with `async_save`: the AsyncRequest to schedule, else None)."""
    state = _sharded_state(
        model,
        optimizer,
        opt_param_scheduler,
        with_optim=not getattr(args, "no_save_optim", False),
        with_rng=not getattr(args, "no_save_rng", False),
    )
    state.update(
        args=cs.safe_args(args),
        checkpoint_version=cs.CHECKPOINT_VERSION,
        iteration=iteration,
        num_floating_point_operations_so_far=flops,
    )
    return dist_checkpointing.save(
        state, staging, async_sharded_save=bool(getattr(args, "async_save", False)),
        verify_integrity=bool(getattr(args, "ckpt_verify_integrity", False)),
    )  # fmt: skip


def load_checkpoint(
    model,
    optimizer,
    opt_param_scheduler,
    load_arg: str = "load",
    strict: bool = True,
    checkpointing_context=None,
    *,
    args=None,
    **_unused,
) -> tuple[int, float]:
    """Restore from the tracked checkpoint under `args.<load_arg>`; returns (iteration, flops).

    No tracker: nothing is loaded and (0, 0) is returned (training starts from scratch).
    `finetune`: weights only, iteration 0. `no_load_optim` / `no_load_rng` skip those parts.
    """
    args = _args(args)
    root = getattr(args, load_arg, None)
    if not root:
        raise ValueError(f"args.{load_arg} ({root!r}) must name a checkpoint directory")
    step = getattr(args, "ckpt_step", None)
    try:
        found = cs.read_tracker(root) if step is None else (int(step), False)
    except CheckpointingException as e:
        raise _damaged(e, root, None) from None
    if step is not None:
        _say(f"--ckpt-step {step}: loading iteration {step} of {root}, not the tracker's")
    if found is None and getattr(args, "exit_on_missing_checkpoint", False):
        raise CheckpointingException(
            f"--exit-on-missing-checkpoint: no {cs.TRACKER_FNAME} in --load {root}"
        )
    if found is None:
        if _rank() == 0:
            print(f"WARNING: no {cs.TRACKER_FNAME} in {root}; starting from scratch", flush=True)
        return 0, 0
    iteration, release = found
    try:  # a damaged file: name the older complete iteration the user can load instead
        ckpt_dir = commit.resolve(root, iteration, release, warn=_rank() == 0)
        if not dist_checkpointing.check_is_distributed_checkpoint(ckpt_dir):
            raise DamagedCheckpointError(_incomplete(ckpt_dir, step))
        finetune = bool(getattr(args, "finetune", False)) or release
        with_optim = not finetune and not getattr(args, "no_load_optim", False)
        with_rng = not finetune and not getattr(args, "no_load_rng", False)
        saved_args = dist_checkpointing.load_common_state_dict(ckpt_dir).get("args")
        if not finetune and saved_args is not None:  # Megatron's check, before any tensor is read
            ca.check_checkpoint_args(saved_args, args, where=ckpt_dir)
        seed_note, clip_note, drift = "", "", ([], "")
        if not finetune and saved_args is not None and optimizer is not None:  # a resume
            seed_note = ca.check_seed(saved_args, args, ckpt_dir)
            clip_note = ca.clip_grad_note(saved_args, args)
            if with_optim:
                drift = ca.optimizer_drift(saved_args, args, opt_param_scheduler, ckpt_dir)
        _check_parts_saved(ckpt_dir, with_optim, with_rng)
        if with_rng and not _rng_layout_matches(ckpt_dir):
            with_rng = False
            if _rank() == 0:
                print("WARNING: parallel layout changed since the save; RNG states not loaded")
        from gigatron.core.dist_checkpointing.strategies.torch import read_dcp_metadata

        keys = read_dcp_metadata(ckpt_dir).state_dict_metadata
        request = _sharded_state(
            model, optimizer, opt_param_scheduler, with_optim=with_optim, with_rng=with_rng,
            legacy_moe_layout=legacy_moe.uses_legacy_moe_layout(keys),
        )  # fmt: skip
        strictness = getattr(args, "dist_ckpt_strictness", None) or (
            "assume_ok_unexpected" if strict else "log_unexpected"
        )
        state = dist_checkpointing.load(
            request, ckpt_dir, strict=strictness,
            verify_integrity=bool(getattr(args, "ckpt_verify_integrity", False)),
        )  # fmt: skip
    except DamagedCheckpointError as e:
        raise _damaged(e, root, None if release else iteration) from None
    override = with_optim and getattr(opt_param_scheduler, "override_opt_param_scheduler", False)
    override = override or drift[1] == "flags"
    flags_groups = _group_values(optimizer) if override else None  # before the saved ones
    try:
        _restore(state, request, model, optimizer, opt_param_scheduler, with_optim, with_rng)
    except ScheduleMismatchError as err:
        raise ca.schedule_mismatch(err, args, ckpt_dir) from None
    if flags_groups is not None:  # --override-opt_param-scheduler: the flags' lr bounds (as
        for group, values in zip(optimizer.param_groups, flags_groups):  # Megatron), betas, ...
            group.update(values)
        if opt_param_scheduler is not None:
            opt_param_scheduler.step(increment=0)
    if drift[1] == "checkpoint":
        _take_checkpoint_values(args, drift[0])
    if finetune:
        _say(_weights_only_line(ckpt_dir, state.get("iteration", 0), release, optimizer))
        return 0, 0
    for name in ("consumed_train_samples", "consumed_valid_samples"):
        if saved_args is not None and hasattr(saved_args, name):
            setattr(args, name, getattr(saved_args, name))
    line = ca.load_line(
        ckpt_dir, state["iteration"], args, optimizer, opt_param_scheduler, with_optim, with_rng,
        notes=(ca.drift_note(*drift), clip_note, seed_note),
    )  # fmt: skip
    _say(line)
    return state["iteration"], state.get("num_floating_point_operations_so_far", 0)


def _incomplete(ckpt_dir: str, step: int | None = None) -> str:
    from gigatron.core.dist_checkpointing.core import maybe_load_config

    try:
        maybe_load_config(ckpt_dir)
        reason = "no metadata.json"
    except CheckpointingException as e:
        reason = str(e)
    who = f"tracker {cs.TRACKER_FNAME} points at" if step is None else f"--ckpt-step {step} names"
    return f"{who} {ckpt_dir}, which is missing or incomplete ({reason})"


# what the messages of a damaged or refused file say (not a user's flag mismatch)
def _damaged(e: CheckpointingException, root: str, iteration) -> CheckpointingException:
    """`e`, plus the newest complete checkpoint older than `iteration` the user could load."""
    older = commit.newest_complete_before(root, iteration)
    if older is None:
        return DamagedCheckpointError(f"{e}; no older complete checkpoint under {root}")
    name = os.path.basename(cs.checkpoint_dir(root, older))
    return DamagedCheckpointError(
        f"{e}; {name} is complete: pass --ckpt-step {older} (or write {older} into "
        f"{get_checkpoint_tracker_filename(root)}) to load it"
    )


def _weights_only_line(ckpt_dir: str, iteration: int, release: bool, optimizer) -> str:
    """What a weights-only load did: a release checkpoint (what `gigatron convert` writes) is
    just weights; only a training run (an optimizer) starts over from them."""
    what = "a release checkpoint" if release else f"saved at iteration {iteration}"
    line = f"loaded the weights of {ckpt_dir} ({what})"
    if optimizer is None:  # generation, evaluation: nothing else to restore
        return line
    why = "a release checkpoint starts a new run" if release else "--finetune"
    return f"{line}: iteration 0, fresh optimizer, scheduler and RNG ({why})"


def _say(line: str) -> None:
    if _rank() == 0:
        print(line, flush=True)


def _group_values(optimizer) -> list[dict]:
    """Each param group's hyperparameters (`max_lr` / `min_lr`, betas, eps, momentum, ...: what
    the flags gave, before a load replaces them), without its params."""
    return [
        {k: v for k, v in g.items() if k != "params"}
        for g in getattr(optimizer, "param_groups", [])
    ]


def _take_checkpoint_values(args, diffs) -> None:
    """--use-checkpoint-opt_param-scheduler: the param groups hold the checkpoint's values
    already; the args (saved with the next checkpoint) take them too."""
    for name, _, saved in diffs:
        setattr(args, name, saved)


def _check_parts_saved(ckpt_dir: str, with_optim: bool, with_rng: bool) -> None:
    """A checkpoint written with --no-save-optim / --no-save-rng lacks those parts: loading
    them is an error naming the flag that skips them (Megatron's message and rule)."""
    from gigatron.core.dist_checkpointing.strategies.torch import read_dcp_metadata

    keys = read_dcp_metadata(ckpt_dir).state_dict_metadata
    for wanted, part, flag in (
        (with_optim, "optimizer", "--no-load-optim"),
        (with_rng, "rng_state", "--no-load-rng"),
    ):
        if wanted and not any(k == part or k.startswith(part + ".") or k.startswith(part + "/")
                              for k in keys):  # fmt: skip
            raise CheckpointingException(
                f"{ckpt_dir} holds no {part} (saved with --no-save-"
                f"{'optim' if part == 'optimizer' else 'rng'}); pass {flag} or --finetune "
                "to load it"
            )


def _rng_layout_matches(ckpt_dir: str) -> bool:
    """True on every rank when every rank's RNG object exists in the checkpoint."""
    from gigatron.core.dist_checkpointing.strategies.torch import read_dcp_metadata

    mine = cs.per_rank_object("rng_state", None).unique_key
    ok = mine in read_dcp_metadata(ckpt_dir).state_dict_metadata
    if dist.is_initialized() and dist.get_world_size() > 1:
        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, ok)
        ok = all(flags)
    return ok


def _set_extra_state(module, name: str, value) -> None:
    """Hand a loaded `_extra_state` to the module that owns `name` (its path under `module` or
    under the wrappers' `.module`); names with no such module (GroupedMLP's per-expert
    objects) carry nothing gigatron keeps."""
    path = name[: -len("._extra_state")]
    while module is not None:
        try:
            owner = module.get_submodule(path)
        except AttributeError:
            module = getattr(module, "module", None)
            continue
        owner.set_extra_state(value)
        return


def _restore(state, request, model, optimizer, opt_param_scheduler, with_optim, with_rng):
    import torch

    for key, module in zip(cs.model_keys(_unwrap(model)), _unwrap(model)):
        loaded = state.get(key, {})
        with torch.no_grad():
            for name, sh in request[key].items():
                value = loaded.get(name)
                if name.endswith("._extra_state"):  # FP8 delayed-scaling state, else nothing
                    _set_extra_state(module, name, value)
                    continue
                if not torch.is_tensor(value):  # a tensor dropped as "unexpected" by a
                    continue  # non-strict load is absent
                if sh.data.data_ptr() != value.data_ptr():
                    sh.data.copy_(value)
    if with_optim and optimizer is not None and _reshardable(optimizer):
        load_optimizer_state_dict(optimizer, request["optimizer"], state["optimizer"])
    elif with_optim and optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    elif optimizer is not None and hasattr(optimizer, "reload_model_params"):
        optimizer.reload_model_params()  # fp32 main copies follow the loaded weights
    if with_optim and opt_param_scheduler is not None and "opt_param_scheduler" in state:
        opt_param_scheduler.load_state_dict(state["opt_param_scheduler"])
    if with_rng and "rng_state" in state:
        cs.set_rng_state(state["rng_state"][0])
