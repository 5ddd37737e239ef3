"""Tokenizers without BERT specials (Null, GPT SentencePiece, Llama-2) share one mixin: cls, sep,
mask are -1 and there are no sentinel ids, as in Megatron; the BERT/T5 SentencePiece tokenizer
keeps its appended <CLS>/<SEP>/<MASK>."""

from types import SimpleNamespace

import pytest

from gigatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
from gigatron.training.tokenizer import build_tokenizer

spm = pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm_specials")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(["the lazy dog sends gradients forward and back"] * 50))
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(d / "m"), vocab_size=40, model_type="bpe",
        bos_id=1, eos_id=2, unk_id=0, pad_id=3, minloglevel=2,
    )  # fmt: skip
    return str(d / "m.model")


def _build(kind, **kw):
    args = dict(tokenizer_type=kind, rank=0, make_vocab_size_divisible_by=8, vocab_extra_ids=0)
    return build_tokenizer(SimpleNamespace(**{**args, **kw}))


@pytest.mark.parametrize("kind", ["NullTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"])
def test_no_bert_specials(kind, sp_model):
    tok = _build(kind, vocab_size=50, tokenizer_model=sp_model)
    assert isinstance(tok, MegatronLegacyTokenizer)
    assert (tok.cls, tok.sep, tok.mask, tok.additional_special_tokens_ids) == (-1, -1, -1, None)
    eod = 50 if kind == "NullTokenizer" else 2  # the extra id after vocab_size / the model's eos
    assert tok.eod == tok.eos == eod


def test_bert_sentencepiece_keeps_its_specials(sp_model):
    tok = _build("SentencePieceTokenizer", tokenizer_model=sp_model, vocab_extra_ids=1)
    assert [tok.cls, tok.sep, tok.eod, tok.mask] == [40, 41, 42, 43]
    assert tok.additional_special_tokens_ids == [44]
