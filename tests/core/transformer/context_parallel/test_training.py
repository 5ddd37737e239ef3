"""Training under context parallelism with the real schedules, DDP and optimizer matches the
one-rank run: CP x PP = 2 x 2 and TP x CP x DP = 2 x 2 x 2, 10 steps each.

The loss function returns Megatron's legacy 2-tuple (loss, report) with loss = local masked sum /
global token count, so this checks the schedules' `loss *= cp` and DDP's 1/(dp*cp) averaging over
the DP x CP group. Losses at every step and all step-1 gradients agree to 1e-6 relative.
"""

import copy
from functools import partial

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.models.common.tp_state_dict import shard_for_rank
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.core.transformer.context_parallel import ContextParallelAttention
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.utils import get_batch_on_this_cp_rank
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


V, H, HEADS, GROUPS, L, S, B, STEPS, MICRO = 32, 16, 4, 2, 2, 8, 2, 10, 4
RTOL = 1e-6


def _config(tp=1, pp=1, cp=1):
    return TransformerConfig(
        num_layers=L,
        hidden_size=H,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
    )


def _spec(cp, comm):
    spec = get_gpt_layer_local_spec()
    if cp == 1:
        return spec
    spec = copy.deepcopy(spec)
    attn = spec.submodules.self_attention
    attn.submodules.core_attention = ContextParallelAttention
    attn.params = {**attn.params, "cp_comm_type": comm}
    return spec


def _data(step, num_microbatches):
    g = torch.Generator().manual_seed(500 + step)
    out = []
    for _ in range(num_microbatches):
        tokens = torch.randint(0, V, (B, S), generator=g)
        mask = (torch.rand(B, S, generator=g) > 0.25).float()
        out.append(dict(tokens=tokens, labels=torch.roll(tokens, -1, 1), loss_mask=mask))
    return out


def _loss_func(mask, per_token_loss):
    """Megatron's legacy 2-tuple: local masked sum over the token count of the whole sequence."""
    total = (per_token_loss * mask).sum()
    count = mask.sum()
    global_count = count.detach().clone()
    dist.all_reduce(global_count, group=ps.get_context_parallel_group())
    return total / global_count, {"lm loss": torch.stack([total.detach(), count])}


def _forward_step(data_iterator, model):
    batch = dict(next(data_iterator), position_ids=torch.arange(S)[None].expand(B, -1))
    batch = get_batch_on_this_cp_rank(batch)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, partial(_loss_func, batch["loss_mask"])


def _train(model, data_of_step, is_last):
    config = model.config
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    config.no_sync_func = ddp.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-2, weight_decay=0.0), [ddp])
    fb = get_forward_backward_func()
    reports, grads = [], {}
    for step in range(STEPS):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        data = data_of_step(step)
        out = fb(forward_step_func=_forward_step, data_iterator=iter(data), model=ddp,
                 num_microbatches=len(data), seq_length=S, micro_batch_size=B)  # fmt: skip
        if is_last:
            reports.append(np.stack([r["lm loss"].numpy() for r in out]).sum(0))
        if step == 0:
            grads = {_full_name(model, n): p.main_grad.detach().clone()
                     for n, p in model.named_parameters()}  # fmt: skip
        ok, _, _ = opt.step()
        assert ok
    return reports, grads


def _full_name(model, name):
    if name.startswith("decoder.layers."):
        i, rest = name[len("decoder.layers.") :].split(".", 1)
        return f"decoder.layers.{model.decoder.layers[int(i)].layer_number - 1}.{rest}"
    return "embedding.word_embeddings.weight" if name == "output_layer.weight" else name


def _reference():
    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(11)
    torch.manual_seed(11)
    model = GPTModel(_config(), _spec(1, None), V, S, share_embeddings_and_output_weights=True)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    reports, grads = _train(model, lambda step: _data(step, MICRO), True)
    return weights, reports, grads


def _parallel(tp, pp, cp, comm, ref):
    weights, ref_reports, ref_grads = ref
    ps.initialize_model_parallel(tp, pp, context_parallel_size=cp)
    tensor_parallel.model_parallel_cuda_manual_seed(11)
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    model = GPTModel(_config(tp, pp, cp), _spec(cp, comm), V, S, pre_process=pp_rank == 0,
                     post_process=pp_rank == pp - 1,
                     share_embeddings_and_output_weights=True)  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(shard_for_rank(weights[_full_name(model, name)], p, tp_rank, tp))
    m = MICRO // dp
    reports, grads = _train(
        model, lambda step: _data(step, MICRO)[dp_rank * m : (dp_rank + 1) * m], pp_rank == pp - 1
    )
    worst = 0.0
    for name, g in grads.items():
        p = dict(model.named_parameters())[
            next(n for n, _ in model.named_parameters() if _full_name(model, n) == name)
        ]
        want = shard_for_rank(ref_grads[name], p, tp_rank, tp)
        err = ((g - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        assert err <= RTOL, (name, err)
        worst = max(worst, err)
    # losses: (sum, tokens) of the last stages summed over CP and DP (TP ranks hold copies)
    mine = torch.zeros(STEPS, 2, dtype=torch.float64)
    if reports and tp_rank == 0:
        mine += torch.from_numpy(np.stack(reports))
    dist.all_reduce(mine)
    want = torch.from_numpy(np.stack(ref_reports)).double()
    loss_err = ((mine[:, 0] / mine[:, 1]) / (want[:, 0] / want[:, 1]) - 1).abs().max().item()
    assert loss_err <= RTOL, loss_err
    return worst, loss_err


@pytest.fixture(scope="module")
def reference():
    return run_distributed(_reference, 1, timeout=150)[0]


@pytest.mark.timeout(300)
def test_cp2_pp2_trains_like_one_rank(reference):
    results = run_distributed(_parallel, 4, args=(1, 2, 2, "p2p", reference), timeout=240)
    assert max(max(r) for r in results) <= RTOL


@pytest.mark.timeout(400)
def test_tp2_cp2_dp2_trains_like_one_rank(reference):
    results = run_distributed(_parallel, 8, args=(2, 1, 2, "a2a", reference), timeout=300)
    assert max(max(r) for r in results) <= RTOL
