"""A Mixtral-style gigatron GPTModel reproduces transformers' MixtralForCausalLM logits (fp32,
<= 1e-5) from the same random weights mapped through hf_mapping_moe, with SequentialMLP and
GroupedMLP experts, through the local and the fast spec; the mapping inverts exactly."""

import pytest
import torch

from gigatron.core.models.common.tp_state_dict import load_full_state_dict
from gigatron.core.models.gpt import hf_mapping_moe
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from tests._one_rank import one_rank_fixtures

transformers = pytest.importorskip("transformers")


gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)


def _hf_model():
    torch.manual_seed(3)
    hf_cfg = transformers.MixtralConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=24,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=96,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    hf = transformers.MixtralForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # HF's 0.02-std init makes routing and experts nearly invisible
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    return hf_cfg, hf


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("spec_fn", [get_gpt_layer_local_spec, get_gpt_layer_fast_spec])
def test_mixtral_logits_match_transformers(grouped, spec_fn):
    hf_cfg, hf = _hf_model()
    config, model_kwargs = hf_mapping_moe.mixtral_config_to_transformer_config(
        hf_cfg, use_cpu_initialization=True, moe_grouped_gemm=grouped
    )
    spec = spec_fn(num_experts=config.num_moe_experts, moe_grouped_gemm=grouped)
    model = GPTModel(config, spec, **model_kwargs).eval()
    sd = hf_mapping_moe.mixtral_to_megatron(hf.state_dict(), 2, 4, 2, grouped=grouped)
    load_full_state_dict(model, sd)

    ids = torch.randint(0, 96, (2, 16))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        ours = model(ids, None, attention_mask=None)
        _, routing_map = model.decoder.layers[0].mlp.router(torch.randn(16, 2, 32))
    assert routing_map.sum(0).min() > 0  # every expert is used: the test sees all of them
    err = (ours - ref).abs().max().item()
    assert err <= 1e-5, err
    back = hf_mapping_moe.megatron_to_mixtral(dict(model.state_dict()), 2, 4, 2, 4)
    for key, value in hf.state_dict().items():
        torch.testing.assert_close(back[key], value, rtol=0, atol=0)


def test_localize_experts_keeps_this_ranks_experts():
    sd = {
        f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc1.weight": torch.full((1,), e)
        for e in range(4)
    }
    sd["decoder.layers.0.mlp.router.weight"] = torch.zeros(1)
    local = hf_mapping_moe.localize_experts(sd, 4, 2, 1)
    assert local["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"].item() == 2
    assert local["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"].item() == 3
    assert len(local) == 3
