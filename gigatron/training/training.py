"""The training loop: `pretrain(...)` in Megatron's shape.

Mirrors `megatron.training.training`: `pretrain(train_valid_test_dataset_provider,
model_provider, model_type, forward_step_func, ..., args_defaults=...)` parses the flags, starts
torch.distributed and the parallel groups, builds the model chunks (pipeline / virtual stages,
DDP), the optimizer and scheduler, loads a checkpoint, builds data iterators and runs
`train_step` until `--train-iters`, evaluating, logging and saving on the way, then evaluates
the validation and the test split once more (Megatron's end of `pretrain`).

Robustness beyond Megatron: a non-finite gradient is detected on every rank in the same step
(one small all-reduce) and the update skipped (`--skip-nan-steps`) or the run stopped, naming
the ranks and the iteration; SIGTERM (`--exit-signal-handler`) and `--exit-duration-in-mins`
save a checkpoint before exiting on every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time

import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    TorchFullyShardedDataParallel,
    TorchFullyShardedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.num_microbatches_calculator import (
    get_num_microbatches,
    init_num_microbatches_calculator,
    unset_num_microbatches_calculator,
    update_num_microbatches,
)
from gigatron.training import _config_from_args as cfa
from gigatron.training import _exit_conditions as exits
from gigatron.training import _log_window
from gigatron.training import _memory as memory
from gigatron.training import _train_helpers as helpers
from gigatron.training import _training_log as tlog
from gigatron.training._data_iterators import (  # noqa: F401  (Megatron's names live here)
    build_train_valid_test_data_iterators,
    build_train_valid_test_data_loaders,
    cyclic_iter,
)
from gigatron.training._megatron_flops import num_floating_point_operations  # noqa: F401
from gigatron.training._profiler import StepProfiler
from gigatron.training._startup_banner import print_startup_banner
from gigatron.training._timeline import TrainingTimeline
from gigatron.training._train_step import (  # noqa: F401  (Megatron's public names live here)
    NonFiniteGradientError,
    evaluate,
    materialize_losses,
    train_step,
)
from gigatron.training.arguments import build_parser
from gigatron.training.data_samplers import (  # noqa: F401
    build_pretraining_data_loader,
    exit_signal_number,
)
from gigatron.training.flops import num_floating_point_operations as step_flops
from gigatron.training.global_vars import get_args, get_timers  # noqa: F401
from gigatron.training.initialize import initialize_megatron
from gigatron.training.peft.adapter_io import save_adapters
from gigatron.training.peft.lora import lora_from_args
from gigatron.training.utils import print_rank_0


# ---------------------------------------------------------------- model and optimizer
def get_model(model_provider_func, model_type=None, wrap_with_ddp: bool = True):
    """Build this rank's model chunk(s) (one per virtual stage), wrapped in DDP. Returns a list."""

    args = get_args()
    vp = ps.get_virtual_pipeline_model_parallel_world_size()
    chunks = []
    for vp_stage in range(vp or 1):
        pre = ps.is_pipeline_first_stage(ignore_virtual=vp is None, vp_stage=vp_stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=vp is None, vp_stage=vp_stage)
        kwargs = dict(pre_process=pre, post_process=post)
        if vp is not None:
            kwargs["vp_stage"] = vp_stage
        chunk = model_provider_func(**kwargs)
        chunk.model_type = model_type
        if vp is not None:
            chunk.vp_stage = vp_stage
        chunks.append(chunk)
    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    )
    fsdp = wrap_with_ddp and (
        getattr(args, "use_megatron_fsdp", False) or getattr(args, "use_torch_fsdp2", False)
    )
    for chunk in chunks:
        # a model built on the meta device (`gigatron estimate`) stays there
        if device is not None and not any(p.is_meta for p in chunk.parameters()):
            chunk.to(device)
        if fsdp:  # the shards are the fp32 main params; FSDP gathers compute-dtype copies
            chunk.float()
        elif args.params_dtype != torch.float32:
            chunk.to(args.params_dtype)
    helpers.check_moe_layer_pattern(chunks, getattr(chunks[0], "config", None))
    _compile_chunks(args, chunks)
    num_params = sum(p.numel() for c in chunks for p in c.parameters())
    print_rank_0(f" > number of parameters on (tp, pp) rank (0, 0): {num_params}")
    if not wrap_with_ddp:
        return chunks
    ddp_config = get_megatron_ddp_config(args)
    if fsdp:
        return [_fully_shard(args, chunk, ddp_config) for chunk in chunks]
    return [
        DistributedDataParallel(
            config=chunk.config,
            ddp_config=ddp_config,
            module=chunk,
            disable_bucketing=(i > 0) or ps.get_pipeline_model_parallel_rank() > 0,
        )
        for i, chunk in enumerate(chunks)
    ]


