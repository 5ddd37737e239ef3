"""GPTModel reproduces transformers' GPT2LMHeadModel and LlamaForCausalLM logits (fp32, <= 1e-5)
from the same random weights mapped through gigatron.core.models.gpt.hf_mapping."""

import tempfile

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.common.tp_state_dict import load_full_state_dict
from gigatron.core.models.gpt import hf_mapping
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def gloo_world():
    """A one-process gloo world for this module, torn down after it (other tests expect none)."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def single_rank():
    """A one-process gloo world with TP = PP = 1, as Megatron's tests set up."""
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    yield
    parallel_state.destroy_model_parallel()


def _randomize_norms(model):
    """HF inits norms to 1/0; random values make the mapping of norm weights observable."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("weight") else 0.0))


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
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    _randomize_norms(hf)
    config, model_kwargs = hf_mapping.gpt2_config_to_transformer_config(
        hf_cfg, use_cpu_initialization=True
    )
    model = GPTModel(config, spec_fn(), **model_kwargs).eval()
    sd = hf_mapping.gpt2_to_megatron(hf.state_dict(), config.num_layers, config.num_attention_heads)
    load_full_state_dict(model, sd)

    ids = torch.randint(0, 96, (2, 16))
    pos = torch.arange(16)[None].expand(2, -1)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        ours = model(ids, pos, attention_mask=None)
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
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    _randomize_norms(hf)
    config, model_kwargs = hf_mapping.llama_config_to_transformer_config(
        hf_cfg, use_cpu_initialization=True
    )
    assert model_kwargs["rotary_base"] == 5000.0
    model = GPTModel(config, spec_fn(), **model_kwargs).eval()
    sd = hf_mapping.llama_to_megatron(hf.state_dict(), 2, 8, 2)
    load_full_state_dict(model, sd)

    ids = torch.randint(0, 96, (2, 16))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        ours = model(ids, None, attention_mask=None)
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
    hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    _randomize_norms(hf)
    config, model_kwargs = hf_mapping.qwen3_config_to_transformer_config(
        hf_cfg, use_cpu_initialization=True
    )
    assert config.kv_channels == 16 and model_kwargs["share_embeddings_and_output_weights"]
    model = GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=True), **model_kwargs).eval()
    hf_sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    load_full_state_dict(model, hf_mapping.llama_to_megatron(hf_sd, 2, 4, 2))
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        err = (model(ids, None, None) - hf(input_ids=ids).logits).abs().max().item()
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
