"""DeepSeek-V2 / V3 (multi-latent attention + MoE with shared experts) through `gigatron convert`.

Tiny random-weight models built by `transformers` (V2: plain RoPE, softmax router; V3: YaRN RoPE,
sigmoid router with e_score_correction_bias, group-limited top-k, routed_scaling_factor; both
with a leading dense layer (first_k_dense_replace) and shared experts) are converted to a
gigatron checkpoint, loaded into a GPTModel and must give transformers' logits (fp32, <= 1e-5);
the checkpoint converted back is bitwise the original safetensors. Settings Megatron computes
differently are refused by name.
"""

import argparse

import pytest
import torch

from tests._one_rank import one_rank_fixtures

transformers = pytest.importorskip("transformers")
gloo_world, single_rank = one_rank_fixtures()
VOCAB, B, S = 100, 2, 16


def deepseek_hf_config(family: str) -> dict:
    """Tiny DeepSeek config kwargs: hidden 32, 4 heads, 2 layers (dense, MoE), 4 experts."""
    cfg = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
        max_position_embeddings=64, routed_scaling_factor=2.5, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    if family == "deepseek_v3":  # YaRN with both mscales; groups of 2 experts, 1 group per token
        cfg.update(n_group=2, topk_group=1)
        cfg["rope_parameters"] = dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
            beta_fast=32, beta_slow=1, mscale=0.9, mscale_all_dim=0.7,
        )  # fmt: skip
    return cfg


def make_deepseek_model(family: str, path: str, seed: int = 0):
    """Save a random DeepSeek model to `path` (norms, router and its bias randomised) and
    return it."""
    cls = {"deepseek_v2": "DeepseekV2", "deepseek_v3": "DeepseekV3"}[family]
    config = getattr(transformers, cls + "Config")(**deepseek_hf_config(family))
    torch.manual_seed(seed)
    model = getattr(transformers, cls + "ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms: not all ones, so a wrong mapping shows
                p.copy_(torch.randn_like(p) * 0.1 + 1.0)
            elif name.endswith("mlp.gate.weight"):  # spread routing scores over experts
                p.normal_(0.0, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_deepseek_convert_logits_and_bitwise_export(family, tmp_path):
    from gigatron.convert import (
        convert_gigatron_to_hf,
        convert_hf_to_gigatron,
        read_hf_config,
        spec_from_hf_config,
    )
    from gigatron.convert.hf_io import HFReader
    from gigatron.training.checkpointing import load_checkpoint

    hf_dir, ckpt, back = str(tmp_path / "hf"), str(tmp_path / "gt"), str(tmp_path / "back")
    hf = make_deepseek_model(family, hf_dir)
    ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    convert_hf_to_gigatron(hf_dir, ckpt)
    model = spec_from_hf_config(read_hf_config(hf_dir)).build_model().eval()
    load_checkpoint([model], None, None, args=argparse.Namespace(load=ckpt))
    with torch.no_grad():
        got = model(ids, None, None)[..., :VOCAB]
    err = (got - ref).abs().max().item()
    assert err <= 1e-5, f"{family}: max |logits - transformers| = {err}"

    convert_gigatron_to_hf(ckpt, back)
    orig, exported = HFReader(hf_dir), HFReader(back)
    assert sorted(orig.keys()) == sorted(exported.keys())
    for name in orig.keys():
        a, b = orig.get(name), exported.get(name)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


@pytest.mark.parametrize(
    "family, changes, named",
    [
        ("deepseek_v3", {"norm_topk_prob": False}, "norm_topk_prob (False)"),
        ("deepseek_v3", {"rope_interleave": False}, "rope_interleave (False)"),
        ("deepseek_v3", {"n_group": 2, "topk_group": 2}, "num_experts_per_tok // topk_group (1)"),
        ("deepseek_v2", {"num_key_value_heads": 2}, "num_key_value_heads (2)"),
        ("deepseek_v2", {"attention_bias": True}, "attention_bias (True)"),
        (
            "deepseek_v2",
            {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1},
            "num_experts_per_tok // topk_group (2)",
        ),
    ],
)
def test_deepseek_settings_megatron_computes_differently_are_refused(family, changes, named):
    from gigatron.convert import spec_from_hf_config

    cfg = {**deepseek_hf_config(family), "model_type": family, **changes}
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        spec_from_hf_config(cfg)