def _fully_shard(args, chunk, ddp_config):
    """`--use-megatron-fsdp` / `--use-torch-fsdp2`: the chunk sharded over DP (docs/fsdp.md)."""
    if args.use_megatron_fsdp:
        return FullyShardedDataParallel(chunk.config, ddp_config, chunk)
    fields = {f.name: getattr(ddp_config, f.name) for f in dataclasses.fields(ddp_config)}
    fsdp2_config = TorchFullyShardedDataParallelConfig(
        **fields, reshard_after_forward=args.torch_fsdp2_reshard_after_forward
    )
    return TorchFullyShardedDataParallel(chunk.config, fsdp2_config, chunk)


def _compile_chunks(args, chunks) -> None:
    """`--torch-compile layers|model` [`--torch-compile-mode`, `--torch-compile-layers-per-graph`]
    (gigatron additions): torch.compile in place."""
    from gigatron.core.transformer.fast_path import (
        compile_transformer_layers,
        parse_layers_per_graph,
    )

    mode = getattr(args, "torch_compile", "none")
    compile_mode = getattr(args, "torch_compile_mode", None)
    per_graph = parse_layers_per_graph(getattr(args, "torch_compile_layers_per_graph", "1"))
    if per_graph != 1 and mode == "none":
        raise ValueError(
            f"--torch-compile-layers-per-graph {per_graph} needs --torch-compile layers or model"
        )
    if compile_mode is not None and mode == "none":
        raise ValueError(
            f"--torch-compile-mode {compile_mode} needs --torch-compile layers or model"
        )
    if mode == "layers":
        for chunk in chunks:
            compile_transformer_layers(chunk, mode=compile_mode, layers_per_graph=per_graph)
    elif mode == "model":
        if len(chunks) > 1 or ps.get_pipeline_model_parallel_world_size() > 1:
            raise ValueError(
                "--torch-compile model needs --pipeline-model-parallel-size 1 (a stage's "
                "input tensor changes per microbatch); use --torch-compile layers"
            )
        if per_graph != 1:  # the model's graphs stop around the layer groups
            compile_transformer_layers(chunks[0], mode=compile_mode, layers_per_graph=per_graph)
        chunks[0].compile(mode=compile_mode)


def get_megatron_optimizer_config(args):
    """(OptimizerConfig from the flags by field name, per-parameter overrides) as Megatron's
    helper returns; gigatron has no per-parameter overrides, so the dict is empty."""
    return cfa.optimizer_config_from_args(args), {}


def get_megatron_ddp_config(args):
    """DistributedDataParallelConfig from the flags by field name (Megatron's helper)."""
    return cfa.ddp_config_from_args(args)


def setup_model_and_optimizer(model_provider_func, model_type=None):
    from gigatron.core.optimizer import get_megatron_optimizer

    args = get_args()
    model = get_model(model_provider_func, model_type)
    optimizer = get_megatron_optimizer(get_megatron_optimizer_config(args)[0], model)
    scheduler = cfa.scheduler_from_args(args, optimizer)
    return model, optimizer, scheduler


def _wire_config_hooks(model, optimizer) -> None:
    """Give the schedules the DDP / optimizer hooks, as Megatron's train() does."""
    from gigatron.core.utils import get_model_config

    args = get_args()
    config = get_model_config(model[0])
    config.grad_scale_func = optimizer.scale_loss if args.fp16 else None
    no_sync = [m.no_sync for m in model]
    config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
    config.finalize_model_grads_func = finalize_model_grads
    if args.overlap_grad_reduce and len(model) > 1:
        config.grad_sync_func = [m.start_grad_sync for m in model]
    if args.overlap_param_gather and args.use_distributed_optimizer:
        params_sync = [m.start_param_sync for m in model]
        config.param_sync_func = params_sync[0] if len(model) == 1 else params_sync


