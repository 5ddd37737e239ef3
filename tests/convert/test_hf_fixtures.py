"""Tiny random-weight HF models saved by `transformers` (safetensors), one per family, shared by
the convert tests; plus checks that the fixtures are what they claim (sharded index, dtypes)."""

import json
import os

import pytest
import torch

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "mixtral")
ADAPTER_FAMILIES = (
    "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3_text", "qwen2_moe", "gpt_oss",
)  # fmt: skip
"""Families added with the adapter registry (gigatron.convert.families)."""
MOE_FAMILIES = ("mixtral", "qwen3_moe", "qwen2_moe", "gpt_oss")
VOCAB = 100  # padded to 128 (x TP) by gigatron: padding is exercised


def hf_config(family: str, vocab: int = VOCAB):
    import transformers as t

    common = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "gpt2":
        return t.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    llama_like = dict(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        **common,
    )
    if family == "llama":
        return t.LlamaConfig(rope_theta=5000.0, **llama_like)
    if family == "mistral":
        # a window shorter than the tests' 16 tokens: window_size (4, 0) on every layer
        return t.MistralConfig(sliding_window=5, head_dim=8, **llama_like)
    if family == "qwen2":
        return t.Qwen2Config(rope_theta=20000.0, **{**llama_like, "tie_word_embeddings": True})
    if family == "mixtral":
        return t.MixtralConfig(
            num_local_experts=4, num_experts_per_tok=2, sliding_window=None, **llama_like
        )
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)
    if family == "qwen3":  # head_dim 16 != hidden / heads (8); tied output
        return t.Qwen3Config(head_dim=16, **{**llama_like, "tie_word_embeddings": True})
    if family == "qwen3_moe":  # norm_topk_prob True: the renormalised router
        return t.Qwen3MoeConfig(head_dim=8, norm_topk_prob=True, **moe, **llama_like)
    if family == "qwen2_moe":  # norm_topk_prob False (softmax over all); gated shared expert
        return t.Qwen2MoeConfig(shared_expert_intermediate_size=40, **moe, **llama_like)
    if family == "phi3":
        return t.Phi3Config(
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5},
            **llama_like,
        )  # fmt: skip
    if family == "gpt_oss":  # window 4 on layer 1, full layer 2; YaRN x4 ramping over
        # rotary channels 3.3 .. 10.4 of 16 (truncate false: not rounded), a clamp that bites
        return t.GptOssConfig(
            num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=4,
            swiglu_limit=1.5,
            rope_parameters={"rope_type": "yarn", "rope_theta": 50.0, "factor": 4.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 1024},
            **{**llama_like, "intermediate_size": 24},
        )  # fmt: skip
    # Gemma: sliding window 4 < the tests' sequences; layer 1 sliding, layer 2 global.
    gemma = dict(sliding_window=4, query_pre_attn_scalar=12, head_dim=16, **llama_like)
    if family == "gemma2":  # small caps, so the tanh bends the scores and logits
        return t.Gemma2Config(
            attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
            **{**gemma, "tie_word_embeddings": True},
        )  # fmt: skip
    if family == "gemma3_text":  # local RoPE base 100, global 20000 with linear scaling 2
        return t.Gemma3TextConfig(
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0},
            },
            **gemma,
        )
    raise ValueError(family)


TOKENIZER_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello gigatron: greedy decoding of a tiny model",
    "pack my box with five dozen liquor jugs",
]


def make_tokenizer(path: str, vocab: int = 300):
    """A byte-level BPE (`tokenizers`) with `<|endoftext|>` as id 0 (BOS = EOS, as the model
    configs say), saved by transformers as `tokenizer.json` + `tokenizer_config.json`."""
    import transformers as t
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_CORPUS * 10, trainer)
    eos = "<|endoftext|>"
    fast = t.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos)
    fast.save_pretrained(path)
    return fast


def make_hf_model(
    family: str,
    path: str,
    *,
    seed: int = 0,
    max_shard_size=None,
    tokenizer: bool = False,
    init_std: float | None = None,
    vocab: int | None = None,
):
    """Save a random-weight model (norms and biases randomised too) to `path`; returns it.

    tokenizer: save a real tokenizer (`make_tokenizer`) and size the vocabulary to it;
    otherwise a stand-in tokenizer_config.json is written and the vocabulary is VOCAB.
    init_std: the config's initializer_range (larger: greedy continuations vary more).
    vocab: the config's vocab_size, if not the tokenizer's / VOCAB."""
    import transformers as t

    torch.manual_seed(seed)
    cls = {
        "gpt2": t.GPT2LMHeadModel,
        "llama": t.LlamaForCausalLM,
        "mistral": t.MistralForCausalLM,
        "qwen2": t.Qwen2ForCausalLM,
        "mixtral": t.MixtralForCausalLM,
        "qwen3": t.Qwen3ForCausalLM,
        "qwen3_moe": t.Qwen3MoeForCausalLM,
        "phi3": t.Phi3ForCausalLM,
        "gemma2": t.Gemma2ForCausalLM,
        "gemma3_text": t.Gemma3ForCausalLM,
        "qwen2_moe": t.Qwen2MoeForCausalLM,
        "gpt_oss": t.GptOssForCausalLM,
    }[family]
    tok_vocab = len(make_tokenizer(path)) if tokenizer else VOCAB
    config = hf_config(family, vocab or tok_vocab)
    if init_std is not None:
        config.initializer_range = init_std
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # HF inits norms to 1 / biases to 0 (GPT-OSS's stacked expert biases too): make their
            # mapping observable
            if p.dim() == 1 or name.endswith("_bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name or "ln" in name else 0))
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kw)
    if not tokenizer:
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 64}, f)  # stands in for tokenizer files (carried along)
    return model


def test_sharded_fixture_has_index(tmp_path):
    pytest.importorskip("transformers")
    make_hf_model("llama", str(tmp_path), max_shard_size="20KB")
    with open(tmp_path / "model.safetensors.index.json") as f:
        files = set(json.load(f)["weight_map"].values())
    assert len(files) > 1
