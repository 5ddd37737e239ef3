"""Megatron's memory-mapped token files: `<prefix>.bin` (tokens) and `<prefix>.idx` (index).

Mirrors `megatron.core.datasets.indexed_dataset`. Files are byte-identical to Megatron's, so a
corpus preprocessed by either project loads in the other. `.idx` layout (little-endian, no padding):

    magic b"MMIDIDX\\x00\\x00" | u64 version=1 | u8 dtype code | u64 N sequences | u64 D doc entries
    | i32[N] sequence lengths | i64[N] byte pointers into .bin | i64[D] document indices
    | i8[N] sequence modes (multimodal only)

Document indices start at 0 and hold the sequence count after each document (last == N).

gigatron checks every value when it opens a dataset (Megatron checks none), one line naming the
file and the record on failure: lengths are non-negative, each pointer is the sum of the byte
lengths before it (what every Megatron writer produces), the `.bin` is exactly as long as the
sequences, and document indices start at 0, never decrease and end at N. The checks are a few
vectorised passes over the index (chunked, so memory stays bounded on a large corpus).
"""

from __future__ import annotations

import os
import shutil
import struct
from enum import Enum
from typing import Any

import numpy
import torch

from gigatron.core.untrusted_files import check_regular_file

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_HEADER_BYTES = 34  # magic 9 + version 8 + dtype 1 + sequence count 8 + document count 8
_CHECK_CHUNK = 1 << 22  # index entries checked per vectorised pass


class DType(Enum):
    """NumPy token dtypes and their one-byte codes in the `.idx` header (Megatron's numbering)."""

    uint8 = 1
    int8 = 2
    int16 = 3
    int32 = 4
    int64 = 5
    float64 = 6
    float32 = 7
    uint16 = 8

    @classmethod
    def code_from_dtype(cls, value: type[numpy.number]) -> int:
        return cls[numpy.dtype(value).name].value

    @classmethod
    def dtype_from_code(cls, value: int) -> type[numpy.number]:
        return getattr(numpy, cls(value).name)

    @staticmethod
    def size(key: int | type[numpy.number]) -> int:
        """Bytes per element of a dtype code or a NumPy dtype."""
        if isinstance(key, int):
            return numpy.dtype(DType.dtype_from_code(key)).itemsize
        return numpy.dtype(key).itemsize

    @staticmethod
    def optimal_dtype(cardinality: int | None) -> type[numpy.number]:
        """uint16 for vocabularies below 65500 tokens, int32 otherwise (Megatron's rule)."""
        if cardinality is not None and cardinality < 65500:
            return numpy.uint16
        return numpy.int32


def get_idx_path(path_prefix: str) -> str:
    return path_prefix + ".idx"


def get_bin_path(path_prefix: str) -> str:
    return path_prefix + ".bin"


