"""IndexedDataset / IndexedDatasetBuilder: Megatron's byte format, reads, merges and errors."""

import os
import struct

import numpy
import pytest
import torch

from gigatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

try:
    from megatron.core.datasets import indexed_dataset as mcore_indexed
except Exception:  # megatron-core not installed (or broken): skip the side-by-side tests
    mcore_indexed = None
needs_mcore = pytest.mark.skipif(mcore_indexed is None, reason="megatron-core not installed")

DOCS = [[[5, 6, 7]], [[8, 9]], [[1, 2], [3], [60000, 4, 4]], [[]], [[11] * 40]]


def _write(builder_cls, prefix, dtype, docs=DOCS, use_add_item=False):
    builder = builder_cls(prefix + ".bin", dtype=dtype)
    for doc in docs:
        if use_add_item:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
        else:
            flat = [t for seq in doc for t in seq]
            builder.add_document(torch.tensor(flat, dtype=torch.int64), [len(s) for s in doc])
    builder.finalize(prefix + ".idx")


def _read_all(dataset):
    return [numpy.asarray(dataset[i]).tolist() for i in range(len(dataset))]


def _bytes(prefix):
    return tuple(open(prefix + ext, "rb").read() for ext in (".bin", ".idx"))


def test_worked_example_bytes(tmp_path):
    prefix = str(tmp_path / "ex")
    _write(IndexedDatasetBuilder, prefix, numpy.uint16, docs=[[[5, 6, 7]], [[8, 9]]])
    bin_bytes, idx_bytes = _bytes(prefix)
    assert bin_bytes.hex() == "05000600070008000900"
    expected = (
        "4d4d494449445800000100000000000000080200000000000000030000000000000003000000"
        "020000000000000000000000060000000000000000000000000000000100000000000000"
        "0200000000000000"
    )
    assert idx_bytes.hex() == expected
    assert len(idx_bytes) == 82


@pytest.mark.parametrize("dtype", [numpy.uint16, numpy.int32])
@pytest.mark.parametrize("mmap", [True, False])
def test_reads_and_partial_reads(tmp_path, dtype, mmap):
    prefix = str(tmp_path / "d")
    _write(IndexedDatasetBuilder, prefix, dtype)
    ds = IndexedDataset(prefix, mmap=mmap)
    seqs = [s for doc in DOCS for s in doc]
    assert len(ds) == len(seqs)
    assert _read_all(ds) == seqs
    assert ds[2].dtype == dtype
    assert ds.document_indices.tolist() == [0, 1, 2, 5, 6, 7]
    assert ds.sequence_lengths.tolist() == [len(s) for s in seqs]
    assert ds.get(4, offset=1, length=2).tolist() == [4, 4]
    assert ds.get(4, offset=1).tolist() == [4, 4]
    assert [x.tolist() for x in ds[2:5]] == seqs[2:5]
    with pytest.raises(ValueError, match="contiguous"):
        ds[0:4:2]


def test_add_item_equals_add_document_and_add_index_merges(tmp_path):
    a, b, merged = (str(tmp_path / n) for n in ("a", "b", "m"))
    _write(IndexedDatasetBuilder, a, numpy.uint16)
    _write(IndexedDatasetBuilder, b, numpy.uint16, use_add_item=True)
    assert _bytes(a) == _bytes(b)
    builder = IndexedDatasetBuilder(merged + ".bin", dtype=numpy.uint16)
    builder.add_index(a)
    builder.add_index(b)
    builder.finalize(merged + ".idx")
    ds = IndexedDataset(merged)
    seqs = [s for doc in DOCS for s in doc]
    assert _read_all(ds) == seqs + seqs
    assert ds.document_indices.tolist() == [0, 1, 2, 5, 6, 7, 8, 9, 12, 13, 14]
    wrong = IndexedDatasetBuilder(str(tmp_path / "w.bin"), dtype=numpy.int32)
    with pytest.raises(ValueError, match="dtype"):
        wrong.add_index(a)


def test_multimodal_modes(tmp_path):
    prefix = str(tmp_path / "mm")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32, multimodal=True)
    builder.add_item(torch.tensor([1, 2]), mode=0)
    builder.add_item(torch.tensor([3]), mode=1)
    builder.end_document()
    builder.finalize(prefix + ".idx")
    ds = IndexedDataset(prefix, multimodal=True)
    seq, mode = ds[1]
    assert seq.tolist() == [3] and mode == 1
    assert ds.sequence_modes.tolist() == [0, 1]


