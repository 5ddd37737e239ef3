"""Run scripts written for `megatron.core` on gigatron, unchanged.

    python -m gigatron.compat.megatron my_script.py --flags ...        # one process
    python -m gigatron.compat.megatron -m package.module ... / -c "code"  # as python's -m / -c
    torchrun --nproc-per-node 2 -m gigatron.compat.megatron my_script.py ...

Alone (no torchrun) it sets what torchrun sets for one process (RANK=0, LOCAL_RANK=0,
WORLD_SIZE=1, MASTER_ADDR=127.0.0.1, a free MASTER_PORT) unless WORLD_SIZE is already set.

or, inside Python, `import gigatron.compat.megatron as m; m.install()` before the script's own
imports. After `install()`, `import megatron.core.X` and `import megatron.training.X` resolve to
`gigatron.core.X` and `gigatron.training.X` (the same module objects), and `megatron.bridge` (its
`AutoBridge`) to `gigatron.convert.bridge`. Nothing named `megatron`
is touched unless this module is used, so gigatron installs beside the real megatron-core.
A `megatron` module gigatron does not provide fails with ImportError naming it. On a machine
without CUDA, a script whose CUDA call fails (`torch.cuda.set_device`, `.cuda()`, nccl, a world
size from `torch.cuda.device_count()`; read from the traceback) gets a hint naming the CPU path
(`_cuda_hint`). Without this launcher (or `install()`), `import megatron` is Python's own
ModuleNotFoundError: gigatron ships no top-level `megatron` package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import types

_PREFIXES = {
    "megatron.core": "gigatron.core",
    "megatron.training": "gigatron.training",
    "megatron.bridge": "gigatron.convert.bridge",  # Megatron-Bridge's AutoBridge
}


def _target(fullname: str) -> str | None:
    for src, dst in _PREFIXES.items():
        if fullname == src or fullname.startswith(src + "."):
            return dst + fullname[len(src) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        if spec.name == "megatron.core":
            # Megatron's `import megatron.core` allows its checkpoints' classes (argparse's
            # Namespace, NumPy's scalars, its enums) in every weights-only torch.load; gigatron's
            # own import leaves torch's allowlist alone, so only the alias does this.
            importlib.import_module("gigatron.core.safe_globals").register_safe_globals()
        return module

    def exec_module(self, module) -> None:  # already executed under its gigatron name
        pass


class _MegatronAliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "megatron":
            return importlib.machinery.ModuleSpec(fullname, _RootLoader(), is_package=True)
        if not fullname.startswith("megatron."):
            return None
        dst = _target(fullname)
        if dst is None:
            raise ImportError(
                f"{fullname} is not provided by gigatron's megatron alias (only megatron.core, "
                "megatron.training and megatron.bridge are)",
                name=fullname,
            )
        try:
            spec = importlib.util.find_spec(dst)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            raise ModuleNotFoundError(
                f"{fullname} has no gigatron counterpart ({dst} does not exist); "
                "see docs/compat.md for what is covered",
                name=fullname,
            )
        alias = importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(dst), is_package=spec.submodule_search_locations is not None
        )
        if spec.submodule_search_locations is not None:
            alias.submodule_search_locations = list(spec.submodule_search_locations)
        return alias


class _RootLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType("megatron")
        module.__path__ = []
        module.__doc__ = "gigatron's alias of the megatron namespace (gigatron.compat.megatron)"
        return module

    def exec_module(self, module) -> None:
        pass


_FINDER = _MegatronAliasFinder()


def install() -> None:
    """Make `megatron.core` / `megatron.training` / `megatron.bridge` imports resolve to gigatron
    (idempotent)."""
    loaded = [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]
    real = [m for m in loaded if not _is_alias(sys.modules[m])]
    if real:
        raise RuntimeError(
            f"the real megatron package is already imported ({real[0]}); install the gigatron "
            "alias before anything imports megatron"
        )
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Remove the alias and forget the aliased modules."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        del sys.modules[name]


def _is_alias(module) -> bool:
    name = getattr(module, "__name__", "")
    return name.startswith("gigatron") or name == "megatron" and not hasattr(module, "__file__")


_USAGE = "usage: python -m gigatron.compat.megatron (SCRIPT.py | -m MODULE | -c CODE) [args ...]"


# set by srun / mpirun / MPICH-style launchers: the number of processes they started
_MULTI_TASK = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _single_process_env() -> None:
    """Run alone (no torchrun): the environment torchrun gives one process, so that
    init_process_group's env:// rendezvous works unchanged. A launcher's values are kept; under
    srun / mpirun (several tasks, no WORLD_SIZE) nothing is filled in and one line says why, as
    N copies each calling itself rank 0 of 1 would train N separate models."""
    if "WORLD_SIZE" in os.environ:
        return
    for key in _MULTI_TASK:
        value = os.environ.get(key, "")
        if value.isdigit() and int(value) > 1:
            print(f"gigatron.compat.megatron: {key}={value} says this is one of {value} processes, "
                  "so the one-process defaults (RANK=0, WORLD_SIZE=1) are not set; launch with "
                  "torchrun, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT "
                  "from the launcher's variables (SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK)",
                  file=sys.stderr)  # fmt: skip
            return
    import socket

    with socket.socket() as s:  # a free port, as torchrun --standalone picks one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    defaults = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    first = argv[0]
    if first in ("-c", "-m") and len(argv) < 2:
        print(f"gigatron.compat.megatron: error: argument expected for {first}\n{_USAGE}",
              file=sys.stderr)  # fmt: skip
        return 2
    if first.startswith("-") and first not in ("-c", "-m"):
        print(f"gigatron.compat.megatron: error: unknown option {first} (the options are -m MODULE "
              f"and -c CODE, as python's; a script's own flags go after it)\n{_USAGE}",
              file=sys.stderr)  # fmt: skip
        return 2
    install()
    _single_process_env()
    source_text = None
    if first == "-c":
        source_text, rest = argv[1], argv[2:]
        name = "<string>"
        sys.argv = ["-c", *rest]
        code = compile(source_text, name, "exec")
        run = lambda: exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
    elif first == "-m":
        module, rest = argv[1], argv[2:]
        spec = importlib.util.find_spec(module)
        name = spec.origin if spec is not None and spec.origin else module
        sys.argv = [name, *rest]
        run = lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        name, rest = first, argv[1:]
        sys.argv = [name, *rest]
        sys.path.insert(0, os.path.dirname(os.path.abspath(name)))  # as `python SCRIPT.py`
        run = lambda: runpy.run_path(name, run_name="__main__")
    try:
        run()
    except Exception as err:
        hint = _no_cuda_hint(name, err, source_text)
        if hint is None:
            raise
        raise RuntimeError(f"gigatron.compat.megatron: {hint}") from err
    return 0


def _no_cuda_hint(script: str, err: Exception, source_text: str | None = None) -> str | None:
    """On a machine without CUDA, what to change when `err` comes from the script's CUDA calls."""
    import torch

    if torch.cuda.is_available():
        return None
    from gigatron.compat._cuda_hint import cuda_hint

    return cuda_hint(script, err, source_text)


if __name__ == "__main__":
    sys.exit(main())
