"""Megatron's BertWordPieceLowerCase / BertWordPieceCase tokenizers (`--vocab-file vocab.txt`).

Ids equal the original BERT algorithm's (`transformers`' legacy pure-Python BasicTokenizer +
WordpieceTokenizer, a port of Google's bert_tokenization that Megatron copies) on text with
punctuation, accents, CJK characters, control characters and an over-long word; [BOS], [EOS] and
the `vocab_extra_ids` sentinels are appended after the file's tokens, as Megatron's
`_BertWordPieceTokenizer` does.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gigatron.training.tokenizer import build_tokenizer

legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", ".",
         ",", "##s", "un", "##able", "café", "cafe", "hello", "Hello", "!", "中", "##t", "c",
         "##a"]  # fmt: skip
TEXT = "Hello, the Cats sat on the mat! Unable café CAFÉ 中文 x\tcat\u0000s " + "a" * 250


def _tokenizer(tmp_path, kind, extra=0):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    args = SimpleNamespace(tokenizer_type=kind, vocab_file=str(path), vocab_extra_ids=extra,
                           rank=1)  # fmt: skip
    return build_tokenizer(args), args


@pytest.mark.parametrize("kind, lower", [("BertWordPieceLowerCase", True),
                                         ("BertWordPieceCase", False)])  # fmt: skip
def test_ids_equal_the_original_algorithm(tmp_path, kind, lower):
    tok, _ = _tokenizer(tmp_path, kind)
    vocab = {t: i for i, t in enumerate(VOCAB)}
    basic = legacy.BasicTokenizer(do_lower_case=lower, tokenize_chinese_chars=True)
    pieces = legacy.WordpieceTokenizer(vocab, "[UNK]", max_input_chars_per_word=200)
    want = [vocab[p] for word in basic.tokenize(TEXT) for p in pieces.tokenize(word)]
    assert tok.tokenize(TEXT) == want
    assert tok.detokenize(tok.tokenize("the cats sat")) == "the cats sat"


def test_specials_and_sentinels_follow_megatron(tmp_path):
    tok, args = _tokenizer(tmp_path, "BertWordPieceLowerCase", extra=3)
    n = len(VOCAB)
    assert (tok.pad, tok.cls, tok.sep, tok.mask) == (0, 2, 3, 4)
    assert (tok.bos, tok.eos) == (n, n + 1) and tok.vocab["[BOS]"] == n
    assert tok.additional_special_tokens == ["<extra_id_0>", "<extra_id_1>", "<extra_id_2>"]
    assert tok.additional_special_tokens_ids == [n + 2, n + 3, n + 4]
    assert tok.vocab_size == n + 5 and tok.inv_vocab[n + 4] == "<extra_id_2>"
    assert args.padded_vocab_size == 128
    # the dataset cache hash reads these, as Megatron builds them
    assert tok.unique_identifiers["class"] == "_BertWordPieceTokenizer"
    assert tok.unique_identifiers["lower_case"] == "True"
    assert tok.unique_identifiers["vocab_extra_ids"] == "3"
    assert tok.decode_token_ids([tok.cls, 6, 12, tok.pad]) == " cats"


def test_a_vocabulary_without_bert_specials_is_refused(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("the\ncat\n", encoding="utf-8")
    args = SimpleNamespace(tokenizer_type="BertWordPieceCase", vocab_file=str(path), rank=1)
    with pytest.raises(ValueError, match=r"has no \['\[CLS\]', '\[SEP\]', '\[PAD\]'"):
        build_tokenizer(args)
