"""bench_ckpt's state-dict helpers: walk a nested sharded state dict, make NaN load targets,
check a load bitwise against what was saved, measure and evict the checkpoint's files.

Duck-typed over gigatron's and megatron-core's ShardedTensor (both have `.key` and `.data`), so
one set of helpers serves both sides of bench/ckpt/bench_ckpt.py.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist


def _leaves(sd, path=()):
    """(path, leaf) of a nested dict/list state dict."""
    if isinstance(sd, dict):
        for k, v in sd.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(sd, list):
        for i, v in enumerate(sd):
            yield from _leaves(v, (*path, i))
    else:
        yield path, sd


def _is_tensor_leaf(v) -> bool:
    """A ShardedTensor or ShardedTensorFactory of either library (duck-typed)."""
    return torch.is_tensor(getattr(v, "data", None)) and hasattr(v, "key")


def _reference(sd) -> dict:
    """{path: tensor that will be saved} (taken before save: megatron's save edits the dict)."""
    return {p: v.data for p, v in _leaves(sd) if _is_tensor_leaf(v)}


def _map(sd, fn):
    """Same nested structure with `fn` applied to every sharded-tensor leaf."""
    if isinstance(sd, dict):
        return {k: _map(v, fn) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_map(v, fn) for v in sd]
    return fn(sd) if _is_tensor_leaf(sd) else sd


def _fresh(sd):
    """Load targets: same layout, every sharded tensor's data a new NaN (or -1) tensor."""

    def nan_like(v):
        fill = float("nan") if v.data.is_floating_point() else -1
        return dataclasses.replace(v, data=torch.full_like(v.data, fill))

    return _map(sd, nan_like)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN-safe, -0.0 != +0.0): megatron's padding is uninitialised memory."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _verify(reference: dict, loaded) -> tuple[bool, int, str]:
    """(all equal bitwise, tensors checked, first mismatch) of loaded vs reference tensors."""
    for path, want in reference.items():
        got = loaded
        try:
            for k in path:
                got = got[k]
        except (KeyError, IndexError, TypeError):
            return False, len(reference), "/".join(map(str, path))
        same = (
            torch.is_tensor(got)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and (got.numel() == 0 or got.data_ptr() != want.data_ptr())  # not the saved tensor
            and torch.equal(_bits(got.to(want.device)), _bits(want))
        )
        if not same:
            return False, len(reference), "/".join(map(str, path))
    return True, len(reference), ""


def _payload_bytes(reference: dict) -> int:
    return sum(t.numel() * t.element_size() for t in reference.values())


def _dir_bytes(path: str) -> tuple[int, int]:
    """(apparent bytes, allocated bytes as du counts them) of every file under `path`."""
    apparent = allocated = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def _evict(path: str) -> None:
    """Push the files to disk and drop them from the page cache (no root needed)."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()


def _record_files(out: dict, ckpt: str, reference: dict, drop_cache: bool) -> None:
    """Bytes of the saved checkpoint's files and of its tensors into `out`; then, with
    `drop_cache`, evict the files so that the load reads them from disk."""
    out["bytes_on_disk"], out["du_bytes"] = _dir_bytes(ckpt)
    out["payload_bytes"] = _payload_bytes(reference)
    if drop_cache:
        _evict(ckpt)


def _record_verify(out: dict, reference: dict, loaded) -> None:
    """`_verify` into `out`: `verified` stays True only while every repeat matched bitwise."""
    ok, out["verified_tensors"], bad = _verify(reference, loaded)
    out["verified"] = out["verified"] and ok
    if not ok:
        out["first_mismatch"] = bad
