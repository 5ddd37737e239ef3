"""Interop with megatron-core's own `dist_checkpointing` (0.16 installed here; also run against
0.19.2), both directions.

Two plain gloo processes (megatron-core's writer starts worker processes, which the forkserver
harness's daemonic ranks may not): megatron-core saves a sharded state dict (row-split tensor,
stacked layers with a prepended axis, a ShardedObject, common state with an argparse.Namespace);
gigatron loads it at another sharding, and the reverse. Every loaded tensor must equal the
source bitwise.

Then a small Llama-style GPTModel (local spec) with Megatron's three-line snippet on both sides
(`save(model.sharded_state_dict(prefix=""), d)`, `model.load_state_dict(load(
model.sharded_state_dict(prefix=""), d))`), at TP 1 and TP 2: megatron-core's checkpoint of
either TP size loaded into gigatron's GPTModel at either TP size gives megatron-core's logits
(1e-5), and gigatron's loaded into megatron-core's gives gigatron's logits; megatron-core re-saves
what it loaded from gigatron and the re-saved tensors equal gigatron's checkpoint bitwise. The
checkpoints megatron-core 0.19.2 wrote (tests/fixtures/megatron_core) load the same way.

On a CPU-only torch the test stubs what megatron-core needs from CUDA (`torch.cuda.synchronize`,
`torch.cuda.current_device` -> "cpu", its RNG tracker's CUDA state) and, without psutil, its
writer's memory logging.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tests._paths import FIXTURES as FIXTURE_ROOT
from tests._paths import REPO, with_oracle

pytestmark = pytest.mark.multirank


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


def _worker(rank, world, m_dir, g_dir):
    import torch.distributed as dist

    from gigatron.core import dist_checkpointing as gdc

    mdc = megatron_dc
    mdc.save(_state(mdc, rank, world)[0], m_dir)
    gdc.save(_state(gdc, rank, world)[0], g_dir)
    dist.barrier()
    _check(gdc, m_dir, rank, world)  # megatron-core wrote it, gigatron reads
    _check(mdc, g_dir, rank, world)  # gigatron wrote it, megatron-core reads
    dist.barrier()


def _two_rank_worker(rank, world, init_file, m_root, g_root):
    """One launch of the two processes (python + megatron-core's imports take seconds) for both
    tests: `_worker` under `<root>/plain`, then `_gpt_worker`'s TP2 save phase."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    _stub_cuda_for_megatron_writer()
    _worker(rank, world, f"{m_root}/plain", f"{g_root}/plain")
    _gpt_worker(rank, world, init_file, m_root, g_root, "save", initialized=True)


@pytest.fixture(scope="module")
def two_rank_roots(tmp_path_factory):
    return _launch("_two_rank_worker", 2, tmp_path_factory.mktemp("interop"))


@pytest.mark.slow
def test_megatron_core_and_gigatron_read_each_others_checkpoints(two_rank_roots):
    dirs = [f"{root}/plain" for root in two_rank_roots]
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


GPT_KW = dict(
    num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=48,
    normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False, hidden_dropout=0.0,
    attention_dropout=0.0, use_cpu_initialization=True,
)  # fmt: skip
FIXTURES = os.path.join(FIXTURE_ROOT, "megatron_core")


def _gpt_worker(rank, world, init_file, m_root, g_root, phase, initialized=False):
    """TP = world. phase "save": megatron-core and gigatron each save a GPT under
    `<root>/tp<world>` (+ its full logits); then (both phases) every checkpoint of the other
    side found under the roots is loaded with the snippet and the logits compared; megatron-core
    re-saves what it loaded from gigatron under `<m_root>/from_gigatron_tp<N>_at_tp<world>`."""
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

    if not initialized:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)  # fmt: skip
        _stub_cuda_for_megatron_writer()
    kw = dict(GPT_KW, activation_func=F.silu, tensor_model_parallel_size=world)
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

    def logits(model, ids=ids):
        with torch.no_grad():
            local = model(ids, pos, mask)  # [b, s, V/tp]
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)

    def close(a, b):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)

    mdc = megatron_dc
    if phase == "save":
        m, g = megatron_gpt(1), gigatron_gpt(2)
        for root in (m_root, g_root):
            os.makedirs(f"{root}/tp{world}", exist_ok=True)
        dist.barrier()
        mdc.save(m.sharded_state_dict(prefix=""), f"{m_root}/tp{world}")
        gdc.save(g.sharded_state_dict(prefix=""), f"{g_root}/tp{world}")
        m_logits, g_logits = logits(m), logits(g)
        assert (m_logits - g_logits).abs().max() > 1e-3  # the two sides start apart
        if rank == 0:
            torch.save(m_logits, f"{m_root}/tp{world}.logits.pt")
            torch.save(g_logits, f"{g_root}/tp{world}.logits.pt")
        dist.barrier()
    for tp in (1, 2):
        if not os.path.exists(f"{m_root}/tp{tp}.logits.pt"):
            continue
        g_from_m = gigatron_gpt(3)
        g_from_m.load_state_dict(
            gdc.load(g_from_m.sharded_state_dict(prefix=""), f"{m_root}/tp{tp}")
        )
        close(logits(g_from_m), torch.load(f"{m_root}/tp{tp}.logits.pt"))
        m_from_g = megatron_gpt(4)
        m_from_g.load_state_dict(
            mdc.load(m_from_g.sharded_state_dict(prefix=""), f"{g_root}/tp{tp}")
        )
        close(logits(m_from_g), torch.load(f"{g_root}/tp{tp}.logits.pt"))
        resaved = f"{m_root}/from_gigatron_tp{tp}_at_tp{world}"
        os.makedirs(resaved, exist_ok=True)
        dist.barrier()
        mdc.save(m_from_g.sharded_state_dict(prefix=""), resaved)
    for tp in (1, 2):  # megatron-core 0.19.2's own checkpoints
        fixture = torch.load(f"{FIXTURES}/mcore-0.19.2-tp{tp}.logits.pt", weights_only=True)
        g_from_m = gigatron_gpt(5)
        g_from_m.load_state_dict(
            gdc.load(g_from_m.sharded_state_dict(prefix=""), f"{FIXTURES}/mcore-0.19.2-tp{tp}")
        )
        close(logits(g_from_m, fixture["ids"]), fixture["logits"])
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


