"""Tokenizers with Megatron's interface, and `build_tokenizer(args)`.

Mirrors `megatron.training.tokenizer.tokenizer`: same class names, same `--tokenizer-type`
strings, same special-token rules (GPT-2's EOD is `<|endoftext|>`, the null tokenizer's EOD is
the extra id `vocab_size`), and `args.padded_vocab_size` set the same way. Everything loads from
local files. BPE runs on the Hugging Face `tokenizers` library (the `data` extra), which gives
the same ids as GPT-2's reference byte-level BPE; SentencePiece needs `sentencepiece`.
"""

from __future__ import annotations

import math
import os
from typing import Any

from gigatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
from gigatron.core.tokenizers.null_tokenizer import NullTokenizer
from gigatron.core.tokenizers.text.libraries.sft_tokenizer import SFTTokenizer
from gigatron.training.tokenizer._bert_wordpiece import _BertWordPieceTokenizer
from gigatron.training.tokenizer._common import (
    _import_tokenizers,
    read_json_file,
    read_merges,
    read_tokenizer_text,
)
from gigatron.training.tokenizer._sentencepiece import (
    _GPTSentencePieceTokenizer,
    _Llama2Tokenizer,
    _SentencePieceTokenizer,
)
from gigatron.training.tokenizer._tiktoken import (
    PATTERN_TIKTOKEN,
    PATTERN_TIKTOKEN_V2,
    CustomTikTokenizer,
)

__all__ = [
    "build_tokenizer",
    "_NullTokenizer",
    "_GPT2BPETokenizer",
    "_HuggingFaceTokenizer",
    "_SentencePieceTokenizer",
    "_GPTSentencePieceTokenizer",
    "_Llama2Tokenizer",
    "_BertWordPieceTokenizer",
]


def _require(args: Any, name: str, tokenizer_type: str) -> Any:
    value = getattr(args, name, None)
    if value is None:
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"tokenizer_type {tokenizer_type!r} needs {flag} ({name} is None)")
    return value


def build_tokenizer(args: Any, **kwargs: Any) -> MegatronLegacyTokenizer:
    """Build the tokenizer named by `args.tokenizer_type`; set `args.padded_vocab_size`.

    Reads `vocab_file`, `merge_file`, `tokenizer_model`, `vocab_size`, `vocab_extra_ids`,
    `tiktoken_pattern`, `tiktoken_num_special_tokens` (1000), `tokenizer_special_tokens`,
    `make_vocab_size_divisible_by` (128) and `tensor_model_parallel_size` (1) from `args`.
    """
    kind = getattr(args, "tokenizer_type", None)
    if kind == "NullTokenizer":
        tokenizer = _NullTokenizer(_require(args, "vocab_size", kind))
    elif kind == "GPT2BPETokenizer":
        tokenizer = _GPT2BPETokenizer(
            _require(args, "vocab_file", kind), _require(args, "merge_file", kind)
        )
    elif kind == "HuggingFaceTokenizer":
        tokenizer = _HuggingFaceTokenizer(_require(args, "tokenizer_model", kind), **kwargs)
    elif kind == "SFTTokenizer":
        tokenizer = SFTTokenizer(
            _require(args, "tokenizer_model", kind),
            getattr(args, "sft_tokenizer_prompt_format", None) or "nemotron-h-aligned",
        )
    elif kind == "SentencePieceTokenizer":
        tokenizer = _SentencePieceTokenizer(
            _require(args, "tokenizer_model", kind),
            vocab_extra_ids=getattr(args, "vocab_extra_ids", 0) or 0,
        )
    elif kind == "GPTSentencePieceTokenizer":
        tokenizer = _GPTSentencePieceTokenizer(_require(args, "tokenizer_model", kind))
    elif kind == "Llama2Tokenizer":
        tokenizer = _Llama2Tokenizer(_require(args, "tokenizer_model", kind))
    elif kind == "BertWordPieceLowerCase":
        tokenizer = _BertWordPieceTokenizer(
            _require(args, "vocab_file", kind),
            lower_case=True,
            vocab_extra_ids=getattr(args, "vocab_extra_ids", 0) or 0,
        )
    elif kind == "BertWordPieceCase":
        tokenizer = _BertWordPieceTokenizer(
            _require(args, "vocab_file", kind),
            lower_case=False,
            vocab_extra_ids=getattr(args, "vocab_extra_ids", 0) or 0,
        )
    elif kind == "TikTokenizer":
        pattern = getattr(args, "tiktoken_pattern", None)
        if pattern not in ("v1", "v2"):
            raise ValueError(f"tiktoken_pattern ({pattern!r}) must be 'v1' or 'v2'")
        tokenizer = CustomTikTokenizer(
            path=_require(args, "tokenizer_model", kind),
            pattern=PATTERN_TIKTOKEN if pattern == "v1" else PATTERN_TIKTOKEN_V2,
            vocab_size=getattr(args, "vocab_size", None),
            num_special_tokens=getattr(args, "tiktoken_num_special_tokens", 1000),
            special_tokens=getattr(args, "tokenizer_special_tokens", None),
        )
    else:
        supported = (
            "NullTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, "
            "GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, BertWordPieceLowerCase, "
            "BertWordPieceCase, SFTTokenizer"
        )
        raise ValueError(f"tokenizer_type {kind!r} is not supported; use one of {supported}")
    if getattr(args, "padded_vocab_size", None) is None:
        try:
            args.padded_vocab_size = _vocab_size_with_padding(tokenizer.vocab_size, args)
        except AttributeError:
            pass  # a read-only args object (e.g. a namedtuple): nothing to record
    return tokenizer


