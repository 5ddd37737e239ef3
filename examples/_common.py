"""Shared setup for the gigatron examples (run them with torchrun; this file is imported).

`init_distributed` picks nccl when CUDA is available, gloo otherwise (CPU), then builds the
model-parallel groups. `tiny_gpt` builds a small GPTModel for this rank's pipeline stage;
`mock_batches` yields random next-token batches; `forward_step` is Megatron's forward_step_func
contract (returns the per-token loss and a loss_func).
"""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from gigatron.core.transformer.transformer_config import TransformerConfig

USE_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if USE_CUDA else torch.device("cpu")
VOCAB, SEQ = 64, 16


def init_distributed(seed: int = 123, **parallel_sizes) -> None:
    """Process group (nccl on GPUs, gloo on CPU) + parallel_state groups + seeded RNGs."""
    if USE_CUDA:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if USE_CUDA else "gloo")
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(**parallel_sizes)
    model_parallel_cuda_manual_seed(seed)


def print_rank0(*args) -> None:
    if dist.get_rank() == 0:
        print(*args, flush=True)


def print_last_stage(*args) -> None:
    """Print once, from the first rank of the last pipeline stage (where losses live)."""
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if last and parallel_state.get_tensor_model_parallel_rank() == 0:
        if parallel_state.get_data_parallel_rank() == 0:
            print(*args, flush=True)


def tiny_config(**overrides) -> TransformerConfig:
    kw = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
    )
    kw.update(overrides)
    return TransformerConfig(**kw)


def tiny_gpt(config: TransformerConfig, num_experts: int | None = None) -> GPTModel:
    """This rank's stage of a small GPT (first stage embeds, last stage computes the loss)."""
    torch.manual_seed(0)
    return GPTModel(
        config,
        get_gpt_layer_local_spec(num_experts=num_experts),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=True),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=True),
    ).to(DEVICE)


def mock_batches(micro_batch_size: int, seed: int = 0):
    """Endless {tokens, labels, loss_mask, position_ids} batches, the same on every rank of a
    model-parallel group (seeded by data-parallel rank). Learnable: each sequence counts up by
    a per-sequence step (mod VOCAB) from a random start, so the loss visibly drops."""
    g = torch.Generator().manual_seed(seed + 1000 * parallel_state.get_data_parallel_rank())
    while True:
        start = torch.randint(0, VOCAB, (micro_batch_size, 1), generator=g)
        step = torch.randint(1, 3, (micro_batch_size, 1), generator=g)
        tokens = (start + step * torch.arange(SEQ + 1)[None]) % VOCAB  # [b, s+1]
        yield {
            "tokens": tokens[:, :-1].to(DEVICE),
            "labels": tokens[:, 1:].to(DEVICE),
            "loss_mask": torch.ones(micro_batch_size, SEQ, device=DEVICE),
            "position_ids": torch.arange(SEQ, device=DEVICE)[None].expand(micro_batch_size, -1),
        }


def loss_func(loss_mask, output_tensor):
    """Masked mean of the per-token losses `[b, s]`; Megatron's 2-tuple form."""
    loss = (output_tensor.float() * loss_mask).sum() / loss_mask.sum()
    # clone: the schedule divides the returned loss by num_microbatches in place (as Megatron's)
    return loss, {"lm loss": loss.detach().clone()}


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def mean_loss(losses: list[dict]) -> float:
    """Mean 'lm loss' over the microbatch reports ([] off the last stage -> nan)."""
    if not losses:
        return float("nan")
    return float(sum(d["lm loss"] for d in losses) / len(losses))


def wrap_and_optimizer(model, optimizer_config=None, ddp_config=None):
    """DDP-wrap `model` and build the Megatron optimizer over it (reads DDP's main_grad), wiring
    the config hooks the schedule calls (no_sync, finalize_model_grads)."""
    from gigatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = model.config
    ddp = DistributedDataParallel(config, ddp_config or DistributedDataParallelConfig(), model)
    config.no_sync_func = ddp.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer_config = optimizer_config or OptimizerConfig(lr=3e-3, weight_decay=0.0)
    return ddp, get_megatron_optimizer(optimizer_config, [ddp])


def train_step(ddp, optimizer, data, num_microbatches: int, micro_batch_size: int):
    """One step: zero grads, forward+backward over the microbatches, optimizer step."""
    from gigatron.core.pipeline_parallel import get_forward_backward_func

    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=data,
        model=ddp,
        num_microbatches=num_microbatches,
        seq_length=SEQ,
        micro_batch_size=micro_batch_size,
        forward_only=False,
    )
    updated, grad_norm, _ = optimizer.step()
    return mean_loss(losses), grad_norm, updated