def update_train_iters(args) -> None:
    """Megatron's: with --train-samples, the iterations they take (the batch-size ramp-up
    counted step by step; a partial last batch is dropped). Nothing with --train-iters."""
    if args.train_iters:
        return
    if args.step_batch_size_schedule is not None:
        from gigatron.core.num_microbatches_calculator import get_current_global_batch_size

        iterations, consumed = 0, 0
        while consumed < args.train_samples:  # each step takes the schedule's batch
            update_num_microbatches(consumed, consistency_check=False)
            consumed += get_current_global_batch_size()
            iterations += 1
        update_num_microbatches(0, consistency_check=False)
        args.train_iters = iterations
    elif not args.rampup_batch_size:
        args.train_iters = args.train_samples // args.global_batch_size
    else:
        from gigatron.core.num_microbatches_calculator import get_current_global_batch_size

        iterations, consumed = 0, 0
        ramp_samples = int(args.rampup_batch_size[2])
        while consumed <= ramp_samples and consumed <= args.train_samples:
            update_num_microbatches(consumed, consistency_check=False)
            consumed += get_current_global_batch_size()
            iterations += 1
        update_num_microbatches(0, consistency_check=False)
        if args.train_samples > consumed:
            iterations += (args.train_samples - consumed) // args.global_batch_size
        args.train_iters = iterations
    print_rank_0(f"setting training iterations to {args.train_iters}")


# ---------------------------------------------------------------- --freeze-all-layers
def _freeze_all_model_chunks(model_list: list) -> list:
    """Every parameter of every chunk frozen, MoE expert biases too; returns `model_list`."""
    return helpers.freeze_all_model_chunks(model_list)


def _forward_backward_grad_context(args):
    """(torch.no_grad(), True) under --freeze-all-layers, else (nullcontext(), False)."""
    return helpers.forward_backward_grad_context(args)


# ---------------------------------------------------------------- packed-sequence FLOPs
# sum(L_i) and sum(L_i^2) of the real (unpadded) sequences of this iteration's micro-batches,
# [2] float64; `_seqlen_stats_active` says a THD batch was seen (else no collective at all).
_seqlen_stats_in_iteration: torch.Tensor | None = None
_seqlen_stats_active: bool = False


def update_seqlen_stats_from_cu_seqlens(cu_seqlens: torch.Tensor | None) -> None:
    """Add one micro-batch's real `cu_seqlens` [n+1] (0, L_1, L_1+L_2, ...); fewer than two
    entries (or None) is no sequence and changes nothing. No host sync."""
    global _seqlen_stats_in_iteration, _seqlen_stats_active
    if cu_seqlens is None or cu_seqlens.numel() < 2:
        return
    _seqlen_stats_in_iteration = helpers.add_seqlen_stats(_seqlen_stats_in_iteration, cu_seqlens)
    _seqlen_stats_active = True


def consume_seqlen_stats_in_iteration() -> tuple[float | None, float | None]:
    """(total real tokens, sum of squared lengths) over the global batch, then reset; (None,
    None) without a collective when no packed batch was seen (the unpacked defaults apply)."""
    global _seqlen_stats_active
    if not _seqlen_stats_active:
        return None, None
    _seqlen_stats_active = False
    return helpers.reduce_seqlen_stats(_seqlen_stats_in_iteration)


# ---------------------------------------------------------------- data
def get_train_valid_test_num_samples() -> tuple[int, int | None, int]:
    """(train, validation, test) samples the datasets are built for, from `get_args()`."""
    return helpers.num_samples(get_args())


def _save(iteration, model, optimizer, scheduler, flops_so_far) -> None:
    from gigatron.training.checkpointing import save_checkpoint

    args = get_args()
    if getattr(args, "last_saved_iteration", None) == iteration:
        return  # already saved at this step (interval and end of training coincide)
    _sync_params_before_save(model)
    lora = lora_from_args(args)
    if lora is not None:  # adapter-only checkpoints: the base model is the one loaded
        path = os.path.join(args.save, "lora", f"iter_{iteration:07d}")
        save_adapters(model, lora, path)
        args.last_saved_iteration = iteration
        print_rank_0(f"saved LoRA adapters at iteration {iteration} to {path}")
        return
    save_checkpoint(iteration, model, optimizer, scheduler, flops_so_far)
    args.last_saved_iteration = iteration
    if args.async_save:  # written in the background: published (and said so) when finalized
        print_rank_0(f"scheduled checkpoint at iteration {iteration} to {args.save} (async)")
    else:
        print_rank_0(f"saved checkpoint at iteration {iteration} to {args.save}")


