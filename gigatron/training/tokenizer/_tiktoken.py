"""Megatron's `CustomTikTokenizer` (`--tokenizer-type TikTokenizer`) on Hugging Face `tokenizers`.

The vocabulary file is Megatron's JSON list of `{"rank", "token_bytes" (base64), "token_str"}`,
ranks 0..255 being the single bytes. tiktoken's BPE repeatedly merges the adjacent pair whose
merged bytes have the lowest rank; that is a byte-level BPE whose merges are ordered by the rank
of the merged token, so the ranks are converted to (vocab, merges) once and run by `tokenizers`
(no `tiktoken` needed). Ids: `num_special_tokens` special ids first (`<unk>`, `<s>`, `</s>`, ...,
`<SPECIAL_i>` fillers), then the ranks shifted by that count; EOD = EOS = `</s>`.
"""

from __future__ import annotations

import base64
from typing import Any

from gigatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
from gigatron.training.tokenizer._common import _import_tokenizers, read_json_file

PATTERN_TIKTOKEN = (
    r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
PATTERN_TIKTOKEN_V2 = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def load_mergeable_ranks(path: str, max_vocab: int | None = None) -> dict[bytes, int]:
    """Megatron's `reload_mergeable_ranks`: token bytes -> rank, checked."""
    vocab = read_json_file(path, "TikTokenizer vocabulary", list)
    if max_vocab is not None:
        vocab = vocab[:max_vocab]
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(vocab):
        if not isinstance(entry, dict) or entry.get("rank") != i:
            rank = entry.get("rank") if isinstance(entry, dict) else entry
            raise ValueError(f"{path}: entry {i} has rank {rank!r}, expected {i}")
        try:
            token = base64.b64decode(entry["token_bytes"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: entry {i} has no base64 token_bytes ({e})") from None
        if i < 256 and token != bytes([i]):
            raise ValueError(f"{path}: rank {i} < 256 must be the single byte {i}")
        ranks[token] = i
    if len(ranks) != len(vocab):
        raise ValueError(f"{path}: duplicate token_bytes entries")
    return ranks


def ranks_to_bpe(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of the byte-level BPE equivalent to tiktoken on `ranks`."""
    byte_map = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(byte_map[x] for x in b)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], text(left), text(right)))
    merges.sort()
    return vocab, [(m[3], m[4]) for m in merges]


class CustomTikTokenizer(MegatronLegacyTokenizer):
    """tiktoken-style BPE from Megatron's JSON rank file.

    Args:
        path: the JSON rank file.
        pattern: the pre-tokenizer regex (PATTERN_TIKTOKEN or PATTERN_TIKTOKEN_V2).
        vocab_size: total ids including special tokens (default 2**17).
        num_special_tokens: ids reserved at the start for special tokens.
        special_tokens: must include `<unk>`, `<s>`, `</s>`.
    """

    def __init__(
        self,
        path: str,
        pattern: str,
        vocab_size: int | None,
        num_special_tokens: int,
        special_tokens: list[str] | None,
    ) -> None:
        super().__init__(
            path,
            pattern=pattern,
            vocab_size=vocab_size,
            num_special_tokens=num_special_tokens,
            special_tokens=special_tokens,
        )
        tk = _import_tokenizers()
        self._vocab_size = vocab_size if vocab_size is not None else 2**17
        special = list(special_tokens) if special_tokens is not None else SPECIAL_TOKENS[:]
        if len(set(special)) != len(special) or not set(SPECIAL_TOKENS) <= set(special):
            raise ValueError(
                f"special_tokens {special} must be unique and include {SPECIAL_TOKENS}"
            )
        if not len(special) <= num_special_tokens < self._vocab_size:
            raise ValueError(
                f"num_special_tokens ({num_special_tokens}) must be >= {len(special)} special "
                f"tokens and < vocab_size ({self._vocab_size})"
            )
        special += [f"<SPECIAL_{i}>" for i in range(len(special), num_special_tokens)]
        ranks = load_mergeable_ranks(path, max_vocab=self._vocab_size - num_special_tokens)
        vocab, merges = ranks_to_bpe(ranks)
        vocab = {t: r + num_special_tokens for t, r in vocab.items()}
        # Special ids are not in the BPE model: tiktoken's encode_ordinary never produces them.
        self._tokenizer = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges))
        self._tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [
                tk.pre_tokenizers.Split(tk.Regex(pattern), behavior="isolated"),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        self._tokenizer.decoder = tk.decoders.ByteLevel()
        self._special = {t: i for i, t in enumerate(special)}
        self._inv_special = {i: t for t, i in self._special.items()}
        self._unk_id = self._special["<unk>"]
        self._bos_id = self._special["<s>"]
        self._eos_id = self._special["</s>"]
        self._num_special = num_special_tokens

    def tokenize(self, s: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._tokenizer.encode(s, add_special_tokens=False).ids
        return ([self._bos_id] if bos else []) + ids + ([self._eos_id] if eos else [])

    def detokenize(self, tokens: list[int]) -> str:
        out, run = [], []
        for t in tokens:
            t = int(t)
            if t < self._num_special:
                out.append(self._tokenizer.decode(run))
                out.append(self._inv_special[t])
                run = []
            else:
                run.append(t)
        out.append(self._tokenizer.decode(run))
        return "".join(out)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def vocab(self) -> dict[Any, int]:
        return {**self._special, **self._tokenizer.get_vocab()}

    @property
    def inv_vocab(self) -> dict[int, Any]:
        return {i: t for t, i in self.vocab.items()}

    @property
    def bos(self) -> int:
        return self._bos_id

    @property
    def eos(self) -> int:
        return self._eos_id

    @property
    def unk(self) -> int:
        return self._unk_id

    @property
    def eod(self) -> int:
        return self._eos_id
