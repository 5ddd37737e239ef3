"""GroupedMLP equals SequentialMLP (outputs and all grads, grouped kernel and fallback); MoELayer
(both dispatchers, both expert kinds, shared experts) equals a per-token loop over the routed
experts; helpful errors for names Megatron does not have; moe_layer_freq patterns."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import tensor_parallel
from gigatron.core.transformer.mlp import MLPSubmodules
from gigatron.core.transformer.moe import experts as experts_mod
from gigatron.core.transformer.moe import moe_utils
from gigatron.core.transformer.moe.experts import (
    GroupedMLP,
    SequentialMLP,
    grouped_weights_from_sequential,
    sequential_weights_from_grouped,
)
from gigatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from gigatron.core.transformer.moe.shared_experts import SharedExpertMLP
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

MLP_SUB = MLPSubmodules(
    linear_fc1=tensor_parallel.ColumnParallelLinear, linear_fc2=tensor_parallel.RowParallelLinear
)


gloo_world, single_rank = one_rank_fixtures()


@pytest.fixture(autouse=True)
def moe_logging():
    yield
    moe_utils.get_moe_layer_wise_logging_tracker().clear()


def _config(**kw):
    base = dict(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        num_moe_experts=4,
        moe_router_topk=2,
        ffn_hidden_size=24,
        moe_ffn_hidden_size=8,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        init_method_std=0.3,
    )
    base.update(kw)
    return TransformerConfig(**base)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("glu", [True, False])
def test_grouped_mlp_equals_sequential_mlp(kernel, glu, monkeypatch):
    if kernel and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm not in this torch")
    if not kernel:
        monkeypatch.setattr(experts_mod, "grouped_mm_available", lambda x, w: False)
    cfg = _config(gated_linear_unit=glu, activation_func=F.silu if glu else F.gelu)
    seq = SequentialMLP(4, cfg, MLP_SUB)
    grp = GroupedMLP(4, cfg)
    w1, w2 = grouped_weights_from_sequential(
        [e.linear_fc1.weight.detach() for e in seq.local_experts],
        [e.linear_fc2.weight.detach() for e in seq.local_experts],
    )
    with torch.no_grad():
        grp.weight1.copy_(w1)
        grp.weight2.copy_(w2)
    counts = torch.tensor([3, 0, 5, 2])  # an expert without tokens
    x = torch.randn(10, 16)
    assert experts_mod.grouped_mm_available(x, grp.weight1.view(4, 16, -1)) == kernel
    probs = torch.rand(10)
    xs, ps = x.clone().requires_grad_(), probs.clone().requires_grad_()
    xg, pg = x.clone().requires_grad_(), probs.clone().requires_grad_()
    out_s, _ = seq(xs, counts, ps)
    out_g, _ = grp(xg, counts, pg)
    torch.testing.assert_close(out_g, out_s, rtol=1e-5, atol=1e-6)
    dy = torch.randn_like(out_s)
    out_s.backward(dy)
    out_g.backward(dy)
    torch.testing.assert_close(xg.grad, xs.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pg.grad, ps.grad, rtol=1e-5, atol=1e-6)
    g1, g2 = sequential_weights_from_grouped(grp.weight1.grad, grp.weight2.grad, 4)
    for e, expert in enumerate(seq.local_experts):
        torch.testing.assert_close(g1[e], expert.linear_fc1.weight.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g2[e], expert.linear_fc2.weight.grad, rtol=1e-5, atol=1e-6)
    assert g1[1].abs().sum() == 0  # no tokens, zero (not missing) grad


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_grouped_mlp_equals_fp8_sequential_mlp(recipe):
    """FP8 experts: GroupedMLP's per-expert FP8 GEMMs on its grouped weights cast and scale as
    SequentialMLP's FP8 linears do, so outputs and every gradient agree (an expert without
    tokens included: zero grad, no amax of an empty tensor)."""
    pytest.importorskip("torchao.float8")
    from gigatron.core.fp8_utils import cpu_takes_rowwise_scales, get_fp8_recipe, set_fp8

    if recipe == "rowwise" and not cpu_takes_rowwise_scales():
        pytest.skip("this torch's CPU _scaled_mm takes per-tensor scales only")
    cfg = _config(hidden_size=32, moe_ffn_hidden_size=16, fp8="hybrid", fp8_recipe=recipe)
    seq, grp = SequentialMLP(4, cfg, MLP_SUB), GroupedMLP(4, cfg)
    set_fp8(seq, get_fp8_recipe(cfg))
    set_fp8(grp, get_fp8_recipe(cfg))
    w1, w2 = grouped_weights_from_sequential(
        [e.linear_fc1.weight.detach() for e in seq.local_experts],
        [e.linear_fc2.weight.detach() for e in seq.local_experts],
    )
    with torch.no_grad():
        grp.weight1.copy_(w1)
        grp.weight2.copy_(w2)
    counts = torch.tensor([3, 0, 5, 2])
    x, probs, dy = torch.randn(10, 32), torch.rand(10), torch.randn(10, 32)
    xs, ps = x.clone().requires_grad_(), probs.clone().requires_grad_()
    xg, pg = x.clone().requires_grad_(), probs.clone().requires_grad_()
    out_s, out_g = seq(xs, counts, ps)[0], grp(xg, counts, pg)[0]
    out_s.backward(dy)
    out_g.backward(dy)
    torch.testing.assert_close(out_g, out_s, rtol=0, atol=1e-6)
    # FP8 differs from fp32 by more than rounding: the test would see a silent fallback
    with torch.no_grad():
        plain = GroupedMLP(4, _config(hidden_size=32, moe_ffn_hidden_size=16))
        plain.weight1.copy_(w1)
        plain.weight2.copy_(w2)
        assert (plain(x, counts, probs)[0] - out_g).abs().max() > 1e-4
    torch.testing.assert_close(xg.grad, xs.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(pg.grad, ps.grad, rtol=0, atol=1e-6)
    g1, g2 = sequential_weights_from_grouped(grp.weight1.grad, grp.weight2.grad, 4)
    for e, expert in enumerate(seq.local_experts):
        torch.testing.assert_close(g1[e], expert.linear_fc1.weight.grad, rtol=0, atol=1e-6)
        torch.testing.assert_close(g2[e], expert.linear_fc2.weight.grad, rtol=0, atol=1e-6)
    assert g1[1].abs().sum() == 0


def _reference(layer, x):
    """out[t] = sum over routed e of p[t, e] * expert_e(x[t]) (+ shared expert), by loops."""
    probs, rmap = layer.router(x)
    flat = x.reshape(-1, x.shape[-1])
    out = torch.zeros_like(flat)
    cfg = layer.config
    for t in range(flat.shape[0]):
        for e in rmap[t].nonzero().flatten().tolist():
            if isinstance(layer.experts, SequentialMLP):
                expert = layer.experts.local_experts[e]
                w1, w2 = expert.linear_fc1.weight, expert.linear_fc2.weight
            else:
                w1s, w2s = sequential_weights_from_grouped(
                    layer.experts.weight1, layer.experts.weight2, 4
                )
                w1, w2 = w1s[e], w2s[e]
            h = w1 @ flat[t]
            if cfg.gated_linear_unit:
                gate, up = h.chunk(2)
                h = cfg.activation_func(gate) * up
            else:
                h = cfg.activation_func(h)
            out[t] += probs[t, e] * (w2 @ h)
    out = out.view_as(x)
    if layer.shared_experts is not None:
        out = out + layer.shared_experts(x)
    return out


@pytest.mark.parametrize("dispatcher", ["allgather", "alltoall"])
@pytest.mark.parametrize("grouped", [False, True])
def test_moe_layer_equals_per_token_loop(dispatcher, grouped):
    cfg = _config(
        moe_token_dispatcher_type=dispatcher,
        moe_grouped_gemm=grouped,
        moe_shared_expert_intermediate_size=8 if not grouped else None,
    )
    experts = (
        ModuleSpec(module=GroupedMLP)
        if grouped
        else ModuleSpec(module=SequentialMLP, submodules=MLP_SUB)
    )
    shared = ModuleSpec(module=SharedExpertMLP, submodules=MLP_SUB)
    layer = MoELayer(cfg, MoESubmodules(experts=experts, shared_experts=shared)).eval()
    x = torch.randn(6, 2, 16)
    out, bias = layer(x)
    assert bias is None and out.shape == x.shape
    with torch.no_grad():
        ref = _reference(layer, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_expert_params_use_the_expert_rng_and_attributes():
    cfg = _config(use_cpu_initialization=False)
    seq = SequentialMLP(2, cfg, MLP_SUB)
    w = seq.local_experts[0].linear_fc1.weight
    assert w.allreduce  # EP = 1: ordinary DP reduction, as Megatron
    # initialised on the expert-parallel stream: re-seeding and redrawing there reproduces it
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    with tracker.fork(tensor_parallel.get_expert_parallel_rng_tracker_name()):
        redraw = torch.empty_like(w)
        cfg.init_method(redraw)
    torch.testing.assert_close(redraw, w.detach())


def test_names_megatron_lacks_say_what_to_use():
    with pytest.raises(ImportError, match="SequentialMLP or GroupedMLP"):
        from gigatron.core.transformer.moe import MoEMLP  # noqa: F401
    with pytest.raises(ImportError, match="SequentialMLP or GroupedMLP"):
        from gigatron.core.transformer.moe.experts import MoEMLP  # noqa: F401,F811
    with pytest.raises(AttributeError):
        experts_mod.NoSuchThing  # noqa: B018


def test_config_errors_name_field_and_rule():
    with pytest.raises(ValueError, match="moe_router_enable_expert_bias"):
        MoELayer(
            _config(moe_router_enable_expert_bias=True),
            MoESubmodules(experts=ModuleSpec(module=SequentialMLP, submodules=MLP_SUB)),
        )
    with pytest.raises(ValueError, match="sinkhorn"):
        MoELayer(
            _config(moe_router_load_balancing_type="sinkhorn"),
            MoESubmodules(experts=ModuleSpec(module=SequentialMLP, submodules=MLP_SUB)),
        )
    with pytest.raises(ValueError, match="GroupedMLP has no bias"):
        GroupedMLP(4, _config(add_bias_linear=True))


def test_expert_bias_with_expert_tensor_parallelism_is_refused_naming_megatrons_sum():
    from gigatron.core.transformer.moe._checks import check_moe_config

    with pytest.raises(ValueError, match=r"expert_tensor_parallel_size 4: gigatron refuses"):
        check_moe_config(_config(add_bias_linear=True), ep_size=1, etp_size=4)
    check_moe_config(_config(add_bias_linear=True), ep_size=1, etp_size=1)


def test_moe_layer_freq_pattern():
    assert moe_utils.get_moe_layer_pattern(_config(num_layers=4, moe_layer_freq=2)) == [1, 0, 1, 0]
    assert moe_utils.get_moe_layer_pattern(_config(num_layers=3, moe_layer_freq=[0, 1, 1])) == [
        0,
        1,
        1,
    ]
    with pytest.raises(ValueError, match="moe_layer_freq"):
        moe_utils.get_moe_layer_pattern(_config(num_layers=3, moe_layer_freq=[1, 0]))


def test_permute_unpermute_round_trip_with_probs():
    tokens = torch.arange(8.0).view(4, 2)
    rmap = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    probs = torch.rand(4, 3) * rmap
    permuted, pprobs, idx = moe_utils.permute(tokens, rmap, probs)
    assert idx.tolist() == [0, 2, 1, 2, 0, 3]  # expert-major, token order inside an expert
    torch.testing.assert_close(pprobs, probs.t()[rmap.t()])
    back = moe_utils.unpermute(permuted, idx, tokens.shape)
    torch.testing.assert_close(back, tokens * rmap.sum(1, keepdim=True))
    weighted = moe_utils.unpermute(permuted, idx, tokens.shape, probs=probs, routing_map=rmap)
    torch.testing.assert_close(weighted, tokens * probs.sum(1, keepdim=True))


@pytest.mark.parametrize("dispatcher", ["allgather", "alltoall"])
@pytest.mark.parametrize("pad", [False, True])
def test_moe_layer_with_capacity_dropping_and_padding(dispatcher, pad):
    cfg = _config(
        moe_token_dispatcher_type=dispatcher,
        moe_expert_capacity_factor=0.5,
        moe_pad_expert_input_to_capacity=pad,
    )
    spec = ModuleSpec(module=SequentialMLP, submodules=MLP_SUB)
    layer = MoELayer(cfg, MoESubmodules(experts=spec)).eval()
    x = torch.randn(6, 2, 16)
    _, rmap = layer.router(x)
    capacity = 3  # ceil(12 tokens * k=2 / 4 experts * 0.5)
    if pad:
        assert rmap.sum(0).tolist() == [capacity] * 4
    else:
        assert (rmap.sum(0) <= capacity).all() and rmap.sum() < 24  # some tokens dropped
    out, _ = layer(x)
    with torch.no_grad():
        ref = _reference(layer, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
