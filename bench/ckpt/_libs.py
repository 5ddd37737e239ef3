"""bench_ckpt's two sides: a GPT + DDP + Adam after one training step, built from gigatron.core or
megatron.core (the same public names), and the sharded state dict each one saves.

`_megatron_plain_setup` and `_megatron_cpu_stubs` are the CPU stand-in for megatron-core, whose
models and optimizers need CUDA (see bench/ckpt/bench_ckpt.py's docstring).
"""

from __future__ import annotations

import collections
import contextlib
import importlib

import torch

from bench._lib.args import CONFIGS  # (layers, hidden, heads, seq, vocab per config)
from bench.ckpt._state import _reference

Side = collections.namedtuple("Side", "make_state params model optimizer")
STEP_TOKENS = 256  # sequence length of the one training step that creates the Adam state


def _shape(args) -> dict:
    s = CONFIGS[args.config]
    return dict(layers=s["layers"], hidden=s["hidden"], heads=s["heads"], seq=s["seq"],
                vocab=s["vocab"])  # fmt: skip


def _train_step(ddp, optimizer, shape, device) -> None:
    """One forward/backward/optimizer step on random tokens (creates the Adam moments)."""
    s = min(shape["seq"], STEP_TOKENS)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shape["vocab"], (1, s), generator=g).to(device)
    pos = torch.arange(s, device=device)[None]
    mask = torch.ones(1, 1, s, s, dtype=torch.bool, device=device).triu(1)  # True = masked
    ddp.zero_grad_buffer()
    ddp(tokens, pos, mask, labels=tokens).float().mean().backward()
    ddp.finish_grad_sync()
    ok = optimizer.step()[0]
    if not ok:
        raise RuntimeError("the optimizer skipped its step (bench_ckpt): no Adam state to save")


def _build(pkg: str, args):
    """(model, ddp, optimizer) from `pkg` ("gigatron.core" or "megatron.core": the same names)
    after one training step: GPTModel (local spec, bf16, tied embeddings), DDP, Adam."""

    def mod(name):
        return importlib.import_module(f"{pkg}.{name}")

    shape, bf16 = _shape(args), torch.bfloat16
    mod("parallel_state").initialize_model_parallel()
    torch.manual_seed(1234)
    mod("tensor_parallel.random").model_parallel_cuda_manual_seed(1234)
    cfg = mod("transformer.transformer_config").TransformerConfig(
        num_layers=shape["layers"], hidden_size=shape["hidden"],
        num_attention_heads=shape["heads"], hidden_dropout=0.0, attention_dropout=0.0,
        bf16=True, params_dtype=bf16, pipeline_dtype=bf16,
    )  # fmt: skip
    spec = mod("models.gpt.gpt_layer_specs").get_gpt_layer_local_spec()
    with torch.device(args.device):
        model = mod("models.gpt").GPTModel(
            config=cfg, transformer_layer_spec=spec, vocab_size=shape["vocab"],
            max_sequence_length=shape["seq"], share_embeddings_and_output_weights=True,
            position_embedding_type="learned_absolute",
        )  # fmt: skip
    model = model.to(device=args.device, dtype=bf16)
    distributed, optim = mod("distributed"), mod("optimizer")
    ddp_config = distributed.DistributedDataParallelConfig(
        use_distributed_optimizer=args.dist_opt, grad_reduce_in_fp32=True
    )
    ddp = distributed.DistributedDataParallel(config=cfg, ddp_config=ddp_config, module=model)
    opt_config = optim.OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, params_dtype=bf16,
                                       use_distributed_optimizer=args.dist_opt)  # fmt: skip
    optimizer = optim.get_megatron_optimizer(opt_config, [ddp])
    _train_step(ddp, optimizer, shape, args.device)
    return model, ddp, optimizer


def _gigatron_setup(args) -> Side:
    from gigatron.core.dist_checkpointing.optimizer import optimizer_sharded_state_dict

    model, ddp, optimizer = _build("gigatron.core", args)

    def make_state():
        # What gigatron.training's checkpoints save: stacked-layer model keys and the
        # per-parameter (fully reshardable) optimizer state.
        model_sd = model.sharded_state_dict()
        return {"model": model_sd, "optimizer": optimizer_sharded_state_dict(optimizer, model_sd)}

    return Side(make_state, sum(p.numel() for p in model.parameters()), ddp, optimizer)


def _megatron_setup(args) -> Side:
    """megatron-core's own model and optimizer state (CUDA only: its optimizer checks for it)."""
    model, ddp, optimizer = _build("megatron.core", args)
    metadata = {"distrib_optim_sharding_type": args.megatron_sharding_type}

    def make_state():
        model_sd = model.sharded_state_dict()
        optim_sd = optimizer.sharded_state_dict(model_sd, is_loading=False, metadata=metadata)
        return {"model": model_sd, "optimizer": optim_sd}

    return Side(make_state, sum(p.numel() for p in model.parameters()), ddp, optimizer)


def _megatron_plain_setup(args):
    """CPU stand-in: one plain megatron ShardedTensor per tensor of gigatron's payload."""
    from megatron.core.dist_checkpointing import ShardedTensor

    gigatron = _gigatron_setup(args)
    reference = _reference(gigatron.make_state())
    tensors = {"/".join(map(str, p)): t.detach().contiguous().clone() for p, t in reference.items()}

    def make_state():
        return {k: ShardedTensor.from_rank_offsets(k, t) for k, t in tensors.items()}

    return Side(make_state, gigatron.params, None, None)


@contextlib.contextmanager
def _megatron_cpu_stubs():
    """What megatron-core's writer needs from CUDA, on a CPU-only run (restored afterwards)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    saved = (torch.cuda.synchronize, torch.cuda.current_device, filesystem_async._process_memory)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    try:
        import psutil  # noqa: F401
    except ImportError:  # its writer logs process memory through psutil
        filesystem_async._process_memory = lambda: 0
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved[:2]
        filesystem_async._process_memory = saved[2]
