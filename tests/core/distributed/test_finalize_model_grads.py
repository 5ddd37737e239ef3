"""finalize_model_grads on 4 gloo ranks, grads set by hand so every expected value is exact.

Layout A, TP=2 x PP=2: SP-marked params (`sequence_parallel=True`) and q/k layernorms (with
`qk_layernorm`) are summed over TP, `average_gradients_across_tp_domain` ones averaged, TP-split
params are left alone, and the tied embedding/output weight is summed between the first and
last stage (embedding group).
Layout B, PP=2 x DP=2 with per-token loss: the DP reduction sums (no 1/dp pre-scale), the
token count is broadcast from the last stage and summed over DP, and all grads are divided by it.
Layout C, EP=2 x DP=4: expert params (`allreduce=False`) are summed over the expert-DP group
(2 ranks) but scaled by 1/(dp x cp) = 1/4 like dense ones (Megatron's convention); a chained
dense + expert distributed optimizer steps; `check_for_nan_in_grad` raises before communicating.
"""

from types import SimpleNamespace

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


class _Stage(torch.nn.Module):
    """A pipeline stage of a tied-embedding LM, reduced to the attributes Megatron reads."""

    def __init__(self):
        super().__init__()
        self.pre_process = ps.is_pipeline_first_stage()
        self.post_process = ps.is_pipeline_last_stage()
        self.share_embeddings_and_output_weights = True
        self.word_embeddings = torch.nn.Parameter(torch.zeros(6, 4))
        self.norm = torch.nn.Parameter(torch.zeros(4))
        self.norm.sequence_parallel = True
        self.fc = torch.nn.Parameter(torch.zeros(4, 4))
        self.fc.tensor_model_parallel = True
        self.q_layernorm = torch.nn.LayerNorm(4)  # summed over TP when config.qk_layernorm
        self.router = torch.nn.Parameter(torch.zeros(3))
        self.router.average_gradients_across_tp_domain = True  # averaged over TP

    def shared_embedding_or_output_weight(self):
        return self.word_embeddings


def _grads(stage):
    return {n: p.main_grad.flatten()[0].item() for n, p in stage.named_parameters()}


def _body():
    rank = torch.distributed.get_rank()
    out = {}
    # Layout A: TP=2, PP=2.
    ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    stage = _Stage()
    config = SimpleNamespace(sequence_parallel=True, qk_layernorm=True)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), stage)
    ddp.zero_grad_buffer()
    for p in stage.parameters():
        p.main_grad.fill_(rank + 1)
    finalize_model_grads([ddp])
    out["A"] = _grads(stage)
    ps.destroy_model_parallel()
    # Layout B: PP=2, DP=2, per-token loss.
    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    stage = _Stage()
    config = SimpleNamespace(calculate_per_token_loss=True)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), stage)
    with torch.no_grad():
        stage.fc.fill_(rank)
    ddp.broadcast_params()  # DP rank 0's values everywhere in the DP group
    out["B_fc_after_broadcast"] = stage.fc.flatten()[0].item()
    ddp.zero_grad_buffer()
    for p in stage.parameters():
        p.main_grad.fill_(rank + 1)
    num_tokens = torch.tensor([10.0 * (rank + 1)])
    finalize_model_grads([ddp], num_tokens=num_tokens)
    out["B"] = _grads(stage)
    out["B_tokens"] = num_tokens.item()
    ps.destroy_model_parallel()
    # Layout C: EP=2 (expert-DP groups (0,2) and (1,3)), DP=4.
    ps.initialize_model_parallel(expert_model_parallel_size=2)
    # 16x16 layers: every rank owns part of a bucket (padded to lcm(dp, 128) = 128 multiples).
    torch.manual_seed(0)
    dense = torch.nn.Linear(16, 16)
    torch.manual_seed(10 + ps.get_expert_model_parallel_rank())  # each EP rank its own expert
    model = torch.nn.Sequential(dense, torch.nn.Linear(16, 16))
    for p in model[1].parameters():
        p.allreduce = False
    ddp = DistributedDataParallel(
        SimpleNamespace(), DistributedDataParallelConfig(use_distributed_optimizer=True), model
    )
    opt = get_megatron_optimizer(OptimizerConfig(lr=0.1, use_distributed_optimizer=True), [ddp])
    ddp.zero_grad_buffer()
    for p in model.parameters():
        p.main_grad.fill_(rank + 1)
    finalize_model_grads([ddp])
    # Under the distributed optimizer only this rank's shard is reduced: read a grad element in
    # the shard, via the shard main params after step's prepare_grads.
    opt.prepare_grads()
    out["C_dense"] = sorted({v for o in opt.chained_optimizers[:1] for v in _shard_grads(o)})
    out["C_expert"] = sorted({v for o in opt.chained_optimizers[1:] for v in _shard_grads(o)})
    ok = opt.step()[0]
    out["C_step"] = ok
    out["C_expert_weight"] = model[1].weight.detach().numpy().copy()
    try:
        ddp_nan = DistributedDataParallel(
            SimpleNamespace(),
            DistributedDataParallelConfig(check_for_nan_in_grad=True),
            torch.nn.Linear(2, 2),
        )
        ddp_nan.zero_grad_buffer()
        next(ddp_nan.parameters()).main_grad.fill_(float("nan"))
        ddp_nan.finish_grad_sync()
        out["C_nan"] = "no error"
    except RuntimeError as e:
        out["C_nan"] = str(e)
    return out


