"""Copy-engine TP collectives (gigatron/core/tensor_parallel/_ce_collectives.py) equal NCCL's
bitwise on 2 GPUs: the ops alone, eager and compiled, several in flight
(bench/parallel/bench_tp_comm.py --check-only), and routed through a TP = 2 + SP GPTModel's linears
and mappings by `enable_copy_engine_collectives` (± tp_comm_overlap). Skipped without 2 CUDA
devices."""

import os
import subprocess
import sys

import pytest
import torch

from tests._paths import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.multirank]

ROOT = str(REPO)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_copy_engine_collectives_match_nccl():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", "29681", os.path.join(ROOT, "bench", "parallel", "bench_tp_comm.py"),
           "--check-only"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _tp_layer_body(tp_comm_overlap):
    """A TP = 2 + SP GPT model (bf16) forward + backward with the TP group's collectives on the
    copy engines vs on NCCL: loss and every grad bitwise equal (TP = 2 sums have two addends)."""
    from dataclasses import replace

    from gigatron.core import parallel_state, tensor_parallel
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.tensor_parallel._collectives import enable_copy_engine_collectives
    from tests.core.tensor_parallel.test_compile import B, S, V, _gpt_config

    parallel_state.initialize_model_parallel(2)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    cfg = replace(_gpt_config(True, 2), tp_comm_overlap=tp_comm_overlap)
    model = GPTModel(cfg, get_gpt_layer_fast_spec(), V, S).cuda().bfloat16()
    g = torch.Generator().manual_seed(3)
    ids, labels = (torch.randint(0, V, (B, S), generator=g).cuda() for _ in range(2))
    group = parallel_state.get_tensor_model_parallel_group()

    def step(copy_engine):
        enable_copy_engine_collectives(group, copy_engine)
        model.zero_grad(set_to_none=True)
        loss = model(ids, None, None, labels=labels).float().mean()
        loss.backward()
        torch.cuda.synchronize()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]

    nccl, copy_engine = step(False), step(True)
    enable_copy_engine_collectives(group, False)
    return [bool(torch.equal(a, b)) for a, b in zip(nccl, copy_engine, strict=True)]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("tp_comm_overlap", [False, True])
def test_copy_engine_routing_keeps_a_tp2_sp_model_bitwise(tp_comm_overlap):
    from gigatron.testing import run_distributed

    equal = run_distributed(_tp_layer_body, 2, args=(tp_comm_overlap,), backend="nccl")
    assert all(all(rank) for rank in equal), equal
