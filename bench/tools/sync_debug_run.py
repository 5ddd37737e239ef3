"""Run a module (e.g. gigatron.training.pretrain_gpt) with CUDA sync debugging: every host sync
torch reports (`.item()`, `.tolist()`, D2H copies, `nonzero`, stream syncs) is counted by its
Python call site, and the table is printed at exit. Syncs that happen every iteration show up
with a count near the number of iterations; one-off ones (set-up, checkpointing) with 1 or 2.

    torchrun --nproc-per-node 1 bench/tools/sync_debug_run.py -m gigatron.training.pretrain_gpt ARGS

Without CUDA it only runs the module (torch reports no syncs on CPU).
"""

from __future__ import annotations

import atexit
import collections
import os
import runpy
import sys
import traceback
import warnings

import torch

# the repo root: the module runs from a checkout without an install (as the device's image)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

_COUNTS: collections.Counter[str] = collections.Counter()
_STACKS: dict[str, list[str]] = {}  # one full stack per site (torch frames included)
_MESSAGE = "synchronizing CUDA operation"


def _site(stack: list[traceback.FrameSummary], depth: int = 4) -> str:
    """The innermost `depth` frames of the project's own code, innermost first."""
    own = [
        f
        for f in stack
        if f.filename.startswith(_ROOT + os.sep) and "site-packages" not in f.filename
    ]
    own = [f for f in own if not f.filename.endswith("sync_debug_run.py")] or stack[-depth:]
    return " <- ".join(
        f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in own[::-1][:depth]
    )


def _show(message, category, filename, lineno, file=None, line=None, _orig=warnings.showwarning):
    if _MESSAGE not in str(message):
        return _orig(message, category, filename, lineno, file, line)
    stack = traceback.extract_stack()[:-1]
    site = _site(stack)
    _COUNTS[site] += 1
    if site not in _STACKS:
        _STACKS[site] = [f"{f.filename}:{f.lineno} {f.name}" for f in stack[-14:]]


def _report() -> None:
    rank = os.environ.get("RANK", "0")  # the process group is gone by exit
    print(f"sync-debug rank {rank}: {sum(_COUNTS.values())} host syncs by call site", flush=True)
    for site, n in _COUNTS.most_common(25):
        print(f"sync-debug {n:6d}  {site}", flush=True)
    for site, _ in _COUNTS.most_common(4):
        print(f"sync-debug stack of {site}:", flush=True)
        for frame in _STACKS[site]:
            print(f"sync-debug     {frame}", flush=True)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit("usage: sync_debug_run.py -m MODULE [ARGS...]")
    if torch.cuda.is_available():
        warnings.filterwarnings("always", message=f".*{_MESSAGE}.*")
        warnings.showwarning = _show
        torch.cuda.set_sync_debug_mode("warn")
        atexit.register(_report)
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
