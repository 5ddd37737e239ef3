"""Packed sequences (PackedSeqParams, thd) on one process: the per-document losses and every
gradient of a packed row equal the same documents run one by one, unpacked (fp32, 1e-6).

Llama style (RoPE restarting at each document, GQA) on the plain and the fast (SDPA) spec, and
GPT-2 style (learned positions restarting through position_ids, explicit causal mask OR-ed with
the document mask). The TP = 2 and CP = 2 layouts are in test_packed_sequences_parallel.py.
"""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from gigatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.packed_seq_params import PackedSeqParams, thd_document_positions
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures
from tests.core.models.gpt import _parity as parity

gloo_world, single_rank = one_rank_fixtures()

V, MAX_S = 64, 32
GPT2 = dict(num_layers=2, hidden_size=32, num_attention_heads=4, activation_func=F.gelu)
STYLES = {
    "llama": (parity.LLAMA_CONFIG, parity.LLAMA_MODEL),
    "gpt2": (GPT2, dict(position_embedding_type="learned_absolute")),
}


def build(style="llama", tp=1, cp=1, sp=False, spec_fn=get_gpt_layer_local_spec):
    config, model = STYLES[style]
    cfg = TransformerConfig(
        **config,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        context_parallel_size=cp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    return GPTModel(cfg, spec_fn(), V, MAX_S, **model)


def make_batch(docs):
    """tokens / labels / loss weights [1, t] and cu_seqlens [n + 1] int32 of documents `docs`."""
    g = torch.Generator().manual_seed(7)
    t = sum(docs)
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32)
    position_ids = torch.cat([torch.arange(n) for n in docs])[None]  # restart per document
    return dict(
        tokens=torch.randint(0, V, (1, t), generator=g),
        labels=torch.randint(0, V, (1, t), generator=g),
        weights=torch.rand(1, t, generator=g),
        position_ids=position_ids,
        cu_seqlens=cu,
    )


def cp_token_index(cu, cp, rank):
    """Positions in the packed row of CP rank `rank`'s tokens [t / cp] (per-document zigzag)."""
    doc, pos = thd_document_positions(cu, int(cu[-1]) // cp, cp, rank)
    return cu.long()[doc] + pos


def packed_params(cu):
    lengths = cu[1:] - cu[:-1]
    return PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
        max_seqlen_q=int(lengths.max()), max_seqlen_kv=int(lengths.max()),
    )  # fmt: skip


def causal(s):
    return torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)


def run_unpacked(model, batch, mask=False):
    """Each document alone (positions from 0, causal): losses [1, t], then backward of
    sum(loss * weights) over all of them (grads accumulate in the model)."""
    cu = batch["cu_seqlens"].tolist()
    losses = []
    for a, b in zip(cu[:-1], cu[1:]):
        loss = model(
            batch["tokens"][:, a:b], batch["position_ids"][:, a:b],
            causal(b - a) if mask else None, labels=batch["labels"][:, a:b],
        )  # fmt: skip
        (loss * batch["weights"][:, a:b]).sum().backward()
        losses.append(loss.detach())
    return torch.cat(losses, dim=1)


def run_packed(model, batch, params, mask=False):
    """The packed row in one forward: loss [1, t_local] (backward of sum(loss * weights))."""
    s = batch["tokens"].shape[1]
    loss = model(
        batch["tokens"], batch["position_ids"], causal(s) if mask else None,
        labels=batch["labels"], packed_seq_params=params,
    )  # fmt: skip
    (loss * batch["weights"]).sum().backward()
    return loss.detach()


@pytest.mark.parametrize(
    "style, spec_fn",
    [
        ("llama", get_gpt_layer_local_spec),
        ("llama", get_gpt_layer_fast_spec),
        ("gpt2", get_gpt_layer_local_spec),
    ],
    ids=["llama-local", "llama-sdpa", "gpt2-local"],
)
def test_packed_equals_unpacked_documents(style, spec_fn):
    torch.manual_seed(0)
    model = build(style, spec_fn=spec_fn)
    batch = make_batch((5, 3, 1, 7))
    mask = style == "gpt2"
    ref_loss = run_unpacked(model, batch, mask)
    full, ref_grads = parity.weights_and_grads(model)
    model.zero_grad(set_to_none=True)
    loss = run_packed(model, batch, packed_params(batch["cu_seqlens"]), mask)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=0, atol=1e-6, msg=name)


