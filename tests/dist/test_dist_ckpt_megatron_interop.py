"""Interop with megatron-core's own `dist_checkpointing` (0.16 installed here; also run against
0.19.2), both directions.

Two plain gloo processes (megatron-core's writer starts worker processes, which the forkserver
harness's daemonic ranks may not): megatron-core saves a sharded state dict (row-split tensor,
stacked layers with a prepended axis, a ShardedObject, common state with an argparse.Namespace);
gigatron loads it at another sharding, and the reverse. Every loaded tensor must equal the
source bitwise. Then a small Llama-style GPTModel at TP2: megatron-core's checkpoint loaded into
gigatron's GPTModel (and gigatron's into megatron-core's) gives the saving side's logits (1e-5).

On a CPU-only torch the test stubs what megatron-core needs from CUDA (`torch.cuda.synchronize`,
`torch.cuda.current_device` -> "cpu", its RNG tracker's CUDA state) and, without psutil, its
writer's memory logging.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

megatron_dc = pytest.importorskip("megatron.core.dist_checkpointing")


def _state(lib, rank, world, *, request=False):
    import argparse

    full = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    stack = torch.arange(3 * 4 * 6, dtype=torch.float32).view(3, 4, 6) / 7
    ST, SO = lib.ShardedTensor, lib.ShardedObject
    if request:  # columns instead of rows; the whole stack, replicated
        return {
            "a": ST.from_rank_offsets("a", torch.zeros(8, 6 // world), (1, rank, world)),
            "layers": ST.from_rank_offsets("stack", torch.zeros(3, 4, 6), replica_id=rank),
            "obj": SO("obj", None, (world,), (rank,)),
        }, (full.chunk(world, 1)[rank], stack)
    return {
        "a": ST.from_rank_offsets("a", full.chunk(world, 0)[rank].clone(), (0, rank, world)),
        "layers": [
            ST.from_rank_offsets(
                "stack",
                stack[i].chunk(world, 1)[rank].clone(),
                (0, i, 3),
                (2, rank, world),
                prepend_axis_num=1,
            )
            for i in range(3)
        ],  # fmt: skip
        "obj": SO("obj", {"rank": rank, "t": torch.ones(2) * rank}, (world,), (rank,)),
        "common": {"iteration": 5, "args": argparse.Namespace(lr=0.1, name="x")},
    }, None


def _check(lib, ckpt_dir, rank, world):
    req, (want_a, want_stack) = _state(lib, rank, world, request=True)
    got = lib.load(req, ckpt_dir, validate_access_integrity=False)
    assert torch.equal(got["a"], want_a) and torch.equal(got["layers"], want_stack)
    assert got["obj"]["rank"] == rank and torch.equal(got["obj"]["t"], torch.ones(2) * rank)
    assert got["common"]["iteration"] == 5 and got["common"]["args"].lr == 0.1


def _worker(rank, world, init_file, m_dir, g_dir):
    import torch.distributed as dist

    from gigatron.core import dist_checkpointing as gdc

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    _stub_cuda_for_megatron_writer()
    mdc = megatron_dc
    mdc.save(_state(mdc, rank, world)[0], m_dir)
    gdc.save(_state(gdc, rank, world)[0], g_dir)
    dist.barrier()
    _check(gdc, m_dir, rank, world)  # megatron-core wrote it, gigatron reads
    _check(mdc, g_dir, rank, world)  # gigatron wrote it, megatron-core reads
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_megatron_core_and_gigatron_read_each_others_checkpoints(tmp_path):
    dirs = _launch("_worker", 2, tmp_path)
    m_cfg, g_cfg = (json.load(open(os.path.join(d, "metadata.json"))) for d in dirs)
    # megatron-core 0.19 dropped common_backend(_version) from metadata.json (it ignores unknown
    # fields on read); 0.16 writes and expects them: gigatron writes 0.16's superset
    assert g_cfg["sharded_backend"] == "torch_dist", g_cfg
    assert m_cfg == {k: g_cfg[k] for k in m_cfg}, (m_cfg, g_cfg)
    for d in dirs:  # same file kinds (megatron-core 0.16 writes 2 files per rank, gigatron 1)
        names = set(os.listdir(d))
        assert {".metadata", "metadata.json", "__0_0.distcp", "__1_0.distcp"} <= names
    # the common state: common.pt (0.16's layout, gigatron's), or from megatron-core 0.19 on a
    # `common_state` object inside the DCP files (which gigatron read back in the workers)
    assert "common.pt" in os.listdir(dirs[1])
    from gigatron.core.dist_checkpointing.strategies import torch as torch_dist

    m_keys = torch_dist.read_dcp_metadata(dirs[0]).state_dict_metadata
    m_has_object = any(k.startswith("common_state") for k in m_keys)
    assert "common.pt" in os.listdir(dirs[0]) or m_has_object


def _gpt_worker(rank, world, init_file, m_dir, g_dir):
    """TP = world: megatron-core GPT -> checkpoint -> gigatron GPT (and back); logits equal."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state as mps
    from megatron.core.models.gpt import GPTModel as MGPT
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec as mspec
    from megatron.core.transformer.transformer_config import TransformerConfig as MTC

    from gigatron.core import dist_checkpointing as gdc
    from gigatron.core import parallel_state as ps
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.transformer.transformer_config import TransformerConfig
    from gigatron.training._checkpoint_state import model_sharded_state_dict

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    _stub_cuda_for_megatron_writer()
    kw = dict(
        num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=4,
        ffn_hidden_size=48, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, tensor_model_parallel_size=world,
    )  # fmt: skip
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(8)[None].expand(2, -1)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).triu(1)  # explicit: megatron's default is CUDA
    mps.initialize_model_parallel(tensor_model_parallel_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    if not torch.cuda.is_available():  # megatron-core's attention forks its CUDA RNG tracker
        from megatron.core.tensor_parallel import random as mrandom

        mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
        mrandom._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
        mrandom.get_cuda_rng_tracker().states_["model-parallel-rng"] = torch.get_rng_state()

    def megatron_gpt(seed):
        torch.manual_seed(seed)
        return MGPT(MTC(**kw), mspec(), 64, 8, position_embedding_type="rope")

    def gigatron_gpt(seed):
        torch.manual_seed(seed)
        return GPTModel(TransformerConfig(**kw), get_gpt_layer_local_spec(), 64, 8,
                        position_embedding_type="rope")  # fmt: skip

    def gigatron_load(model, ckpt_dir):
        request = model_sharded_state_dict(model)
        loaded = gdc.load(request, ckpt_dir)
        with torch.no_grad():
            for name, sh in request.items():
                if torch.is_tensor(loaded[name]):
                    sh.data.copy_(loaded[name])

    m = megatron_gpt(1)
    mdc = megatron_dc
    mdc.save(m.sharded_state_dict(), m_dir)
    g = gigatron_gpt(2)
    gdc.save(model_sharded_state_dict(g), g_dir)
    dist.barrier()
    with torch.no_grad():
        g_from_m = gigatron_gpt(3)
        gigatron_load(g_from_m, m_dir)
        torch.testing.assert_close(g_from_m(ids, pos, mask), m(ids, pos, mask), rtol=0, atol=1e-5)
        m_from_g = megatron_gpt(4)
        m_from_g.load_state_dict(mdc.load(m_from_g.sharded_state_dict(), g_dir))
        torch.testing.assert_close(m_from_g(ids, pos, mask), g(ids, pos, mask), rtol=0, atol=1e-5)
    dist.barrier()
    dist.destroy_process_group()


def _stub_cuda_for_megatron_writer():
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *args, **kwargs: None
        torch.cuda.current_device = lambda: "cpu"
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    try:
        import psutil  # noqa: F401
    except ImportError:
        filesystem_async._process_memory = lambda: 0


def _launch(worker: str, world: int, tmp_path) -> list[str]:
    init_file = str(tmp_path / "init")
    dirs = [str(tmp_path / "megatron"), str(tmp_path / "gigatron")]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        f"import sys; from tests.dist.test_dist_ckpt_megatron_interop import {worker}; "
        f"{worker}(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    logs = [tempfile.TemporaryFile() for _ in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), str(world), init_file, *dirs],
            cwd=root,
            env=env,
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for r in range(world)
    ]
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=200)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            rc = "timeout"
        logs[r].seek(0)
        assert rc == 0, f"rank {r} exit {rc}:\n{logs[r].read().decode()[-3000:]}"
    return dirs


@pytest.mark.slow
def test_gpt_checkpoint_interop_with_megatron_core_tp2(tmp_path):
    """Same config, TP2: logits after loading equal the saving side's logits, both directions."""
    _launch("_gpt_worker", 2, tmp_path)
