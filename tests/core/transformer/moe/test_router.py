"""TopKRouter: aux loss / seq aux loss / z-loss equal hand-computed values for a fixed routing
(and inject their exact gradients), imbalance costs more than balance, the expert bias moves the
routing toward balance, capacity dropping and padding, score functions."""

import math

import pytest
import torch

from gigatron.core.transformer.moe import moe_utils
from gigatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
from gigatron.core.transformer.moe.router import TopKRouter
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()


@pytest.fixture(autouse=True)
def moe_state():
    moe_utils.get_moe_layer_wise_logging_tracker().clear()
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0))


def _config(**kw):
    base = dict(
        num_layers=2,
        hidden_size=8,
        num_attention_heads=2,
        num_moe_experts=4,
        moe_router_topk=1,
        add_bias_linear=False,
        use_cpu_initialization=True,
    )
    base.update(kw)
    return TransformerConfig(**base)


def _router(**kw):
    router = TopKRouter(_config(**kw))
    router.set_layer_number(2)
    return router.train()


def _tracked(name):
    return moe_utils.get_moe_layer_wise_logging_tracker()[name]["values"][1].item()


BALANCED = [[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 2.0, 0], [0, 0, 0, 2.0]]
IMBALANCED = [[2.0, 0, 0, 0]] * 4


def _hand_aux(logits, k, coeff):
    """E * coeff / (k T^2) * sum_e (sum_t softmax[t, e]) * (tokens routed to e)."""
    t_count, e_count = logits.shape
    scores = torch.softmax(logits, dim=-1)
    counts = torch.zeros(e_count)
    for t in range(t_count):
        for e in torch.topk(scores[t], k).indices.tolist():
            counts[e] += 1
    return e_count * coeff / (k * t_count**2) * (scores.sum(0) * counts).sum()


def test_aux_loss_matches_hand_value_and_gradient():
    coeff = 0.01
    router = _router(moe_aux_loss_coeff=coeff)
    logits = torch.tensor(BALANCED).view(4, 1, 4).requires_grad_()
    probs, routing_map = router.routing(logits)
    # balanced, k = 1: every expert gets one token and its scores sum to 1 -> aux / coeff = 1
    assert _tracked("load_balancing_loss") == pytest.approx(1.0, abs=1e-6)
    assert routing_map.sum(0).tolist() == [1, 1, 1, 1]
    # backward through probs with zero upstream grad leaves exactly d(aux)/d(logits)
    (probs * 0).sum().backward()
    ref_logits = torch.tensor(BALANCED).requires_grad_()
    (expected,) = torch.autograd.grad(_hand_aux(ref_logits, 1, coeff), ref_logits)
    torch.testing.assert_close(logits.grad.view(4, 4), expected, rtol=1e-6, atol=1e-8)


def test_imbalanced_routing_costs_more_than_balanced():
    router = _router(moe_aux_loss_coeff=1.0)
    router.routing(torch.tensor(IMBALANCED).view(4, 1, 4))
    imbalanced = _tracked("load_balancing_loss")
    e2 = math.exp(2.0)
    # all 4 tokens on expert 0: 4 / 16 * 4 * (4 e^2 / (e^2 + 3)) = 4 e^2 / (e^2 + 3)
    assert imbalanced == pytest.approx(4 * e2 / (e2 + 3), rel=1e-6)
    assert imbalanced > 1.0  # the balanced value (previous test)


def test_seq_aux_loss_is_mean_of_per_sequence_losses():
    coeff, s, b = 0.1, 4, 2
    router = _router(
        moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=coeff, moe_router_topk=2
    )
    torch.manual_seed(0)
    logits = torch.randn(s, b, 4)
    router.routing(logits)
    per_seq = [_hand_aux(logits[:, j], 2, coeff) for j in range(b)]
    expected = sum(per_seq) / b / coeff
    assert _tracked("seq_load_balancing_loss") == pytest.approx(expected.item(), rel=1e-6)


def test_z_loss_matches_hand_value_and_gradient():
    coeff = 0.001
    router = _router(moe_aux_loss_coeff=0.0, moe_z_loss_coeff=coeff)
    torch.manual_seed(1)
    logits = torch.randn(3, 2, 4, requires_grad=True)
    probs, _ = router.routing(logits)
    flat = logits.detach().view(6, 4)
    hand = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in flat.tolist()) / 6
    assert _tracked("z_loss") == pytest.approx(hand, rel=1e-6)
    (probs * 0).sum().backward()
    ref = flat.clone().requires_grad_()
    (expected,) = torch.autograd.grad(coeff * torch.logsumexp(ref, -1).square().mean(), ref)
    torch.testing.assert_close(logits.grad.view(6, 4), expected, rtol=1e-6, atol=1e-9)


def test_aux_loss_gradient_follows_the_loss_scale():
    router = _router(moe_aux_loss_coeff=0.01)
    grads = []
    for scale in (1.0, 0.25):
        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale))
        logits = torch.tensor(IMBALANCED).view(4, 1, 4).requires_grad_()
        probs, _ = router.routing(logits)
        (probs * 0).sum().backward()
        grads.append(logits.grad)
    torch.testing.assert_close(grads[1], grads[0] * 0.25)


