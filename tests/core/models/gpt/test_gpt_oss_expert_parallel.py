"""GPT-OSS's MoE pieces at EP = 2 (2 ranks, DP = 2, DDP): biased router and experts (fc1 and the
prob-weighted fc2 bias), clamped quick GEGLU with offset 1, plus windowed / full layers and
learnable sinks, give the one-rank EP = 1 run's losses and every main_grad (fp32)."""

import dataclasses

import pytest
import torch

from gigatron.core.activations import quick_gelu
from gigatron.testing import run_distributed
from tests.core.models.gpt import test_moe_expert_parallel as ep_case
from tests.core.models.gpt._moe_cases import moe_gpt_config

pytestmark = pytest.mark.multirank

GPT_OSS = dict(
    activation_func=quick_gelu, glu_linear_offset=1.0, activation_func_clamp_value=0.5,
    add_bias_linear=True, window_size=(3, 0), window_attn_skip_freq=2, softmax_type="learnable",
)  # fmt: skip


def _gpt_oss_config(num_layers, **layout):
    base = moe_gpt_config(num_layers, **layout)
    return dataclasses.replace(base, moe_layer_freq=1, **GPT_OSS)


def _run(ep):
    ep_case.moe_gpt_config = _gpt_oss_config  # this module's config in the shared EP recipe
    return ep_case._run(ep)


def test_gpt_oss_moe_ep2_matches_one_rank():
    ((ref_losses, ref_grads),) = run_distributed(_run, 1, args=(1,), timeout=180)
    results = run_distributed(_run, 2, args=(2,), timeout=180)
    losses = [results[0][0][0], results[1][0][0]]
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= 1e-6
    seen = set()
    for _, grads in results:
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)
            seen.add(name)
    assert seen == set(ref_grads)
    biases = [n for n in ref_grads if "local_experts" in n and n.endswith("bias")]
    assert biases and all(ref_grads[n].abs().sum() > 0 for n in biases)
    assert any("softmax_offset" in n for n in ref_grads)
