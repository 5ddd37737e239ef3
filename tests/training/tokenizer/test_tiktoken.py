"""TikTokenizer: ids equal to tiktoken's BPE algorithm (a direct reference implementation)."""

import base64
import json
import os
from types import SimpleNamespace

import pytest

from gigatron.tools.train_tokenizer import train_bpe_tokenizer
from gigatron.training.tokenizer import build_tokenizer
from gigatron.training.tokenizer._tiktoken import (
    PATTERN_TIKTOKEN,
    PATTERN_TIKTOKEN_V2,
    _bytes_to_unicode,
)

regex = pytest.importorskip("regex")
pytest.importorskip("tokenizers")

TEXTS = [
    "The quick brown fox jumps over the lazy dog, again and again!",
    "Numbers 12345 and symbols #@$ mix with ÜNICODE ümlauts, 日本語 and emoji 🙂.",
    "  leading spaces\n\nand new lines\r\n\tTabs too... don't they're",
] * 15


def _reference_encode(text, ranks, pattern):
    """tiktoken's encode_ordinary: regex pieces, then lowest-rank-first byte-pair merges."""
    ids = []
    for piece in regex.findall(pattern, text):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                rank = ranks.get(parts[i] + parts[i + 1])
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, i)
            if best is None:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[p] for p in parts]
    return ids


@pytest.fixture(scope="module")
def rank_file(tmp_path_factory):
    """A valid rank file: the 256 bytes, then the tokens of a small trained BPE in merge order."""
    root = str(tmp_path_factory.mktemp("tt"))
    train_bpe_tokenizer(TEXTS, vocab_size=400, output_dir=root, min_frequency=1)
    decode = {c: b for b, c in _bytes_to_unicode().items()}
    ranks = {bytes([i]): i for i in range(256)}
    with open(os.path.join(root, "merges.txt")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            left, right = line.rstrip("\n").split(" ")
            token = bytes(decode[c] for c in left + right)
            ranks.setdefault(token, len(ranks))
    entries = [
        {
            "rank": r,
            "token_bytes": base64.b64encode(t).decode(),
            "token_str": t.decode("utf-8", "replace"),
        }
        for t, r in sorted(ranks.items(), key=lambda x: x[1])
    ]
    path = os.path.join(root, "ranks.json")
    with open(path, "w") as f:
        json.dump(entries, f)
    return path, ranks


@pytest.mark.parametrize("version,pattern", [("v1", PATTERN_TIKTOKEN), ("v2", PATTERN_TIKTOKEN_V2)])
def test_tiktokenizer_matches_reference(rank_file, version, pattern):
    path, ranks = rank_file
    args = SimpleNamespace(
        tokenizer_type="TikTokenizer",
        tokenizer_model=path,
        tiktoken_pattern=version,
        vocab_size=1024,
        tiktoken_num_special_tokens=16,
        tokenizer_special_tokens=None,
    )
    tok = build_tokenizer(args)
    assert tok.vocab_size == 1024 and tok.eod == tok.eos == 2 and tok.bos == 1
    assert tok.unique_identifiers["class"] == "CustomTikTokenizer"
    for text in TEXTS[:3] + ["", "a", "  ", "\n\n\n"]:
        want = [i + 16 for i in _reference_encode(text, ranks, pattern)]
        ids = tok.tokenize(text)
        assert ids == want, text
        assert tok.detokenize(ids) == text
    assert tok.detokenize([1] + tok.tokenize("hi")) == "<s>hi"
    with pytest.raises(ValueError, match="tiktoken_pattern"):
        build_tokenizer(SimpleNamespace(tokenizer_type="TikTokenizer", tokenizer_model=path))
