"""Expert parallelism: EP = 2, 4 and EP x TP (with and without expert TP) give the EP = 1 outputs,
input grads and (through DDP + finalize_model_grads) correctly scaled router and expert grads.

Every rank builds the unsharded EP = 1 twin on single-rank groups from the same full weights and
runs it on each DP rank's micro-batch [s, b, h] of the global batch [s, B, h] (aux losses are
per micro-batch, as in Megatron); the parallel layer gets this rank's slice (dense layout: s
split over TP under SP, B over DP) and its experts' shards (experts split over EP, expert ffn
over expert TP). Loss = sum(out * dy) (+ aux, sequence-aux and z losses) over the global batch,
so with DDP's 1/dp pre-scaling every main_grad must equal the twin's summed grad / dp. Each
spawn runs both dispatchers and both expert kinds.
"""

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.models.common.moe_state_dict import load_full_moe_state_dict
from gigatron.core.process_groups_config import ProcessGroupCollection
from gigatron.core.transformer.mlp import MLPSubmodules
from gigatron.core.transformer.moe.experts import (
    GroupedMLP,
    SequentialMLP,
    grouped_weights_from_sequential,
    sequential_weights_from_grouped,
)
from gigatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from gigatron.core.transformer.moe.moe_utils import update_router_expert_bias
from gigatron.core.transformer.moe.router import TopKRouter
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


E, H, F_EXP, S, B_LOCAL, TOPK = 8, 16, 8, 8, 2, 2
MLP_SUB = MLPSubmodules(
    linear_fc1=tensor_parallel.ColumnParallelLinear, linear_fc2=tensor_parallel.RowParallelLinear
)


def _config(tp, ep, etp, dispatcher, grouped):
    return TransformerConfig(
        num_layers=1,
        hidden_size=H,
        num_attention_heads=2,
        num_moe_experts=E,
        moe_router_topk=TOPK,
        ffn_hidden_size=32,
        moe_ffn_hidden_size=F_EXP,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        sequence_parallel=tp > 1,
        moe_token_dispatcher_type=dispatcher,
        moe_grouped_gemm=grouped,
        moe_router_load_balancing_type=["aux_loss", "seq_aux_loss"],
        moe_aux_loss_coeff=[0.1, 0.05],
        moe_z_loss_coeff=0.01,
    )


def _layer(cfg, grouped, pg_collection=None):
    experts = (
        ModuleSpec(module=GroupedMLP)
        if grouped
        else ModuleSpec(module=SequentialMLP, submodules=MLP_SUB)
    )
    return MoELayer(cfg, MoESubmodules(experts=experts), pg_collection=pg_collection).train()


def _full_weights():
    g = torch.Generator().manual_seed(7)
    router = torch.randn(E, H, generator=g) * 0.5
    fc1 = [torch.randn(2 * F_EXP, H, generator=g) * 0.3 for _ in range(E)]  # [gate; up]
    fc2 = [torch.randn(H, F_EXP, generator=g) * 0.3 for _ in range(E)]
    return router, fc1, fc2


def _shard(fc1, fc2, etp, etp_rank):
    """One expert's [gate; up] rows and fc2 columns for expert-TP rank `etp_rank`."""
    f = F_EXP // etp
    sl = slice(etp_rank * f, (etp_rank + 1) * f)
    gate, up = fc1.chunk(2, dim=0)
    return torch.cat([gate[sl], up[sl]]), fc2[:, sl]


def _load(layer, weights, experts_idx, etp, etp_rank):
    router, fc1, fc2 = weights
    with torch.no_grad():
        layer.router.weight.copy_(router)
        shards = [_shard(fc1[e], fc2[e], etp, etp_rank) for e in experts_idx]
        if isinstance(layer.experts, GroupedMLP):
            w1, w2 = grouped_weights_from_sequential([a for a, _ in shards], [b for _, b in shards])
            layer.experts.weight1.copy_(w1)
            layer.experts.weight2.copy_(w2)
        else:
            for expert, (a, b) in zip(layer.experts.local_experts, shards):
                expert.linear_fc1.weight.copy_(a)
                expert.linear_fc2.weight.copy_(b)


def _expert_grads(layer):
    """Per local expert (fc1 grad, fc2 grad), from main_grad (DDP) or .grad."""

    def g(p):
        return p.main_grad if hasattr(p, "main_grad") else p.grad

    if isinstance(layer.experts, GroupedMLP):
        n = layer.num_local_experts
        return list(
            zip(
                *sequential_weights_from_grouped(
                    g(layer.experts.weight1), g(layer.experts.weight2), n
                )
            )
        )
    return [(g(e.linear_fc1.weight), g(e.linear_fc2.weight)) for e in layer.experts.local_experts]


def _self_groups():
    """Single-rank groups (every rank creates all of them, in the same order)."""
    mine = None
    for r in range(dist.get_world_size()):
        group = dist.new_group([r])
        if r == dist.get_rank():
            mine = group
    names = ("tp", "cp", "tp_cp", "ep", "expt_tp", "tp_ep", "expt_dp", "tp_dp_cp", "dp", "pp")
    return ProcessGroupCollection(**{n: mine for n in names})