class _IndexReader:
    """Parse and memory-map an `.idx` file, validating it against the format and its `.bin`."""

    def __init__(self, idx_path: str, multimodal: bool) -> None:
        if not os.path.exists(idx_path):
            raise FileNotFoundError(f"index file {idx_path} does not exist")
        file_size = check_regular_file(idx_path, what="index file")
        with open(idx_path, "rb") as stream:
            header = stream.read(_HEADER_BYTES)
        if len(header) < _HEADER_BYTES:
            raise ValueError(
                f"{idx_path}: index file is {file_size} bytes, shorter than the "
                f"{_HEADER_BYTES}-byte header of Megatron's indexed format"
            )
        if header[:9] != _INDEX_HEADER:
            raise ValueError(
                f"{idx_path}: bad magic {header[:9]!r}, expected {_INDEX_HEADER!r} "
                "(not a Megatron indexed dataset .idx file)"
            )
        (version,) = struct.unpack("<Q", header[9:17])
        if version != 1:
            raise ValueError(f"{idx_path}: bad version {version}, only version 1 is supported")
        code = header[17]
        try:
            self.dtype = DType.dtype_from_code(code)
        except ValueError:
            raise ValueError(
                f"{idx_path}: unknown dtype code {code}, must be one of {[d.value for d in DType]}"
            ) from None
        self.dtype_size = DType.size(self.dtype)
        self.sequence_count, self.document_count = struct.unpack("<QQ", header[18:34])

        n, d = self.sequence_count, self.document_count
        expected = _HEADER_BYTES + 12 * n + 8 * d + (n if multimodal else 0)
        if file_size < expected:
            raise ValueError(
                f"{idx_path}: index file is {file_size} bytes but its header ({n} sequences, "
                f"{d} document entries{', multimodal' if multimodal else ''}) needs {expected}"
            )
        self._mmap = numpy.memmap(idx_path, mode="r", order="C")
        buf = memoryview(self._mmap)
        offset = _HEADER_BYTES
        self.sequence_lengths = numpy.frombuffer(buf, numpy.int32, count=n, offset=offset)
        offset += 4 * n
        self.sequence_pointers = numpy.frombuffer(buf, numpy.int64, count=n, offset=offset)
        offset += 8 * n
        self.document_indices = numpy.frombuffer(buf, numpy.int64, count=d, offset=offset)
        offset += 8 * d
        self.sequence_modes = None
        if multimodal:
            self.sequence_modes = numpy.frombuffer(buf, numpy.int8, count=n, offset=offset)
        if d == 0 or int(self.document_indices[-1]) != n:
            last = int(self.document_indices[-1]) if d else None
            raise ValueError(
                f"{idx_path}: last document index ({last}) must equal the sequence count ({n})"
            )
        self.data_bytes = self._check_values(idx_path)

    def _check_values(self, idx_path: str) -> int:
        """Check lengths, pointers and document indices; return the bytes the `.bin` must hold."""
        lengths, pointers, docs = (
            self.sequence_lengths,
            self.sequence_pointers,
            self.document_indices,
        )
        end = 0  # byte where the previous chunk's last sequence ends
        for lo in range(0, len(lengths), _CHECK_CHUNK):
            chunk = lengths[lo : lo + _CHECK_CHUNK].astype(numpy.int64)
            bad = numpy.flatnonzero(chunk < 0)
            if bad.size:
                i = lo + int(bad[0])
                raise ValueError(
                    f"{idx_path}: sequence {i} has length {int(lengths[i])}; lengths must be >= 0"
                )
            ends = numpy.cumsum(chunk * self.dtype_size) + end
            starts = numpy.concatenate(([end], ends[:-1]))
            bad = numpy.flatnonzero(pointers[lo : lo + _CHECK_CHUNK] != starts)
            if bad.size:
                i = lo + int(bad[0])
                raise ValueError(
                    f"{idx_path}: sequence {i} starts at byte {int(pointers[i])} but the lengths "
                    f"before it put it at byte {int(starts[bad[0]])} (a damaged or hand-edited "
                    "index)"
                )
            end = int(ends[-1])
        if len(docs) and int(docs[0]) != 0:
            raise ValueError(f"{idx_path}: document index 0 is {int(docs[0])}; the first must be 0")
        for lo in range(0, len(docs), _CHECK_CHUNK):
            chunk = docs[max(lo - 1, 0) : lo + _CHECK_CHUNK]
            bad = numpy.flatnonzero(numpy.diff(chunk) < 0)
            if bad.size:
                i = max(lo - 1, 0) + int(bad[0]) + 1
                raise ValueError(
                    f"{idx_path}: document index {i} ({int(docs[i])}) is below the one before it "
                    f"({int(docs[i - 1])}); document indices never decrease"
                )
        return end

    def __len__(self) -> int:
        return self.sequence_count

    def __getitem__(self, idx: int) -> tuple[int, int, int | None]:
        """(byte pointer, length, mode or None) of sequence `idx`."""
        mode = None if self.sequence_modes is None else self.sequence_modes[idx]
        return int(self.sequence_pointers[idx]), int(self.sequence_lengths[idx]), mode