def _varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size):
    """CPU stand-in for FlashAttention's varlen kernel: q/k/v [t, n, hn] -> [t, n, hn]."""
    assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32 and k.shape[1] == q.shape[1]
    assert max_q == max_k == int(cu_q.diff().max())
    out = [
        F.scaled_dot_product_attention(
            *(x[a:b].transpose(0, 1) for x in (q, k, v)),
            is_causal=tuple(window_size) == (-1, 0), scale=scale,
        ).transpose(0, 1)
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist())
    ]  # fmt: skip
    return torch.cat(out)


def test_varlen_path_plumbing_against_the_plain_path(monkeypatch):
    """The SDPA spec's CUDA varlen path (q/k/v slicing, GQA repeat, bounds, scale, causal
    window) with a CPU stand-in for the kernel: the plain path's losses and grads. The kernel
    itself runs in test_packed_sequences_cuda.py."""
    from gigatron.core.transformer import sdpa_attention

    calls = []
    monkeypatch.setattr(
        sdpa_attention, "varlen_attn", lambda *a, **k: calls.append(1) or _varlen_reference(*a, **k)
    )
    monkeypatch.setattr(sdpa_attention.SDPADotProductAttention, "_use_varlen", lambda *a: True)
    torch.manual_seed(0)
    plain = build()
    fast = build(spec_fn=get_gpt_layer_fast_spec)
    fast.load_state_dict(plain.state_dict())
    batch, cu = make_batch((5, 3, 1, 7)), make_batch((5, 3, 1, 7))["cu_seqlens"]
    ref = run_packed(plain, batch, packed_params(cu))
    torch.testing.assert_close(run_packed(fast, batch, packed_params(cu)), ref, rtol=0, atol=1e-6)
    assert len(calls) == fast.config.num_layers
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-6, msg=name)


def test_packed_params_errors_name_the_value():
    torch.manual_seed(0)
    model = build()
    batch = make_batch((4, 4))
    bad = torch.tensor([0, 4, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q \[0, 4, 7\] must run from 0 to .* \(8\)"):
        model(batch["tokens"], None, None, packed_seq_params=packed_params(bad))
    two_rows = batch["tokens"].expand(2, -1)
    with pytest.raises(ValueError, match=r"micro-batch dimension 1 \(got 2\)"):
        model(two_rows, None, None, packed_seq_params=packed_params(batch["cu_seqlens"]))


class _FakeGroup:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def test_thd_rope_restarts_positions_per_document():
    """apply_rotary_pos_emb(cu_seqlens=...) rotates each document from position 0, on one rank
    ([t, 1, n, hn] and Megatron's [t, n, hn]) and on each CP rank's per-document chunks (an
    attention score sees only relative positions, so the model parity cannot show this)."""
    docs, table = (4, 8, 4), RotaryEmbedding(8, 1.0)(16, packed_seq=True)  # [16, 1, 1, 8]
    cu = torch.tensor([0, 4, 12, 16], dtype=torch.int32)
    t = torch.randn(16, 1, 2, 8, generator=torch.Generator().manual_seed(3))
    per_doc = torch.cat(
        [apply_rotary_pos_emb(x, table[: x.shape[0]]) for x in t.split(list(docs))]
    )  # [16, 1, 2, 8]
    torch.testing.assert_close(apply_rotary_pos_emb(t, table, cu_seqlens=cu), per_doc)
    thd = apply_rotary_pos_emb(t[:, 0], table, cu_seqlens=cu)  # [t, n, hn]
    torch.testing.assert_close(thd, per_doc[:, 0])
    for rank in range(2):
        group = _FakeGroup(2, rank)
        index = cp_token_index(cu, 2, rank)  # this rank's tokens (get_batch_on_this_cp_rank's)
        local = apply_rotary_pos_emb(t[index], table, cu_seqlens=cu, cp_group=group)
        torch.testing.assert_close(local, per_doc[index])
