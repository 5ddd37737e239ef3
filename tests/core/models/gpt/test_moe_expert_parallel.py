"""End to end: a 2-layer MoE GPTModel (MoE + dense layer from moe_layer_freq, aux and z losses)
under DDP at EP = 2 (2 ranks, DP = 2) gets the same losses and grads (main_grad after
finalize_model_grads) as EP = 1 on one rank running both micro-batches.

Both runs build the model from the same seed with CPU initialisation, which is layout-invariant
for the experts too. The one-rank run uses the schedules' aux-loss scale (1 / num_microbatches),
the two-rank run scale 1 with DDP's 1/dp: both halve the aux-loss grads of each micro-batch.
"""

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
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
from gigatron.testing import run_distributed
from tests.core.models.gpt._moe_cases import global_expert_name, moe_gpt_config

pytestmark = pytest.mark.multirank


VOCAB, SEQ, MBS = 64, 16, 2


def _run(ep: int):
    world, rank = dist.get_world_size(), dist.get_rank()
    ps.initialize_model_parallel(expert_model_parallel_size=ep)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    torch.manual_seed(0)
    cfg = moe_gpt_config(2, expert_model_parallel_size=ep)
    model = GPTModel(
        cfg,
        get_gpt_decoder_block_spec(cfg, False),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
    )
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), model)
    ids = torch.randint(0, VOCAB, (2, MBS, SEQ), generator=torch.Generator().manual_seed(5))
    micro = [0, 1] if world == 1 else [rank]
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0 / len(micro)))
    losses = []
    for m in micro:
        loss = ddp(ids[m], None, attention_mask=None, labels=ids[m]).mean()
        (loss / len(micro)).backward()
        losses.append(loss.item())
    finalize_model_grads([ddp])
    grads = {
        global_expert_name(name, ep): p.main_grad.detach().clone()
        for name, p in model.named_parameters()
    }
    return losses, grads


def test_moe_gpt_ep2_matches_one_rank():
    ((ref_losses, ref_grads),) = run_distributed(_run, 1, args=(1,), timeout=180)
    results = run_distributed(_run, 2, args=(2,), timeout=180)
    losses = [results[0][0][0], results[1][0][0]]
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= 1e-6
    seen, worst = set(), 0.0
    for _, grads in results:
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)
            worst = max(worst, (g - ref_grads[name]).abs().max().item())
            seen.add(name)
    assert seen == set(ref_grads)  # every expert of the EP = 1 model lives on one EP rank
    assert any(g.abs().sum() > 0 for n, g in ref_grads.items() if "router" in n)
    print(f"EP2 vs EP1 GPT: losses {losses} vs {ref_losses}, worst grad err {worst:.2e}")