def test_optimal_dtype_and_codes():
    assert DType.optimal_dtype(65499) is numpy.uint16
    assert DType.optimal_dtype(65500) is numpy.int32
    assert DType.optimal_dtype(None) is numpy.int32
    assert DType.code_from_dtype(numpy.uint16) == 8 and DType.code_from_dtype(numpy.int32) == 4
    assert DType.dtype_from_code(1) is numpy.uint8 and DType.size(8) == 2


def test_clear_errors_name_the_file(tmp_path):
    prefix = str(tmp_path / "e")
    _write(IndexedDatasetBuilder, prefix, numpy.uint16)
    good_idx = open(prefix + ".idx", "rb").read()
    good_bin = open(prefix + ".bin", "rb").read()

    os.rename(prefix + ".bin", prefix + ".bin.x")
    with pytest.raises(FileNotFoundError, match=r"e\.bin"):
        IndexedDataset(prefix)
    os.rename(prefix + ".bin.x", prefix + ".bin")
    os.rename(prefix + ".idx", prefix + ".idx.x")
    with pytest.raises(FileNotFoundError, match=r"e\.idx"):
        IndexedDataset(prefix)
    os.rename(prefix + ".idx.x", prefix + ".idx")

    def expect(idx_bytes, bin_bytes, pattern):
        open(prefix + ".idx", "wb").write(idx_bytes)
        open(prefix + ".bin", "wb").write(bin_bytes)
        with pytest.raises(ValueError, match=pattern):
            IndexedDataset(prefix)

    expect(b"XXIDIDX\x00\x00" + good_idx[9:], good_bin, r"e\.idx: bad magic")
    expect(good_idx[:9] + struct.pack("<Q", 2) + good_idx[17:], good_bin, r"e\.idx: bad version 2")
    expect(good_idx[:17] + b"\x63" + good_idx[18:], good_bin, r"e\.idx: unknown dtype code 99")
    expect(good_idx[:-8], good_bin, r"e\.idx: index file is \d+ bytes")
    expect(
        good_idx, good_bin[:-2], r"e\.idx: sequence \d+ ends at byte \d+, past the end of .*e\.bin"
    )
    expect(good_idx[:20], good_bin, "shorter than the 34-byte header")


@needs_mcore
@pytest.mark.parametrize("dtype", [numpy.uint16, numpy.int32])
def test_megatron_reads_ours_and_we_read_theirs(tmp_path, dtype):
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    _write(IndexedDatasetBuilder, ours, dtype)
    _write(mcore_indexed.IndexedDatasetBuilder, theirs, dtype)
    assert _bytes(ours) == _bytes(theirs)  # byte-identical files

    seqs = [s for doc in DOCS for s in doc]
    m = mcore_indexed.IndexedDataset(ours)
    assert _read_all(m) == seqs
    assert m.document_indices.tolist() == IndexedDataset(ours).document_indices.tolist()
    assert m.index.dtype == dtype
    g = IndexedDataset(theirs)
    assert _read_all(g) == seqs and g.index.dtype == dtype
    assert g.get(4, 1, 2).tolist() == m.get(4, 1, 2).tolist()


@needs_mcore
def test_add_index_matches_megatron_bytes(tmp_path):
    a = str(tmp_path / "a")
    _write(IndexedDatasetBuilder, a, numpy.uint16)
    outs = []
    for name, cls in (("g", IndexedDatasetBuilder), ("m", mcore_indexed.IndexedDatasetBuilder)):
        prefix = str(tmp_path / name)
        builder = cls(prefix + ".bin", dtype=numpy.uint16)
        builder.add_item(torch.tensor([7, 7]))
        builder.end_document()
        builder.add_index(a)
        builder.finalize(prefix + ".idx")
        outs.append(_bytes(prefix))
    assert outs[0] == outs[1]


def test_header_checks_for_megatron_fast_path_arguments(tmp_path):
    prefix = str(tmp_path / "h")
    _write(IndexedDatasetBuilder, prefix, numpy.uint16)
    ds = IndexedDataset(prefix, sequences_per_dataset=(7, 6), dtype_code=8)
    assert len(ds) == 7
    with pytest.raises(ValueError, match="sequences_per_dataset"):
        IndexedDataset(prefix, sequences_per_dataset=(7, 5))
    with pytest.raises(ValueError, match="dtype_code 4"):
        IndexedDataset(prefix, dtype_code=4)
    with pytest.raises(ValueError, match="fast_cache_load"):
        IndexedDataset(prefix, fast_cache_load=True)
