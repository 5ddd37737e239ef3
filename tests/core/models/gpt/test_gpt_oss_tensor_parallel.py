"""GPT-OSS's attention and MLP pieces under TP = 2, with and without SP, on gloo ranks: a GPTModel
with alternating sliding windows, learnable attention sinks (split over TP with the heads) and a
clamped quick GEGLU (offset 1) gives the TP = 1 model's logits, loss and every gradient, the
sinks' included (fp32, 1e-5)."""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.activations import quick_gelu
from gigatron.core.models.common.tp_state_dict import shard_for_rank
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed
from tests.core.models.gpt import _parity as parity

pytestmark = pytest.mark.multirank

V, S, B = 64, 8, 2


def _build(tp, sp):
    cfg = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=4,
        ffn_hidden_size=48, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=quick_gelu, glu_linear_offset=1.0, activation_func_clamp_value=0.5,
        window_size=(2, 0), window_attn_skip_freq=2, softmax_type="learnable",
        tensor_model_parallel_size=tp, sequence_parallel=sp, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True,
    )  # fmt: skip
    return GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), V, 16,
                    position_embedding_type="rope")  # fmt: skip


def _run(model):
    g = torch.Generator().manual_seed(5)
    ids, labels = torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)
    with torch.no_grad():
        logits = model(ids, None, None)
    model(ids, None, None, labels=labels).sum().backward()
    return logits


def _reference(_style):
    torch.manual_seed(0)
    model = _build(1, False)
    with torch.no_grad():  # sinks and biases away from their init values
        for name, p in model.named_parameters():
            if "softmax_offset" in name:
                p.copy_(torch.randn_like(p))
    logits = _run(model)
    full, grads = parity.weights_and_grads(model)
    return full, logits, grads


def _body(tp):
    (full, ref_logits, ref_grads) = parity.references_then_layout(_reference, ["oss"], tp)["oss"]
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    worst = 0.0
    for sp in (False, True):
        model = _build(tp, sp)
        params = parity.load_shards(model, full, tp_rank, tp)
        assert any(getattr(p, "tensor_model_parallel", False) for n, p in params.items()
                   if "softmax_offset" in n)  # fmt: skip
        logits = _run(model)
        want = ref_logits.chunk(tp, dim=-1)[tp_rank]
        torch.testing.assert_close(logits, want, rtol=0, atol=1e-5)
        for name, p in params.items():
            grad = p.grad
            if getattr(p, "sequence_parallel", False):
                grad = grad.clone()
                dist.all_reduce(grad, group=parallel_state.get_tensor_model_parallel_group())
            expected = shard_for_rank(ref_grads[name], p, tp_rank, tp)
            torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5, msg=name)
            worst = max(worst, (grad - expected).abs().max().item())
    return worst


def test_gpt_oss_pieces_tensor_parallel_match_tp1():
    assert max(run_distributed(_body, 2, args=(2,), timeout=240)) <= 1e-5
