"""GPTModel reproduces transformers' GPT2LMHeadModel and LlamaForCausalLM logits (fp32, <= 1e-5)
from the same random weights mapped through gigatron.core.models.gpt.hf_mapping."""

import pytest
import torch

from gigatron.core.models.common.tp_state_dict import load_full_state_dict
from gigatron.core.models.gpt import hf_mapping
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from tests._one_rank import one_rank_fixtures

transformers = pytest.importorskip("transformers")


gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)


def _randomize_norms(model):
    """HF inits norms to 1/0; random values make the mapping of norm weights observable."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("weight") else 0.0))


def _pair(hf_cls, hf_cfg, config_fn, spec):
    """The HF model (random norms) and a gigatron GPTModel with the mapped config, not loaded."""
    hf = hf_cls(hf_cfg).eval()
    _randomize_norms(hf)
    config, model_kwargs = config_fn(hf_cfg, use_cpu_initialization=True)
    return hf, model_kwargs, GPTModel(config, spec, **model_kwargs).eval()


def _logits(hf, model, ids, position_ids=None):
    """(gigatron logits, HF logits), both [b, s, vocab], without grad."""
    with torch.no_grad():
        return model(ids, position_ids, attention_mask=None), hf(input_ids=ids).logits


@pytest.mark.parametrize("spec_fn", [get_gpt_layer_local_spec, get_gpt_layer_fast_spec])
def test_gpt2_logits_match_transformers(spec_fn):
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=96,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf, _, model = _pair(
        transformers.GPT2LMHeadModel,
        hf_cfg,
        hf_mapping.gpt2_config_to_transformer_config,
        spec_fn(),
    )
    config = model.config
    sd = hf_mapping.gpt2_to_megatron(hf.state_dict(), config.num_layers, config.num_attention_heads)
    load_full_state_dict(model, sd)

    ids = torch.randint(0, 96, (2, 16))
    ours, ref = _logits(hf, model, ids, torch.arange(16)[None].expand(2, -1))
    assert ours.shape == ref.shape == (2, 16, 96)
    err = (ours - ref).abs().max().item()
    assert err <= 1e-5, err


@pytest.mark.parametrize("spec_fn", [get_gpt_layer_local_spec, get_gpt_layer_fast_spec])
def test_llama_logits_match_transformers(spec_fn):
    torch.manual_seed(1)
    hf_cfg = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=96,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_theta=5000.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    hf, model_kwargs, model = _pair(
        transformers.LlamaForCausalLM,
        hf_cfg,
        hf_mapping.llama_config_to_transformer_config,
        spec_fn(),
    )
    assert model_kwargs["rotary_base"] == 5000.0
    load_full_state_dict(model, hf_mapping.llama_to_megatron(hf.state_dict(), 2, 8, 2))

    ours, ref = _logits(hf, model, torch.randint(0, 96, (2, 16)))
    err = (ours - ref).abs().max().item()
    assert err <= 1e-5, err
    # The mapping is invertible: gigatron -> HF gives back HF's tensors exactly.
    back = hf_mapping.megatron_to_llama(dict(model.state_dict()), 2, 8, 2)
    for key, value in hf.state_dict().items():
        torch.testing.assert_close(back[key], value, rtol=0, atol=0)


def test_qwen3_qk_norm_and_wide_heads_match_transformers():
    """Qwen3: per-head q/k RMSNorm before RoPE, head_dim (16) != hidden / heads (8)."""
    torch.manual_seed(2)
    hf_cfg = transformers.Qwen3Config(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=48,
        vocab_size=96,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    hf, model_kwargs, model = _pair(
        transformers.Qwen3ForCausalLM,
        hf_cfg,
        hf_mapping.qwen3_config_to_transformer_config,
        get_gpt_layer_local_spec(qk_layernorm=True),
    )
    assert model.config.kv_channels == 16 and model_kwargs["share_embeddings_and_output_weights"]
    hf_sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    load_full_state_dict(model, hf_mapping.llama_to_megatron(hf_sd, 2, 4, 2))
    ours, ref = _logits(hf, model, torch.randint(0, 96, (2, 12)))
    err = (ours - ref).abs().max().item()
    assert err <= 1e-5, err


def test_qkv_layout_is_grouped_per_query_group():
    """Rows [q1 q2 k1 v1 | q3 q4 k2 v2] for 4 heads in 2 groups, head dim 1."""
    q = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    k = torch.tensor([[10.0], [20.0]])
    v = torch.tensor([[100.0], [200.0]])
    fused = hf_mapping.qkv_to_megatron(q, k, v, num_heads=4, num_groups=2)
    assert fused.flatten().tolist() == [1, 2, 10, 100, 3, 4, 20, 200]
    back = hf_mapping.qkv_from_megatron(fused, num_heads=4, num_groups=2)
    for a, b in zip(back, (q, k, v)):
        assert torch.equal(a, b)