def _shard_grads(opt):
    return [round(g.item(), 6) for p in opt.get_parameters() for g in p.grad.flatten()]


def test_finalize_model_grads():
    res = run_distributed(_body, 4)
    # A: ranks 0,1 = TP group of stage 0; 2,3 = stage 1. Embedding groups: (0,2) and (1,3).
    for rank in range(4):
        a = res[rank]["A"]
        tp_peer = rank ^ 1
        other_stage = (rank + 2) % 4
        assert a["norm"] == (rank + 1) + (tp_peer + 1), rank
        assert a["fc"] == rank + 1, rank
        assert a["q_layernorm.weight"] == (rank + 1) + (tp_peer + 1), rank
        assert a["router"] == ((rank + 1) + (tp_peer + 1)) / 2, rank
        assert a["word_embeddings"] == (rank + 1) + (other_stage + 1), rank
    # B: DP groups (0,1) at stage 0 and (2,3) at stage 1; sums 3 and 7; embedding 3 + 7 = 10.
    # Token count: last stage's (30 or 40) broadcast down its PP group, summed over DP -> 70.
    for rank in range(4):
        b = res[rank]["B"]
        assert res[rank]["B_tokens"] == 70.0
        assert res[rank]["B_fc_after_broadcast"] == (0 if rank < 2 else 2)
        dp_sum = 3.0 if rank < 2 else 7.0
        torch.testing.assert_close(b["norm"], dp_sum / 70.0)
        torch.testing.assert_close(b["fc"], dp_sum / 70.0)
        torch.testing.assert_close(b["word_embeddings"], 10.0 / 70.0)
    # C: dense grads: sum over 4 ranks (1+2+3+4) / 4; expert: over (0,2) or (1,3), / 4.
    for rank in range(4):
        c = res[rank]
        assert c["C_dense"] == [2.5], (rank, c["C_dense"])
        want = ((1 + 3) if rank % 2 == 0 else (2 + 4)) / 4
        assert c["C_expert"] == [want], (rank, c["C_expert"])
        assert c["C_step"]
        assert "NaN or Inf" in c["C_nan"], c["C_nan"]
    # Expert-DP peers hold identical experts after the all-gather.
    assert (res[0]["C_expert_weight"] == res[2]["C_expert_weight"]).all()
    assert (res[1]["C_expert_weight"] == res[3]["C_expert_weight"]).all()
    assert not (res[0]["C_expert_weight"] == res[1]["C_expert_weight"]).all()


def test_tied_copies_summed_in_another_order_agree():
    from gigatron.core.distributed.finalize_model_grads import _copies_agree

    first = torch.tensor([12.5, 40.0], dtype=torch.float64)
    rounded = first * (1 + 1e-8)  # an all-reduce summed in another order
    assert _copies_agree([first, rounded], 1000)
    assert not _copies_agree([first, first * (1 + 1e-3)], 1000)  # a stage trained its own copy
    assert not _copies_agree([first, torch.tensor([12.5, 41.0], dtype=torch.float64)], 1000)
