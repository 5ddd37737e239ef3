"""config.json -> gigatron model description: supported settings map, unsupported ones are
ValueErrors naming the key and value."""

import json

import pytest

from gigatron.convert.hf_config import spec_from_hf_config

transformers = pytest.importorskip("transformers")


def _cfg(family, **changes):
    from tests.convert.test_hf_fixtures import hf_config

    cfg = json.loads(hf_config(family).to_json_string())
    cfg.update(changes)
    return cfg


def test_llama_gqa_rope_and_vocab_padding():
    spec = spec_from_hf_config(_cfg("llama"), tensor_model_parallel_size=2)
    c, m = spec.config_kwargs, spec.model_kwargs
    assert (c["num_attention_heads"], c["num_query_groups"], c["kv_channels"]) == (4, 2, 8)
    assert m["rotary_base"] == 5000 and m["position_embedding_type"] == "rope"
    assert (spec.vocab_size, spec.padded_vocab_size) == (100, 256)  # 128 x TP 2
    assert not spec.tied and "--group-query-attention" in spec.training_flags()


def test_llama3_rope_scaling_maps_to_megatron_flags():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    spec = spec_from_hf_config(_cfg("llama", rope_parameters=rope))
    assert spec.model_kwargs["rope_scaling"] is True
    assert spec.model_kwargs["rope_scaling_factor"] == 32.0
    assert spec.model_kwargs["rotary_base"] == 500000


def test_qwen2_has_qkv_bias_only_and_tied_embeddings():
    spec = spec_from_hf_config(_cfg("qwen2"))
    assert spec.config_kwargs["add_qkv_bias"] and not spec.config_kwargs["add_bias_linear"]
    assert spec.tied


def test_mistral_sliding_window_is_window_size_w_minus_one():
    spec = spec_from_hf_config(_cfg("mistral", sliding_window=16))
    assert spec.config_kwargs["window_size"] == (15, 0)
    flags = spec.training_flags()
    assert flags[flags.index("--window-size") + 1] == "15,0"
    full = spec_from_hf_config(_cfg("mistral", sliding_window=None))
    assert "window_size" not in full.config_kwargs


def test_gpt2_tanh_gelu():
    spec = spec_from_hf_config(_cfg("gpt2"))
    assert spec.config_kwargs["activation_func"].keywords == {"approximate": "tanh"}
    assert spec.model_kwargs["position_embedding_type"] == "learned_absolute"


@pytest.mark.parametrize(
    "family, changes, named",
    [
        ("llama", {"model_type": "falcon"}, "model_type ('falcon')"),
        ("mistral", {"sliding_window": 0}, "sliding_window (0)"),
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window (True)"),
        ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "'yarn'"),
        ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                       "high_freq_factor": 2.0}}, "high_freq_factor (2.0)"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act ('gelu')"),
        ("llama", {"attention_bias": True, "mlp_bias": False}, "attention_bias/mlp_bias"),
        ("gpt2", {"activation_function": "relu"}, "activation_function ('relu')"),
        ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise (0.1)"),
    ],
)  # fmt: skip
def test_unsupported_settings_name_key_and_value(family, changes, named):
    with pytest.raises(ValueError) as err:
        spec_from_hf_config(_cfg(family, **changes))
    assert named in str(err.value)
