"""GPTModel with TP = 2 and 4, with and without sequence parallelism, on gloo ranks: logits,
loss and every gradient equal the TP = 1 model built from the same full weights (fp32, 1e-5),
also with cross_entropy_loss_fusion against the plain TP = 1 loss.

Model styles: GPT-2 (LayerNorm, biases, GELU, learned positions, tied embeddings, explicit
mask), Llama (RMSNorm, SwiGLU, RoPE, GQA, untied output, causal mask built inside), and a GQA
model with 2 K/V heads (fewer than the ranks at TP = 4), a QKV bias and q/k layernorm, and a
Gemma 2 / 3 model (sandwich norms, soft-capping, sliding-window and global layers with their own
RoPE, q/k norms; _parity.GEMMA_CONFIG)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gigatron.core import parallel_state
from gigatron.core.models.common.tp_state_dict import shard_for_rank
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed
from tests.core.models.gpt import _parity as parity

pytestmark = pytest.mark.multirank


V, S, B = 64, 8, 2
STYLES = {
    "gpt2": dict(
        config=dict(
            num_layers=2,
            hidden_size=32,
            num_attention_heads=8,
            ffn_hidden_size=64,
            activation_func=F.gelu,
        ),
        model=dict(
            position_embedding_type="learned_absolute", share_embeddings_and_output_weights=True
        ),
    ),
    "llama": dict(
        config={**parity.LLAMA_CONFIG, "layernorm_epsilon": 1e-6}, model=parity.LLAMA_MODEL
    ),
    # fewer K/V heads than TP ranks at TP = 4: K/V heads shared by 2 ranks (Megatron's scheme)
    "gqa2": dict(
        config=dict(
            num_layers=1,
            hidden_size=32,
            num_attention_heads=8,
            num_query_groups=2,
            normalization="RMSNorm",
            add_bias_linear=False,
            add_qkv_bias=True,
        ),
        model=dict(position_embedding_type="rope"),
    ),
    "gemma": dict(config={**parity.GEMMA_CONFIG, "qk_layernorm": True}, model=parity.GEMMA_MODEL),
}


def _build(style, tp, sp, spec_fn=get_gpt_layer_local_spec, fusion=False):
    cfg = TransformerConfig(
        **STYLES[style]["config"],
        cross_entropy_loss_fusion=fusion,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    return GPTModel(cfg, spec_fn(qk_layernorm=cfg.qk_layernorm), V, 16, **STYLES[style]["model"])


def _inputs(style):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (B, S), generator=g)
    labels = torch.randint(0, V, (B, S), generator=g)
    weights = torch.rand(B, S, generator=g)
    mask = None
    if style == "gpt2":  # causal + the first two tokens of sample 1 are padding
        mask = torch.ones(B, 1, S, S, dtype=torch.bool).triu(1)
        mask[1, :, :, :2] = True
        mask[1, :, :2, :2] = torch.ones(2, 2, dtype=torch.bool).triu(1)
    return ids, labels, weights, mask


def _run(model, style):
    ids, labels, weights, mask = _inputs(style)
    with torch.no_grad():
        logits = model(ids, None, mask)
    loss = model(ids, None, mask, labels=labels)
    (loss * weights).sum().backward()
    return logits, loss.detach()


def _reference(style):
    torch.manual_seed(0)
    model = _build(style, 1, False)
    logits, loss = _run(model, style)
    full, grads = parity.weights_and_grads(model)
    return full, logits, loss, grads


def _check(style, tp, sp, ref, spec_fn, fusion=False):
    full, ref_logits, ref_loss, ref_grads = ref
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    model = _build(style, tp, sp, spec_fn, fusion)
    params = parity.load_shards(model, full, tp_rank, tp)
    logits, loss = _run(model, style)
    ids, _, _, mask = _inputs(style)
    if not sp:  # runtime_gather_output (not allowed with SP, as in Megatron): full vocabulary
        torch.testing.assert_close(
            model(ids, None, mask, runtime_gather_output=True), ref_logits, rtol=0, atol=1e-5
        )
    errors = {
        "logits": (logits - ref_logits.chunk(tp, dim=-1)[tp_rank]).abs().max().item(),
        "loss": (loss - ref_loss).abs().max().item(),
    }
    torch.testing.assert_close(logits, ref_logits.chunk(tp, dim=-1)[tp_rank], rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-5)
    grad_err = 0.0
    for name, p in params.items():
        grad = p.grad
        # finalize_model_grads' TP rule: SP-marked params, and q/k norms (each rank saw only its
        # heads), have partial grads that are summed over TP.
        qk_norm = "q_layernorm" in name or "k_layernorm" in name
        if getattr(p, "sequence_parallel", False) or qk_norm:
            grad = grad.clone()
            dist.all_reduce(grad, group=parallel_state.get_tensor_model_parallel_group())
        expected = shard_for_rank(ref_grads[name], p, tp_rank, tp)
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5, msg=f"{style} {name}")
        grad_err = max(grad_err, (grad - expected).abs().max().item())
    errors["grads"] = grad_err
    return errors


def _body(tp, spec_name, fusion=False):
    spec_fn = {"local": get_gpt_layer_local_spec, "fast": get_gpt_layer_fast_spec}[spec_name]
    refs = parity.references_then_layout(_reference, STYLES, tp)
    return {
        (style, sp): _check(style, tp, sp, refs[style], spec_fn, fusion)
        for style in STYLES
        for sp in (False, True)
    }


@pytest.mark.parametrize("tp", [2, 4])
def test_gpt_tensor_parallel_matches_tp1(tp):
    errors = run_distributed(_body, tp, args=(tp, "local"), timeout=240)[0]
    for key, errs in errors.items():
        assert max(errs.values()) <= 1e-5, (key, errs)


def test_gpt_tensor_parallel_fast_spec_matches_tp1():
    run_distributed(_body, 2, args=(2, "fast"), timeout=240)


def test_gpt_cross_entropy_loss_fusion_matches_tp1():
    """cross_entropy_loss_fusion (chunked output layer + cross entropy, logits recomputed in
    backward): per-token loss and every grad equal the plain TP = 1 model's, tied and untied
    output weights, with and without SP."""
    errors = run_distributed(_body, 2, args=(2, "fast", True), timeout=240)[0]
    for key, errs in errors.items():
        assert max(errs.values()) <= 1e-5, (key, errs)
