"""What to say when a Megatron script run through the alias fails on a machine without CUDA.

Megatron's examples assume GPUs: `torch.cuda.set_device(local_rank)`, `model.cuda()`,
`init_process_group("nccl")`, `world_size = torch.cuda.device_count()`. Without CUDA these fail
with messages that do not say what to change ("Torch not compiled with CUDA enabled", "module
'torch._C' has no attribute '_cuda_setDevice'", or, with a world size of 0, an error far from the
cause). The launcher knows there is no GPU, so it adds one hint naming the CPU path and every
line of the script that calls CUDA (the run stops at the first; the others fail next).

Whether a CUDA call failed is read from the traceback, never from the message: an error that
only mentions CUDA (`cuda rng state ... is not added`, a TypeError naming torch.cuda.amp) is
the script's own mistake and passes through unchanged.
"""

from __future__ import annotations

import os
import re
import traceback

# source lines of the script that call CUDA / NCCL
_CUDA_CALL = re.compile(
    r"\.cuda\(|torch\.cuda\.|device=['\"]cuda|\.to\(['\"]cuda|['\"]nccl['\"]|device_count\("
    r"|cuda_device"
)
_SHOWN = 20  # CUDA lines listed at most

CPU_PATH = (
    "take the CPU path: skip torch.cuda.set_device and .cuda() (or guard them with "
    "torch.cuda.is_available()), init_process_group(backend='gloo'), take the world size from "
    "int(os.environ['WORLD_SIZE']) (torchrun sets it; torch.cuda.device_count() is 0 here), keep "
    "tensors on torch.device('cpu') and pass use_cpu_initialization=True to TransformerConfig "
    "(docs/learn.md)"
)


def _in_package(filename: str, *parts: str) -> bool:
    path = filename.replace("\\", "/")
    return any(f"/{p}/" in path for p in parts)


def _failed_cuda_line(frames, source: str, lines: list[str]) -> int | None:
    """The script's line where a CUDA call failed: torch.cuda raised (lazy init, set_device) below
    it, or the script's innermost line calls CUDA and only torch ran after it (nccl in
    init_process_group, a CUDA generator built in C). None when no CUDA call failed."""
    own = [i for i, f in enumerate(frames) if os.path.abspath(f.filename) == source]
    if not own:
        return None
    last = own[-1]
    lineno = frames[last].lineno or 0
    if any(_in_package(f.filename, "torch/cuda") for f in frames):
        return lineno
    text = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    below = frames[last + 1 :]
    if _CUDA_CALL.search(text) and all(_in_package(f.filename, "torch") for f in below):
        return lineno
    return None


def _world_from_device_count(frames, calls: list[tuple[int, str]]) -> bool:
    """The script takes its world size from torch.cuda.device_count() (0 here) and the error
    comes from setting up the process group or the model-parallel groups."""
    if not any("device_count(" in text for _, text in calls):
        return False
    return any(
        _in_package(f.filename, "torch/distributed")
        or f.filename.replace("\\", "/").endswith("gigatron/core/parallel_state.py")
        for f in frames
    )


def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def cuda_hint(script: str, err: BaseException, source_text: str | None = None) -> str | None:
    """The hint for `err` raised by `script` (a file, or `source_text` run under that name, as
    `-c` does) on a machine without CUDA, or None when no CUDA call of the script failed."""
    if source_text is None:
        try:
            with open(script, encoding="utf-8") as f:
                source_text = f.read()
        except (OSError, UnicodeDecodeError):
            source_text = ""
    lines = source_text.splitlines()
    calls = [
        (i, text.strip())
        for i, text in enumerate(lines, 1)
        if _CUDA_CALL.search(text) and not text.lstrip().startswith("#")
    ]
    source = os.path.abspath(script)
    where = None
    for e in _chain(err):
        frames = traceback.extract_tb(e.__traceback__)
        failed = _failed_cuda_line(frames, source, lines)
        if failed is not None:
            where = f" It stopped at line {failed}."
        elif _world_from_device_count(frames, calls):
            n = next(i for i, text in calls if "device_count(" in text)
            where = f" Its world size is torch.cuda.device_count() (line {n}), 0 here."
        if where is not None:
            break
    if where is None:
        return None
    if calls:
        shown = [f"line {i}: {text}" for i, text in calls[:_SHOWN]]
        more = [f"... {len(calls) - _SHOWN} more"] if len(calls) > _SHOWN else []
        where += f" All of {script}'s CUDA lines: " + "; ".join(shown + more) + "."
    return (
        f"this machine has no CUDA device (torch.cuda.is_available() is False) and a CUDA call "
        f"of the script failed with {type(err).__name__}.{where} To run it here, {CPU_PATH}"
    )
