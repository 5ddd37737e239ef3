"""What to say when a Megatron script run through the alias fails on a machine without CUDA.

Megatron's examples assume GPUs: `torch.cuda.set_device(local_rank)`, `model.cuda()`,
`init_process_group("nccl")`, `world_size = torch.cuda.device_count()`. Without CUDA these fail
with messages that do not say what to change ("Torch not compiled with CUDA enabled", "module
'torch._C' has no attribute '_cuda_setDevice'", or, with a world size of 0, an error far from the
cause). The launcher knows there is no GPU, so it adds one hint naming the CPU path and the lines
of the script that call CUDA.
"""

from __future__ import annotations

import os
import re
import traceback

# a message, or a line of the script in the traceback, that comes from a CUDA / NCCL call (whole
# words: `model_parallel_cuda_manual_seed` in a message is no CUDA call)
_CUDA_TEXT = re.compile(r"\b(cuda|nccl|nvidia|gpus?)\b|ProcessGroupNCCL", re.IGNORECASE)
# source lines worth pointing at in the script
_CUDA_CALL = re.compile(
    r"\.cuda\(|torch\.cuda\.|device=['\"]cuda|['\"]nccl['\"]|device_count\(|cuda_device"
)

CPU_PATH = (
    "take the CPU path: skip torch.cuda.set_device and .cuda() (or guard them with "
    "torch.cuda.is_available()), init_process_group(backend='gloo'), take the world size from "
    "int(os.environ['WORLD_SIZE']) (torchrun sets it; torch.cuda.device_count() is 0 here), keep "
    "tensors on torch.device('cpu') and pass use_cpu_initialization=True to TransformerConfig "
    "(docs/learn.md)"
)


def _mentions_cuda(script: str, err: BaseException) -> bool:
    """`err` (or its cause) says CUDA / NCCL, was raised inside torch.cuda, or passed through a
    line of `script` that calls them (library frames are not read: their CUDA branches are
    not taken on the CPU)."""
    script = os.path.abspath(script)
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if _CUDA_TEXT.search(str(err)):
            return True
        for frame in traceback.extract_tb(err.__traceback__):
            if "/torch/cuda/" in frame.filename.replace("\\", "/"):
                return True
            if os.path.abspath(frame.filename) == script and _CUDA_TEXT.search(frame.line or ""):
                return True
        err = err.__cause__ or err.__context__
    return False


def _cuda_lines(script: str) -> list[str]:
    try:
        with open(script, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [
        f"line {i}: {text.strip()}"
        for i, text in enumerate(lines, 1)
        if _CUDA_CALL.search(text) and not text.lstrip().startswith("#")
    ]


def cuda_hint(script: str, err: BaseException) -> str | None:
    """The hint for `err` raised by `script` on a machine without CUDA, or None when `err`
    does not come from a CUDA call (nor from a world size of 0 read from device_count())."""
    calls = _cuda_lines(script)
    from_device_count = any("device_count(" in line for line in calls)
    if not (_mentions_cuda(script, err) or from_device_count):
        return None
    where = ""
    if calls:
        shown = calls[:6] + ([f"... {len(calls) - 6} more"] if len(calls) > 6 else [])
        where = f" {script} calls CUDA at " + "; ".join(shown) + "."
    return (
        f"this machine has no CUDA device (torch.cuda.is_available() is False) and the script "
        f"failed with {type(err).__name__}.{where} To run it here, {CPU_PATH}"
    )
