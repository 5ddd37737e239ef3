"""Megatron Core's simple training loop, written against `megatron.core` imports.

Runs on real megatron-core, and on gigatron through the opt-in alias without edits:

    torchrun --nproc-per-node 2 -m gigatron.compat.megatron examples/run_simple_mcore_train_loop.py

Steps (Megatron's examples/run_simple_mcore_train_loop.py): TP=2 process groups, seeded model
parallel RNG, a 2-layer GPTModel with the local layer spec, DDP wrapping, mock GPT data through
BlendedMegatronDatasetBuilder, 5 iterations of get_forward_backward_func + finalize_model_grads +
optimizer step, then a dist_checkpointing save and load of the sharded state dict.

One deliberate difference from Megatron's file: the optimizer is get_megatron_optimizer, not a
plain torch.optim.Adam. DDP's grad hook moves each `.grad` into `param.main_grad` and sets `.grad`
to None, so a plain Adam would see no gradients; the Megatron optimizer reads `main_grad`.
Uses gloo on CPU and nccl when CUDA is available.
"""

import argparse
import os
from functools import partial

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.utils import compile_helpers
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.tokenizers import MegatronTokenizer
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.utils.data import DataLoader

SEQ_LENGTH = 64
MICRO_BATCH_SIZE = 8
USE_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if USE_CUDA else torch.device("cpu")


def initialize_distributed(tensor_model_parallel_size=1, pipeline_model_parallel_size=1):
    parallel_state.destroy_model_parallel()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if USE_CUDA:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(
        backend="nccl" if USE_CUDA else "gloo", rank=rank, world_size=world_size
    )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size, pipeline_model_parallel_size
    )


def model_provider():
    config = TransformerConfig(
        num_layers=2,
        hidden_size=12,
        num_attention_heads=4,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=100,
        max_sequence_length=SEQ_LENGTH,
    )


def get_train_data_iterator():
    if torch.distributed.get_rank() == 0:
        compile_helpers()
    torch.distributed.barrier()
    config = GPTDatasetConfig(
        random_seed=0,
        sequence_length=SEQ_LENGTH,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        tokenizer=MegatronTokenizer.from_pretrained(
            metadata_path={"library": "null-text"}, vocab_size=64
        ),
        mid_level_dataset_surplus=0.005,
    )
    datasets = BlendedMegatronDatasetBuilder(
        MockGPTDataset, [1000, None, None], lambda: True, config
    ).build()
    return iter(DataLoader(datasets[0], batch_size=MICRO_BATCH_SIZE, shuffle=True))


def loss_func(loss_mask, output_tensor):
    losses = output_tensor.float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses.view(-1) * loss_mask) / loss_mask.sum()
    return loss, {"lm loss": loss.detach()}  # a report: no graph kept, read with float()


def forward_step_func(data_iterator, model):
    data = next(data_iterator)
    tokens = data["tokens"].to(DEVICE)
    attention_mask = data["attention_mask"].to(DEVICE)
    position_ids = data["position_ids"].to(DEVICE)
    labels = data["labels"].to(DEVICE)
    loss_mask = data["loss_mask"].to(DEVICE)
    output_tensor = model(tokens, position_ids, attention_mask, labels=labels)
    return output_tensor, partial(loss_func, loss_mask)


def save_distributed_checkpoint(checkpoint_path, gpt_model):
    sharded_state_dict = gpt_model.sharded_state_dict(prefix="")
    dist_checkpointing.save(sharded_state_dict=sharded_state_dict, checkpoint_dir=checkpoint_path)


def load_distributed_checkpoint(checkpoint_path, gpt_model):
    sharded_state_dict = gpt_model.sharded_state_dict(prefix="")
    checkpoint = dist_checkpointing.load(
        sharded_state_dict=sharded_state_dict, checkpoint_dir=checkpoint_path
    )
    gpt_model.load_state_dict(checkpoint)
    return gpt_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument(  # its own folder: docs/learn.md's programs save to ckpt/
        "--ckpt-dir", default=os.path.join(os.getcwd(), "runs", "run_simple_mcore_train_loop")
    )
    args = parser.parse_args()

    initialize_distributed(tensor_model_parallel_size=2, pipeline_model_parallel_size=1)
    model_parallel_cuda_manual_seed(123)

    gpt_model = model_provider().to(DEVICE)
    config = gpt_model.config
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=False, overlap_grad_reduce=False, use_distributed_optimizer=False
    )
    gpt_model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=gpt_model)
    optim = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3), [gpt_model])

    train_iterator = get_train_data_iterator()
    forward_backward_func = get_forward_backward_func()

    for iteration in range(args.iterations):
        gpt_model.zero_grad_buffer()
        optim.zero_grad()
        losses_reduced = forward_backward_func(
            forward_step_func=forward_step_func,
            data_iterator=train_iterator,
            model=gpt_model,
            num_microbatches=1,
            seq_length=SEQ_LENGTH,
            micro_batch_size=MICRO_BATCH_SIZE,
            decoder_seq_length=SEQ_LENGTH,
            forward_only=False,
        )
        finalize_model_grads([gpt_model])
        update_successful, grad_norm, _ = optim.step()
        if torch.distributed.get_rank() == 0:
            print(
                f"iteration {iteration}: losses {[float(d['lm loss']) for d in losses_reduced]} "
                f"grad_norm {float(grad_norm):.4f} updated {update_successful}",
                flush=True,
            )

    ckpt_path = args.ckpt_dir
    if torch.distributed.get_rank() == 0:
        os.makedirs(ckpt_path, exist_ok=True)
    torch.distributed.barrier()
    save_distributed_checkpoint(ckpt_path, gpt_model.module)

    saved = {
        k: v.detach().clone()
        for k, v in gpt_model.module.state_dict().items()
        if isinstance(v, torch.Tensor)
    }
    with torch.no_grad():  # scramble, so the load has to bring the weights back
        for p in gpt_model.module.parameters():
            p.add_(1.0)
    load_distributed_checkpoint(ckpt_path, gpt_model.module)
    for name, tensor in gpt_model.module.state_dict().items():
        if name in saved and not torch.equal(saved[name], tensor):
            raise RuntimeError(f"checkpoint round trip changed {name}")
    if torch.distributed.get_rank() == 0:
        print(
            f"checkpoint saved to {ckpt_path} and loaded back equal ({len(saved)} tensors)",
            flush=True,
        )
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
