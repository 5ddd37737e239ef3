"""Context parallelism by hand: each rank holds a slice of every sequence, attention runs over
the whole sequence across ranks, and the loss is the one the full sequence gives.

    torchrun --nproc-per-node 2 -m gigatron.compat.megatron examples/tutorials/context_parallel.py

Written against `megatron.core`. The model is built and scored once without context parallelism
(both ranks see whole sequences), then again at context_parallel_size=2 on the same batch: the
two losses agree. Then a few training steps at CP 2. docs/learn.md walks through it.
"""

import argparse
import os
from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import get_batch_on_this_cp_rank

SEQ_LENGTH, MICRO_BATCH_SIZE, VOCAB_SIZE = 32, 4, 64
USE_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if USE_CUDA else torch.device("cpu")


def build_model(seed: int = 1234) -> GPTModel:
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,  # gigatron's context-parallel attention has no dropout
        use_cpu_initialization=True,
        # the model must know: its attention then exchanges keys and values between CP ranks
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
    )
    return GPTModel(config, get_gpt_layer_local_spec(), VOCAB_SIZE, SEQ_LENGTH).to(DEVICE)


def make_batch(step: int) -> dict:
    """Sequences that count up from a random start (learnable), the same on every rank."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB_SIZE, (MICRO_BATCH_SIZE, 1), generator=g)
    tokens = (start + torch.arange(SEQ_LENGTH + 1)) % VOCAB_SIZE  # [b, s + 1]
    return {
        "tokens": tokens[:, :-1],
        "labels": tokens[:, 1:],
        "loss_mask": torch.ones(MICRO_BATCH_SIZE, SEQ_LENGTH),
        "position_ids": torch.arange(SEQ_LENGTH).expand(MICRO_BATCH_SIZE, -1),
    }


def loss_func(loss_mask, output_tensor):
    """(sum of this rank's token losses, its token count, report). The schedule divides by the
    count; the report adds both over the CP group, so it is the mean over the whole sequence."""
    loss = torch.sum(output_tensor.float() * loss_mask)
    num_tokens = loss_mask.sum().to(torch.int)
    report = torch.stack([loss.detach(), num_tokens.float()])
    torch.distributed.all_reduce(report, group=parallel_state.get_context_parallel_group())
    return loss, num_tokens, {"lm loss": report}


def forward_step_func(data_iterator, model):
    # this rank's 2 of the 2 x CP chunks of every sequence (chunks r and 2 CP - 1 - r, so every
    # rank gets the same share of the causal attention work)
    batch = get_batch_on_this_cp_rank({k: v.to(DEVICE) for k, v in next(data_iterator).items()})
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def mean_loss(model, batch, forward_only: bool) -> float:
    reports = get_forward_backward_func()(
        forward_step_func=forward_step_func,
        data_iterator=iter([batch]),
        model=model,
        num_microbatches=1,
        seq_length=SEQ_LENGTH,
        micro_batch_size=MICRO_BATCH_SIZE,
        forward_only=forward_only,
    )
    total = sum(r["lm loss"] for r in reports)
    return float(total[0] / total[1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cp", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    if USE_CUDA:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(backend="nccl" if USE_CUDA else "gloo")
    rank = torch.distributed.get_rank()

    parallel_state.initialize_model_parallel()  # first without CP: whole sequences everywhere
    full_loss = mean_loss(build_model(), make_batch(0), forward_only=True)
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(context_parallel_size=args.cp)
    model = build_model()  # the same weights: CP shards the sequence, not the model
    cp_loss = mean_loss(model, make_batch(0), forward_only=True)
    if rank == 0:
        print(f"loss without context parallel: {full_loss:.6f}", flush=True)
        print(f"loss with context parallel {args.cp}: {cp_loss:.6f}", flush=True)

    ddp_model = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-2), [ddp_model])
    for step in range(args.steps):
        ddp_model.zero_grad_buffer()
        optimizer.zero_grad()
        loss = mean_loss(ddp_model, make_batch(100 + step), forward_only=False)
        finalize_model_grads([ddp_model])  # gradients summed over the CP (and DP) ranks
        optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {loss:.4f}", flush=True)
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