def _sync_params_before_save(model) -> None:
    """--overlap-param-gather: after a step each DP rank holds only its own shard of the new
    params until the next forward's pre-hooks all-gather them; a checkpoint needs them whole
    (Megatron disables the pre-hooks with a param sync around its saves). The sync marks the
    gather done, so the next forward does not gather again."""
    args = get_args()
    if args.overlap_param_gather and args.use_distributed_optimizer:
        for chunk in model:
            chunk.start_param_sync(force_sync=True)


def _finalize_async_save(blocking: bool) -> None:
    """--async-save: move the tracker once a save is done (blocking: wait for it)."""
    if get_args().async_save:
        from gigatron.training.checkpointing import maybe_finalize_async_save

        maybe_finalize_async_save(blocking=blocking)


# ---------------------------------------------------------------- the loop
def train(
    forward_step_func,
    model,
    optimizer,
    scheduler,
    train_iter,
    valid_iter,
    config,
    start_iteration: int,
    flops_so_far: float,
):
    """Run iterations until --train-iters (or an exit condition); returns the last iteration
    and the floating-point operations so far. Each iteration: one step, its record in the log
    window, an evaluation and a save where their intervals say, then the exit conditions."""
    args = get_args()
    for chunk in model:
        chunk.train()
    exit_signal = exits.ExitSignal(args.exit_signal_handler, exit_signal_number(args))
    args.train_exit_reason = None  # set when an exit condition stops the loop
    bar = tlog.ProgressBar(args.train_iters, start_iteration, enabled=not args.no_progress_bar)
    window = _log_window.LogWindow(args, bar)
    history = args.train_history = getattr(args, "train_history", [])
    profiler = StepProfiler(args, start_iteration)
    timeline = TrainingTimeline(args, config)  # --timeline: nothing when off
    manual_gc = memory.ManualGC(args)  # --manual-gc: collector off, collections at set points
    start_time, iteration = time.time(), start_iteration
    try:
        while iteration < args.train_iters:
            profiler.step(iteration)
            timeline.step(iteration)
            update_num_microbatches(args.consumed_train_samples, consistency_check=True)
            args.iteration = iteration
            result = train_step(
                forward_step_func,
                helpers.chunk_iterators(train_iter, model),
                model,
                optimizer,
                scheduler,
                config,
            )
            timeline.after_step()
            iteration = args.iteration = iteration + 1
            memory.empty_unused_memory(args, level=1)
            manual_gc.after_step(iteration)
            entry = _log_window.step_record(args, config, iteration, result)
            history.append(entry)
            flops_so_far += _consume_global_batch(args)
            window.add(entry, model=model, optimizer=optimizer, num_zeros=result[3])
            _evaluate_on_interval(forward_step_func, model, config, valid_iter, manual_gc)
            _finalize_async_save(blocking=False)
            saved = bool(args.save and args.save_interval and iteration % args.save_interval == 0)
            if saved:
                window.read()  # a NaN step the sync-free step skipped: raise first
                _save(iteration, model, optimizer, scheduler, flops_so_far)
            reason = exits.exit_reason(args, exit_signal, start_time, iteration)
            if reason is not None:
                if args.save and not saved:
                    window.read()
                    _save(iteration, model, optimizer, scheduler, flops_so_far)
                print_rank_0(f"exiting at iteration {iteration}: {reason}")
                args.train_exit_reason = reason
                break
        window.read()  # after the last iteration or an exit condition's break
        timeline.close()  # gathers on every rank: only on the loop's normal end
    except BaseException:
        with contextlib.suppress(Exception):  # the loop's own error is the one to report
            window.read()
        raise
    finally:
        manual_gc.close()
        try:
            profiler.close()
        finally:
            bar.close()
            exit_signal.restore()
            _finalize_async_save(blocking=True)
    return iteration, flops_so_far


def _consume_global_batch(args) -> float:
    """Add this iteration's global batch to consumed_train_samples; its floating-point ops."""
    batch = get_num_microbatches() * args.micro_batch_size * args.data_parallel_size
    args.consumed_train_samples += batch
    return step_flops(args, batch)


