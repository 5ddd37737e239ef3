"""MambaMixer on one process against transformers' Mamba2Mixer (its pure-PyTorch path) with the
same weights: output, input grad and every weight grad (fp32, 1e-5), chunked and unchunked; the
config fields and the mixer's rules; the static inference state (prefill + decode equal the full
forward)."""

import pytest
import torch

from gigatron.core.inference import StaticInferenceContext
from gigatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
from gigatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from gigatron.core.transformer import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=3)
H, HEADS, P, G, N = 32, 8, 8, 2, 16  # hidden, heads, head dim, groups, state dim
TOL = dict(rtol=1e-5, atol=1e-5)
SPEC = MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)


def _config(**changes):
    fields = dict(num_layers=1, hidden_size=H, num_attention_heads=4, mamba_num_heads=HEADS,
                  mamba_head_dim=P, mamba_num_groups=G, mamba_state_dim=N, add_bias_linear=False,
                  use_cpu_initialization=True)  # fmt: skip
    return TransformerConfig(**{**fields, **changes})


def _hf_mixer(chunk_size):
    transformers = pytest.importorskip("transformers")
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    cfg = transformers.Mamba2Config(
        hidden_size=H, num_heads=HEADS, head_dim=P, n_groups=G, state_size=N, expand=2,
        conv_kernel=4, chunk_size=chunk_size, use_bias=False, use_conv_bias=True,
        layer_norm_epsilon=1e-5, num_hidden_layers=1,
    )  # fmt: skip
    torch.manual_seed(0)
    return Mamba2Mixer(cfg, layer_idx=0)


def _ours_from_hf(hf, chunk_size, layer_number=1):
    ours = MambaMixer(_config(), SPEC, d_model=H, chunk_size=chunk_size, layer_number=layer_number)
    hf_sd = hf.state_dict()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF leaves A_log / D at arange / ones: perturb all for a real check
        for key in ("A_log", "D", "dt_bias", "norm.weight"):
            hf_sd[key] += 0.1 * torch.randn(hf_sd[key].shape, generator=g)
        hf.load_state_dict(hf_sd)
        rename = {"conv1d.weight": "conv1d_weight", "conv1d.bias": "conv1d_bias"}
        ours.load_state_dict({rename.get(k, k): v for k, v in hf_sd.items()})
    return ours


@pytest.mark.parametrize("chunk_size, seq", [(4, 10), (16, 10)])
def test_forward_and_backward_equal_transformers_mamba2_mixer(chunk_size, seq):
    hf = _hf_mixer(chunk_size)
    ours = _ours_from_hf(hf, chunk_size)
    x = torch.randn(2, seq, H, generator=torch.Generator().manual_seed(2))  # [b, s, h]
    x_hf, x_ours = x.clone().requires_grad_(), x.transpose(0, 1).clone().requires_grad_()
    y_hf = hf(x_hf)
    y_ours, bias = ours(x_ours)
    assert bias is None
    torch.testing.assert_close(y_ours.transpose(0, 1), y_hf, **TOL)
    grad = torch.randn(y_hf.shape, generator=torch.Generator().manual_seed(3))
    y_hf.backward(grad)
    y_ours.backward(grad.transpose(0, 1))
    torch.testing.assert_close(x_ours.grad.transpose(0, 1), x_hf.grad, **TOL)
    ours_params = dict(ours.named_parameters())
    for name, param in hf.named_parameters():
        name = {"conv1d.weight": "conv1d_weight", "conv1d.bias": "conv1d_bias"}.get(name, name)
        torch.testing.assert_close(ours_params[name].grad, param.grad, **TOL, msg=name)


def test_mamba_fields_are_config_fields_and_rules_name_them():
    cfg = _config(is_hybrid_model=True, use_mamba_mem_eff_path=False)
    assert (cfg.mamba_state_dim, cfg.mamba_head_dim, cfg.mamba_num_groups) == (N, P, G)
    default = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4)
    assert (
        default.mamba_state_dim,
        default.mamba_head_dim,
        default.mamba_num_groups,
        default.mamba_num_heads,
    ) == (128, 64, 8, None)  # fmt: skip  (Megatron's defaults)
    mixer = MambaMixer(_config(mamba_num_heads=None, mamba_num_groups=1), SPEC, d_model=H)
    assert mixer.nheads == 2 * H // P  # expand 2
    with pytest.raises(ValueError, match=r"head count \(6\) must be divisible by mamba_num_groups"):
        MambaMixer(_config(mamba_num_heads=6, mamba_num_groups=4), SPEC, d_model=H)
    with pytest.raises(ValueError, match="bias=False"):
        MambaMixer(_config(), SPEC, d_model=H, bias=True)


def test_prefill_then_decode_equals_full_forward():
    mixer = MambaMixer(_config(), SPEC, d_model=H, chunk_size=4, layer_number=3).eval()
    x = torch.randn(10, 2, H, generator=torch.Generator().manual_seed(4))  # [s, b, h]
    ctx = StaticInferenceContext(max_batch_size=2, max_sequence_length=10)
    with torch.no_grad():
        full, _ = mixer(x)
        for start, end in [(0, 6), (6, 7), (7, 10)]:
            got, _ = mixer(x[start:end], inference_context=ctx)
            ctx.increment_sequence_len_offset(end - start)
            torch.testing.assert_close(got, full[start:end], **TOL)
    conv_state, ssm_state = ctx.key_value_memory_dict[3]
    assert conv_state.shape == (2, 2 * HEADS * P // 2 + 2 * G * N, 4)
    assert ssm_state.shape == (2, HEADS, P, N)