class _MMapBinReader:
    def __init__(self, bin_path: str) -> None:
        # numpy.memmap refuses empty files; an empty corpus has nothing to map.
        self._mmap = numpy.memmap(bin_path, mode="r") if os.path.getsize(bin_path) else None

    def read(self, dtype: type[numpy.number], count: int, offset: int) -> numpy.ndarray:
        if self._mmap is None:
            return numpy.empty(0, dtype=dtype)
        return numpy.frombuffer(memoryview(self._mmap), dtype=dtype, count=count, offset=offset)


class _FileBinReader:
    def __init__(self, bin_path: str) -> None:
        self._bin_path = bin_path

    def read(self, dtype: type[numpy.number], count: int, offset: int) -> numpy.ndarray:
        out = numpy.empty(count, dtype=dtype)
        with open(self._bin_path, "rb", buffering=0) as f:
            f.seek(offset)
            f.readinto(out)
        return out


class IndexedDataset(torch.utils.data.Dataset):
    """The low-level dataset: sequence `i` is a 1-D token array `[len_i]` read from `.bin`.

    Args:
        path_prefix: path without the `.bin` / `.idx` suffix.
        multimodal: whether the index carries one int8 mode per sequence.
        mmap: memory-map the `.bin` (True) or read it with file pointers (False).
    """

    def __init__(
        self,
        path_prefix: str,
        multimodal: bool = False,
        mmap: bool = True,
        object_storage_config: Any = None,
        s3_config: Any = None,
        fast_cache_load: bool = False,
        sequences_per_dataset: tuple[int, int] | None = None,
        dtype_code: int | None = None,
    ) -> None:
        super().__init__()
        if object_storage_config is not None or s3_config is not None:
            raise ValueError(
                "object_storage_config / s3_config are not supported by gigatron: "
                "copy the files to a local path"
            )
        if fast_cache_load:
            raise ValueError(f"fast_cache_load ({fast_cache_load}) is not supported by gigatron")
        self.initialize(path_prefix, multimodal, mmap)
        # Megatron trusts these instead of the header; gigatron reads the header and checks them.
        header = (self.index.sequence_count, self.index.document_count)
        if sequences_per_dataset is not None and tuple(sequences_per_dataset) != header:
            raise ValueError(
                f"{get_idx_path(path_prefix)}: sequences_per_dataset {tuple(sequences_per_dataset)}"
                f" does not match the header's (sequences, document entries) {header}"
            )
        if dtype_code is not None and DType.dtype_from_code(dtype_code) != self.index.dtype:
            raise ValueError(
                f"{get_idx_path(path_prefix)}: dtype_code {dtype_code} does not match the "
                f"header's code {DType.code_from_dtype(self.index.dtype)}"
            )

    def initialize(self, path_prefix: str, multimodal: bool, mmap: bool) -> None:
        idx_path, bin_path = get_idx_path(path_prefix), get_bin_path(path_prefix)
        for path in (idx_path, bin_path):
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path} does not exist (an indexed dataset needs both {idx_path} "
                    f"and {bin_path})"
                )
        self.path_prefix = path_prefix
        self.multimodal = multimodal
        self.mmap = mmap
        self.index = _IndexReader(idx_path, multimodal)
        have = check_regular_file(bin_path, what="data file")
        needed = self.index.data_bytes
        if have < needed:
            lengths, pointers = self.index.sequence_lengths, self.index.sequence_pointers
            ends = pointers + lengths.astype(numpy.int64) * self.index.dtype_size
            i = int(numpy.argmax(ends > have))
            raise ValueError(
                f"{idx_path}: sequence {i} ends at byte {int(ends[i])}, past the end of "
                f"{bin_path} ({have} bytes; truncated .bin, or an .idx of another corpus?)"
            )
        if have > needed:
            raise ValueError(
                f"{bin_path}: data file has {have - needed} bytes after the last sequence of "
                f"{idx_path} (it ends at byte {needed}): the two files are not one corpus"
            )
        self.fingerprint = corpus_fingerprint(idx_path, bin_path)
        self.bin_reader = _MMapBinReader(bin_path) if mmap else _FileBinReader(bin_path)

    def __getstate__(self) -> tuple[str, bool, bool]:
        return self.path_prefix, self.multimodal, self.mmap

    def __setstate__(self, state: tuple[str, bool, bool]) -> None:
        self.initialize(*state)

    def __len__(self) -> int:
        """Number of sequences (not documents)."""
        return len(self.index)

    def __getitem__(self, idx: int | numpy.integer | slice) -> Any:
        """Sequence `idx` as `[len]` array (or `(array, mode)`); a contiguous slice gives a list."""
        if isinstance(idx, (int, numpy.integer)):
            pointer, length, mode = self.index[idx]
            seq = self.bin_reader.read(self.index.dtype, length, pointer)
            return (seq, mode) if mode is not None else seq
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError(f"slices into IndexedDataset must be contiguous, got step {step}")
            lengths = self.index.sequence_lengths[start:stop]
            if len(lengths) == 0:
                return []
            flat = self.bin_reader.read(
                self.index.dtype, int(lengths.sum()), int(self.index.sequence_pointers[start])
            )
            seqs = numpy.split(flat, numpy.cumsum(lengths)[:-1])
            if self.multimodal:
                return seqs, self.index.sequence_modes[start:stop]
            return seqs
        raise TypeError(f"unexpected index type {type(idx).__name__} for IndexedDataset")

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> Any:
        """Tokens `[offset, offset + length)` of sequence `idx` (to its end when length is None)."""
        pointer, seq_length, mode = self.index[idx]
        if length is None:
            length = seq_length - offset
        seq = self.bin_reader.read(
            self.index.dtype, int(length), pointer + int(offset) * self.index.dtype_size
        )
        return (seq, mode) if mode is not None else seq

    @property
    def sequence_lengths(self) -> numpy.ndarray:
        """int32 `[N]` tokens per sequence."""
        return self.index.sequence_lengths

    @property
    def document_indices(self) -> numpy.ndarray:
        """int64 `[D]` sequence boundaries of documents, starting at 0."""
        return self.index.document_indices

    def get_document_indices(self) -> numpy.ndarray:
        return self.index.document_indices

    def set_document_indices(self, document_indices: numpy.ndarray) -> None:
        self.index.document_indices = document_indices

    @property
    def sequence_modes(self) -> numpy.ndarray:
        if self.index.sequence_modes is None:
            raise ValueError(f"{self.path_prefix}: sequence_modes needs multimodal=True")
        return self.index.sequence_modes

    @staticmethod
    def exists(path_prefix: str) -> bool:
        return os.path.exists(get_idx_path(path_prefix)) and os.path.exists(
            get_bin_path(path_prefix)
        )


