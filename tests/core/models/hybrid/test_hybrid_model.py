"""HybridModel on one process: Megatron's checkpoint keys (per-layer, TE names for the fused
norms, in_proj / conv split), MambaModel's deprecated keyword, refusals by name, and cached
generation (Mamba conv/SSM states + attention KV cache) equal to the full forward."""

import pytest
import torch

from gigatron.core.dist_checkpointing.mapping import apply_factories
from gigatron.core.inference import StaticInferenceContext
from gigatron.core.models.hybrid import HybridModel
from gigatron.core.models.hybrid.hybrid_layer_specs import hybrid_stack_spec
from gigatron.core.models.mamba import MambaModel
from gigatron.core.transformer import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=5)
V = 64


def _model(pattern="M*M-", cls=HybridModel, **kw):
    cfg = TransformerConfig(
        num_layers=4, hidden_size=32, num_attention_heads=4, mamba_num_heads=8, mamba_head_dim=8,
        mamba_num_groups=2, mamba_state_dim=16, add_bias_linear=False, normalization="RMSNorm",
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        is_hybrid_model=True,
    )  # fmt: skip
    spec = {"mamba_stack_spec" if cls is MambaModel else "hybrid_stack_spec": hybrid_stack_spec}
    return cls(config=cfg, vocab_size=V, max_sequence_length=16, hybrid_layer_pattern=pattern,
               **spec, **kw)  # fmt: skip


def test_checkpoint_keys_are_megatrons():
    sharded = _model().sharded_state_dict()
    apply_factories(sharded)
    keys = set()
    for value in sharded.values():
        keys |= {t.key for t in (value if isinstance(value, list) else [value])}
    keys = {k for k in keys if "_extra_state" not in k}
    mamba = {f"mixer.in_proj.weight.{p}" for p in "z x B C dt".split()} | {
        f"mixer.conv1d.{w}.{p}" for w in ("weight", "bias") for p in "xBC"
    } | {"mixer.A_log", "mixer.D", "mixer.dt_bias", "mixer.norm.weight", "mixer.out_proj.weight",
         "mixer.in_proj.layer_norm_weight"}  # fmt: skip
    expected = {f"decoder.layers.{i}.{k}" for i in (0, 2) for k in mamba} | {
        "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight",
        "decoder.layers.1.self_attention.linear_qkv.weight",
        "decoder.layers.1.self_attention.linear_proj.weight",
        "decoder.layers.3.mlp.linear_fc1.layer_norm_weight",
        "decoder.layers.3.mlp.linear_fc1.weight",
        "decoder.layers.3.mlp.linear_fc2.weight",
        "decoder.final_norm.weight",
        "embedding.word_embeddings.weight",
        "output_layer.weight",
    }
    assert keys == expected


def test_mamba_model_takes_the_deprecated_spec_keyword_and_refusals_name_the_rule():
    assert isinstance(_model(cls=MambaModel), HybridModel)
    with pytest.raises(ValueError, match="hybrid_override_pattern and hybrid_layer_pattern"):
        _model(hybrid_override_pattern="MM")
    with pytest.raises(ValueError, match=r"'G' \(Gated DeltaNet layer\) is not implemented"):
        _model("MG")
    with pytest.raises(ValueError, match="MTP patterns"):
        _model("M*/MM")


def test_cached_generation_equals_full_forward():
    model = _model(position_embedding_type="rope").eval()
    tokens = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, None, None)
    ctx = StaticInferenceContext(max_batch_size=2, max_sequence_length=10)
    ctx.materialize_only_last_token_logits = False
    with torch.no_grad():
        for start, end in [(0, 6), (6, 7), (7, 10)]:
            got = model(tokens[:, start:end], None, None, inference_context=ctx)
            ctx.increment_sequence_len_offset(end - start)
            torch.testing.assert_close(got, full[:, start:end], rtol=1e-5, atol=1e-5)