# ---------------------------------------------------------------- evaluation
def _validation_sets(args, valid_iter) -> list[tuple[str, object, int]]:
    """(suffix, iterator, eval_iters) per validation set: one set, suffix "", or with
    --multiple-validation-sets "-<name>" (--validation-set-names) or "-<index>" per set."""
    if not getattr(args, "multiple_validation_sets", False):
        return [("", valid_iter, args.eval_iters)]
    names = getattr(args, "validation_set_names", None)
    if names and len(names) != len(valid_iter):
        raise ValueError(
            f"--validation-set-names gives {len(names)} names for {len(valid_iter)} "
            "validation datasets"
        )
    suffixes = [f"-{name}" for name in (names or range(len(valid_iter)))]
    return list(zip(suffixes, valid_iter, args.eval_iters))


def _evaluate_validation(forward_step_func, model, config, valid_iter, prefix, iteration) -> list:
    """Evaluate each validation set (Megatron's evaluate_and_print_results), log each line
    "validation<suffix> loss at <prefix> | ..."; the losses per set."""
    args = get_args()
    out = []
    full = getattr(args, "full_validation", False)
    for suffix, iterator, eval_iters in _validation_sets(args, valid_iter):
        losses = evaluate(
            forward_step_func,
            helpers.chunk_iterators(iterator, model),
            model,
            config,
            eval_iters=eval_iters,
            full_validation=full,
        )
        memory.empty_unused_memory(args, level=1)
        tlog.log_validation(args, prefix, losses, iteration, suffix=suffix)
        out.append(losses)
    return out


def _evaluate_on_interval(forward_step_func, model, config, valid_iter, manual_gc) -> None:
    """--eval-interval: evaluate on the validation split after this iteration."""
    args = get_args()
    iteration = args.iteration
    if valid_iter is None or not args.eval_iters or not args.eval_interval:
        return
    if iteration % args.eval_interval != 0:
        return
    start = getattr(args, "start_eval_at_iter", None)
    if start is not None and iteration < start:  # --start-eval-at-iter
        return
    manual_gc.around_evaluation()
    sets = _evaluate_validation(
        forward_step_func, model, config, valid_iter, f"iteration {iteration}", iteration
    )
    manual_gc.around_evaluation()
    for losses in sets:
        tlog.write_validation_ppl(args, tlog.tb_writer(), iteration, losses)


def _evaluate_at_end(forward_step_func, model, config, valid_iter, test_iter, iteration) -> dict:
    """Megatron's end of `pretrain()`: after training (or with --skip-train) one evaluation of
    --eval-iters iterations on the validation split, then one on the test split, each where the
    provider gave the split and --eval-iters > 0 (Megatron's do_valid / do_test). The validation
    runs even when the loop has just evaluated that iteration, as Megatron's does. Returns
    {"valid": losses, "test": losses} for the splits evaluated ("valid" a list of losses per
    set with --multiple-validation-sets)."""
    args = get_args()
    out = {}
    write = not getattr(args, "skip_train", False)  # Megatron writes no scalars under skip-train
    if valid_iter is not None and args.eval_iters:
        prefix = f"iteration {iteration} on validation set"
        sets = _evaluate_validation(forward_step_func, model, config, valid_iter, prefix, iteration)
        for losses in sets if write else ():
            tlog.write_validation_ppl(args, tlog.tb_writer(), iteration, losses)
        out["valid"] = sets if getattr(args, "multiple_validation_sets", False) else sets[0]
    test_iters = getattr(args, "test_eval_iters", None)  # --full-validation: --eval-iters
    test_iters = args.eval_iters if test_iters is None else test_iters
    if test_iter is not None and test_iters:
        out["test"] = evaluate(
            forward_step_func,
            helpers.chunk_iterators(test_iter, model),
            model,
            config,
            eval_iters=test_iters,
        )
        memory.empty_unused_memory(args, level=1)
        prefix = f"iteration {iteration} on test set"
        tlog.log_validation(args, prefix, out["test"], iteration)
        if write:
            tlog.write_validation_ppl(args, tlog.tb_writer(), iteration, out["test"])
    return out


