"""`build_tokenizer(args)`: the tokenizer named by `args.tokenizer_type`, as Megatron 0.20's
`megatron.core.tokenizers.utils.build_tokenizer`; `vocab_size_with_padding`.

"NullTokenizer" gives the 0.20 text null tokenizer (`MegatronTokenizerText`, library
"null-text": `vocab_size` as given, EOD `vocab_size - 1` or `args.null_tokenizer_eod_id`, PAD
`args.null_tokenizer_pad_id` or -1). The file-backed types (Hugging Face, SentencePiece,
tiktoken, GPT-2 BPE, BERT WordPiece) raise NotImplementedError naming
`gigatron.training.tokenizer.build_tokenizer`, which builds them (and "SFTTokenizer",
`gigatron.core.tokenizers.text.libraries.sft_tokenizer`) from the same args (gigatron's core does
not import its training layer); "MultimodalTokenizer" and "NullMultimodalTokenizer" are Megatron
types gigatron does not have (NotImplementedError); any other type is a ValueError.
With `args.pad_vocab_size` set, `args.padded_vocab_size` is filled in when None.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from gigatron.core.tokenizers.text.text_tokenizer import MegatronTokenizerText

MEGATRON_TOKENIZERS = ["BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer"]
SP_TOKENIZERS = ["SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"]
SUPPORTED_TOKENIZERS = [
    "HuggingFaceTokenizer", "TikTokenizer", "MultimodalTokenizer", "NullTokenizer",
    "NullMultimodalTokenizer", "SFTTokenizer", *MEGATRON_TOKENIZERS, *SP_TOKENIZERS,
]  # fmt: skip
_NOT_IN_GIGATRON = ("MultimodalTokenizer", "NullMultimodalTokenizer")

logger = logging.getLogger(__name__)


def build_tokenizer(args: Any, **kwargs: Any):
    """The tokenizer of `args.tokenizer_type` (see the module docstring)."""
    kind = args.tokenizer_type
    if kind not in SUPPORTED_TOKENIZERS:
        raise ValueError(f"tokenizer_type {kind} is not supported; "
                         f"the available tokenizers are {SUPPORTED_TOKENIZERS}")  # fmt: skip
    if kind in _NOT_IN_GIGATRON:
        raise NotImplementedError(f"tokenizer_type {kind}: gigatron has no multimodal "
                                  "tokenizer")  # fmt: skip
    if kind != "NullTokenizer":
        raise NotImplementedError(f"tokenizer_type {kind}: build it with "
                                  "gigatron.training.tokenizer.build_tokenizer(args)")  # fmt: skip
    options = {"vocab_size": args.vocab_size}
    for name, key in (("null_tokenizer_eod_id", "eod_id"), ("null_tokenizer_pad_id", "pad_id")):
        if getattr(args, name, None) is not None:
            options[key] = getattr(args, name)
    tokenizer = MegatronTokenizerText(None, {"library": "null-text"}, **options)
    if getattr(args, "pad_vocab_size", False) and getattr(args, "padded_vocab_size", None) is None:
        args.padded_vocab_size = vocab_size_with_padding(tokenizer.vocab_size, args)
    return tokenizer


def vocab_size_with_padding(orig_vocab_size: int, args: Any, logging_enabled: bool = True) -> int:
    """`orig_vocab_size` rounded up to a multiple of `args.make_vocab_size_divisible_by *
    args.tensor_model_parallel_size` (logged on rank 0)."""
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    after = math.ceil(orig_vocab_size / multiple) * multiple
    if args.rank == 0 and logging_enabled:
        logger.info(f" > padded vocab (size: {orig_vocab_size}) with "
                    f"{after - orig_vocab_size} dummy tokens (new size: {after})")  # fmt: skip
    return after
