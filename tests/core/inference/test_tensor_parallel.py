"""Generation under TP = 2 on gloo ranks equals TP = 1 from the same full weights: cached
logits (prefill + decode steps, gathered over TP) within 1e-5, greedy tokens identical, log
probs close, seeded top-k sampling identical, and both TP ranks return the same tokens.
Styles: MHA + learned positions + tied embeddings; GQA with one K/V head (fewer K/V heads than
TP ranks) + RoPE + untied output."""

import pytest
import torch

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.inference import StaticInferenceContext, generate
from gigatron.testing import run_distributed
from tests.core.inference._models import MHA_LEARNED, V, build_model, gqa_rope

pytestmark = pytest.mark.multirank


PROMPTS = [[3, 14, 15, 9, 2], [6, 5, 35]]
# gqa1: fewer K/V heads than TP ranks
STYLES = {"mha_learned": MHA_LEARNED, "gqa1_rope": gqa_rope(1)}


def _model(style):
    return build_model(STYLES[style], cuda_seed=123)


def _cached_logits(model, tokens):
    """Prefill 5 positions, then 3 single-token steps; full-vocab logits [b, 8, V]."""
    ctx = StaticInferenceContext(tokens.shape[0], tokens.shape[1])
    ctx.materialize_only_last_token_logits = False
    chunks = []
    with torch.no_grad():
        for start, end in [(0, 5), (5, 6), (6, 7), (7, 8)]:
            logits = model(tokens[:, start:end], None, None, inference_context=ctx)
            ctx.increment_sequence_len_offset(end - start)
            chunks.append(tensor_parallel.gather_from_tensor_model_parallel_region(logits))
    return torch.cat(chunks, dim=1)


def _run_both_layouts(style):
    tokens = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(5))
    out = {}
    for tp in (2, 1):
        parallel_state.initialize_model_parallel(tp, 1)
        model = _model(style)
        greedy = generate(
            model, None, PROMPTS, top_k=1, num_tokens_to_generate=6, return_log_probs=True
        )
        sampled = generate(
            model, None, PROMPTS, top_k=8, temperature=0.9, num_tokens_to_generate=6,
            random_seed=7,
        )  # fmt: skip
        out[tp] = dict(
            logits=_cached_logits(model, tokens),
            greedy=[r.generated_tokens for r in greedy],
            log_probs=torch.tensor([r.generated_log_probs for r in greedy]),
            sampled=[r.generated_tokens for r in sampled],
        )
        parallel_state.destroy_model_parallel()
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("style", list(STYLES))
def test_tp2_generation_equals_tp1(style):
    per_rank = run_distributed(_run_both_layouts, 2, args=(style,), timeout=240)
    for out in per_rank:
        torch.testing.assert_close(out[2]["logits"], out[1]["logits"], rtol=0, atol=1e-5)
        assert out[2]["greedy"] == out[1]["greedy"]
        torch.testing.assert_close(out[2]["log_probs"], out[1]["log_probs"], rtol=0, atol=1e-5)
        assert out[2]["sampled"] == out[1]["sampled"]
    assert per_rank[0][2]["sampled"] == per_rank[1][2]["sampled"]  # TP ranks agree
    assert per_rank[0][2]["greedy"] == per_rank[1][2]["greedy"]