def _vocab_size_with_padding(orig_vocab_size: int, args: Any, logging_enabled: bool = True) -> int:
    """Round up to a multiple of make_vocab_size_divisible_by * tensor_model_parallel_size."""
    multiple = (getattr(args, "make_vocab_size_divisible_by", 128) or 1) * (
        getattr(args, "tensor_model_parallel_size", 1) or 1
    )
    after = int(math.ceil(orig_vocab_size / multiple) * multiple)
    if logging_enabled and getattr(args, "rank", 0) == 0:
        print(
            f" > padded vocab (size: {orig_vocab_size}) with {after - orig_vocab_size} dummy "
            f"tokens (new size: {after})",
            flush=True,
        )
    return after


class _NullTokenizer(NullTokenizer):
    """Megatron's training-side name for the null tokenizer (`--tokenizer-type NullTokenizer`).

    A subclass, not an alias: the class name goes into `unique_identifiers`, hence into the md5
    that names dataset cache files, which must stay Megatron's."""


class _HFTokenizerBase(MegatronLegacyTokenizer):
    """Shared plumbing over a `tokenizers.Tokenizer` held in `self._tokenizer`."""

    _tokenizer: Any
    _add_special_tokens: bool = False

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=self._add_special_tokens).ids

    def detokenize(self, token_ids: Any) -> str:
        return self._tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=False)

    def offsets(self, ids: list[int], text: str) -> list[int]:
        encoding = self._tokenizer.encode(text, add_special_tokens=self._add_special_tokens)
        return [start for start, _ in encoding.offsets[: len(ids)]]

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocab(self) -> dict:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    @property
    def inv_vocab(self) -> dict:
        return {i: t for t, i in self.vocab.items()}

    @property
    def encoder(self) -> dict:
        return self.vocab

    @property
    def decoder(self) -> dict:
        return self.inv_vocab


