"""Datasets of the training scripts (mirrors `megatron.training.datasets`): `fim_dataset`
(fill-in-the-middle GPT samples) and `varlen_dataset` (schema detection for SFT-style data)."""
