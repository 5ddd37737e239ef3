"""Peak bytes of live tensors on any device, CPU included: what `gigatron estimate` is checked
against where `torch.cuda.max_memory_allocated` does not exist.

`LiveTensorBytes` is a TorchDispatchMode: every op's output storage is counted once (views share
their base's storage) when it first appears, and uncounted when its last reference dies (a weak
reference on the storage). Not counted: tensors made before the mode was entered (enter it before
the model is built), allocator rounding and fragmentation (CUDA's caching allocator adds these;
the CPU has none), and buffers a collective library keeps to itself.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """`with LiveTensorBytes() as m: ...`; then `m.peak` (bytes), `m.live`, `m.reset_peak()`."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref] = {}

    def reset_peak(self) -> None:
        """Start a new peak from what is alive now (after the model is built, say)."""
        self.peak = self.live

    def _release(self, key: int, nbytes: int) -> None:
        self._refs.pop(key, None)
        self.live -= nbytes

    def _count(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._refs:
            return
        nbytes = storage.nbytes()
        self._refs[key] = weakref.ref(storage, lambda _, k=key, n=nbytes: self._release(k, n))
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._count(t)
        return out
