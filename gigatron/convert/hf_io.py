"""Streaming safetensors I/O: read tensors as file-backed memory maps, write one tensor at a time.

No counterpart in megatron.core (Megatron's HF bridges load whole state dicts). The safetensors
format is an 8-byte little-endian header length, a JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}` padded with
spaces to a multiple of 8, then the raw little-endian bytes. `HFReader.get` maps a tensor's byte
range with NumPy (`np.memmap`), so a tensor costs page cache, not process memory; `HFReader.read`
copies only a box of it (a row range, or a column range per row: what one TP / EP piece owns)
with `os.preadv`, the bytes the safetensors library's `safe_open(...).get_slice` would read,
and counts them (the streaming tests and benchmark). Writing plans
every file's header from (name, shape, dtype) first and then streams the bytes, so a model larger
than memory converts. Sharded models use `model.safetensors.index.json`
(`{"metadata": {"total_size"}, "weight_map": {name: file}}`), as transformers writes it.
"""

from __future__ import annotations

import json
import os
import struct
import weakref
from collections.abc import Callable, Iterable

import numpy as np
import torch

from gigatron.core.untrusted_files import (
    UntrustedFileError,
    confined_path,
    open_regular_file,
    read_text,
)

INDEX_FNAME = "model.safetensors.index.json"
SINGLE_FNAME = "model.safetensors"

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
# NumPy has no bf16/fp8: those are mapped as same-width integers and viewed back in torch.
_NP_SAME_WIDTH = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def read_weight_map(index: str) -> dict[str, str]:
    """The `weight_map` of `model.safetensors.index.json` at `index`: a regular file within
    `LIMITS["index_json"]`, a JSON object whose weight_map maps tensor names to file names;
    anything else is one line naming the file and the rule."""
    text = read_text(index, what="safetensors index", max_bytes="index_json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UntrustedFileError(
            f"{index} is not JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    if not isinstance(data, dict):
        raise UntrustedFileError(f"{index} holds a {type(data).__name__}, not a JSON object")
    if "weight_map" not in data:
        raise UntrustedFileError(f"{index} has no weight_map (tensor name -> safetensors file)")
    weight_map = data["weight_map"]
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise UntrustedFileError(
            f"{index}: weight_map must map tensor names to safetensors file names (strings)"
        )
    if not weight_map:
        raise UntrustedFileError(f"{index}: weight_map names no tensors")
    return weight_map


MAX_HEADER_BYTES = 100_000_000
"""A safetensors header's largest size (the safetensors library refuses larger ones too)."""


def _read_header(path: str) -> tuple[dict, int]:
    """(JSON header, byte offset where the data section starts), checked against the file: every
    tensor's dtype, shape and byte range must be consistent and inside the file. The file comes
    from elsewhere: anything else is a ValueError naming it, before any tensor is mapped."""
    with open_regular_file(path, what="safetensors file") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if 0 < n <= size - 8 and n > MAX_HEADER_BYTES:  # the safetensors library's own cap
            raise ValueError(f"{path}: safetensors header of {n} bytes is over the "
                             f"{MAX_HEADER_BYTES}-byte limit for a header: damaged")  # fmt: skip
        if not 0 < n <= size - 8:
            raise ValueError(f"{path} is not a valid safetensors file (header length {n}, file "
                             f"{size} bytes): damaged or truncated")  # fmt: skip
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: safetensors header is not JSON ({e}): damaged") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header is not a JSON object: damaged")
    for name, info in header.items():
        if name != "__metadata__":
            _check_entry(path, name, info, size - 8 - n)
    return header, 8 + n


def _check_entry(path: str, name: str, info, data_size: int) -> None:
    try:
        shape, dtype = info["shape"], _dtype(info["dtype"])
        begin, end = info["data_offsets"]
        ok = all(type(d) is int and d >= 0 for d in shape) and type(begin) is type(end) is int
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: tensor {name!r} has a malformed header entry ({e})") from None
    if not ok or not 0 <= begin <= end <= data_size or end - begin != _nbytes(shape, dtype):
        raise ValueError(
            f"{path}: tensor {name!r} (shape {shape}, {info['dtype']}) claims bytes "
            f"[{begin}, {end}) of a {data_size}-byte data section: damaged or truncated"
        )


