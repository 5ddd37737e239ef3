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
import itertools
import math
import signal
import time

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.num_microbatches_calculator import (
    get_num_microbatches,
    init_num_microbatches_calculator,
    unset_num_microbatches_calculator,
    update_num_microbatches,
)
from gigatron.training import _config_from_args as cfa
from gigatron.training import _loop_extras as lx
from gigatron.training import _training_log as tlog
from gigatron.training._profiler import StepProfiler
from gigatron.training._startup_banner import print_startup_banner
from gigatron.training._train_step import (  # noqa: F401  (Megatron's public names live here)
    NonFiniteGradientError,
    evaluate,
    materialize_losses,
    train_step,
)
from gigatron.training.arguments import build_parser
from gigatron.training.data_samplers import build_pretraining_data_loader, exit_signal_number
from gigatron.training.global_vars import get_args
from gigatron.training.initialize import initialize_megatron
from gigatron.training.utils import print_rank_0


# ---------------------------------------------------------------- model and optimizer
def get_model(model_provider_func, model_type=None, wrap_with_ddp: bool = True):
    """Build this rank's model chunk(s) (one per virtual stage), wrapped in DDP. Returns a list."""
    from gigatron.core.distributed import DistributedDataParallel

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
    for chunk in chunks:
        if device is not None:
            chunk.to(device)
        if args.params_dtype != torch.float32:
            chunk.to(args.params_dtype)
    lx.check_moe_layer_pattern(chunks, getattr(chunks[0], "config", None))
    _compile_chunks(args, chunks)
    num_params = sum(p.numel() for c in chunks for p in c.parameters())
    print_rank_0(f" > number of parameters on (tp, pp) rank (0, 0): {num_params}")
    if not wrap_with_ddp:
        return chunks
    ddp_config = cfa.ddp_config_from_args(args)
    return [
        DistributedDataParallel(
            config=chunk.config,
            ddp_config=ddp_config,
            module=chunk,
            disable_bucketing=(i > 0) or ps.get_pipeline_model_parallel_rank() > 0,
        )
        for i, chunk in enumerate(chunks)
    ]


def _compile_chunks(args, chunks) -> None:
    """`--torch-compile layers|model` [`--torch-compile-mode`, `--torch-compile-layers-per-graph`]
    (gigatron additions): torch.compile in place."""
    from gigatron.core.transformer._compile import (
        compile_transformer_layers,
        parse_layers_per_graph,
    )

    mode = getattr(args, "torch_compile", "none")
    compile_mode = getattr(args, "torch_compile_mode", None)
    per_graph = parse_layers_per_graph(getattr(args, "torch_compile_layers_per_graph", "1"))
    if per_graph != 1 and mode == "none":
        raise ValueError(
            f"--torch-compile-layers-per-graph {per_graph} needs --torch-compile layers or "
            "model (gigatron/training/training.py)"
        )
    if compile_mode is not None and mode == "none":
        raise ValueError(
            f"--torch-compile-mode {compile_mode} needs --torch-compile layers or model "
            "(gigatron/training/training.py)"
        )
    if mode == "layers":
        for chunk in chunks:
            compile_transformer_layers(chunk, mode=compile_mode, layers_per_graph=per_graph)
    elif mode == "model":
        if len(chunks) > 1 or ps.get_pipeline_model_parallel_world_size() > 1:
            raise ValueError(
                "--torch-compile model needs --pipeline-model-parallel-size 1 (a stage's "
                "input tensor changes per microbatch); use --torch-compile layers "
                "(gigatron/training/training.py)"
            )
        if per_graph != 1:  # the model's graphs stop around the layer groups
            compile_transformer_layers(chunks[0], mode=compile_mode, layers_per_graph=per_graph)
        chunks[0].compile(mode=compile_mode)


def setup_model_and_optimizer(model_provider_func, model_type=None):
    from gigatron.core.optimizer import get_megatron_optimizer

    args = get_args()
    model = get_model(model_provider_func, model_type)
    optimizer = get_megatron_optimizer(cfa.optimizer_config_from_args(args), model)
    scheduler = cfa.scheduler_from_args(args, optimizer)
    return model, optimizer, scheduler


def _wire_config_hooks(model, optimizer) -> None:
    """Give the schedules the DDP / optimizer hooks, as Megatron's train() does."""
    from gigatron.core.distributed import finalize_model_grads
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
    if not args.rampup_batch_size:
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


