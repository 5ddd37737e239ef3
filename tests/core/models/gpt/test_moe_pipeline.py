"""MoE GPT through the pipeline schedule: PP = 2 x EP = 2 x DP = 2 (4 ranks) gives the losses and
main grads of one rank running all 4 micro-batches unsplit (aux and z losses on).

Both sides build the model with the layout-invariant CPU initialisation
(gigatron.core.layout_invariant_init), so no weights are copied: each component is seeded by
name and the experts are drawn in global order. The schedule sets the aux-loss scale to
1 / num_microbatches on every stage; with DDP's 1 / dp over 2 DP ranks of 2 micro-batches each,
that matches the reference's 1 / 4.
"""

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.layout_invariant_init import set_layout_invariant_init_seed
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.testing import run_distributed
from tests.core.models.gpt._moe_cases import global_expert_name, moe_gpt_config

pytestmark = pytest.mark.multirank


V, S, B, M = 64, 8, 2, 4


def _loss(per_token):
    loss = per_token.mean()
    return loss, {"lm loss": loss.detach().clone()}  # the schedule scales `loss` in place


def _forward_step(data_iterator, model):
    tokens = next(data_iterator)
    return model(tokens, None, None, labels=tokens), _loss


def _run(pp: int, ep: int):
    ps.initialize_model_parallel(pipeline_model_parallel_size=pp, expert_model_parallel_size=ep)
    tensor_parallel.model_parallel_cuda_manual_seed(3)
    set_layout_invariant_init_seed(7)
    cfg = moe_gpt_config(
        4,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        pipeline_dtype=torch.float32,
    )
    pp_rank = ps.get_pipeline_model_parallel_rank()
    model = GPTModel(
        cfg,
        get_gpt_decoder_block_spec(cfg, False),
        V,
        S,
        pre_process=pp_rank == 0,
        post_process=pp_rank == pp - 1,
        position_embedding_type="rope",
    )
    set_layout_invariant_init_seed(None)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), model)
    cfg.finalize_model_grads_func = finalize_model_grads
    tokens = torch.randint(0, V, (M, B, S), generator=torch.Generator().manual_seed(9))
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    mine = list(tokens[dp_rank * M // dp : (dp_rank + 1) * M // dp])
    out = get_forward_backward_func()(
        forward_step_func=_forward_step,
        data_iterator=iter(mine),
        model=ddp,
        num_microbatches=len(mine),
        seq_length=S,
        micro_batch_size=B,
    )
    grads = {}
    for name, p in model.named_parameters():
        if name.startswith("decoder.layers."):
            i, rest = name[len("decoder.layers.") :].split(".", 1)
            name = f"decoder.layers.{model.decoder.layers[int(i)].layer_number - 1}.{rest}"
        grads[global_expert_name(name, ep)] = p.main_grad.detach().clone()
    losses = [r["lm loss"].item() for r in out] if out else []
    return dp_rank, losses, grads


def test_moe_gpt_pp2_ep2_matches_one_rank():
    ((_, ref_losses, ref_grads),) = run_distributed(_run, 1, args=(1, 1), timeout=180)
    results = run_distributed(_run, 4, args=(2, 2), timeout=240)
    losses = {}
    worst, seen = 0.0, set()
    for dp_rank, rank_losses, grads in results:
        if rank_losses:
            losses[dp_rank] = rank_losses
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)
            worst = max(worst, (g - ref_grads[name]).abs().max().item())
            seen.add(name)
    assert seen == set(ref_grads)
    got = losses[0] + losses[1]
    assert max(abs(a - b) for a, b in zip(got, ref_losses)) <= 1e-6, (got, ref_losses)
    print(f"PP2 x EP2 x DP2 vs one rank: worst grad err {worst:.2e}")
