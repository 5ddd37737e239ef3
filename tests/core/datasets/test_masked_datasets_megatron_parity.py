"""BERTMaskedWordPieceDataset and T5MaskedWordPieceDataset give megatron-core 0.16.1's samples
exactly (every field of every sample of every split) for the same files and config, through
each library's BlendedMegatronDatasetBuilder. Megatron's compiled helpers_cpp build_mapping is
the oracle for gigatron's NumPy port, which is also checked directly."""

import tempfile

import numpy
import pytest
import torch.distributed as dist

from tests.fixtures.bert_t5.corpus import write_corpus

mcore_data = pytest.importorskip("megatron.core.datasets.bert_dataset")


@pytest.fixture(scope="module", autouse=True)
def gloo_world():
    created = not dist.is_initialized()  # Megatron's sample index asks for the rank
    if created:
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("corpus") / "tiny_text_sentence")
    return prefix, write_corpus(prefix)


MASKING = [
    dict(masking_max_ngram=3, masking_do_full_word=True, masking_do_permutation=False,
         masking_use_longer_ngrams=False, masking_use_geometric_distribution=False),
    dict(masking_max_ngram=4, masking_do_full_word=False, masking_do_permutation=True,
         masking_use_longer_ngrams=True, masking_use_geometric_distribution=False),
    dict(masking_max_ngram=10, masking_do_full_word=True, masking_do_permutation=False,
         masking_use_longer_ngrams=False, masking_use_geometric_distribution=True),
]  # fmt: skip


def _build(lib, kind, prefix, tok, masking, cache, sizes):
    if lib == "megatron":
        from megatron.core.datasets import bert_dataset, t5_dataset
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
    else:
        from gigatron.core.datasets import bert_dataset, t5_dataset
        from gigatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
    common = dict(
        random_seed=1234,
        blend=([prefix], None),
        split="80,10,10",
        path_to_cache=cache,
        tokenizer=tok,
        masking_probability=0.15,
        short_sequence_probability=0.1,
        **masking,
    )
    if kind == "bert":
        cls = bert_dataset.BERTMaskedWordPieceDataset
        config = bert_dataset.BERTMaskedWordPieceDatasetConfig(
            sequence_length=48, classification_head=True, **common
        )
    else:
        cls = t5_dataset.T5MaskedWordPieceDataset
        config = t5_dataset.T5MaskedWordPieceDatasetConfig(
            sequence_length=48, sequence_length_decoder=32, **common
        )
    return BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()


@pytest.mark.parametrize("kind", ["bert", "t5"])
@pytest.mark.parametrize("masking", range(len(MASKING)))
def test_samples_identical_to_megatron(corpus, tmp_path, kind, masking):
    prefix, tok = corpus
    sizes = [40, 6, 3]  # Megatron needs sizes (None fails in its helpers_cpp call)
    ours = _build("gigatron", kind, prefix, tok, MASKING[masking], str(tmp_path / "g"), sizes)
    ref = _build("megatron", kind, prefix, tok, MASKING[masking], str(tmp_path / "m"), sizes)
    compared = 0
    for ours_split, ref_split in zip(ours, ref):
        assert len(ours_split) == len(ref_split)
        numpy.testing.assert_array_equal(ours_split.sample_index, ref_split.sample_index)
        for i in range(len(ref_split)):
            numpy.random.seed(i)  # Megatron's permutation draws one number from the global RNG
            a = ours_split[i]
            numpy.random.seed(i)
            b = ref_split[i]
            assert a.keys() == b.keys()
            for key in b:
                numpy.testing.assert_array_equal(a[key], b[key], err_msg=f"{kind} {i} {key}")
            compared += 1
    assert compared >= 49
    masked = sum(int(ours[0][i]["loss_mask"].sum()) for i in range(len(ours[0])))
    assert masked > 0  # the samples really are masked


def test_build_mapping_matches_helpers_cpp(corpus):
    from megatron.core.datasets import helpers_cpp

    from gigatron.core.datasets.indexed_dataset import IndexedDataset
    from gigatron.core.datasets.masked_dataset import build_mapping

    data = IndexedDataset(corpus[0])
    docs = data.document_indices.astype(numpy.int64)
    for args in [(1, 2**62, 45, 0.1, 1234, False, 2), (1000, 500, 29, 0.5, 7, False, 1)]:
        ref = helpers_cpp.build_mapping(docs, data.sequence_lengths, *args)
        numpy.testing.assert_array_equal(build_mapping(docs, data.sequence_lengths, *args), ref)
