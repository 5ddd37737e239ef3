"""BERT's WordPiece tokenizer from a `vocab.txt`: `--tokenizer-type BertWordPieceLowerCase` /
`BertWordPieceCase`.

Mirrors `_BertWordPieceTokenizer` of `megatron.training.tokenizer.tokenizer` (over Megatron's copy
of Google's `bert_tokenization.FullTokenizer`): ids are line numbers of the vocabulary file;
`[CLS]`, `[SEP]`, `[PAD]`, `[MASK]` come from it; `[BOS]` and `[EOS]` are appended when absent,
then `--vocab-extra-ids N` sentinels `<extra_id_0>` ... `<extra_id_{N-1}>` (T5's span markers).
The added tokens take ids after the file's and never come out of `tokenize` (their brackets are
punctuation to BERT's splitter), as in Megatron.

The text is split by Hugging Face `tokenizers`' BERT normalizer, pre-tokenizer and WordPiece model,
which implement the original algorithm: clean control characters, space out CJK characters,
lower-case and strip accents (LowerCase only), split on whitespace and punctuation, then greedy
longest-match-first word pieces ("##" continuations, `[UNK]` for a word of no pieces or over 200
characters).
"""

from __future__ import annotations

from typing import Any

from gigatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
from gigatron.training.tokenizer._common import _import_tokenizers, read_tokenizer_text

_MAX_CHARS_PER_WORD = 200  # bert_tokenization.WordpieceTokenizer's default


def _load_vocab(vocab_file: str) -> dict[str, int]:
    """token -> line number (bert_tokenization.load_vocab: stripped lines, a repeat overwrites)."""
    vocab: dict[str, int] = {}
    text = read_tokenizer_text(vocab_file, "BERT vocabulary")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as file lines
    if lines and lines[-1] == "":
        lines.pop()
    for index, line in enumerate(lines):
        vocab[line.strip()] = index
    return vocab


class _BertWordPieceTokenizer(MegatronLegacyTokenizer):
    """Original BERT WordPiece tokenizer, with [BOS]/[EOS] and `vocab_extra_ids` sentinels."""

    def __init__(self, vocab_file: str, lower_case: bool = True, vocab_extra_ids: int = 0) -> None:
        super().__init__(vocab_file, lower_case=lower_case, vocab_extra_ids=vocab_extra_ids)
        tk = _import_tokenizers()
        self._vocab = _load_vocab(vocab_file)
        specials = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")
        missing = [t for t in specials if t not in self._vocab]
        if missing:
            raise ValueError(
                f"the BERT vocabulary {vocab_file} has no {missing} (one token per line, "
                "BERT's special tokens included)"
            )
        wordpiece = tk.models.WordPiece(
            dict(self._vocab), unk_token="[UNK]", max_input_chars_per_word=_MAX_CHARS_PER_WORD
        )
        self._tokenizer = tk.Tokenizer(wordpiece)
        self._tokenizer.normalizer = tk.normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=lower_case,
            lowercase=lower_case,
        )  # fmt: skip
        self._tokenizer.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
        self._inv_vocab = {i: t for t, i in self._vocab.items()}
        self.cls_id, self.sep_id = self._vocab["[CLS]"], self._vocab["[SEP]"]
        self.pad_id, self.mask_id = self._vocab["[PAD]"], self._vocab["[MASK]"]
        self._bos_token, self._eos_token = "[BOS]", "[EOS]"
        self.add_token(self._bos_token)
        self.add_token(self._eos_token)
        self._bos_token_id = self._vocab[self._bos_token]
        self._eos_token_id = self._vocab[self._eos_token]
        self._additional_special_tokens: list[str] = []
        self.add_additional_special_tokens([f"<extra_id_{i}>" for i in range(vocab_extra_ids)])

    def add_token(self, token: str) -> None:
        """Append `token` at id `vocab_size` unless the vocabulary has it."""
        if token not in self._vocab:
            self._inv_vocab[self.vocab_size] = token
            self._vocab[token] = self.vocab_size

    def add_additional_special_tokens(self, tokens: list[str]) -> None:
        self._additional_special_tokens = list(tokens)
        for token in tokens:
            self.add_token(token)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Any) -> str:
        """Tokens joined by spaces, "##" continuations glued on (convert_tokens_to_string)."""
        tokens = [self._inv_vocab[int(i)] for i in ids]
        return " ".join(tokens).replace(" ##", "").strip()

    def detokenize(self, token_ids: Any) -> str:
        return self.decode(token_ids)

    def decode_token_ids(self, token_ids: Any) -> str:
        """Megatron's variant for generation: [PAD] and [CLS] dropped, pieces glued."""
        out = ""
        for token in (self._inv_vocab[int(i)] for i in token_ids):
            if token in ("[PAD]", "[CLS]"):
                continue
            out += token[2:] if token.startswith("##") else " " + token
        return out

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def vocab(self) -> dict:
        return self._vocab

    @property
    def inv_vocab(self) -> dict:
        return self._inv_vocab

    @property
    def cls(self) -> int:
        return self.cls_id

    @property
    def sep(self) -> int:
        return self.sep_id

    @property
    def pad(self) -> int:
        return self.pad_id

    @property
    def mask(self) -> int:
        return self.mask_id

    @property
    def bos(self) -> int:
        return self._bos_token_id

    @property
    def eos(self) -> int:
        return self._eos_token_id

    @property
    def bos_token(self) -> str:
        return self._bos_token

    @property
    def eos_token(self) -> str:
        return self._eos_token

    @property
    def bos_token_id(self) -> int:
        return self._bos_token_id

    @property
    def eos_token_id(self) -> int:
        return self._eos_token_id

    @property
    def additional_special_tokens(self) -> list[str]:
        return self._additional_special_tokens

    @additional_special_tokens.setter
    def additional_special_tokens(self, value: list[str]) -> None:
        self._additional_special_tokens = value

    @property
    def additional_special_tokens_ids(self) -> list[int]:
        return [self._vocab.get(t) for t in self._additional_special_tokens]