def _check_cpu_init_is_layout_invariant(tp, ep, etp, self_pg, ep_rank, etp_rank):
    """CPU init (same seed) gives this rank exactly its shards of the EP = 1 experts, for
    SequentialMLP and GroupedMLP alike."""
    n_local = E // ep
    torch.manual_seed(5)
    ref = SequentialMLP(E, _config(1, 1, 1, "alltoall", False), MLP_SUB, pg_collection=self_pg)
    for grouped in (False, True):
        torch.manual_seed(5)
        cfg = _config(tp, ep, etp, "alltoall", grouped)
        layer = GroupedMLP(n_local, cfg) if grouped else SequentialMLP(n_local, cfg, MLP_SUB)
        if grouped:
            fc1, fc2 = sequential_weights_from_grouped(layer.weight1, layer.weight2, n_local)
        else:
            fc1 = [e.linear_fc1.weight for e in layer.local_experts]
            fc2 = [e.linear_fc2.weight for e in layer.local_experts]
        for i in range(n_local):
            expert = ref.local_experts[ep_rank * n_local + i]
            w1, w2 = _shard(expert.linear_fc1.weight, expert.linear_fc2.weight, etp, etp_rank)
            torch.testing.assert_close(fc1[i], w1, rtol=0, atol=0)
            torch.testing.assert_close(fc2[i], w2, rtol=0, atol=0)


def _check_expert_bias_counts_every_rank(tp, ep, etp):
    """The aux-loss-free bias step uses the token counts of all TP x DP ranks together."""
    cfg = dataclasses.replace(
        _config(tp, ep, etp, "alltoall", False),
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_z_loss_coeff=None,
        moe_router_bias_update_rate=0.5,
    )
    router = TopKRouter(cfg).train()
    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(world, 6, 1, E, generator=g)
    logits[:, :, :, 0] += 3.0 * (torch.arange(world) % 2 == 0).view(-1, 1, 1)  # even ranks
    router.routing(logits[rank])
    update_router_expert_bias([router], cfg)
    counts = torch.zeros(E)
    for r in range(world):
        top = torch.topk(torch.sigmoid(logits[r].view(-1, E)), TOPK, dim=-1).indices
        counts += torch.zeros(6, E).scatter(1, top, 1.0).sum(0)
    expected = torch.sign(counts.mean() - counts) * 0.5
    torch.testing.assert_close(router.expert_bias, expected, rtol=0, atol=0)


def _check_full_state_dict_reshards(ref, layer, grouped):
    """The EP = 1 twin's state dict loads into this layout's layer as exactly its shards."""
    full = {k: v for k, v in ref.state_dict().items() if not k.endswith("_extra_state")}
    if grouped:
        key = "experts.local_experts.{}.linear_fc{}.weight"
        fc1 = [full.pop(key.format(e, 1)) for e in range(E)]
        fc2 = [full.pop(key.format(e, 2)) for e in range(E)]
        full["experts.weight1"], full["experts.weight2"] = grouped_weights_from_sequential(fc1, fc2)
    expected = {n: p.detach().clone() for n, p in layer.named_parameters()}
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()
    load_full_moe_state_dict(layer, full)
    for name, p in layer.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=0, atol=0, msg=name)


def _run_layout(tp, ep, etp):
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    tp_rank, dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
    dp = ps.get_data_parallel_world_size()
    ep_rank, etp_rank = ps.get_expert_model_parallel_rank(), ps.get_expert_tensor_parallel_rank()
    self_pg = _self_groups()
    weights = _full_weights()
    g = torch.Generator().manual_seed(11)
    x_full = torch.randn(S, B_LOCAL * dp, H, generator=g)
    dy_full = torch.randn(S, B_LOCAL * dp, H, generator=g)
    s_sl = slice(tp_rank * S // tp, (tp_rank + 1) * S // tp)
    b_sl = slice(dp_rank * B_LOCAL, (dp_rank + 1) * B_LOCAL)
    n_local = E // ep
    _check_cpu_init_is_layout_invariant(tp, ep, etp, self_pg, ep_rank, etp_rank)
    _check_expert_bias_counts_every_rank(tp, ep, etp)
    report = []
    for dispatcher in ("allgather", "alltoall"):
        for grouped in (False, True):
            ref = _layer(_config(1, 1, 1, dispatcher, False), False, self_pg)
            _load(ref, weights, range(E), 1, 0)
            xr = x_full.clone().requires_grad_()
            outs = []
            for d in range(dp):  # one micro-batch per DP rank: the aux losses are per batch
                bs = slice(d * B_LOCAL, (d + 1) * B_LOCAL)
                out_d, _ = ref(xr[:, bs])
                (out_d * dy_full[:, bs]).sum().backward()
                outs.append(out_d.detach())
            out_ref = torch.cat(outs, dim=1)

            cfg = _config(tp, ep, etp, dispatcher, grouped)
            layer = _layer(cfg, grouped)
            _load(layer, weights, range(ep_rank * n_local, (ep_rank + 1) * n_local), etp, etp_rank)
            _check_full_state_dict_reshards(ref, layer, grouped)
            ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), layer)
            x = x_full[s_sl, b_sl].clone().requires_grad_()
            out, _ = ddp(x)
            (out * dy_full[s_sl, b_sl]).sum().backward()
            finalize_model_grads([ddp])

            tol = dict(rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out, out_ref[s_sl, b_sl].detach(), **tol)
            torch.testing.assert_close(x.grad, xr.grad[s_sl, b_sl], **tol)
            torch.testing.assert_close(
                layer.router.weight.main_grad, ref.router.weight.grad / dp, **tol
            )
            ref_grads = _expert_grads(ref)
            err = 0.0
            for i, (g1, g2) in enumerate(_expert_grads(layer)):
                r1, r2 = _shard(*ref_grads[ep_rank * n_local + i], etp, etp_rank)
                torch.testing.assert_close(g1, r1 / dp, **tol)
                torch.testing.assert_close(g2, r2 / dp, **tol)
                err = max(err, (g1 - r1 / dp).abs().max().item())
            report.append(
                (dispatcher, grouped, (out - out_ref[s_sl, b_sl]).abs().max().item(), err)
            )
            ddp.zero_grad_buffer()
    assert all(not getattr(p, "allreduce", True) for p in layer.experts.parameters())
    return report


