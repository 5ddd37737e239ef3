"""megatron.core.tokenizers.text.libraries.bytelevel_tokenizer: UTF-8 bytes as ids, special
tokens counted down from the top of the vocabulary, through MegatronTokenizer.from_pretrained."""

import pytest

from gigatron.core.tokenizers import MegatronTokenizer
from gigatron.core.tokenizers.text.libraries import ByteLevelTokenizer
from gigatron.core.tokenizers.text.libraries.abstract_tokenizer import (
    MegatronTokenizerTextAbstract,
)


def test_bytes_round_trip_and_special_ids():
    tok = ByteLevelTokenizer(special_tokens=["<A>", "<B>"], vocab_size=300, _bos_id=2)
    assert tok.vocab_size == 302 and tok.special_start == 300
    assert tok.token_to_id("<A>") == 301 and tok.token_to_id("<B>") == 300
    assert tok.text_to_ids("hé") == [104, 195, 169]
    assert tok.ids_to_text([104, 195, 169, 301, 32]) == "hé"  # specials dropped, rstrip
    assert tok.ids_to_tokens([104, 300]) == [104, "<B>"]
    assert tok.tokens_to_ids(["<A>", 7]) == [301, 7] and tok.tokens_to_ids("<A>") == [301]
    assert (tok.eos_id, tok.eod, tok.pad_id, tok.bos_id, tok.unk_id) == (0, 0, 1, 2, 259)
    with pytest.raises(NotImplementedError, match="special_tokens"):
        tok.add_special_tokens(["<C>"])


def test_from_pretrained_byte_level():
    tok = MegatronTokenizer.from_pretrained(
        metadata_path={"library": "byte-level"}, vocab_size=1024, _bos_id=3,
        special_tokens=["<T1>", "<T2>"],
    )  # fmt: skip
    assert tok.vocab_size == 1026
    assert tok.tokenize("Hello") == [72, 101, 108, 108, 111]
    assert tok.detokenize([72, 101, 108, 108, 111, 1025]) == "Hello"
    assert tok.eod == 0 and tok.pad == 1


def test_abstract_aliases_read_short_names():
    class Lib(MegatronTokenizerTextAbstract):
        text_to_tokens = tokens_to_text = tokens_to_ids = ids_to_tokens = None
        text_to_ids = ids_to_text = add_special_tokens = None
        pad, eos = 5, 9

    lib = Lib()
    assert lib.pad_id == 5 and lib.eos_id == 9 and lib.eod == 9  # eod falls back to EOS
    with pytest.raises(AttributeError, match="'mask' or 'mask_id'"):
        lib.mask_id  # noqa: B018
