"""A GPT-OSS-shaped GPTModel (window_size / window_attn_skip_freq 2, learnable sinks, clamped
quick GEGLU with offset 1, biases everywhere incl. the router and the experts) gives
transformers' GptOssForCausalLM logits (tiny random config built offline; fp32, <= 1e-5
relative). The weights are mapped here, in the test (no gpt_oss convert adapter yet): HF's
interleaved gate/up expert columns become Megatron's [gate; up] fc1 rows."""

import pytest
import torch

from gigatron.convert._recipe_ops import qkv_to_megatron
from gigatron.core.activations import quick_gelu
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

transformers = pytest.importorskip("transformers")
gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)

V, H, NH, NG, HN, E, F_, W, L = 96, 32, 4, 2, 8, 4, 16, 4, 2


def _hf_model():
    cfg = transformers.GptOssConfig(
        vocab_size=V, hidden_size=H, intermediate_size=F_, num_hidden_layers=L,
        num_attention_heads=NH, num_key_value_heads=NG, head_dim=HN, num_local_experts=E,
        num_experts_per_tok=2, sliding_window=W, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False,
        attention_dropout=0.0, router_aux_loss_coef=0.0, rms_norm_eps=1e-5,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():  # random everything (HF zero-inits some biases and the sinks)
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def _gigatron_model():
    cfg = TransformerConfig(
        num_layers=L, hidden_size=H, num_attention_heads=NH, num_query_groups=NG, kv_channels=HN,
        ffn_hidden_size=F_, normalization="RMSNorm", layernorm_epsilon=1e-5,
        gated_linear_unit=True, activation_func=quick_gelu, glu_linear_offset=1.0,
        activation_func_clamp_value=7.0, add_bias_linear=True, window_size=(W - 1, 0),
        window_attn_skip_freq=2, softmax_type="learnable", num_moe_experts=E,
        moe_router_topk=2, moe_ffn_hidden_size=F_, moe_router_pre_softmax=False,
        moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="alltoall", hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec(num_experts=E, normalization="RMSNorm")
    return GPTModel(cfg, spec, V, 64, position_embedding_type="rope", rotary_base=10000,
                    share_embeddings_and_output_weights=False)  # fmt: skip


def _mapped(hf_sd):
    out = {"embedding.word_embeddings.weight": hf_sd["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf_sd["model.norm.weight"],
           "output_layer.weight": hf_sd["lm_head.weight"]}  # fmt: skip
    for i in range(L):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        a, s = f"{h}self_attn.", f"{g}self_attention."
        out[f"{g}input_layernorm.weight"] = hf_sd[f"{h}input_layernorm.weight"]
        out[f"{g}pre_mlp_layernorm.weight"] = hf_sd[f"{h}post_attention_layernorm.weight"]
        for b in ("weight", "bias"):
            q, k, v = (hf_sd[f"{a}{n}_proj.{b}"] for n in "qkv")
            out[f"{s}linear_qkv.{b}"] = qkv_to_megatron(q, k, v, NH, NG)
            out[f"{s}linear_proj.{b}"] = hf_sd[f"{a}o_proj.{b}"]
        out[f"{s}core_attention.softmax_offset"] = hf_sd[f"{a}sinks"]
        m = f"{h}mlp."
        out[f"{g}mlp.router.weight"] = hf_sd[f"{m}router.weight"]
        out[f"{g}mlp.router.bias"] = hf_sd[f"{m}router.bias"]
        for e in range(E):
            x = f"{g}mlp.experts.local_experts.{e}."
            w1 = hf_sd[f"{m}experts.gate_up_proj"][e].t()  # [2f, h], rows gate, up, gate, ...
            b1 = hf_sd[f"{m}experts.gate_up_proj_bias"][e]
            out[f"{x}linear_fc1.weight"] = torch.cat([w1[0::2], w1[1::2]])
            out[f"{x}linear_fc1.bias"] = torch.cat([b1[0::2], b1[1::2]])
            out[f"{x}linear_fc2.weight"] = hf_sd[f"{m}experts.down_proj"][e].t()
            out[f"{x}linear_fc2.bias"] = hf_sd[f"{m}experts.down_proj_bias"][e]
    return out


def test_gpt_oss_logits_equal_transformers():
    hf = _hf_model()
    model = _gigatron_model().eval()
    mapped = _mapped(hf.state_dict())
    assert set(mapped) == {n for n, _ in model.named_parameters()}
    model.load_state_dict(mapped, strict=False)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits  # [b, s, v]
        got = model(ids, None, None)
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    print(f"GPT-OSS: max |logits - transformers| / max |logits| = {err:.2e}")
    assert err <= 1e-5, err
    # the windowed layer matters: full attention on both layers gives other logits
    hf.config.layer_types = ["full_attention", "full_attention"]
    for layer in hf.model.layers:
        layer.self_attn.sliding_window = None
        layer.attention_type = "full_attention"
    with torch.no_grad():
        assert (hf(input_ids=ids).logits - ref).abs().max() > 1e-3
