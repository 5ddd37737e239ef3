"""KV-cache decoding equals recomputing the full sequence: logits (fp32, 1e-5) for a prefill,
a multi-token chunk and single-token steps, and greedy tokens of `generate` for a batch of
prompts of different lengths. Styles: MHA + learned positions + tied embeddings (local spec),
GQA + RoPE + RMSNorm + SwiGLU (fast SDPA spec). Also: termination id, InferenceParams alias."""

import pytest
import torch

from gigatron.core.inference import StaticInferenceContext, generate
from gigatron.core.inference_params import InferenceParams
from tests._one_rank import one_rank_fixtures
from tests.core.inference._models import MHA_LEARNED, V, build_model, gqa_rope

STYLES = {"mha_learned": MHA_LEARNED, "gqa_rope": gqa_rope(2)}


gloo_world, single_rank = one_rank_fixtures(cuda_seed=123)


def _model(style):
    return build_model(STYLES[style])


def _full_logits(model, tokens):
    with torch.no_grad():
        return model(tokens, None, None)  # [b, t, V], causal mask built inside


@pytest.mark.parametrize("style", list(STYLES))
def test_cached_logits_equal_full_recompute(style):
    model = _model(style)
    tokens = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    full = _full_logits(model, tokens)  # [2, 12, V]
    ctx = StaticInferenceContext(max_batch_size=2, max_sequence_length=12)
    ctx.materialize_only_last_token_logits = False  # compare every position of each chunk
    with torch.no_grad():
        for start, end in [(0, 5), (5, 8), (8, 9), (9, 10), (10, 11), (11, 12)]:
            got = model(tokens[:, start:end], None, None, inference_context=ctx)
            ctx.increment_sequence_len_offset(end - start)
            torch.testing.assert_close(got, full[:, start:end], rtol=0, atol=1e-5)
    key, value = ctx.key_value_memory_dict[1]
    ng = STYLES[style][0].get("num_query_groups", 4)
    assert key.shape == value.shape == (12, 2, ng, 8)  # [max_s, max_b, ng, hn]


@pytest.mark.parametrize("style", list(STYLES))
def test_greedy_generate_equals_recompute_loop(style):
    model = _model(style)
    prompts = [[3, 14, 15, 9, 2, 6], [5, 35, 8]]  # different lengths in one batch
    results = generate(model, None, prompts, top_k=1, num_tokens_to_generate=7)
    for prompt, result in zip(prompts, results):
        tokens = torch.tensor([prompt])
        for _ in range(7):
            nxt = _full_logits(model, tokens)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
        assert result.prompt_tokens == prompt
        assert result.generated_tokens == tokens[0, len(prompt) :].tolist()
        assert not result.stopped_on_termination


def test_last_token_logits_only_by_default():
    model = _model("gqa_rope")
    tokens = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(2))
    ctx = InferenceParams(max_batch_size=1, max_sequence_length=8)
    assert isinstance(ctx, StaticInferenceContext)
    with torch.no_grad():
        got = model(tokens, None, None, inference_params=ctx)  # legacy keyword
    assert got.shape == (1, 1, V)
    torch.testing.assert_close(got[:, 0], _full_logits(model, tokens)[:, -1], rtol=0, atol=1e-5)


def test_stops_at_termination_id():
    model = _model("mha_learned")
    prompt = [7, 1, 22]
    free = generate(model, None, [prompt], top_k=1, num_tokens_to_generate=8)[0]
    stop_id = free.generated_tokens[2]
    first = free.generated_tokens.index(stop_id)
    out = generate(
        model, None, [prompt, [9, 9]], top_k=1, num_tokens_to_generate=8, termination_id=stop_id
    )
    assert out[0].stopped_on_termination
    assert out[0].generated_tokens == free.generated_tokens[: first + 1]
    assert len(out[1].generated_tokens) == 8 or out[1].stopped_on_termination


def test_cache_overflow_and_sequence_parallel_errors():
    model = _model("mha_learned")
    ctx = StaticInferenceContext(max_batch_size=1, max_sequence_length=4)
    with pytest.raises(ValueError, match="max_sequence_length"):
        with torch.no_grad():
            model(torch.zeros(1, 5, dtype=torch.long), None, None, inference_context=ctx)
    with pytest.raises(ValueError, match="max_sequence_length"):
        generate(model, None, [[1] * 30], top_k=1, num_tokens_to_generate=5)


class _WordTokenizer:
    """Ids as words 'w<id>'; eod set by the test; vocab smaller than the padded V."""

    vocab_size = 60

    def __init__(self, eod):
        self.eod = eod

    def tokenize(self, text):
        return [int(w[1:]) for w in text.split()]

    def detokenize(self, ids):
        return "".join(f" w{i}" for i in ids)


def test_text_prompts_stop_at_tokenizer_eod():
    model = _model("gqa_rope")
    free = generate(model, _WordTokenizer(eod=-1), ["w7 w1 w22"], top_k=1)[0]
    # num_tokens_to_generate None (megatron-core 0.19's default): up to max_sequence_length 32
    assert len(free.generated_tokens) == 32 - 3 and max(free.generated_tokens) < 60
    eod = free.generated_tokens[3]
    out = generate(model, _WordTokenizer(eod=eod), ["w7 w1 w22"], top_k=1)[0]
    n = free.generated_tokens.index(eod) + 1
    assert out.stopped_on_termination and out.generated_tokens == free.generated_tokens[:n]
    assert out.generated_text == "".join(f" w{i}" for i in free.generated_tokens[: n - 1])
    assert out.text == "w7 w1 w22" + out.generated_text
    kept = generate(
        model, _WordTokenizer(eod=eod), ["w7 w1 w22"], top_k=1, detokenize_stop_sequence=True
    )[0]  # the stop token stays in the text
    assert kept.generated_text == "".join(f" w{i}" for i in free.generated_tokens[:n])
