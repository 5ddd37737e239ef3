"""`ByteLevelTokenizer`: text as its UTF-8 bytes (id = byte value, 0..255), with special tokens
at the top of the vocabulary.

`vocab_size` (default 512) grows by the number of `special_tokens`; the k-th special token (of
n) gets id `vocab_size + n - 1 - k` (counted down from the top), and ids from the lowest special
id up are dropped when decoding. EOS (= EOD) is id 0, PAD 1, BOS None unless given (`_eos_id`,
`_pad_id`, `_bos_id`); they map to themselves. Tokens are ids, except special tokens, which are
their strings.
"""

from __future__ import annotations

from gigatron.core.tokenizers.text.libraries.abstract_tokenizer import (
    MegatronTokenizerTextAbstract,
)


class ByteLevelTokenizer(MegatronTokenizerTextAbstract):
    """Byte-level text tokenizer; see the module docstring."""

    def __init__(
        self,
        special_tokens: dict | list | None = None,
        vocab_size: int = 512,
        _eos_id: int = 0,
        _pad_id: int = 1,
        _bos_id: int | None = None,
    ) -> None:
        self._eos_id, self._pad_id, self._bos_id = _eos_id, _pad_id, _bos_id
        specials = list(special_tokens or [])
        self.vocab_size = vocab_size + len(specials)
        self.special_token_to_id = {i: i for i in (_pad_id, _bos_id, _eos_id)}
        self.special_start = self.vocab_size - len(specials)
        for k, token in enumerate(specials):
            self.special_token_to_id[token] = self.vocab_size - 1 - k
        self.id_to_special_token = {v: k for k, v in self.special_token_to_id.items()}

    def text_to_ids(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def ids_to_text(self, ids) -> str:
        """The bytes below the special ids as UTF-8 (invalid bytes dropped), right-stripped."""
        kept = bytes(i for i in ids if i < self.special_start)
        return kept.decode("utf-8", errors="ignore").rstrip()

    text_to_tokens = text_to_ids  # tokens are ids
    tokens_to_text = ids_to_text

    def token_to_id(self, token):
        return self.special_token_to_id.get(token, token)

    def id_to_token(self, id_: int):
        return id_ if id_ < self.special_start else self.id_to_special_token[id_]

    def tokens_to_ids(self, tokens) -> list:
        return [self.token_to_id(t) for t in ([tokens] if isinstance(tokens, str) else tokens)]

    def ids_to_tokens(self, ids) -> list:
        return [self.id_to_token(i) for i in ([ids] if isinstance(ids, int) else ids)]

    def add_special_tokens(self, special_tokens) -> None:
        raise NotImplementedError("ByteLevelTokenizer: special tokens are fixed at construction "
                                  "(special_tokens=...)")  # fmt: skip

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def eod(self) -> int:
        return self._eos_id

    @property
    def unk_id(self) -> int:
        return 259
