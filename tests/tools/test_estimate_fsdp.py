"""`gigatron estimate` learns the FSDP layouts: at DP 4 a rank's parameter + gradient + optimizer
bytes under optim_grads_params (and `--use-torch-fsdp2`) are a quarter of DDP's replicated
figure within 10% (the padding of uneven rows), no_shard's equal it, optim shards them too but
keeps the whole model gathered through the step, which optim_grads_params frees layer by layer.
The measured side (live shard bytes on 4 CPU ranks within 10% of a quarter of replicated) is
tests/core/distributed/test_fully_sharded_data_parallel.py."""

from gigatron.tools.estimate.args import estimate_args
from gigatron.tools.estimate.memory import rank_memory
from gigatron.tools.estimate.world import build_chunks, fake_rank

BASE = (
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--micro-batch-size 2 --vocab-size 256 --world-size 4"
).split()
MFSDP = ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]


def _memory(extra):
    args = estimate_args(BASE + extra)
    with fake_rank(args, 1):
        return rank_memory(args, build_chunks(args))


def _static(mem):
    return mem["param_bytes"] + mem["grad_bytes"] + mem["optimizer_bytes"]


def test_estimate_shards_state_under_fsdp_strategies():
    ddp = _memory([])
    zero3 = _memory(MFSDP)  # Megatron's flag default: optim_grads_params
    fsdp2 = _memory(["--use-torch-fsdp2", "--untie-embeddings-and-output-weights"])
    untied = _memory(["--untie-embeddings-and-output-weights"])
    no_shard = _memory(MFSDP + ["--data-parallel-sharding-strategy", "no_shard"])
    optim = _memory(MFSDP + ["--data-parallel-sharding-strategy", "optim"])
    assert abs(_static(zero3) / (_static(ddp) / 4) - 1) < 0.10
    assert abs(_static(fsdp2) / (_static(untied) / 4) - 1) < 0.10
    assert _static(no_shard) == _static(ddp)
    assert _static(optim) == _static(zero3)
    assert optim["transient_bytes"] > zero3["transient_bytes"]
