"""Checkpoint and tokenizer settings (Megatron's CheckpointConfig and TokenizerConfig, which live
in its training_config; here in a file of their own)."""

from dataclasses import dataclass, field
from typing import Literal

_STRICTNESS = Literal[
    "assume_ok_unexpected",
    "log_unexpected",
    "log_all",
    "raise_unexpected",
    "raise_all",
    "return_unexpected",
    "return_all",
    "ignore_all",
]


def _negated(flag: str, default) -> dict:
    """Megatron's legacy `--no-x` switch of field `x`: store_true into `no_x`."""
    dest = flag[2:].replace("-", "_")
    meta = {"arg_names": [flag], "dest": dest, "action": "store_true", "default": default}
    return {"argparse_meta": meta}


def _renamed(flag: str, dest: str) -> dict:
    """A switch whose flag and dest carry a `ckpt_` prefix the field has not."""
    return {"argparse_meta": {"arg_names": [flag], "dest": dest}}


@dataclass(kw_only=True)
class CheckpointConfig:
    """Saving and loading checkpoints."""

    save: str | None = None
    """Checkpoint directory to save to."""

    save_interval: int | None = None
    """Iterations between saves."""

    save_optim: bool = field(default=True, metadata=_negated("--no-save-optim", None))
    """Save the optimizer state (--no-save-optim: do not)."""

    save_rng: bool = field(default=True, metadata=_negated("--no-save-rng", None))
    """Save the RNG state (--no-save-rng: do not)."""

    load: str | None = None
    """Checkpoint directory to load from."""

    load_optim: bool = field(default=True, metadata=_negated("--no-load-optim", False))
    """Load the optimizer and scheduler state (--no-load-optim: do not)."""

    load_rng: bool = field(default=True, metadata=_negated("--no-load-rng", False))
    """Load the RNG state (--no-load-rng: do not)."""

    finetune: bool = False
    """Load the weights only: iteration 0, fresh optimizer, scheduler and RNG, no check of the
    model flags against the checkpoint's."""

    ckpt_step: int | None = None
    """Load this iteration of --load instead of the one its tracker names."""

    use_checkpoint_args: bool = False
    """Take the model flags (and unset tokenizer flags) from the --load checkpoint's saved args
    before the model is built (Megatron's load_args_from_checkpoint)."""

    exit_on_missing_checkpoint: bool = False
    """With --load: exit when no checkpoint is found there instead of starting fresh."""

    ckpt_format: Literal["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"] = "torch_dist"
    """torch_dist (gigatron's only format; Megatron's other values are refused)."""

    auto_detect_ckpt_format: bool = False
    """Accepted, no effect: gigatron reads torch_dist only (a torch-format load fails with a
    message)."""

    fully_parallel_save: bool = field(
        default=True, metadata=_renamed("--no-ckpt-fully-parallel-save", "ckpt_fully_parallel_save")
    )
    """Accepted, no effect: checkpoint write scheduling only; the files hold the same."""

    async_save: bool = False
    """Write checkpoints in the background."""

    fully_parallel_load: bool = field(
        default=False, metadata=_renamed("--ckpt-fully-parallel-load", "ckpt_fully_parallel_load")
    )
    """Accepted, no effect: checkpoint read scheduling only."""

    ckpt_assume_constant_structure: bool = False
    """Accepted, no effect: a caching hint for repeated saves."""

    dist_ckpt_strictness: _STRICTNESS | None = None
    """What loading does with unexpected / missing keys (Megatron's default
    assume_ok_unexpected)."""


@dataclass(kw_only=True)
class TokenizerConfig:
    """The tokenizer and its files."""

    vocab_size: int | None = None
    """Vocabulary size (NullTokenizer)."""

    vocab_file: str | None = None
    """Tokenizer vocabulary file."""

    merge_file: str | None = None
    """BPE merges file."""

    vocab_extra_ids: int = 0
    """T5 sentinels <extra_id_i> added to the vocabulary."""

    tokenizer_type: str | None = None
    """NullTokenizer | GPT2BPETokenizer | HuggingFaceTokenizer | SentencePieceTokenizer |
    GPTSentencePieceTokenizer | Llama2Tokenizer | TikTokenizer | BertWordPieceLowerCase |
    BertWordPieceCase."""

    tokenizer_model: str | None = None
    """Tokenizer model file or directory."""

    tiktoken_pattern: Literal["v1", "v2"] | None = None
    """TikTokenizer's pre-tokenization regex: v1 or v2 (read by TikTokenizer only)."""

    tiktoken_num_special_tokens: int = 1000
    """TikTokenizer: ids reserved for special tokens before the BPE ranks."""
