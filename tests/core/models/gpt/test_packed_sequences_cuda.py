"""Packed sequences on CUDA in bf16 (skipped without a GPU): the fast spec's FlashAttention
varlen path (one `varlen_attn` call per layer, no mask) gives the plain path's masked loss and
gradients, and the per-document losses of the documents run alone. bf16 tolerances (relative
loss error < 5e-3, relative gradient error < 3e-2), as test_fast_path_cuda.py."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.packed_seq_params import PackedSeqParams
from gigatron.core.transformer import sdpa_attention
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

pytestmark = pytest.mark.gpu
gloo_world, single_rank = one_rank_fixtures()

LLAMA = dict(
    num_layers=2, hidden_size=256, num_attention_heads=4, num_query_groups=2,
    ffn_hidden_size=512, gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
    add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, bf16=True,
    params_dtype=torch.bfloat16,
)  # fmt: skip
VOCAB, DOCS = 1024, (100, 60, 96)


def _model(spec, state=None):
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    with torch.device("cuda"):
        model = GPTModel(
            TransformerConfig(**LLAMA), spec(), VOCAB, sum(DOCS), position_embedding_type="rope"
        )
    model = model.cuda().to(torch.bfloat16)
    if state is not None:
        model.load_state_dict(state)
    return model


def _run(model, tokens, labels, packed=None):
    loss = model(tokens, None, None, labels=labels, packed_seq_params=packed)
    loss.float().mean().backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters()}
    return loss.detach().float(), grads


def test_varlen_path_matches_masked_path_and_unpacked_documents(monkeypatch):
    g = torch.Generator(device="cuda").manual_seed(1)
    t = sum(DOCS)
    tokens = torch.randint(0, VOCAB, (1, t), device="cuda", generator=g)
    labels = torch.randint(0, VOCAB, (1, t), device="cuda", generator=g)
    cu = torch.tensor([0, 100, 160, 256], dtype=torch.int32, device="cuda")
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                             max_seqlen_q=100, max_seqlen_kv=100)  # fmt: skip
    calls = []
    kernel = sdpa_attention.varlen_attn
    monkeypatch.setattr(
        sdpa_attention, "varlen_attn", lambda *a, **k: calls.append(1) or kernel(*a, **k)
    )
    plain = _model(get_gpt_layer_local_spec)
    fast = _model(get_gpt_layer_fast_spec, plain.state_dict())
    loss1, grads1 = _run(fast, tokens, labels, packed)
    assert len(calls) == LLAMA["num_layers"]
    loss0, grads0 = _run(plain, tokens, labels, packed)
    assert ((loss1 - loss0).norm() / loss0.norm()) < 5e-3
    for name, g0 in grads0.items():
        rel = (grads1[name] - g0).norm() / g0.norm().clamp_min(1e-12)
        assert rel < 3e-2, f"{name}: relative grad error {rel:.2e}"
    alone = torch.cat(
        [fast(tokens[:, a:b], None, None, labels=labels[:, a:b]).detach().float()
         for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())], dim=1,
    )  # fmt: skip
    assert ((loss1 - alone).norm() / alone.norm()) < 5e-3
