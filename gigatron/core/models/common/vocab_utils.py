"""Vocabulary padding, as Megatron's training script does it (`_vocab_size_with_padding`).

The embedding and output layers split the vocabulary evenly over TP ranks, and GEMMs run faster on
multiples of 128, so the vocabulary is rounded up to a multiple of
`make_vocab_size_divisible_by * tensor_model_parallel_size`. Padded rows are never a target.
"""

from __future__ import annotations


def vocab_size_with_padding(
    orig_vocab_size: int,
    make_vocab_size_divisible_by: int = 128,
    tensor_model_parallel_size: int = 1,
) -> int:
    """Smallest multiple of make_vocab_size_divisible_by * tp that is >= orig_vocab_size."""
    if orig_vocab_size <= 0:
        raise ValueError(f"orig_vocab_size ({orig_vocab_size}) must be positive")
    if make_vocab_size_divisible_by <= 0 or tensor_model_parallel_size <= 0:
        raise ValueError(
            f"make_vocab_size_divisible_by ({make_vocab_size_divisible_by}) and "
            f"tensor_model_parallel_size ({tensor_model_parallel_size}) must be positive"
        )
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-orig_vocab_size // multiple) * multiple
