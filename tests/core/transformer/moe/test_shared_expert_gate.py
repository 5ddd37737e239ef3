"""moe_shared_expert_gate: the shared experts' output times sigmoid(x @ gate_weight^T) per token.

One module: it equals the formula on the plain MLP's output, and the gate weight [1, h] is in
the state dict and the sharded state dict (TP-replicated). Parallel: at EP 2 (x DP 2) and
TP 2 x EP 2 (SP, expert TP 2), with and without moe_shared_expert_overlap, outputs, input grads
and every grad (the gate's summed over TP under SP by finalize_model_grads, averaged over DP)
equal the one-rank twin's (helpers of test_shared_expert_overlap.py). The gate without shared
experts, or a spec's `gate` param contradicting the config, is a ValueError.
"""

import dataclasses

import pytest
import torch

from gigatron.core.transformer.moe.experts import GroupedMLP
from gigatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from gigatron.core.transformer.moe.shared_experts import SharedExpertMLP
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.testing import run_distributed
from tests.core.transformer.moe.test_expert_parallel import MLP_SUB, H, S, _self_groups
from tests.core.transformer.moe.test_shared_expert_overlap import (
    _gate_weight,
    _layer,
    _layout,
    _shared_config,
    _shared_weights,
)

pytestmark = pytest.mark.multirank


def _one_rank():
    self_pg = _self_groups()
    cfg = _shared_config(1, 1, 1, False, gate=True)
    layer = _layer(cfg, self_pg)
    sh = layer.shared_experts
    fc1, fc2 = _shared_weights()
    with torch.no_grad():
        sh.linear_fc1.weight.copy_(fc1)
        sh.linear_fc2.weight.copy_(fc2)
        sh.gate_weight.copy_(_gate_weight())
    x = torch.randn(S, 2, H, generator=torch.Generator().manual_seed(3))
    gate, up = (x @ fc1.t()).chunk(2, dim=-1)
    plain = (torch.nn.functional.silu(gate) * up) @ fc2.t()  # [s, b, h]
    want = plain * torch.sigmoid(x @ _gate_weight().t())  # [s, b, 1] score per token
    torch.testing.assert_close(sh(x), want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(sh(x), plain)  # the gate changes the output
    assert sh.gate_weight.shape == (1, H)
    assert "gate_weight" in sh.state_dict()
    sharded = sh.sharded_state_dict(prefix="mlp.shared_experts.")
    assert sharded["mlp.shared_experts.gate_weight"].global_shape == (1, H)

    no_shared = dataclasses.replace(cfg, moe_shared_expert_intermediate_size=None)
    with pytest.raises(ValueError, match="moe_shared_expert_gate=True needs"):
        _layer(no_shared, self_pg)
    spec = ModuleSpec(module=SharedExpertMLP, params={"gate": False}, submodules=MLP_SUB)
    sub = MoESubmodules(experts=ModuleSpec(module=GroupedMLP), shared_experts=spec)
    with pytest.raises(ValueError, match="must agree"):
        MoELayer(cfg, sub, pg_collection=self_pg)
    off = dataclasses.replace(cfg, moe_shared_expert_gate=False)  # an older spec's gate=False
    assert MoELayer(off, sub, pg_collection=self_pg).shared_experts.gate_weight is None


def _run():
    self_pg = _self_groups()
    return [_layout(1, 2, 1, self_pg, gate=True), _layout(2, 2, 2, self_pg, gate=True)]


def test_gated_shared_experts_apply_the_sigmoid_gate():
    run_distributed(_one_rank, 1, timeout=120)


def test_gated_shared_experts_match_the_twin_at_ep2_and_tp2_sp_ep2():
    reports = run_distributed(_run, 4, timeout=240)
    worst = max(max(r) for r in reports)
    print(f"gated shared experts EP2 / TP2xEP2: worst error / max |value| {worst:.2e}")
    assert worst <= 1e-6
