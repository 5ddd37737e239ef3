"""An `.idx` whose values are impossible is refused with one line naming the file and the
record: negative lengths, pointers that do not follow from the lengths, sequences past the end
of the `.bin` (or bytes after the last one), document indices out of order or out of range."""

from __future__ import annotations

import numpy
import pytest

from gigatron.core.datasets.indexed_dataset import IndexedDataset, write_index

LENGTHS = [3, 5, 2, 4]
HEADER = 34
N = len(LENGTHS)


def _corpus(tmp_path, lengths=LENGTHS, doc_idx=(0, 2, 4), bin_extra=0):
    prefix = str(tmp_path / "c")
    total = sum(max(x, 0) for x in LENGTHS)
    numpy.arange(total + bin_extra, dtype=numpy.uint16).tofile(prefix + ".bin")
    write_index(prefix + ".idx", numpy.uint16, LENGTHS, list(doc_idx))
    if list(lengths) != LENGTHS:
        _patch(prefix, HEADER, numpy.asarray(lengths, dtype=numpy.int32))
    return prefix


def _patch(prefix, offset, array):
    with open(prefix + ".idx", "r+b") as f:
        f.seek(offset)
        f.write(array.tobytes())


def test_negative_sequence_length_names_file_and_sequence(tmp_path):
    prefix = _corpus(tmp_path, lengths=[3, -5, 2, 4])
    with pytest.raises(ValueError, match=r"c\.idx: sequence 1 has length -5"):
        IndexedDataset(prefix)


def test_pointer_that_does_not_follow_the_lengths_is_refused(tmp_path):
    prefix = _corpus(tmp_path)
    _patch(prefix, HEADER + 4 * N + 8 * 2, numpy.asarray([12], dtype=numpy.int64))
    with pytest.raises(ValueError, match=r"c\.idx: sequence 2 starts at byte 12 .* 16"):
        IndexedDataset(prefix)


def test_sequence_past_the_end_of_bin_names_both_files_and_the_sequence(tmp_path):
    prefix = _corpus(tmp_path, lengths=[3, 5, 2, 40])
    with pytest.raises(ValueError, match=r"c\.idx: sequence 3 .* past the end of .*c\.bin"):
        IndexedDataset(prefix)


def test_bytes_after_the_last_sequence_are_refused(tmp_path):
    prefix = _corpus(tmp_path, bin_extra=3)
    with pytest.raises(ValueError, match=r"c\.bin: data file has 6 bytes after the last sequence"):
        IndexedDataset(prefix)


@pytest.mark.parametrize(
    "doc_idx, pattern",
    [
        ((1, 2, 4), r"document index 0 is 1; the first must be 0"),
        ((0, 3, 2, 4), r"document index 2 \(2\) is below the one before it \(3\)"),
    ],
)
def test_document_indices_out_of_order_are_refused(tmp_path, doc_idx, pattern):
    with pytest.raises(ValueError, match=r"c\.idx: " + pattern):
        IndexedDataset(_corpus(tmp_path, doc_idx=doc_idx))


def test_a_valid_corpus_still_reads(tmp_path):
    ds = IndexedDataset(_corpus(tmp_path))
    assert [len(ds[i]) for i in range(N)] == LENGTHS