@pytest.mark.parametrize(
    "world,tp,ep,etp",
    [(2, 1, 2, 1), (4, 1, 4, 1), (4, 2, 2, 2), (4, 2, 2, 1)],
    ids=["ep2", "ep4", "ep2xtp2", "ep2xtp2-etp1"],
)
def test_expert_parallel_matches_ep1(world, tp, ep, etp):
    reports = run_distributed(_run_layout, world, args=(tp, ep, etp), timeout=240)
    worst = max(max(r[2], r[3]) for rank in reports for r in rank)
    print(f"{world} ranks tp={tp} ep={ep} etp={etp}: worst abs err {worst:.2e}")
    assert worst <= 1e-5


def _fp8_experts_under_expert_tp():
    """TP = ETP = 2 (SP), alltoall: FP8 GroupedMLP equals FP8 SequentialMLP built from the same
    expert shards (amaxes over the split ffn dim all-reduced in the expert-TP group)."""
    from gigatron.core.fp8_utils import get_fp8_recipe, set_fp8

    ps.initialize_model_parallel(tensor_model_parallel_size=2, expert_tensor_parallel_size=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    tp_rank, h, f = ps.get_tensor_model_parallel_rank(), 32, 32
    g = torch.Generator().manual_seed(3)
    router = torch.randn(E, h, generator=g) * 0.5
    fc1 = [torch.randn(2 * f, h, generator=g) * 0.3 for _ in range(E)]
    fc2 = [torch.randn(h, f, generator=g) * 0.3 for _ in range(E)]
    x = torch.randn(S, B_LOCAL, h, generator=g)[tp_rank * S // 2 : (tp_rank + 1) * S // 2]
    results = []
    for grouped in (False, True):
        cfg = dataclasses.replace(
            _config(2, 1, 2, "alltoall", grouped), hidden_size=h, moe_ffn_hidden_size=f,
            fp8="hybrid", fp8_recipe="tensorwise",
        )  # fmt: skip
        layer = _layer(cfg, grouped)
        set_fp8(layer, get_fp8_recipe(cfg))
        shards = []
        for e in range(E):  # [gate; up] rows and fc2 columns of this expert-TP rank
            gate, up = fc1[e].chunk(2, dim=0)
            sl = slice(tp_rank * f // 2, (tp_rank + 1) * f // 2)
            shards.append((torch.cat([gate[sl], up[sl]]), fc2[e][:, sl]))
        with torch.no_grad():
            layer.router.weight.copy_(router)
            if grouped:
                w1, w2 = grouped_weights_from_sequential(*map(list, zip(*shards)))
                layer.experts.weight1.copy_(w1)
                layer.experts.weight2.copy_(w2)
            else:
                for expert, (a, b) in zip(layer.experts.local_experts, shards):
                    expert.linear_fc1.weight.copy_(a)
                    expert.linear_fc2.weight.copy_(b)
        xi = x.clone().requires_grad_()
        out, _ = layer(xi)
        out.square().sum().backward()
        results.append((out.detach(), xi.grad, _expert_grads(layer)))
    (out_s, dx_s, grads_s), (out_g, dx_g, grads_g) = results
    torch.testing.assert_close(out_g, out_s, rtol=0, atol=1e-6)
    torch.testing.assert_close(dx_g, dx_s, rtol=0, atol=1e-6)
    for (a1, a2), (b1, b2) in zip(grads_g, grads_s):
        torch.testing.assert_close(a1, b1, rtol=0, atol=1e-6)
        torch.testing.assert_close(a2, b2, rtol=0, atol=1e-6)
    return (out_g - out_s).abs().max().item()


def test_fp8_grouped_experts_equal_sequential_under_expert_tp():
    pytest.importorskip("torchao.float8")
    assert max(run_distributed(_fp8_experts_under_expert_tp, 2, timeout=120)) <= 1e-6
