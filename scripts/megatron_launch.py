"""`run_megatron_unit_tests.py --nproc N,...`: each test directory of a Megatron-LM checkout as
one pytest session under `torchrun --nproc-per-node N` (gloo CPU ranks), rank 0's results read
live, a per-file timeout (the hung file is recorded and the session restarts after it), and
the markdown report (scripts/megatron_test_results.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import megatron_test_results as mtr

AFTER_END_S = 30  # rank 0 finished: the others get this long to leave


def launch(checkout: Path, opts: dict, rest: list[str], script: Path) -> int:
    try:
        sizes = [int(n) for n in opts["nproc"].split(",")]
        timeout = float(opts.get("file_timeout", "120"))
    except ValueError as err:
        print(f"run_megatron_unit_tests: --nproc takes N[,N...] and --file-timeout seconds: {err}",
              file=sys.stderr)  # fmt: skip
        return 2
    if any(n < 1 for n in sizes):
        print(f"run_megatron_unit_tests: --nproc {opts['nproc']}: each N must be >= 1",
              file=sys.stderr)  # fmt: skip
        return 2
    pytest_opts = [a for a in rest if a.startswith("-")]
    paths = [a for a in rest if not a.startswith("-")] or ["tests/unit_tests"]
    deps_opt = ["--deps", opts["deps"]] if "deps" in opts else []  # the ranks' sys.path tail
    files = mtr.find_test_files(checkout, paths)
    sources = {f: (checkout / f).read_text(errors="replace") for f in files}
    excluded = {f: b for f in files if (b := mtr.cpu_blocker(sources[f]))}
    cpu = [f for f in files if f not in excluded]
    buckets: dict[str, list[str]] = defaultdict(list)
    for f in cpu:
        buckets[mtr.directory(f)].append(f)
    results = {}
    with tempfile.TemporaryDirectory(prefix="megatron-tests-") as work:
        for n in sizes:
            results[n] = {"tests": {}, "import_errors": {}, "stopped": {}, "files": cpu}
            for name, bucket in sorted(buckets.items()):
                t0 = time.monotonic()
                _run_bucket(checkout, script, n, bucket, timeout, [*deps_opt, *pytest_opts],
                            Path(work), results[n])  # fmt: skip
                c = mtr.counts(
                    t for k, t in results[n]["tests"].items() if k.split("::")[0] in bucket
                )
                took = time.monotonic() - t0
                print(f"N={n} {name}: {len(bucket)} files, {c['passed']} passed, {c['failed']} "
                      f"failed, {c['skipped']} skipped ({took:.0f} s)", flush=True)  # fmt: skip
    for n in sizes:
        c = mtr.counts(results[n]["tests"].values())
        print(f"megatron-on-gigatron N={n}: {c['passed']} passed, {c['failed']} failed, "
              f"{c['skipped']} skipped, {len(results[n]['import_errors'])} files failed to import, "
              f"{len(results[n]['stopped'])} files stopped")  # fmt: skip
    if "results" in opts:  # every test's outcome and message, as JSON
        Path(opts["results"]).write_text(json.dumps({str(n): r for n, r in results.items()}))
    if "report" in opts:
        meta = {
            "command": " ".join(
                ["python scripts/run_megatron_unit_tests.py", *_shown(sys.argv[1:])]
            ),
            "megatron_commit": _commit(checkout),
            "gigatron_commit": _commit(script.parent.parent),
            "timeout": f"{timeout:g}",
            "n_files": len(files),
            "n_cpu": len(cpu),
            "excluded": excluded,
            "test_counts": {f: mtr.count_tests(s) for f, s in sources.items()},
        }
        Path(opts["report"]).write_text(mtr.render(meta, results))
        print(f"report: {opts['report']}")
    return 0


def _shown(argv: list[str]) -> list[str]:
    """The command line as the report shows it: the checkout as a placeholder path."""
    return ["MEGATRON_LM", *argv[1:]] if argv else []


def _commit(path: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _run_bucket(checkout, script, n, files, timeout, pytest_opts, work: Path, res) -> None:
    remaining = list(files)
    while remaining:
        tag = f"n{n}-{len(list(work.glob('*.jsonl')))}"
        events_path, shared = work / f"{tag}.jsonl", work / f"{tag}-ckpt"
        shared.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={n}", str(script), str(checkout), "--worker", str(events_path),
               *pytest_opts, *remaining]  # fmt: skip
        root = str(script.parent.parent)
        path = os.pathsep.join([root, str(checkout), os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_TESTS_SHARED_TMP=str(shared),
                   PYTHONPATH=path)  # fmt: skip
        with open(work / f"{tag}.log", "wb") as log:
            proc = subprocess.Popen(cmd, cwd=checkout, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)  # fmt: skip
            current, since, ended, stop = None, time.monotonic(), None, None
            collect_limit = 2 * timeout + 60 + 3 * len(remaining)
            seen = 0
            while proc.poll() is None:
                time.sleep(0.5)
                events = mtr.load_events(events_path)
                for e in events[seen:]:
                    if e["kind"] == "file_start":
                        current, since = e["file"], time.monotonic()
                    elif e["kind"] == "session_end":
                        ended = time.monotonic()
                seen = len(events)
                now = time.monotonic()
                if ended is not None:
                    if now - ended > AFTER_END_S:
                        _kill(proc)
                elif now - since > (timeout if current else collect_limit):
                    stop = f"timeout ({timeout:g} s)" if current else "timeout while collecting"
                    _kill(proc)
        events = mtr.load_events(events_path)
        for e in events:
            if e["kind"] == "test":
                res["tests"][e["nodeid"]] = {"outcome": e["outcome"], "message": e["message"]}
            elif e["kind"] == "import_error":
                res["import_errors"][e["file"]] = e["message"]
        if any(e["kind"] == "session_end" for e in events):
            return
        if stop is None:
            tail = (work / f"{tag}.log").read_bytes()[-300:].decode(errors="replace").strip()
            last = tail.splitlines()[-1] if tail else ""
            stop = f"a rank died (exit {proc.returncode}): {mtr.first_line(last)}"
        if current is None:  # nothing ran: the whole session failed before its first test
            for f in remaining:
                res["stopped"][f] = stop
            return
        res["stopped"][current] = stop
        remaining = remaining[remaining.index(current) + 1 :]


def _kill(proc) -> None:
    """Stop this launch: torchrun (SIGTERM, which stops its ranks), then SIGKILL for it and
    every process under it (torchrun starts each rank in a session of its own)."""
    family = _descendants(proc.pid)
    try:
        proc.terminate()
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *family]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
