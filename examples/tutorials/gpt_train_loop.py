"""Train a small GPT by hand with Megatron Core, tensor- and/or pipeline-parallel, and save or
load a distributed checkpoint (which another layout can load).

    T=examples/tutorials
    torchrun --nproc-per-node 2 -m gigatron.compat.megatron $T/gpt_train_loop.py --tp 2 --save ckpt
    torchrun --nproc-per-node 2 -m gigatron.compat.megatron $T/gpt_train_loop.py --pp 2 --load ckpt
    torchrun --nproc-per-node 4 -m gigatron.compat.megatron $T/gpt_train_loop.py --tp 2 --pp 2

Written against `megatron.core`, as Megatron's examples/run_simple_mcore_train_loop.py: gloo on
CPU, nccl on GPUs. docs/learn.md walks through it step by step.
"""

import argparse
import os
from functools import partial

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.tokenizers import MegatronTokenizer
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.utils.data import DataLoader, default_collate

try:  # gigatron: every component draws its weights from its own seed (not in megatron-core)
    from megatron.core.layout_invariant_init import set_layout_invariant_init_seed
except ImportError:  # megatron-core: each stage's layers come from its own point of the stream
    set_layout_invariant_init_seed = None

SEQ_LENGTH, MICRO_BATCH_SIZE, NUM_MICROBATCHES, VOCAB_SIZE = 32, 4, 2, 64
USE_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if USE_CUDA else torch.device("cpu")


def initialize_distributed(tp: int, pp: int, seed: int = 1234) -> None:
    """One process per rank (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK), then Megatron's groups."""
    if USE_CUDA:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(backend="nccl" if USE_CUDA else "gloo")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    )
    torch.manual_seed(seed)  # the same on every rank: replicated weights start equal
    model_parallel_cuda_manual_seed(seed)  # TP-sharded weights: one stream per TP rank
    if set_layout_invariant_init_seed is not None:
        # the embedding, layer n and the output layer are drawn from (seed, their name) with
        # use_cpu_initialization: the same full model at every TP x PP layout
        set_layout_invariant_init_seed(seed)


def model_provider() -> GPTModel:
    """This rank's piece of the model: its TP shard of the layers of its pipeline stage."""
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        hidden_dropout=0.0,  # no dropout: every layout computes the same losses
        attention_dropout=0.0,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,  # what pipeline stages send each other
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=VOCAB_SIZE,
        max_sequence_length=SEQ_LENGTH,
        pre_process=parallel_state.is_pipeline_first_stage(),  # embedding on the first stage
        post_process=parallel_state.is_pipeline_last_stage(),  # output layer + loss on the last
    )


def mock_dataset():
    config = GPTDatasetConfig(
        random_seed=0,
        sequence_length=SEQ_LENGTH,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        tokenizer=MegatronTokenizer.from_pretrained(
            metadata_path={"library": "null-text"}, vocab_size=VOCAB_SIZE - 1
        ),
        mid_level_dataset_surplus=0.005,
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        MockGPTDataset, [1000, None, None], lambda: True, config
    ).build()
    return train


def loss_func(loss_mask, output_tensor):
    """Mean of the per-token losses [b, s] the last stage's GPTModel returns (labels given)."""
    losses = output_tensor.float().view(-1)
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask) / loss_mask.sum()
    return loss, {"lm loss": loss.detach().clone()}


def forward_step_func(data_iterator, model):
    data = next(data_iterator)
    output_tensor = model(
        data["tokens"].to(DEVICE),
        data["position_ids"].to(DEVICE),
        data["attention_mask"].to(DEVICE),
        labels=data["labels"].to(DEVICE),
    )
    return output_tensor, partial(loss_func, data["loss_mask"].to(DEVICE))


def run(model, batches, num_microbatches, forward_only=False) -> float | None:
    """One forward (and backward) pass over `num_microbatches` microbatches; the mean loss on
    the last pipeline stage (None elsewhere: losses exist only where the loss is computed)."""
    losses = get_forward_backward_func()(
        forward_step_func=forward_step_func,
        data_iterator=batches,
        model=model,
        num_microbatches=num_microbatches,
        seq_length=SEQ_LENGTH,
        micro_batch_size=MICRO_BATCH_SIZE,
        forward_only=forward_only,
    )
    if not parallel_state.is_pipeline_last_stage():
        return None
    return sum(float(d["lm loss"]) for d in losses) / len(losses)


def print_once(text: str) -> None:
    """From one rank of the last stage (TP ranks there hold the same loss)."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    if parallel_state.is_pipeline_last_stage() and tp_rank == 0:
        print(text, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save", help="save a distributed checkpoint here after training")
    parser.add_argument("--load", help="load this distributed checkpoint before anything else")
    args = parser.parse_args()

    initialize_distributed(args.tp, args.pp)
    model = model_provider().to(DEVICE)
    layers = [layer.layer_number for layer in model.decoder.layers]  # global layer numbers
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    rank = torch.distributed.get_rank()
    print(f"rank {rank}: tp rank {tp_rank}, pp rank {pp_rank}, layers {layers}", flush=True)
    dataset = mock_dataset()
    eval_batch = default_collate([dataset[i] for i in range(MICRO_BATCH_SIZE)])

    if args.load:
        # every rank asks for its own shards; they may have been saved by another layout
        state = dist_checkpointing.load(model.sharded_state_dict(), args.load)
        model.load_state_dict(state)
        loss = run(model, iter([eval_batch]), 1, forward_only=True)
        if loss is not None:
            print_once(f"loaded {args.load}: eval loss {loss:.6f}")

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=False, overlap_grad_reduce=False)
    ddp_model = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3), [ddp_model])
    train_iterator = iter(DataLoader(dataset, batch_size=MICRO_BATCH_SIZE, shuffle=True))
    for step in range(args.steps):
        ddp_model.zero_grad_buffer()
        optimizer.zero_grad()
        loss = run(ddp_model, train_iterator, NUM_MICROBATCHES)
        finalize_model_grads([ddp_model])  # DP grad all-reduce, tied embedding grads across PP
        update_successful, grad_norm, _ = optimizer.step()
        if loss is not None:
            print_once(f"step {step}: loss {loss:.6f} grad norm {float(grad_norm):.6f}")

    if args.save:
        if torch.distributed.get_rank() == 0:
            os.makedirs(args.save, exist_ok=True)
        torch.distributed.barrier()
        dist_checkpointing.save(model.sharded_state_dict(), args.save)
        loss = run(model, iter([eval_batch]), 1, forward_only=True)
        if loss is not None:
            print_once(f"saved {args.save}: eval loss {loss:.6f}")
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