# ---------------------------------------------------------------- data
def _num_samples(args) -> list[int]:
    """Megatron's get_train_valid_test_num_samples: validation sized for the periodic
    evaluations plus the end-of-run one (that one only under --skip-train), test for one."""
    train = args.train_samples or args.train_iters * args.global_batch_size
    iters = args.train_iters or train // args.global_batch_size
    periodic = iters // args.eval_interval if args.eval_interval else 0  # 0: at the end only
    if getattr(args, "skip_train", False):
        periodic = 0
    evals = (periodic + 1) * args.eval_iters * args.global_batch_size
    return [train, evals, args.eval_iters * args.global_batch_size]


def build_train_valid_test_data_iterators(train_valid_test_dataset_provider):
    """Datasets from the provider, wrapped in resumable loaders; iterators (or None) per split."""
    args = get_args()
    sizes = _num_samples(args)
    print_rank_0(" > datasets target sizes (minimum size):")
    for name, size in zip(("train:     ", "validation:", "test:      "), sizes):
        print_rank_0(f"    {name} {size}")
    train_ds, valid_ds, test_ds = train_valid_test_dataset_provider(sizes)
    # Megatron's: --skip-train reads the validation split (sized for one evaluation) from its
    # start, not from the loaded checkpoint's consumed_valid_samples
    valid_start = 0 if getattr(args, "skip_train", False) else args.consumed_valid_samples
    loaders = [
        build_pretraining_data_loader(train_ds, args.consumed_train_samples, args),
        build_pretraining_data_loader(valid_ds, valid_start, args),
        build_pretraining_data_loader(test_ds, 0, args),
    ]
    return [iter(loader) if loader is not None else None for loader in loaders]


def _chunk_iterators(iterator, model):
    """Interleaved schedules take one iterator per virtual stage, each yielding the same
    micro-batches (Megatron builds one loader per stage). `itertools.tee` gives each chunk its
    own cursor over the one loader; sharing one iterator object made every chunk draw a
    different micro-batch (the first stage's tokens and the last stage's labels disagreed).
    Call once per loader: a list (already split) is returned as it is."""
    if iterator is None or len(model) == 1 or isinstance(iterator, list):
        return iterator
    return list(itertools.tee(iterator, len(model)))


# ---------------------------------------------------------------- exit conditions
class _ExitSignal:
    """Remembers the exit signal (SIGTERM, or `--exit-signal`) so the loop can save and stop at
    a step boundary. DataLoader workers ignore it (`build_pretraining_data_loader`)."""

    def __init__(self, enabled: bool, signum: int = signal.SIGTERM) -> None:
        self.received = False
        self.name = signal.Signals(signum).name
        self._signum, self._previous = signum, None
        if enabled:
            self._previous = signal.signal(signum, self._handler)

    def _handler(self, signum, frame) -> None:
        self.received = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(self._signum, self._previous)


