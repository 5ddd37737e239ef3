"""Run a module (gigatron.training.pretrain_gpt) with every live tensor byte counted: the CPU
stand-in for `torch.cuda.max_memory_allocated`, which the training log reports on CUDA only.

    torchrun --nproc-per-node 1 bench/estimate/live_bytes_run.py [--cuda-kernels] -m MODULE ARGS

The module runs under `gigatron.tools.estimate.measure.LiveTensorBytes` from its first line
(model construction included, as CUDA's counter is since the process started); at its end
`live-bytes rank R peak N` is printed. `--cuda-kernels`: what CUDA compiles into one kernel
each runs as that kernel allocates here too: the chunked cross entropy's elementwise helpers
keep only their outputs, the flat Adam update writes its inputs in place. Eager on CPU they make
fp32 temporaries (three [4096, V] logits-sized ones in the cross entropy's backward, ~19 fp32
copies of a shard in the update) that no GPU run has.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)  # the repo's gigatron, without an install (the device's image)


@contextlib.contextmanager
def cuda_kernels():
    """The cross entropy's helpers as fused kernels (outputs counted once), the flat Adam
    update in place (nothing new counted)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from gigatron.core.fusions import chunked_cross_entropy as ce
    from gigatron.core.optimizer import _flat_adam_step as flat

    def fused(fn):
        def run(*args):
            with _disable_current_modes():  # the kernel's registers: not counted
                out = fn(*args)
            return out.clone()  # its output, counted once

        return run

    def in_place(device):
        def update(*args):
            with _disable_current_modes():
                flat.flat_adam_update(*args)

        return update

    helpers, update_fn = ce._HELPERS["eager"], flat._update_fn
    ce._HELPERS["eager"] = tuple(fused(f) for f in helpers)
    flat._update_fn = in_place
    try:
        yield
    finally:
        ce._HELPERS["eager"], flat._update_fn = helpers, update_fn


def main(argv: list[str]) -> None:
    kernels = bool(argv) and argv[0] == "--cuda-kernels"
    argv = argv[1:] if kernels else argv
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit("usage: live_bytes_run.py [--cuda-kernels] -m MODULE [ARGS...]")
    from gigatron.tools.estimate.measure import LiveTensorBytes

    sys.argv = [argv[1], *argv[2:]]
    mem = LiveTensorBytes()
    try:
        with mem, cuda_kernels() if kernels else contextlib.nullcontext():
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    finally:
        rank = os.environ.get("RANK", "0")
        print(f"live-bytes rank {rank} peak {mem.peak}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