def corpus_fingerprint(idx_path: str, bin_path: str) -> dict[str, list[int]]:
    """Size and mtime_ns of the `.idx` and the `.bin`: what keys the index cache to these files,
    so a corpus regenerated under the same prefix gets fresh cached indices."""
    out = {}
    for name, path in (("idx", idx_path), ("bin", bin_path)):
        st = os.stat(path)
        out[name] = [st.st_size, st.st_mtime_ns]
    return out


def write_index(
    idx_path: str,
    dtype: type[numpy.number],
    sequence_lengths: Any,
    document_indices: Any,
    sequence_modes: Any = None,
) -> None:
    """Write an `.idx` file; pointers are derived from the lengths and the dtype size."""
    lengths = numpy.asarray(sequence_lengths, dtype=numpy.int32)
    pointers = numpy.zeros(len(lengths), dtype=numpy.int64)
    if len(lengths) > 1:
        numpy.cumsum(lengths[:-1].astype(numpy.int64) * DType.size(dtype), out=pointers[1:])
    doc_idx = numpy.asarray(document_indices, dtype=numpy.int64)
    with open(idx_path, "wb") as f:
        f.write(_INDEX_HEADER)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", DType.code_from_dtype(dtype)))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(doc_idx.tobytes(order="C"))
        if sequence_modes is not None:
            f.write(numpy.asarray(sequence_modes, dtype=numpy.int8).tobytes(order="C"))


