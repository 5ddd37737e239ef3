"""Small helpers of `megatron.training.training` that Megatron's scripts and tests call:
sample counts per split, --freeze-all-layers, the built model's --moe-layer-freq check, one
data cursor per virtual stage, and packed-sequence (THD) length statistics.

The statistics accumulator's state lives in `gigatron.training.training` (Megatron's tests
reset `training._seqlen_stats_in_iteration` / `_seqlen_stats_active` there); the math is here.
"""

from __future__ import annotations

import contextlib
import itertools

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.transformer.moe.moe_layer import MoELayer
from gigatron.core.transformer.transformer_layer import TransformerLayer


def eval_batch_sizes(args) -> tuple[int, int]:
    """(eval global batch, eval micro batch): `--eval-global-batch-size` and
    `--eval-micro-batch-size`, each defaulting to its training size (as validate_args sets)."""
    gbs = getattr(args, "eval_global_batch_size", None) or args.global_batch_size
    mbs = getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size
    return gbs, mbs


def num_samples(args) -> tuple[int, int | None, int]:
    """(train, validation, test) samples to build, Megatron's `get_train_valid_test_num_samples`.

    train: `--train-samples`, else train_iters x global batch. validation: one evaluation per
    `--eval-interval` iterations plus the final one, less those before `--start-eval-at-iter`
    (one evaluation under `--skip-train`; None under `--full-validation`), each
    `--eval-iters` x the eval global batch (default: the training one). test: one evaluation.
    Under `--phase-transition-iterations` train is the samples of the current phase only.
    gigatron extra: no `--eval-interval` means evaluating at the end only.
    """
    gbs = args.global_batch_size
    eval_gbs = getattr(args, "eval_global_batch_size", None) or gbs
    train = args.train_samples or args.train_iters * gbs
    if getattr(args, "full_validation", False):
        valid = None
    else:
        if getattr(args, "skip_train", False):
            num_evals = 1
        else:
            iters = args.train_iters or train // gbs
            interval = args.eval_interval
            num_evals = (iters // interval if interval else 0) + 1
            start = getattr(args, "start_eval_at_iter", None)
            if start and interval:  # multiples of the interval below `start` evaluate nothing
                num_evals = max(1, num_evals - (start - 1) // interval)
        valid = num_evals * args.eval_iters * eval_gbs
    test = args.eval_iters * eval_gbs
    transitions = getattr(args, "phase_transition_iterations", None)
    if transitions:
        bounds = [0] + [t * gbs for t in transitions] + [args.train_samples]
        now = args.iteration * gbs
        train = min(b for b in bounds if b > now) - max(b for b in bounds if b <= now)
    return train, valid, test


def freeze_all_model_chunks(model_list: list) -> list:
    """--freeze-all-layers: no parameter of any chunk needs a gradient, and MoE routers stop
    updating their expert bias (`frozen_expert_bias`). In place; returns `model_list`."""
    for chunk in model_list:
        chunk.requires_grad_(False)
        for module in chunk.modules():
            if hasattr(module, "frozen_expert_bias"):
                module.frozen_expert_bias = True
    return model_list


def forward_backward_grad_context(args):
    """(grad context, forward_only) of a train step: `torch.no_grad()` and True under
    --freeze-all-layers (a received pipeline activation requires grad, so without no_grad a
    frozen stage would still build a graph), else a no-op context and False."""
    frozen = bool(getattr(args, "freeze_all_layers", False))
    return (torch.no_grad() if frozen else contextlib.nullcontext()), frozen


def check_moe_layer_pattern(chunks, config) -> None:
    """--moe-layer-freq: the built layers must follow the config's MoE pattern. A provider that
    builds every layer from one layer spec ignores the pattern (pretrain_gpt's did: MoE in
    every layer under --moe-layer-freq 2, a silently different model)."""
    if config is None or not config.num_moe_experts or config.moe_layer_freq == 1:
        return
    from gigatron.core.transformer.moe.moe_utils import get_moe_layer_pattern

    pattern = get_moe_layer_pattern(config)
    for chunk in chunks:
        for name, layer in chunk.named_modules():
            # the MTP block's layers follow their own spec (Megatron's MTP copies the last layer)
            if not isinstance(layer, TransformerLayer) or "mtp." in f".{name}":
                continue
            i = layer.layer_number - 1
            if isinstance(layer.mlp, MoELayer) != bool(pattern[i]):
                raise ValueError(
                    f"--moe-layer-freq {config.moe_layer_freq}: layer {i} was built "
                    f"{'with' if pattern[i] == 0 else 'without'} experts against the pattern "
                    f"{pattern}; the model provider must build the decoder from "
                    "get_gpt_decoder_block_spec(config, ...)"
                )


def chunk_iterators(iterator, model):
    """Interleaved schedules take one iterator per virtual stage, each yielding the same
    micro-batches (Megatron builds one loader per stage). `itertools.tee` gives each chunk its
    own cursor over the one loader; sharing one iterator object made every chunk draw a
    different micro-batch (the first stage's tokens and the last stage's labels disagreed).
    Call once per loader: a list (already split) is returned as it is."""
    if iterator is None or len(model) == 1 or isinstance(iterator, list):
        return iterator
    return list(itertools.tee(iterator, len(model)))


def add_seqlen_stats(acc: torch.Tensor | None, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """acc [2] float64 += [sum L_i, sum L_i^2] of `cu_seqlens` [n+1] (allocated on first use,
    on the current CUDA device when there is one, else beside `cu_seqlens`)."""
    if acc is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else cu_seqlens.device
        )
        acc = torch.zeros(2, dtype=torch.float64, device=device)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(device=acc.device, dtype=torch.float64)
    acc[0] += lengths.sum()
    acc[1] += (lengths * lengths).sum()
    return acc


def reduce_seqlen_stats(acc: torch.Tensor) -> tuple[float, float]:
    """Global (sum L, sum L^2) from every rank's accumulator, then zero it.

    Ranks of one data-parallel replica (TP x CP x PP of them) saw the same sequences, so the
    world sum counts each replica TP x CP x PP times; that factor is divided out."""
    dedup = 1
    if dist.is_initialized() and ps.model_parallel_is_initialized():
        dist.all_reduce(acc)
        dedup = (
            max(ps.get_tensor_model_parallel_world_size(), 1)
            * max(ps.get_context_parallel_world_size(), 1)
            * max(ps.get_pipeline_model_parallel_world_size(), 1)
        )
    tokens, squares = acc.tolist()
    acc.zero_()
    return tokens / dedup, squares / dedup
