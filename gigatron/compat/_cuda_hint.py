"""What to say when a Megatron script run through the alias fails on a machine without CUDA.

Megatron's examples assume GPUs: `torch.cuda.set_device(local_rank)`, `model.cuda()`,
`init_process_group("nccl")`, `world_size = torch.cuda.device_count()`. Without CUDA these fail
with messages that do not say what to change ("Torch not compiled with CUDA enabled", "module
'torch._C' has no attribute '_cuda_setDevice'", or, with a world size of 0, an error far from the
cause). The launcher knows there is no GPU, so it adds one hint naming the CPU path and every
line of the script that calls CUDA (the run stops at the first; the others fail next).

A CUDA call failed when both hold: the error means there is no CUDA (its type and message:
"Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available",
"Distributed package doesn't have NCCL built in", a missing torch._C._cuda_* binding), and the
traceback shows it came from CUDA (a torch.cuda frame, or the user's innermost line calls CUDA
and only torch ran below it). Any other error passes through unchanged, even one that mentions
CUDA or is raised inside torch.cuda (`torch.cuda.amp.autocast(dtype="bfloat16")`, a TypeError,
is the script's own mistake). The user's code is the script and every file outside the Python
installation, its site-packages, torch and gigatron (a helper module next to the script).
"""

from __future__ import annotations

import os
import re
import site
import sysconfig
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


# what an error says when this machine has no CUDA / NCCL (matched with its type)
_NO_CUDA = (
    (AssertionError, re.compile(r"not compiled with CUDA enabled")),
    (RuntimeError, re.compile(
        r"Found no NVIDIA driver|No CUDA GPUs are available|no CUDA-capable device"
        r"|doesn't have NCCL built in|NCCL support is not compiled|without ATen_cuda library"
        r"|CUDA driver initialization failed|not compiled with CUDA enabled"
    )),
    (AttributeError, re.compile(r"module 'torch\._C' has no attribute '_cuda_")),
)  # fmt: skip


def _means_no_cuda(err: BaseException) -> bool:
    return any(isinstance(err, kind) and rx.search(str(err)) for kind, rx in _NO_CUDA)


def _library_dirs() -> tuple[str, ...]:
    """Folders whose files are never the user's: Python's own, site-packages, torch, gigatron."""
    import torch

    import gigatron

    dirs = {os.path.dirname(torch.__file__), os.path.dirname(gigatron.__file__)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    try:
        dirs.update(site.getsitepackages() + [site.getusersitepackages()])
    except AttributeError:  # a virtualenv's old site module
        pass
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _is_user_file(filename: str, source: str, library: tuple[str, ...]) -> bool:
    if os.path.abspath(filename) == source:
        return True
    if filename.startswith("<") or not os.path.isfile(filename):
        return False
    path = os.path.realpath(filename)
    parts = path.replace("\\", "/").split("/")
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not path.startswith(library)


def _in_package(filename: str, *parts: str) -> bool:
    path = filename.replace("\\", "/")
    return any(f"/{p}/" in path for p in parts)


def _failed_cuda_line(frames, source: str, lines: list[str]) -> str | None:
    """Where the user's code made the CUDA call that failed ("line N", or "FILE line N" in a
    module of the user's other than the script): torch.cuda raised (lazy init, set_device) below
    it, or the user's innermost line calls CUDA and only torch ran after it (nccl in
    init_process_group, a CUDA generator built in C). None when no CUDA call failed."""
    library = _library_dirs()
    own = [i for i, f in enumerate(frames) if _is_user_file(f.filename, source, library)]
    if not own:
        return None
    last = own[-1]
    frame = frames[last]
    lineno = frame.lineno or 0
    in_script = os.path.abspath(frame.filename) == source
    where = f"line {lineno}" if in_script else f"{frame.filename} line {lineno}"
    if any(_in_package(f.filename, "torch/cuda") for f in frames):
        return where
    if in_script:
        text = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    else:
        text = frame.line or ""
    below = frames[last + 1 :]
    if _CUDA_CALL.search(text) and all(_in_package(f.filename, "torch") for f in below):
        return where
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
        failed = _failed_cuda_line(frames, source, lines) if _means_no_cuda(e) else None
        if failed is not None:
            where = f" It stopped at {failed}."
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