def _any_rank(*flags: bool) -> list[bool]:
    """Each flag OR-ed over all ranks (one all-reduce)."""
    t = torch.tensor(
        [1.0 if f else 0.0 for f in flags],
        device="cuda" if dist.get_backend() == "nccl" else "cpu",
    )
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def _save(iteration, model, optimizer, scheduler, flops_so_far) -> None:
    from gigatron.training.checkpointing import save_checkpoint

    args = get_args()
    if getattr(args, "last_saved_iteration", None) == iteration:
        return  # already saved at this step (interval and end of training coincide)
    save_checkpoint(iteration, model, optimizer, scheduler, flops_so_far)
    args.last_saved_iteration = iteration
    print_rank_0(f"saved checkpoint at iteration {iteration} to {args.save}")


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
    """Run iterations until --train-iters (or an exit condition); returns the last iteration."""
    args = get_args()
    for chunk in model:
        chunk.train()
    exit_signal = _ExitSignal(args.exit_signal_handler, exit_signal_number(args))
    args.train_exit_reason = None  # set when an exit condition stops the loop
    bar = tlog.ProgressBar(args.train_iters, start_iteration, enabled=not args.no_progress_bar)
    start_time = time.time()
    iteration = start_iteration
    window_start, window_iters = time.perf_counter(), 0
    counts = {"skipped": 0, "nan": 0}
    history = args.train_history = getattr(args, "train_history", [])
    pending: list[dict] = []  # history entries whose losses are still device tensors
    profiler = StepProfiler(args, start_iteration)
    manual_gc = lx.ManualGC(args)  # --manual-gc: collector off, collections at set points
    try:
        while iteration < args.train_iters:
            profiler.step(iteration)
            update_num_microbatches(args.consumed_train_samples, consistency_check=True)
            args.iteration = iteration
            losses, skipped, grad_norm, num_zeros, nan_iter = train_step(
                forward_step_func,
                _chunk_iterators(train_iter, model),
                model,
                optimizer,
                scheduler,
                config,
            )
            iteration += 1
            args.iteration = iteration
            lx.empty_unused_memory(args, level=1)
            manual_gc.after_step(iteration)
            losses = {**losses, **_moe_losses(args, config, iteration)}
            batch = get_num_microbatches() * args.micro_batch_size * args.data_parallel_size
            args.consumed_train_samples += batch
            flops_so_far += _step_flops(args, batch)
            entry = {
                "iteration": iteration,
                "losses": losses,
                "skipped": skipped,
                "nan": nan_iter,
                # a device tensor with the sync-free step: read when the loop logs
                "grad_norm": grad_norm
                if grad_norm is None or _is_tensor(grad_norm)
                else float(grad_norm),
            }
            history.append(entry)
            pending.append(entry)
            counts["skipped"] += skipped
            counts["nan"] += nan_iter
            window_iters += 1
            log_now = iteration % args.log_interval == 0
            # --log-params-norm, on every rank: the norm is reduced over the model-parallel group
            if log_now and getattr(args, "log_params_norm", False):
                entry["params_norm"] = lx.calc_params_l2_norm(model, bf16=args.bf16)
            window = pending
            if log_now:  # the one host sync for the losses of the window
                materialize_losses(pending)
                pending = []
            shown = next(iter(losses.values()), None)  # a bar shows losses already read
            bar.update(shown if isinstance(shown, float) else None)
            if log_now:
                stats = {
                    "lr": optimizer.param_groups[0]["lr"],
                    "losses": _window_mean(window),
                    "grad_norm": entry["grad_norm"],  # read by materialize_losses
                    "num_zeros": num_zeros,
                    "params_norm": entry.get("params_norm"),
                    "loss_scale": optimizer.get_loss_scale().item() if args.fp16 else None,
                    **{key: int(value) for key, value in counts.items()},
                }
                elapsed = time.perf_counter() - window_start
                tlog.training_log(args, stats, iteration, elapsed, window_iters, bar)
                lx.write_extra_scalars(args, _tb_writer(), iteration, stats)
                window_start, window_iters = time.perf_counter(), 0
                counts = {"skipped": 0, "nan": 0}
            if (
                valid_iter is not None
                and args.eval_iters
                and args.eval_interval
                and iteration % args.eval_interval == 0
            ):
                manual_gc.around_evaluation()
                losses_v = evaluate(
                    forward_step_func, _chunk_iterators(valid_iter, model), model, config
                )
                manual_gc.around_evaluation()
                lx.empty_unused_memory(args, level=1)
                tlog.log_validation(args, f"iteration {iteration}", losses_v, iteration)
                lx.write_validation_ppl(args, _tb_writer(), iteration, losses_v)
            if args.async_save:
                from gigatron.training.checkpointing import maybe_finalize_async_save

                maybe_finalize_async_save(blocking=False)  # moves the tracker once a save is done
            saved = False
            if args.save and args.save_interval and iteration % args.save_interval == 0:
                materialize_losses(pending)  # a NaN step the sync-free step skipped: raise first
                _save(iteration, model, optimizer, scheduler, flops_so_far)
                saved = True
            out_of_time = (
                args.exit_duration_in_mins is not None
                and (time.time() - start_time) / 60.0 > args.exit_duration_in_mins
            )
            # Agreed over ranks only when an exit condition is armed (a collective and a host
            # sync each iteration otherwise, as Megatron also skips them)
            armed = args.exit_signal_handler or args.exit_duration_in_mins is not None
            # the reason agreed too: a rank that was not signalled names the signal as well
            signalled, out_of_time = (
                _any_rank(exit_signal.received, out_of_time) if armed else (False, False)
            )
            if signalled or out_of_time:
                reason = f"{exit_signal.name} received" if signalled else "exit duration reached"
                if args.save and not saved:
                    materialize_losses(pending)
                    _save(iteration, model, optimizer, scheduler, flops_so_far)
                print_rank_0(f"exiting at iteration {iteration}: {reason}")
                args.train_exit_reason = reason
                break
            if args.exit_interval and iteration % args.exit_interval == 0:
                if args.save and not saved:
                    materialize_losses(pending)
                    _save(iteration, model, optimizer, scheduler, flops_so_far)
                print_rank_0(f"exiting at iteration {iteration}: --exit-interval")
                args.train_exit_reason = "--exit-interval"
                break
        materialize_losses(pending)  # after the last iteration or an exit condition's break
    except BaseException:
        with contextlib.suppress(Exception):  # the loop's own error is the one to report
            materialize_losses(pending)
        raise
    finally:
        manual_gc.close()
        try:
            profiler.close()
        finally:
            bar.close()
            exit_signal.restore()
            if args.async_save:
                from gigatron.training.checkpointing import maybe_finalize_async_save

                maybe_finalize_async_save(blocking=True)
    return iteration, flops_so_far


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _tb_writer():
    from gigatron.training import global_vars

    return global_vars.get_tensorboard_writer()