class HFReader:
    """The tensors of a HF model directory (`model.safetensors` or an index + shards).

    `shape_dtype(name)` reads the header only; `get(name)` returns a read-only, file-backed
    tensor (zero copy: its bytes are paged in from the file when touched).
    """

    def __init__(self, hf_dir: str):
        self.hf_dir = hf_dir
        index = os.path.join(hf_dir, INDEX_FNAME)
        if os.path.lexists(index):
            weight_map = read_weight_map(index)
        elif os.path.exists(os.path.join(hf_dir, SINGLE_FNAME)):
            weight_map = None
        else:
            found = sorted(os.listdir(hf_dir)) if os.path.isdir(hf_dir) else "not a directory"
            raise ValueError(
                f"{hf_dir}: no {SINGLE_FNAME} or {INDEX_FNAME} (found {found}); only safetensors "
                "checkpoints are read (no pickle)"
            )
        self._entries: dict[str, tuple[str, dict, int]] = {}
        self.bytes_read = 0
        """Bytes `read` has copied from the files (streaming tests and benchmarks)."""
        self.live_bytes = self.peak_live_bytes = 0
        self.file_metadata: dict = {}
        files = sorted(set(weight_map.values())) if weight_map else [SINGLE_FNAME]
        for fname in files:  # each file the index names stays inside hf_dir
            path = confined_path(hf_dir, fname, what="safetensors file", source=index)
            header, start = _read_header(path)
            self.file_metadata = header.pop("__metadata__", None) or self.file_metadata
            for name, info in header.items():
                self._entries[name] = (path, info, start)
        if weight_map is not None:
            missing = sorted(set(weight_map) - set(self._entries))
            if missing:
                raise ValueError(f"{INDEX_FNAME} names tensors absent from the shards: {missing}")

    def keys(self) -> list[str]:
        return list(self._entries)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """{tensor name: stored shape}, from the headers."""
        return {name: tuple(info["shape"]) for name, (_, info, _) in self._entries.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        _, info, _ = self._entry(name)
        return tuple(info["shape"]), _dtype(info["dtype"])

    def meta(self, name: str) -> torch.Tensor:
        """An empty meta tensor with the stored shape and dtype (for shape planning)."""
        shape, dtype = self.shape_dtype(name)
        return torch.empty(shape, dtype=dtype, device="meta")

    def get(self, name: str) -> torch.Tensor:
        """The stored tensor, memory-mapped read-only from its file."""
        path, info, start = self._entry(name)
        shape, dtype = tuple(info["shape"]), _dtype(info["dtype"])
        begin, end = info["data_offsets"]
        width = torch.empty((), dtype=dtype).element_size()
        count = (end - begin) // width
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        arr = np.memmap(
            path, dtype=_NP_SAME_WIDTH[width], mode="r", offset=start + begin, shape=(count,)
        )
        import warnings

        with warnings.catch_warnings():  # read-only mapping: torch warns, we never write to it
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(arr)
        return flat.view(dtype).view(shape)

    def read(self, name: str, box: tuple[slice, ...] = ()) -> torch.Tensor:
        """Tensor `name`, or its part `box` (one unit-step slice per leading dim), read into
        memory: only the bytes of `box` (rows `box[0]` are one contiguous range, a 2-D column
        range `box[1]` one read per row; later dims are sliced in memory).

        `bytes_read` counts the bytes copied from the files; `live_bytes` / `peak_live_bytes`
        the read buffers still referenced (by the returned tensor or views of it)."""
        path, info, start = self._entry(name)
        shape, dtype = tuple(info["shape"]), _dtype(info["dtype"])
        if not shape:
            box = ()
        r0, r1 = _unit_range(box[0], shape[0], name) if box else (0, shape[0] if shape else 1)
        c0, c1 = 0, shape[1] if len(shape) > 1 else 1
        if len(shape) == 2 and len(box) > 1:
            c0, c1 = _unit_range(box[1], shape[1], name)
            box = box[:1]  # the columns are cut while reading
        width = _nbytes((), dtype)
        row = _nbytes(shape[1:], dtype)
        piece = (c1 - c0) * width if len(shape) == 2 else row
        buf = _Buffer(max(r1 - r0, 0) * piece)
        base = start + info["data_offsets"][0]
        if buf:
            view = memoryview(buf)
            with open_regular_file(path, what="safetensors file") as f:
                if piece == row:  # whole rows: one contiguous range
                    spans = [(view, base + r0 * row)]
                else:
                    spans = [
                        (view[j * piece : (j + 1) * piece], base + r * row + c0 * width)
                        for j, r in enumerate(range(r0, r1))
                    ]
                for dst, offset in spans:
                    if os.preadv(f.fileno(), [dst], offset) != len(dst):
                        raise ValueError(f"{path}: tensor {name!r} is truncated")
        self._count(buf)
        flat = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        if not shape:
            return flat.view(())
        cols = (c1 - c0,) if len(shape) == 2 else shape[1:]
        out = flat.view(max(r1 - r0, 0), *cols)
        return out[(slice(None), *box[1:])] if len(box) > 1 else out

    def _count(self, buf: bytearray) -> None:
        self.bytes_read += len(buf)
        self.live_bytes += len(buf)
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        weakref.finalize(buf, self._release, len(buf))

    def _release(self, n: int) -> None:
        self.live_bytes -= n

    def _entry(self, name: str):
        if name not in self._entries:
            raise KeyError(f"tensor {name!r} is not in {self.hf_dir}")
        return self._entries[name]


class _Buffer(bytearray):
    """A read buffer (a bytearray that can be weakly referenced, to count live bytes)."""


def _unit_range(part: slice, size: int, name: str) -> tuple[int, int]:
    begin, end, step = part.indices(size)
    if step != 1:
        raise ValueError(f"HFReader.read({name!r}): slice step {step} (only unit steps)")
    return begin, max(begin, end)


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"safetensors dtype {name!r} is not supported (known: {sorted(_DTYPES)})")
    return _DTYPES[name]


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()


