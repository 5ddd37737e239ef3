"""A DCP reader that reads a checkpoint's `.metadata` once per directory (mirrors
`megatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader`).

Built on `SafeFileSystemReader`, so the cached metadata was unpickled through the same
allow-list. The cache is class-level, keyed by the directory's absolute path; call
`clear_metadata_cache()` after a checkpoint in a reused directory is rewritten.
"""

from __future__ import annotations

import os

from torch.distributed.checkpoint import Metadata

from gigatron.core.dist_checkpointing.strategies.torch import SafeFileSystemReader

__all__ = ["CachedMetadataFileSystemReader"]


class CachedMetadataFileSystemReader(SafeFileSystemReader):
    """SafeFileSystemReader whose `read_metadata` is shared by readers of the same directory
    (`cache_metadata=False`: read every time)."""

    _metadata_cache: dict[str, Metadata] = {}

    def __init__(self, path: str | os.PathLike, cache_metadata: bool = True) -> None:
        super().__init__(path=path)
        self._cache_key = os.path.abspath(os.fspath(path)) if cache_metadata else None
        self._memo_metadata = cache_metadata  # False: a fresh Metadata on every read

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if self._cache_key is None:
            return super().read_metadata(*args, **kwargs)
        cache = CachedMetadataFileSystemReader._metadata_cache
        if self._cache_key not in cache:
            cache[self._cache_key] = super().read_metadata(*args, **kwargs)
        return cache[self._cache_key]

    @classmethod
    def clear_metadata_cache(cls) -> None:
        cls._metadata_cache.clear()