def _as_numpy(tokens: Any, dtype: type[numpy.number]) -> numpy.ndarray:
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    return numpy.asarray(tokens, dtype=dtype).reshape(-1)


class IndexedDatasetBuilder:
    """Append sequences to a `.bin` file, then `finalize(idx_path)` writes the index.

    Args:
        bin_path: the `.bin` file to create (truncated if it exists).
        dtype: token dtype (Megatron's default int32; preprocess uses `DType.optimal_dtype`).
        multimodal: keep one int8 mode per sequence.
    """

    def __init__(
        self, bin_path: str, dtype: type[numpy.number] = numpy.int32, multimodal: bool = False
    ) -> None:
        DType.code_from_dtype(dtype)  # fail early on a dtype the format cannot name
        self.bin_path = bin_path
        self.data_file = open(bin_path, "wb")
        self.dtype = dtype
        self.multimodal = multimodal
        self.sequence_lengths: list[int] = []
        self.document_indices: list[int] = [0]
        self.sequence_modes: list[int] | None = [] if multimodal else None

    def add_item(self, tensor: Any, mode: int = 0) -> None:
        """Append one sequence `[len]` without closing the document."""
        arr = _as_numpy(tensor, self.dtype)
        self.data_file.write(arr.tobytes(order="C"))
        self.sequence_lengths.append(arr.size)
        if self.multimodal:
            self.sequence_modes.append(mode)

    def add_document(self, tensor: Any, lengths: list[int], modes: list[int] | None = None) -> None:
        """Append a whole document: `tensor` `[sum(lengths)]` split into sequences of `lengths`."""
        arr = _as_numpy(tensor, self.dtype)
        if arr.size != int(numpy.sum(lengths, dtype=numpy.int64)):
            raise ValueError(
                f"add_document: tensor has {arr.size} tokens but lengths sum to "
                f"{int(numpy.sum(lengths))} ({self.bin_path})"
            )
        self.data_file.write(arr.tobytes(order="C"))
        self.sequence_lengths.extend(int(x) for x in lengths)
        self.document_indices.append(len(self.sequence_lengths))
        if self.multimodal:
            self.sequence_modes.extend(modes if modes is not None else [0] * len(lengths))

    def end_document(self) -> None:
        """Close the current document (after `add_item` calls)."""
        self.document_indices.append(len(self.sequence_lengths))

    def add_index(self, path_prefix: str) -> None:
        """Append a whole existing dataset (same dtype) after what was written so far."""
        index = _IndexReader(get_idx_path(path_prefix), multimodal=self.multimodal)
        if index.dtype != self.dtype:
            raise ValueError(
                f"add_index: {get_idx_path(path_prefix)} has dtype {index.dtype.__name__}, "
                f"the builder writes {numpy.dtype(self.dtype).name}; dtypes must match"
            )
        offset = len(self.sequence_lengths)
        self.sequence_lengths.extend(index.sequence_lengths.tolist())
        self.document_indices.extend((index.document_indices[1:] + offset).tolist())
        if self.multimodal:
            self.sequence_modes.extend(index.sequence_modes.tolist())
        data_bytes = index.data_bytes
        del index
        bin_path = get_bin_path(path_prefix)
        have = check_regular_file(bin_path, what="data file")
        if have != data_bytes:  # the merged pointers assume exactly the indexed bytes
            raise ValueError(
                f"add_index: {bin_path} is {have} bytes but {get_idx_path(path_prefix)} indexes "
                f"{data_bytes}: the two files are not one corpus"
            )
        with open(bin_path, "rb") as f:
            shutil.copyfileobj(f, self.data_file)

    def finalize(self, idx_path: str) -> None:
        """Close the `.bin` and write the `.idx`."""
        self.data_file.close()
        write_index(
            idx_path, self.dtype, self.sequence_lengths, self.document_indices, self.sequence_modes
        )
