"""megatron.core.tokenizers.utils.build_tokenizer: tokenizer_type -> tokenizer, padded vocab."""

import math
from types import SimpleNamespace

import pytest

from gigatron.core.tokenizers.text import MegatronTokenizerText
from gigatron.core.tokenizers.utils.build_tokenizer import build_tokenizer, vocab_size_with_padding


def _args(**kw):
    base = dict(tokenizer_type="NullTokenizer", vocab_size=100, rank=0, pad_vocab_size=True,
                make_vocab_size_divisible_by=64, tensor_model_parallel_size=2)  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_null_tokenizer_is_the_text_null_library_with_padded_vocab():
    args = _args(null_tokenizer_eod_id=7)
    tok = build_tokenizer(args)
    assert isinstance(tok, MegatronTokenizerText)
    assert tok.vocab_size == 100 and tok.eod == 7 and tok.pad == -1
    assert tok.tokenize("1 2 3") == [1, 2, 3]
    assert args.padded_vocab_size == 128


def test_padded_vocab_size_already_set_or_not_asked_is_kept():
    args = _args(padded_vocab_size=999)
    build_tokenizer(args)
    assert args.padded_vocab_size == 999
    args = _args(pad_vocab_size=False)
    build_tokenizer(args)
    assert not hasattr(args, "padded_vocab_size")


def test_unknown_and_missing_types():
    with pytest.raises(ValueError, match="tokenizer_type Nope is not supported"):
        build_tokenizer(_args(tokenizer_type="Nope"))
    with pytest.raises(NotImplementedError, match="MultimodalTokenizer"):
        build_tokenizer(_args(tokenizer_type="MultimodalTokenizer"))
    with pytest.raises(NotImplementedError, match="SFTTokenizer: build it with gigatron.training"):
        build_tokenizer(_args(tokenizer_type="SFTTokenizer"))
    with pytest.raises(NotImplementedError, match="gigatron.training.tokenizer.build_tokenizer"):
        build_tokenizer(_args(tokenizer_type="GPT2BPETokenizer"))


@pytest.mark.parametrize("vocab,mult,tp", [(1, 1, 1), (1000, 128, 1), (50257, 128, 8), (64, 64, 1)])
def test_vocab_size_with_padding_rounds_up(vocab, mult, tp):
    args = SimpleNamespace(rank=1, make_vocab_size_divisible_by=mult, tensor_model_parallel_size=tp)
    after = vocab_size_with_padding(vocab, args)
    assert after % (mult * tp) == 0 and vocab <= after < vocab + mult * tp
    assert after == math.ceil(vocab / (mult * tp)) * mult * tp