def test_no_aux_loss_in_eval_or_with_none():
    router = _router(moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0)
    router.routing(torch.tensor(IMBALANCED).view(4, 1, 4))
    assert "load_balancing_loss" not in moe_utils.get_moe_layer_wise_logging_tracker()


def test_softmax_variants_and_sigmoid_probs():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    probs, rmap = moe_utils.topk_routing_with_score_function(logits, 2)
    top = torch.softmax(torch.tensor([3.0, 2.0]), 0)
    assert rmap.tolist() == [[False, True, True, False]]
    torch.testing.assert_close(probs[0, [1, 2]], top)
    pre, _ = moe_utils.topk_routing_with_score_function(logits, 2, use_pre_softmax=True)
    torch.testing.assert_close(pre[0, [1, 2]], torch.softmax(logits[0], 0)[[1, 2]])
    sig, _ = moe_utils.topk_routing_with_score_function(logits, 2, score_function="sigmoid")
    s = torch.sigmoid(torch.tensor([3.0, 2.0]))
    torch.testing.assert_close(sig[0, [1, 2]], s / s.sum())
    # group-limited: groups {0,1} {2,3}; best group by top-1 score is {0,1} -> experts 1 then 0
    _, gmap = moe_utils.topk_routing_with_score_function(
        logits, 2, num_groups=2, group_topk=1, use_pre_softmax=True
    )
    assert gmap.tolist() == [[True, True, False, False]]


def test_expert_bias_moves_toward_balance():
    cfg_kw = dict(
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_bias_update_rate=0.02,
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
    )
    router = _router(**cfg_kw)
    torch.manual_seed(2)
    logits = torch.randn(32, 1, 4) * 0.3
    logits[..., 0] += 1.0  # expert 0 is everyone's favourite
    cfg = router.config

    def spread():
        _, rmap = router.routing(logits)
        counts = rmap.sum(0).float()
        return (counts.max() - counts.min()).item(), counts

    before, counts0 = spread()
    moe_utils.update_router_expert_bias([router], cfg)
    bias = router.expert_bias.clone()
    assert bias[0] < 0 and (bias[1:] > 0).all()  # overloaded expert penalised, others helped
    assert counts0[0] == 32
    for _ in range(60):
        spread()
        moe_utils.update_router_expert_bias([router], cfg)
    after, _ = spread()
    assert before == 32 and after <= 8, (before, after)
    assert router.local_tokens_per_expert.sum() == 32  # counts reset by each update


def test_capacity_dropping_policies_and_padding():
    probs = torch.tensor([[0.9, 0.0], [0.6, 0.0], [0.95, 0.0], [0.7, 0.0]])
    rmap = probs > 0
    # capacity = ceil(4 tokens * k=1 / 2 experts * 1.0) = 2
    p, m = moe_utils.apply_router_token_dropping(probs, rmap, 1, 1.0, "probs")
    assert m[:, 0].tolist() == [True, False, True, False] and not m[:, 1].any()
    p, m = moe_utils.apply_router_token_dropping(probs, rmap, 1, 1.0, "position")
    assert m[:, 0].tolist() == [True, True, False, False]
    p, m = moe_utils.apply_router_token_dropping(probs, rmap, 1, 1.0, "position", True)
    assert m.sum(0).tolist() == [2, 2]  # expert 1 padded with two zero-probability fillers
    assert p[:, 1].abs().sum() == 0
    p, m = moe_utils.apply_router_token_dropping(probs, rmap, 1, 1.0, "probs", True)
    assert m.sum(0).tolist() == [2, 2] and p[:, 1].abs().sum() == 0


def test_router_capacity_inside_routing():
    router = _router(
        moe_expert_capacity_factor=1.0,
        moe_aux_loss_coeff=0.0,
        moe_router_load_balancing_type="none",
    )
    _, rmap = router.routing(torch.tensor(IMBALANCED).view(4, 1, 4))
    assert rmap.sum(0).tolist() == [1, 0, 0, 0]  # capacity ceil(4/4 * 1.0) = 1


def test_aux_loss_gradient_under_torch_compile():
    """The router's aux loss compiled with fullgraph (as compile_transformer_layers does; the
    backward read the scale from the autograd.Function's class, which dynamo cannot trace), the
    scale set before the forward as gigatron's schedules do: the compiled grads equal eager's.
    (Set only after the forward, as Megatron's schedules do, a compiled graph may have used the
    old value: the partitioner can move d(aux), independent of the output grad, forward.)"""
    router = _router(moe_aux_loss_coeff=0.01)

    def run(fn, scale):
        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale))
        logits = torch.tensor(IMBALANCED).view(4, 1, 4).requires_grad_()
        (fn(logits) * 0).sum().backward()
        return logits.grad

    compiled = torch.compile(lambda x: router.routing(x)[0], fullgraph=True, backend="aot_eager")
    for scale in (0.25, 3.0):
        want = run(lambda x: router.routing(x)[0], scale)
        torch.testing.assert_close(run(compiled, scale), want, rtol=1e-6, atol=0)
        assert want.abs().sum() > 0  # the aux loss does reach the logits