def pretrain(
    train_valid_test_dataset_provider,
    model_provider,
    model_type,
    forward_step_func,
    process_non_loss_data_func=None,
    extra_args_provider=None,
    args_defaults: dict | None = None,
    get_embedding_ranks=None,
    get_position_embedding_ranks=None,
    non_loss_data_func=None,
    argv: list[str] | None = None,
    **unused,
):
    """Megatron's entry point: parse flags, build everything, train, evaluate, save.

    Returns a dict with the final iteration and the last validation / test losses (useful for
    scripts and tests; Megatron returns None).
    """
    args = initialize_megatron(
        extra_args_provider,
        args_defaults,
        get_embedding_ranks=get_embedding_ranks,
        get_position_embedding_ranks=get_position_embedding_ranks,
        argv=argv,
    )
    unset_num_microbatches_calculator()
    init_num_microbatches_calculator(
        args.rank,
        [int(x) for x in args.rampup_batch_size] if args.rampup_batch_size else None,
        args.global_batch_size,
        args.micro_batch_size,
        args.data_parallel_size,
        step_batch_size_schedule=args.step_batch_size_schedule,
        seq_length=args.seq_length if args.step_batch_size_schedule is not None else None,
    )
    if args.save and not getattr(args, "skip_train", False):
        from gigatron.training.checkpointing import lock_save_dir

        lock_save_dir(args.save)  # one job per --save: a second one is refused before any work
    tlog.setup_writers(args)
    print_startup_banner(args, build_parser(extra_args_provider))
    model, optimizer, scheduler = setup_model_and_optimizer(model_provider, model_type)
    update_train_iters(args)  # after the scheduler, which stays sample-based (as Megatron's)
    _wire_config_hooks(model, optimizer)
    from gigatron.core.utils import get_model_config

    config = get_model_config(model[0])
    iteration, flops_so_far = 0, 0.0
    if args.load:
        from gigatron.convert import load_hf_for_training
        from gigatron.training.checkpointing import load_checkpoint

        # A Hugging Face directory (config.json + safetensors) starts a fine-tune from its
        # weights; anything else is a gigatron/Megatron checkpoint directory.
        if load_hf_for_training(model, optimizer, args.load):
            iteration, flops_so_far = 0, 0.0
        else:
            iteration, flops_so_far = load_checkpoint(model, optimizer, scheduler)
        args.consumed_train_samples = getattr(args, "consumed_train_samples", 0)
    args.iteration = iteration
    tlog.print_flops_formula(args)
    train_iter, valid_iter, test_iter = build_train_valid_test_data_iterators(
        train_valid_test_dataset_provider
    )
    train_iter = helpers.chunk_iterators(train_iter, model)  # one cursor per virtual stage
    if not getattr(args, "multiple_validation_sets", False):
        valid_iter = helpers.chunk_iterators(valid_iter, model)
    elif valid_iter is not None:  # one cursor per virtual stage, per validation set
        valid_iter = [helpers.chunk_iterators(it, model) for it in valid_iter]
    result = {"iteration": iteration}
    if getattr(args, "skip_train", False):  # Megatron's: no step; evaluate valid + test, exit
        print_rank_0("skipping training (--skip-train is on) ...")
        result.update(
            _evaluate_at_end(
                forward_step_func, model, config, valid_iter, test_iter, args.iteration
            )
        )
        result["model"] = model
        result["history"] = []
        return result
    if iteration < args.train_iters:
        iteration, flops_so_far = train(
            forward_step_func,
            model,
            optimizer,
            scheduler,
            train_iter,
            valid_iter,
            config,
            iteration,
            flops_so_far,
        )
        result["iteration"] = iteration
        if args.save and iteration == args.train_iters:
            _save(iteration, model, optimizer, scheduler, flops_so_far)
            _finalize_async_save(blocking=True)
    # An exit condition ends Megatron's run inside train() (sys.exit): no final evaluation
    if getattr(args, "train_exit_reason", None) is None:
        result.update(
            _evaluate_at_end(forward_step_func, model, config, valid_iter, test_iter, iteration)
        )
    result["model"] = model
    result["history"] = getattr(args, "train_history", [])
    if math.isfinite(flops_so_far):
        result["flops"] = flops_so_far
    if args.save:  # the job is done with --save (every save published above)
        from gigatron.core.dist_checkpointing.checkpoint_files import unlock_save_dir

        unlock_save_dir(args.save)
    return result
