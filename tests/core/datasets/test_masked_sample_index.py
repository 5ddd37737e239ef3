"""BERT / T5 sample index (`masked_dataset.build_mapping`) on corpora that cannot fill it.

Asked for a number of samples, the builder walks epochs until it has them. With no usable
document (BERT's binary head needs >= 2 sentences; a corpus preprocessed without
--split-sentences has 1 per document) every epoch added nothing and the loop ran for 2**31
epochs, i.e. forever (before: these tests time out). A corpus with few usable documents among
many walked every document of every epoch.
"""

from __future__ import annotations

import time

import numpy
import pytest

from gigatron.core.datasets.masked_dataset import build_mapping

EPOCHS = numpy.iinfo(numpy.int32).max - 1  # what MaskedWordPieceDataset passes with num_samples


@pytest.mark.timeout(30)
def test_single_sentence_documents_with_the_binary_head_are_an_error():
    docs, sizes = numpy.arange(21), numpy.full(20, 9, numpy.int32)  # 20 one-sentence documents
    with pytest.raises(ValueError) as err:
        build_mapping(docs, sizes, EPOCHS, 64, 29, 0.1, 1, False, 2)
    for words in ("20 have fewer than 2 sentences", "--split-sentences", "--bert-no-binary-head"):
        assert words in str(err.value), str(err.value)
    # without the head (1 sentence per sample) the same corpus is fine
    assert build_mapping(docs, sizes, EPOCHS, 64, 29, 0.1, 1, False, 1).shape == (80, 3)


@pytest.mark.timeout(30)
def test_documents_with_only_overlong_sentences_are_an_error():
    docs, sizes = numpy.array([0, 2, 4]), numpy.array([600, 5, 700, 5], numpy.int32)
    with pytest.raises(ValueError, match="2 have a sentence over 512 tokens"):
        build_mapping(docs, sizes, EPOCHS, 8, 29, 0.0, 1, False, 2)


@pytest.mark.timeout(30)
def test_few_usable_documents_among_many_build_quickly():
    """100,000 documents, one of them usable: 10,000 samples take 10,000 epochs (a billion
    documents walked before, ~20 s; 10,000 now)."""
    docs = numpy.append(numpy.arange(100_001), 100_002)  # the last document has 2 sentences
    sizes = numpy.full(100_002, 9, numpy.int32)
    start = time.perf_counter()
    rows = build_mapping(docs, sizes, EPOCHS, 10_000, 29, 0.0, 1, False, 2)
    assert rows.shape == (10_000, 3) and set(rows[:, 0].tolist()) == {100_000}
    assert time.perf_counter() - start < 3
