"""Tokenizer helpers (mirrors `megatron.core.tokenizers.utils`)."""
