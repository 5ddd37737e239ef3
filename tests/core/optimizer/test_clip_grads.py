"""Global grad norm, clipping and zero counting under TP x PP x DP = 2 x 2 x 2 (8 gloo ranks).

A 2-stage MLP is built whole on every rank (fixed seed), one real backward gives the full
grads, and each rank takes its hand-made shard: stage 0 holds a column-parallel linear (weight
and bias split on dim 0, `tensor_model_parallel=True`) and a replicated layer norm; stage 1 a
row-parallel linear (weight split on dim 1) with a replicated bias and layer norm. The grads are
written into DDP's main_grad as if the DP all-reduce had just finished. The optimizer must
report the single-rank norm and zero count (replicated params counted once, not tp times) and
apply the same clipped SGD update as the unsharded model.
"""

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.process_groups_config import ProcessGroupCollection
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


H, F = 16, 32
# name -> (stage, TP split dim or None)
LAYOUT = {
    "ln0.weight": (0, None),
    "ln0.bias": (0, None),
    "fc1.weight": (0, 0),
    "fc1.bias": (0, 0),
    "fc2.weight": (1, 1),
    "fc2.bias": (1, None),
    "ln1.weight": (1, None),
}


def _full_grads():
    torch.manual_seed(0)
    ln0, fc1 = torch.nn.LayerNorm(H), torch.nn.Linear(H, F)
    fc2, ln1 = torch.nn.Linear(F, H), torch.nn.LayerNorm(H, bias=False)
    x = torch.randn(8, H)
    loss = ln1(fc2(torch.nn.functional.gelu(fc1(ln0(x))))).pow(2).mean()
    loss.backward()
    mods = {"ln0": ln0, "fc1": fc1, "fc2": fc2, "ln1": ln1}
    params, grads = {}, {}
    for name in LAYOUT:
        mod, attr = name.split(".")
        p = getattr(mods[mod], attr)
        params[name], grads[name] = p.detach().clone(), p.grad.detach().clone()
    grads["fc1.weight"][:3] = 0.0  # zeros on TP rank 0's shard only
    grads["fc2.bias"][:4] = 0.0  # zeros in a replicated param: must count once
    return params, grads


def _shard(t, dim, tp_rank):
    return (t if dim is None else t.chunk(2, dim=dim)[tp_rank]).clone()


def _clip_body():
    ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    full_params, full_grads = _full_grads()
    ref_norm = torch.sqrt(sum(g.double().pow(2).sum() for g in full_grads.values())).item()
    ref_zeros = sum(int((g == 0).sum()) for g in full_grads.values())
    clip = 0.5 * ref_norm  # forces clipping by 1/2
    results = {}
    for dist_opt in (False, True):
        module = torch.nn.Module()
        names = [n for n, (stage, _) in LAYOUT.items() if stage == pp_rank]
        for name in names:
            _, dim = LAYOUT[name]
            p = torch.nn.Parameter(_shard(full_params[name], dim, tp_rank))
            if dim is not None:
                p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
            module.register_parameter(name.replace(".", "_"), p)
        # The distributed-optimizer variant takes its groups from a ProcessGroupCollection.
        pgs = ProcessGroupCollection.use_mpu_process_groups() if dist_opt else None
        ddp = DistributedDataParallel(
            ModelParallelConfig(),
            DistributedDataParallelConfig(use_distributed_optimizer=dist_opt),
            module,
            pg_collection=pgs,
        )
        config = OptimizerConfig(
            optimizer="sgd",
            lr=1.0,
            sgd_momentum=0.0,
            weight_decay=0.0,
            clip_grad=clip,
            log_num_zeros_in_grad=True,
            use_distributed_optimizer=dist_opt,
        )
        opt = get_megatron_optimizer(config, [ddp], pg_collection=pgs)
        ddp.zero_grad_buffer()
        for name in names:
            p = getattr(module, name.replace(".", "_"))
            p.main_grad.copy_(_shard(full_grads[name], LAYOUT[name][1], tp_rank))
        ok, norm, zeros = opt.step()
        assert ok
        # Clipped SGD step: p_new = p - lr * g * clip / (norm + 1e-6), shard by shard.
        coeff = clip / (ref_norm + 1e-6)
        max_err = 0.0
        for name in names:
            p = getattr(module, name.replace(".", "_"))
            want = _shard(full_params[name] - coeff * full_grads[name], LAYOUT[name][1], tp_rank)
            max_err = max(max_err, (p.detach() - want).abs().max().item())
        results[dist_opt] = (norm, zeros, ref_norm, ref_zeros, max_err)
    return results


def test_global_grad_norm_tp2_pp2_dp2():
    per_rank = run_distributed(_clip_body, 8, timeout=180)
    for rank, results in enumerate(per_rank):
        for dist_opt, (norm, zeros, ref_norm, ref_zeros, max_err) in results.items():
            tag = f"rank {rank} distributed_optimizer={dist_opt}"
            assert abs(norm - ref_norm) <= 1e-6 * ref_norm, (tag, norm, ref_norm)
            assert zeros == ref_zeros, (tag, zeros, ref_zeros)
            assert max_err < 1e-6, (tag, max_err)
