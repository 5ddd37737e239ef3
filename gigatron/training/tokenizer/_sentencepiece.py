"""SentencePiece tokenizers (Megatron's `_SentencePieceTokenizer`, `_GPTSentencePieceTokenizer`,
`_Llama2Tokenizer`). They need the `sentencepiece` package; without it they raise an ImportError
that says so.
"""

from __future__ import annotations

from typing import Any

from gigatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
from gigatron.core.untrusted_files import read_bytes
from gigatron.training.tokenizer._common import _WithoutBertSpecials


def _load_sentencepiece(model_file: str) -> Any:
    try:
        import sentencepiece
    except ImportError as err:
        raise ImportError(
            f"SentencePiece tokenizers need the `sentencepiece` package to read {model_file}: "
            "pip install sentencepiece"
        ) from err
    data = read_bytes(model_file, what="SentencePiece model", max_bytes="tokenizer")
    try:
        return sentencepiece.SentencePieceProcessor(model_proto=data)
    except Exception as e:  # the C++ library's message
        raise ValueError(
            f"SentencePiece model {model_file} is not a model sentencepiece reads "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        ) from None


class _SentencePieceTokenizer(MegatronLegacyTokenizer):
    """SentencePiece model plus Megatron's special tokens <CLS> <SEP> <EOD> <MASK>, pad, bos,
    eos and `vocab_extra_ids` sentinels <extra_id_i> (appended when missing)."""

    def __init__(self, model_file: str, vocab_extra_ids: int = 0) -> None:
        super().__init__(model_file, vocab_extra_ids=vocab_extra_ids)
        self.tokenizer = _load_sentencepiece(model_file)
        self._initalize(vocab_extra_ids)

    def _populate_vocab(self) -> None:
        self._inv_vocab = {i: self.tokenizer.id_to_piece(i) for i in range(len(self.tokenizer))}
        self._vocab = {t: i for i, t in self._inv_vocab.items()}

    def _add_special_token(self, token: str) -> int:
        if token not in self._vocab:
            next_id = len(self._vocab)
            self._vocab[token] = next_id
            self._inv_vocab[next_id] = token
        self._special_tokens[token] = self._vocab[token]
        self._inv_special_tokens[self._vocab[token]] = token
        return self._vocab[token]

    def _piece_or(self, piece_id: int, fallback: str) -> str:
        try:
            return self.tokenizer.id_to_piece(piece_id)
        except IndexError:
            return fallback

    def _initalize(self, vocab_extra_ids: int) -> None:
        self._populate_vocab()
        self._special_tokens: dict[str, int] = {}
        self._inv_special_tokens: dict[int, str] = {}
        self._t5_tokens: list[str] = []
        self._cls_id = self._add_special_token("<CLS>")
        self._sep_id = self._add_special_token("<SEP>")
        self._eod_id = self._add_special_token("<EOD>")
        self._mask_id = self._add_special_token("<MASK>")
        self._pad_id = self._add_special_token(self._piece_or(self.tokenizer.pad_id(), "<PAD>"))
        self._bos_id = self._add_special_token(self._piece_or(self.tokenizer.bos_id(), "<BOS>"))
        self._eos_id = self._add_special_token(self._piece_or(self.tokenizer.eos_id(), "<EOS>"))
        for i in range(vocab_extra_ids):
            token = f"<extra_id_{i}>"
            self._add_special_token(token)
            self._t5_tokens.append(token)

    def tokenize(self, text: str) -> list[int]:
        """Special tokens written in the text map to their ids; the rest goes to SentencePiece."""
        ids: list[int] = []
        idx = 0
        while True:
            found = {t: text.find(t, idx) for t in self._special_tokens}
            found = {t: i for t, i in found.items() if i >= 0}
            if not found:
                break
            token = min(found, key=found.get)
            ids.extend(self.tokenizer.encode_as_ids(text[idx : found[token]]))
            ids.append(self._special_tokens[token])
            idx = found[token] + len(token)
        ids.extend(self.tokenizer.encode_as_ids(text[idx:]))
        return ids

    def detokenize(self, ids: list[int]) -> str:
        text, last = "", 0
        for i, id_ in enumerate(ids):
            if id_ in self._inv_special_tokens:
                text += self.tokenizer.decode_ids(ids[last:i]) + " "
                text += self._inv_special_tokens[id_] + " "
                last = i + 1
        return text + self.tokenizer.decode_ids(ids[last:])

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
        return self._cls_id

    @property
    def sep(self) -> int:
        return self._sep_id

    @property
    def pad(self) -> int:
        return self._pad_id

    @property
    def bos(self) -> int:
        return self._bos_id

    @property
    def eod(self) -> int:
        return self._eod_id

    @property
    def eos(self) -> int:
        return self._eos_id

    @property
    def mask(self) -> int:
        return self._mask_id

    @property
    def additional_special_tokens_ids(self) -> list[int]:
        return [self._vocab[t] for t in self._t5_tokens]


class _GPTSentencePieceTokenizer(_WithoutBertSpecials, _SentencePieceTokenizer):
    """Plain SentencePiece ids; EOD = the model's eos id."""

    def __init__(self, model_file: str) -> None:
        super().__init__(model_file, vocab_extra_ids=0)

    def _initalize(self, vocab_extra_ids: int) -> None:
        self._populate_vocab()
        self._pad_id = self.tokenizer.pad_id()
        self._bos_id = self.tokenizer.bos_id()
        self._eos_id = self.tokenizer.eos_id()

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode_as_ids(text)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode_ids(ids)

    @property
    def eod(self) -> int:
        return self._eos_id


class _Llama2Tokenizer(_GPTSentencePieceTokenizer):
    """Llama-2 SentencePiece: `tokenize` prepends BOS by default."""

    def tokenize(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text)
        return ([self._bos_id] if bos else []) + ids + ([self._eos_id] if eos else [])
