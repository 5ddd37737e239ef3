"""Multi-latent attention pieces without processes: the config's rules, YaRN frequencies and
scale against transformers' `yarn` rope, the static KV cache (cached decoding equals the full
forward, cache shaped [s, b, np, qhd] / [s, b, np, vhd]), and the refusals of the forward.
(Logits against transformers' DeepSeek-V2/V3 and TP/SP/CP parity: tests/convert/test_deepseek_*.)
"""

import pytest
import torch

from gigatron.core.inference import StaticInferenceContext
from gigatron.core.models.common.embeddings import YarnRotaryEmbedding
from gigatron.core.models.gpt import GPTModel
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.transformer import MLATransformerConfig, TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=11)
V = 64
MLA = dict(
    num_layers=2, hidden_size=32, num_attention_heads=4, q_lora_rank=16, kv_lora_rank=16,
    qk_head_dim=8, qk_pos_emb_head_dim=8, v_head_dim=12, hidden_dropout=0.0,
    attention_dropout=0.0, add_bias_linear=False, qk_layernorm=True, rotary_scaling_factor=4.0,
    original_max_position_embeddings=8, mscale=0.9, mscale_all_dim=0.7,
    use_cpu_initialization=True,
)  # fmt: skip


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"rope_type": "ntk"}, "rope_type ('ntk')"),
        ({"qk_pos_emb_head_dim": 7}, "qk_pos_emb_head_dim (7)"),
        ({"kv_lora_rank": 0}, "kv_lora_rank (0)"),
        ({"cache_mla_latents": True}, "cache_mla_latents=True"),
    ],
)
def test_mla_config_rules_name_the_field(changes, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        MLATransformerConfig(**{**MLA, **changes})


def test_plain_config_refuses_mla_and_mla_defaults_follow_megatron():
    with pytest.raises(ValueError, match="needs MLATransformerConfig"):
        TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                          multi_latent_attention=True)  # fmt: skip
    cfg = MLATransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4)
    assert (cfg.multi_latent_attention, cfg.normalization, cfg.rope_type) == (
        True, "RMSNorm", "yarn",
    )  # fmt: skip


def test_yarn_frequencies_and_scale_match_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, beta_fast=32, beta_slow=1,
                original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)  # fmt: skip
    hf = transformers.DeepseekV3Config(qk_rope_head_dim=64, rope_parameters=rope)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    ours = YarnRotaryEmbedding(64, scaling_factor=40.0, original_max_position_embeddings=4096,
                               mscale=1.0, mscale_all_dim=1.0)  # fmt: skip
    torch.testing.assert_close(ours.inv_freq, inv_freq, rtol=1e-6, atol=0)
    assert ours.mscale == pytest.approx(attention_factor)
    emb, mscale = ours(5)
    assert emb.shape == (5, 1, 1, 64) and mscale == pytest.approx(attention_factor)


def _mla_model(**changes):
    cfg = MLATransformerConfig(**{**MLA, **changes})
    return GPTModel(
        cfg, get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=True),
        vocab_size=V, max_sequence_length=16, position_embedding_type="rope",
    ).eval()  # fmt: skip


@pytest.mark.parametrize("q_lora_rank, rope_type", [(16, "yarn"), (None, "rope")])
def test_cached_decoding_equals_full_forward(q_lora_rank, rope_type):
    model = _mla_model(q_lora_rank=q_lora_rank, rope_type=rope_type)
    assert getattr(model, "rotary_pos_emb", None) is None  # MLA applies its own RoPE
    tokens = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, None, None)
    ctx = StaticInferenceContext(max_batch_size=2, max_sequence_length=10)
    ctx.materialize_only_last_token_logits = False
    with torch.no_grad():
        for start, end in [(0, 6), (6, 7), (7, 10)]:
            got = model(tokens[:, start:end], None, None, inference_context=ctx)
            ctx.increment_sequence_len_offset(end - start)
            torch.testing.assert_close(got, full[:, start:end], rtol=0, atol=1e-5)
    key, value = ctx.key_value_memory_dict[1]
    assert key.shape == (10, 2, 4, 16) and value.shape == (10, 2, 4, 12)


def test_mla_forward_refuses_outside_rotary_and_packing():
    attn = _mla_model().decoder.layers[0].self_attention
    x = torch.zeros(4, 1, 32)
    with pytest.raises(ValueError, match="builds its own RoPE"):
        attn(x, None, rotary_pos_emb=torch.zeros(4, 1, 1, 8))
    with pytest.raises(ValueError, match="packed_seq_params"):
        attn(x, None, packed_seq_params=object())