class _GPT2BPETokenizer(_HFTokenizerBase):
    """GPT-2 byte-level BPE from `vocab.json` + `merges.txt`; EOD = `<|endoftext|>`."""

    def __init__(self, vocab_file: str, merge_file: str) -> None:
        super().__init__(vocab_file, merge_file)
        tk = _import_tokenizers()
        for path in (vocab_file, merge_file):
            if not os.path.lexists(path):  # what is there is checked when read
                raise FileNotFoundError(f"GPT2BPETokenizer: {path} does not exist")
        vocab = read_json_file(vocab_file, "GPT2BPETokenizer vocabulary")
        if not all(type(i) is int and i >= 0 for i in vocab.values()):
            raise ValueError(
                f"GPT2BPETokenizer vocabulary {vocab_file}: every value must be a token id "
                "(an integer >= 0)"
            )
        merges = read_merges(merge_file)
        try:
            model = tk.models.BPE(vocab, merges)
        except Exception as e:  # the Rust library's message, e.g. a merge of an unknown token
            raise ValueError(
                f"GPT2BPETokenizer: {vocab_file} + {merge_file} do not form a BPE model "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            ) from None
        self._tokenizer = tk.Tokenizer(model)
        # GPT-2's pre-tokenizer regex and byte-to-unicode map; no prefix space, as in GPT-2.
        self._tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        self._tokenizer.decoder = tk.decoders.ByteLevel()
        eod = self._tokenizer.token_to_id("<|endoftext|>")
        if eod is None:
            raise ValueError(f"GPT2BPETokenizer: {vocab_file} has no '<|endoftext|>' token")
        self.eod_id = eod

    @property
    def eod(self) -> int:
        return self.eod_id

    @property
    def eos(self) -> int:
        return self.eod_id


_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>")


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class _HuggingFaceTokenizer(_HFTokenizerBase):
    """A Hugging Face fast tokenizer from a local `tokenizer.json` (or a directory with one).

    Special tokens come from `tokenizer_config.json` / `special_tokens_map.json` next to it when
    present (eos_token -> eod, bos_token, pad_token); otherwise EOD is the first of
    `</s>`, `<|endoftext|>`, `<|end_of_text|>`, `<eos>` in the vocabulary. `tokenize` applies the
    file's post-processor (e.g. a BOS token), as `transformers` does.
    """

    _add_special_tokens = True

    def __init__(self, pretrained_model_name_or_path: str, **kwargs: Any) -> None:
        super().__init__(pretrained_model_name_or_path, **kwargs)
        tk = _import_tokenizers()
        path = pretrained_model_name_or_path
        directory = path if os.path.isdir(path) else os.path.dirname(path)
        json_path = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.lexists(json_path):
            raise FileNotFoundError(
                f"HuggingFaceTokenizer: {json_path} does not exist (gigatron loads local "
                "tokenizer.json files only; nothing is downloaded)"
            )
        text = read_tokenizer_text(json_path, "HuggingFaceTokenizer")
        try:
            self._tokenizer = tk.Tokenizer.from_str(text)
        except Exception as e:  # the Rust library's message (bad JSON, unknown model type)
            raise ValueError(
                f"HuggingFaceTokenizer {json_path} is not a tokenizer.json the `tokenizers` "
                f"library reads ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            ) from None
        special: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            cfg_path = os.path.join(directory, name)
            if os.path.lexists(cfg_path):
                special.update(read_json_file(cfg_path, "HuggingFaceTokenizer settings"))
        self._eos_id = self._id_of(special.get("eos_token"))
        if self._eos_id is None:
            self._eos_id = next(
                (
                    self._tokenizer.token_to_id(t)
                    for t in _EOS_CANDIDATES
                    if self._tokenizer.token_to_id(t) is not None
                ),
                None,
            )
        self._bos_id = self._id_of(special.get("bos_token"))
        self._pad_id = self._id_of(special.get("pad_token"))

    def _id_of(self, token: Any) -> int | None:
        content = _token_content(token)
        return None if content is None else self._tokenizer.token_to_id(content)

    @property
    def eod(self) -> int | None:
        return self._eos_id

    @property
    def eos(self) -> int | None:
        return self._eos_id

    @property
    def bos(self) -> int | None:
        return self._bos_id

    @property
    def pad(self) -> int | None:
        return self._pad_id
