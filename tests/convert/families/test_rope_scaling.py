"""Llama `rope_scaling` types Hugging Face writes, on one rank: transformers' LlamaForCausalLM
logits (fp32, <= 1e-5 relative) from the converted GPTModel, for each type gigatron maps
(`linear` -> Megatron's seq_len_interpolation_factor; `llama3` -> rope_scaling /
rope_scaling_factor), each at positions where the scaling changes the logits (checked against
the unscaled model); the types and settings it cannot reproduce are one-line errors."""

import pytest
import torch

from tests._one_rank import one_rank_fixtures

transformers = pytest.importorskip("transformers")
gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)
B, S, VOCAB = 2, 48, 100

ROPES = {
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
}  # fmt: skip


def _llama(rope: dict | None, path=None):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.2,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    if path is not None:
        model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_rope_scaling_logits_match_transformers(kind, tmp_path, single_rank):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config

    hf = _llama(ROPES[kind], str(tmp_path))
    spec = spec_from_hf_config(read_hf_config(str(tmp_path)))
    model = spec.build_model().eval()
    load_hf_into_model([model], str(tmp_path))
    ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        unscaled = _llama(None)(input_ids=ids).logits  # same seed: same weights
        ours = model(ids, None, attention_mask=None)[..., :VOCAB]
    scale = ref.abs().max()
    assert ((unscaled - ref).abs().max() / scale).item() > 1e-3  # the scaling matters here
    err = ((ours - ref).abs().max() / scale).item()
    print(f"{kind}: relative max |logits - transformers| = {err:.1e}")
    assert err <= 1e-5, f"{kind}: relative max |logits - transformers| = {err}"


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "rope_type ('dynamic')"),
        ({"rope_type": "longrope", "factor": 2.0}, "rope_type ('longrope')"),
        ({**ROPES["llama3"], "original_max_position_embeddings": 4096},
         "original_max_position_embeddings"),
    ],
)  # fmt: skip
def test_unsupported_rope_scaling_is_a_one_line_error(rope, message):
    from gigatron.convert import spec_from_hf_config

    cfg = dict(
        model_type="llama", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
        intermediate_size=48, vocab_size=VOCAB, max_position_embeddings=64,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )  # fmt: skip
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        spec_from_hf_config(cfg)
    assert "\n" not in str(e.value)
