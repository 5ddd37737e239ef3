"""Runs documentation snippets for tests/docs/test_snippets.py without paying Python's,
torch's and gigatron's import per snippet: this process imports them once (running no torch op,
so no thread pool exists yet), then forks a child per request. The child becomes a fresh
`__main__` module whose `__file__` is the snippet (so `multiprocessing` / `run_distributed`
workers re-import it exactly as when the snippet runs as a script), runs it with its output in
files beside it, and exits with 0 or 1.

`run_distributed` starts its ranks from a forkserver that imports torch and gigatron (seconds of
CPU). This process starts that forkserver once and every child reuses it: a rank still gets the
child's working directory, `sys.path` and `__main__` (multiprocessing sends them with each
request), so it runs as under a forkserver of its own.

Protocol: one JSON object per line on stdin, {"script": path}; one line back, {"rc": int}.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types


def _run(script: str) -> int:
    folder = os.path.dirname(script)
    pid = os.fork()
    if pid == 0:  # the child: the snippet as a script run from its folder
        code = 1
        try:
            _reuse_parent_forkserver()
            os.chdir(folder)
            out = os.open(os.path.join(folder, "stdout.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
            err = os.open(os.path.join(folder, "stderr.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.argv = [script]
            sys.path[0] = folder
            main = types.ModuleType("__main__")
            main.__file__ = script
            main.__builtins__ = __builtins__
            sys.modules["__main__"] = main
            with open(script, encoding="utf-8") as f:
                exec(compile(f.read(), script, "exec"), main.__dict__)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _start_forkserver() -> None:
    """Start run_distributed's forkserver (with its preloaded modules) in this process."""
    from multiprocessing import forkserver

    from gigatron.testing.distributed import _context

    _context()  # sets the forkserver's preload list
    forkserver.ensure_running()


def _reuse_parent_forkserver() -> None:
    """In a forked child: use the parent's forkserver (alive as long as the parent is). The
    stock check would `waitpid` the server, which is the parent's child, not this process's."""
    from multiprocessing import forkserver, resource_tracker

    forkserver._forkserver.ensure_running = resource_tracker.ensure_running


def main() -> None:
    import torch  # noqa: F401  (imported once, before any fork)

    import gigatron  # noqa: F401
    import gigatron.testing  # noqa: F401

    _start_forkserver()

    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps({"rc": _run(request["script"])}), flush=True)


if __name__ == "__main__":
    main()
