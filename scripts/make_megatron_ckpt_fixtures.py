"""Write small GPT checkpoints with megatron-core itself, for gigatron's interop tests.

Run under the megatron-core version to capture (its wheel needs only torch, numpy, packaging):

    python scripts/make_megatron_ckpt_fixtures.py OUT_DIR            # TP 1 and TP 2

For each TP size it spawns that many gloo ranks on CPU (megatron-core's CUDA-only calls are
stubbed, as in tests/core/dist_checkpointing/test_megatron_interop.py), builds megatron-core's
GPTModel with its local layer spec, saves `model.sharded_state_dict()` with megatron-core's own
`dist_checkpointing.save` into `OUT_DIR/mcore-<version>-tp<N>/`, and writes
`OUT_DIR/mcore-<version>-tp<N>.logits.pt` holding the inputs and megatron-core's full logits
(`{"version", "config", "ids", "logits" [b, s, vocab]}`), read back with weights_only=True.
The model is the interop tests' Llama-style config (RMSNorm, SwiGLU, GQA, RoPE, no biases).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.multiprocessing as mp

CONFIG = dict(
    num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=48,
    normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False, hidden_dropout=0.0,
    attention_dropout=0.0, use_cpu_initialization=True,
)  # fmt: skip
VOCAB, SEQ = 64, 8


def _stub_cuda() -> None:
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        filesystem_async._process_memory = lambda: 0
    except ImportError:
        pass


def _rank(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import megatron.core
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    _stub_cuda()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    mrandom.get_cuda_rng_tracker().states_["model-parallel-rng"] = torch.get_rng_state()
    cfg = TransformerConfig(**CONFIG, activation_func=F.silu, tensor_model_parallel_size=world)
    torch.manual_seed(1234)
    model = GPTModel(cfg, get_gpt_layer_local_spec(), VOCAB, SEQ, position_embedding_type="rope")
    name = f"mcore-{megatron.core.__version__}-tp{world}"
    ckpt_dir = os.path.join(out_dir, name)
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(prefix=""), ckpt_dir)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(SEQ)[None].expand(2, -1)
    mask = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).triu(1)
    with torch.no_grad():
        local = model(ids, pos, mask)  # [b, s, vocab / tp]
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local.contiguous())
    if rank == 0:
        torch.save(
            {"version": megatron.core.__version__, "config": {**CONFIG, "vocab_size": VOCAB,
             "max_sequence_length": SEQ, "activation": "silu", "position_embedding_type": "rope"},
             "ids": ids, "logits": torch.cat(parts, dim=-1)},
            os.path.join(out_dir, f"{name}.logits.pt"),
        )  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()


def main(out_dir: str) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.makedirs(out_dir, exist_ok=True)
    for world in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                _rank, args=(world, os.path.join(tmp, "init"), out_dir), nprocs=world,
                start_method="spawn",
            )  # fmt: skip
    for name in sorted(os.listdir(out_dir)):
        print(name)


if __name__ == "__main__":
    main(sys.argv[1])
