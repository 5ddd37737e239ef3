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


def resume_vocab_size_with_padding(
    orig_vocab_size: int,
    make_vocab_size_divisible_by: int,
    tensor_model_parallel_size: int,
    saved_padded_vocab_size: int | None,
    saved_make_vocab_size_divisible_by: int | None,
) -> int:
    """Padded vocabulary of a run that resumes from a checkpoint saved with the given values.

    The checkpoint's padded size is kept when only the layout changed (same
    make_vocab_size_divisible_by, the vocabulary still fits, the new TP splits it evenly): the
    padded rows' logits are in every softmax, so dropping or adding rows would change the loss
    of a plain reshard. Otherwise (another divisor or vocabulary, or a TP that does not divide
    it) the padding is recomputed and the load pads or trims the rows of the weights and the
    optimizer state alike. gigatron difference: Megatron recomputes it on every start unless
    `--use-checkpoint-args`."""
    padded = vocab_size_with_padding(
        orig_vocab_size, make_vocab_size_divisible_by, tensor_model_parallel_size
    )
    saved = saved_padded_vocab_size
    keep = (
        saved is not None
        and saved_make_vocab_size_divisible_by == make_vocab_size_divisible_by
        and orig_vocab_size <= saved
        and saved % tensor_model_parallel_size == 0
    )
    return saved if keep else padded