def _launch(worker: str, world: int, tmp_path, *extra: str) -> list[str]:
    init_file = tempfile.mktemp(dir=tmp_path, prefix="init")
    dirs = [str(tmp_path / "megatron"), str(tmp_path / "gigatron")]
    for d in dirs:
        os.makedirs(f"{d}/plain", exist_ok=True)
    root = str(REPO)
    code = (
        f"import sys; from tests.core.dist_checkpointing.test_megatron_interop import {worker}; "
        f"{worker}(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])"
    )
    env = with_oracle(dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    logs = [tempfile.TemporaryFile() for _ in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), str(world), init_file, *dirs, *extra],
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
def test_gpt_checkpoint_interop_with_megatron_core_tp1_tp2(two_rank_roots):
    """Megatron's snippet both ways at TP 1 and TP 2 and across them (module docstring)."""
    from gigatron.core import dist_checkpointing as gdc

    m_root, g_root = two_rank_roots  # TP2 <-> TP2 (the fixture's launch)
    tmp_path = Path(m_root).parent
    _launch("_gpt_worker", 1, tmp_path, "save")  # TP1 <-> TP1 and TP2 -> TP1
    _launch("_gpt_worker", 2, tmp_path, "load")  # TP1 -> TP2
    for tp, at in ((1, 1), (2, 2), (2, 1), (1, 2)):
        ours = gdc.load_plain_tensors(f"{g_root}/tp{tp}")
        resaved = gdc.load_plain_tensors(f"{m_root}/from_gigatron_tp{tp}_at_tp{at}")
        assert sorted(resaved) == sorted(ours), (tp, at)
        for key in ours:
            assert torch.equal(resaved[key], ours[key]), (tp, at, key)