def _window_mean(entries: list[dict]) -> dict[str, float]:
    """Each loss averaged over the log window's iterations that updated the weights, as
    Megatron's log line reports it (a window of skipped steps only: its last losses)."""
    kept = [e for e in entries if not e["skipped"]] or entries[-1:]
    sums: dict[str, list[float]] = {}
    for e in kept:
        for key, value in e["losses"].items():
            sums.setdefault(key, []).append(float(value))
    return {key: sum(v) / len(v) for key, v in sums.items()}


def _moe_losses(args, config, iteration: int) -> dict[str, torch.Tensor]:
    """MoE aux / z losses of this iteration, averaged over MoE layers (every rank calls it:
    the tracker reduces across ranks), also written to TensorBoard / W&B, per layer if asked.
    Device tensors, read with the other losses when the loop logs (no host sync here unless a
    writer is configured: it records every iteration, as Megatron's)."""
    if not args.num_experts:
        return {}
    from gigatron.core.transformer.moe.moe_utils import track_moe_metrics
    from gigatron.training import global_vars

    totals: dict = {}
    track_moe_metrics(
        loss_scale=1.0 / get_num_microbatches(),
        iteration=iteration,
        writer=global_vars.get_tensorboard_writer(),
        wandb_writer=global_vars.get_wandb_writer(),
        total_loss_dict=totals,
        per_layer_logging=config.moe_per_layer_logging,
        num_layers=config.num_layers,
        moe_layer_freq=config.moe_layer_freq,
    )
    return {
        name: torch.as_tensor(value).detach().float().reshape(()) for name, value in totals.items()
    }


def _evaluate_at_end(forward_step_func, model, config, valid_iter, test_iter, iteration) -> dict:
    """Megatron's end of `pretrain()`: after training (or with --skip-train) one evaluation of
    --eval-iters iterations on the validation split, then one on the test split, each where the
    provider gave the split and --eval-iters > 0 (Megatron's do_valid / do_test). The validation
    runs even when the loop has just evaluated that iteration, as Megatron's does. Returns
    {"valid": losses, "test": losses} for the splits evaluated."""
    args = get_args()
    out = {}
    for name, iterator in (("valid", valid_iter), ("test", test_iter)):
        if iterator is None or not args.eval_iters:
            continue
        out[name] = evaluate(forward_step_func, _chunk_iterators(iterator, model), model, config)
        lx.empty_unused_memory(args, level=1)
        split = "validation" if name == "valid" else "test"
        tlog.log_validation(args, f"iteration {iteration} on {split} set", out[name], iteration)
        if not getattr(args, "skip_train", False):  # Megatron writes no scalars under skip-train
            lx.write_validation_ppl(args, _tb_writer(), iteration, out[name])
    return out


def _step_flops(args, batch: int) -> float:
    from gigatron.training.flops import num_floating_point_operations

    return num_floating_point_operations(args, batch)


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
    )
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
    train_iter = _chunk_iterators(train_iter, model)  # one cursor per virtual stage
    valid_iter = _chunk_iterators(valid_iter, model)
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
            if args.async_save:
                from gigatron.training.checkpointing import maybe_finalize_async_save

                maybe_finalize_async_save(blocking=True)
    # An exit condition ends Megatron's run inside train() (sys.exit): no final evaluation
    if getattr(args, "train_exit_reason", None) is None:
        result.update(
            _evaluate_at_end(forward_step_func, model, config, valid_iter, test_iter, iteration)
        )
    result["model"] = model
    result["history"] = getattr(args, "train_history", [])
    if math.isfinite(flops_so_far):
        result["flops"] = flops_so_far
    return result