def _header_bytes(plan: list[tuple[str, tuple, torch.dtype]], metadata: dict) -> bytes:
    header, offset = {"__metadata__": metadata}, 0
    for name, shape, dtype in plan:
        n = _nbytes(shape, dtype)
        header[name] = {
            "dtype": _NAMES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data section 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(
    out_dir: str,
    plan: list[tuple[str, tuple, torch.dtype]],
    produce: Iterable[tuple[str, torch.Tensor]],
    *,
    max_shard_bytes: int = 5 * 1024**3,
    metadata: dict | None = None,
) -> list[str]:
    """Write tensors in `plan` order, each produced once by `produce` (same order).

    plan: [(name, shape, dtype)] known up front (headers are written first). Files are split at
    `max_shard_bytes` (`model-0000i-of-0000n.safetensors` + index), or one `model.safetensors`.
    Returns the file names written.
    """
    metadata = {"format": "pt", **(metadata or {})}
    shards: list[list] = [[]]
    size = 0
    for entry in plan:
        n = _nbytes(entry[1], entry[2])
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += n
    if len(shards) == 1:
        names = [SINGLE_FNAME]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    it = iter(produce)
    for fname, shard in zip(names, shards):
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(_header_bytes(shard, metadata))
            for name, shape, dtype in shard:
                got_name, tensor = next(it)
                if got_name != name or tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                    raise ValueError(
                        f"write_safetensors: produced {got_name} {tuple(tensor.shape)} "
                        f"{tensor.dtype}, planned {name} {tuple(shape)} {dtype}"
                    )
                _write_tensor(f, tensor)
            f.flush()
            os.fsync(f.fileno())
    if len(shards) > 1:
        total = sum(_nbytes(s, d) for _, s, d in plan)
        weight_map = {name: fname for fname, shard in zip(names, shards) for name, _, _ in shard}
        with open(os.path.join(out_dir, INDEX_FNAME), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return names


def _write_tensor(f, tensor: torch.Tensor) -> None:
    t = tensor.detach().to("cpu").contiguous()
    if t.numel():  # the array's buffer is written directly: no bytes copy
        f.write(t.view(-1).view(torch.uint8).numpy().data)


def iter_planned(
    plan: list[tuple[str, tuple, torch.dtype]], make: Callable[[str], torch.Tensor]
) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, make(name)) in plan order (a helper for write_safetensors)."""
    for name, _, _ in plan:
        yield name, make(name)
