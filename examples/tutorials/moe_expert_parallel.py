"""Mixture of Experts with expert parallelism by hand: 4 experts, top-2 routing, each of 2 ranks
holds 2 of the experts and tokens travel to the rank of the expert they are routed to.

    torchrun --nproc-per-node 2 -m gigatron.compat.megatron \\
        examples/tutorials/moe_expert_parallel.py

Written against `megatron.core`. docs/learn.md walks through it.
"""

import argparse
import os

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

SEQ_LENGTH, MICRO_BATCH_SIZE, VOCAB_SIZE, NUM_EXPERTS = 16, 4, 64, 4
USE_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if USE_CUDA else torch.device("cpu")


def build_model(ep: int, dispatcher: str) -> GPTModel:
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        num_moe_experts=NUM_EXPERTS,
        moe_router_topk=2,
        moe_ffn_hidden_size=64,
        moe_aux_loss_coeff=1e-2,  # load balancing: keep every expert busy
        moe_token_dispatcher_type=dispatcher,  # "alltoall" or "allgather"
        expert_model_parallel_size=ep,
    )
    # the layer spec decides what the MLP is: with num_experts it is an MoELayer
    spec = get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    return GPTModel(config, spec, VOCAB_SIZE, SEQ_LENGTH).to(DEVICE)


def make_batch(step: int) -> dict:
    """Counting sequences from a random start, different on each data-parallel rank."""
    g = torch.Generator().manual_seed(1000 * parallel_state.get_data_parallel_rank() + step)
    start = torch.randint(0, VOCAB_SIZE, (MICRO_BATCH_SIZE, 1), generator=g)
    tokens = (start + torch.arange(SEQ_LENGTH + 1)) % VOCAB_SIZE
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}


def loss_func(output_tensor):
    loss = output_tensor.float().mean()
    return loss, {"lm loss": loss.detach().clone()}


def forward_step_func(data_iterator, model):
    batch = {k: v.to(DEVICE) for k, v in next(data_iterator).items()}
    position_ids = torch.arange(SEQ_LENGTH, device=DEVICE).expand(MICRO_BATCH_SIZE, -1)
    output = model(batch["tokens"], position_ids, None, labels=batch["labels"])
    return output, loss_func


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ep", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    parser.add_argument("--dispatcher", default="alltoall", choices=["alltoall", "allgather"])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    if USE_CUDA:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(backend="nccl" if USE_CUDA else "gloo")
    # experts are split over the expert-parallel group; the attention layers are data-parallel
    parallel_state.initialize_model_parallel(expert_model_parallel_size=args.ep)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    model = build_model(args.ep, args.dispatcher)
    experts = model.decoder.layers[0].mlp.experts.local_experts
    print(
        f"rank {torch.distributed.get_rank()}: expert-parallel rank "
        f"{parallel_state.get_expert_model_parallel_rank()}, {len(experts)} of "
        f"{NUM_EXPERTS} experts per layer",
        flush=True,
    )
    ddp_model = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-2), [ddp_model])
    for step in range(args.steps):
        ddp_model.zero_grad_buffer()
        optimizer.zero_grad()
        reports = get_forward_backward_func()(
            forward_step_func=forward_step_func,
            data_iterator=iter([make_batch(step)]),
            model=ddp_model,
            num_microbatches=1,
            seq_length=SEQ_LENGTH,
            micro_batch_size=MICRO_BATCH_SIZE,
        )
        finalize_model_grads([ddp_model])  # dense grads over all ranks, expert grads per expert
        optimizer.step()
        if torch.distributed.get_rank() == 0:
            print(f"step {step}: loss {float(reports[0]['lm loss']):.4f}", flush=True)
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
