"""SentencePiece tokenizers against the sentencepiece library on a model trained here."""

from types import SimpleNamespace

import pytest

spm = pytest.importorskip("sentencepiece")

from gigatron.training.tokenizer import build_tokenizer  # noqa: E402

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Megatron splits layers across ranks; gigatron does it on a laptop.",
    "Pipelines send activations forward and gradients backward.",
] * 40


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(TEXT))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(d / "m"),
        vocab_size=120,
        model_type="bpe",
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=3,
        minloglevel=2,
    )
    return str(d / "m.model")


def _args(kind, model, **kw):
    fields = dict(
        tokenizer_type=kind,
        tokenizer_model=model,
        rank=0,
        make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=1,
        vocab_extra_ids=0,
    )
    return SimpleNamespace(**{**fields, **kw})


def test_gpt_sentencepiece_matches_the_library(sp_model):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer(_args("GPTSentencePieceTokenizer", sp_model))
    text = "The lazy fox sends gradients forward."
    assert tok.tokenize(text) == sp.encode_as_ids(text)
    assert tok.detokenize(tok.tokenize(text)) == text
    assert tok.vocab_size == 120 and tok.eod == sp.eos_id() == 2


def test_llama2_prepends_bos(sp_model):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer(_args("Llama2Tokenizer", sp_model))
    assert tok.tokenize("lazy dog") == [sp.bos_id()] + sp.encode("lazy dog")


def test_megatron_sentencepiece_adds_special_tokens(sp_model):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer(_args("SentencePieceTokenizer", sp_model, vocab_extra_ids=2))
    # <CLS> <SEP> <EOD> <MASK> and two sentinels are appended after the model's 120 pieces;
    # pad/bos/eos already exist in the model.
    assert tok.vocab_size == 120 + 4 + 2
    assert [tok.cls, tok.sep, tok.eod, tok.mask] == [120, 121, 122, 123]
    assert tok.pad == sp.pad_id() and tok.bos == sp.bos_id() and tok.eos == sp.eos_id()
    ids = tok.tokenize("lazy dog<MASK>fox")
    assert tok.mask in ids
    assert tok.detokenize(sp.encode_as_ids("lazy dog")) == "lazy dog"
