"""`run_megatron_unit_tests.py --nproc N,...`: each test directory of a Megatron-LM checkout as
one pytest session under `torchrun --nproc-per-node N` (gloo CPU ranks), rank 0's results read
live, a per-file timeout (the hung file is recorded and the session restarts after it), and
the markdown report (scripts/megatron_test_results.py)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import megatron_test_results as mtr

_TAGS = itertools.count()  # launches so far (shared by --jobs threads: next() is atomic)
AFTER_END_S = 30  # rank 0 finished: the others get this long to leave
START_S = 300  # from torchrun's start to rank 0's pytest (interpreters, rendezvous, imports)


# pytest options whose value may come as the next word
_VALUE_OPTIONS = {
    "-k",
    "-m",
    "-p",
    "-o",
    "-c",
    "-W",
    "--timeout",
    "--tb",
    "--maxfail",
    "--durations",
    "--deselect",
    "--ignore",
    "--ignore-glob",
    "--rootdir",
    "--junitxml",
    "--junit-xml",
    "--confcutdir",
    "--basetemp",
    "--log-level",
}


def split_paths(checkout: Path, rest: list[str]) -> tuple[list[str], list[str]]:
    """pytest's options and the test paths in `rest` (an option's value given as its own word,
    `--timeout 120` or `-p no:cacheprovider`, stays with its option)."""
    opts, paths, i = [], [], 0
    while i < len(rest):
        word = rest[i]
        if word in _VALUE_OPTIONS and i + 1 < len(rest):
            opts += [word, rest[i + 1]]
            i += 2
            continue
        (opts if word.startswith("-") else paths).append(word)
        i += 1
    return opts, paths


def launch(checkout: Path, opts: dict, rest: list[str], script: Path) -> int:
    try:
        sizes = [int(n) for n in opts["nproc"].split(",")]
        timeout = float(opts.get("file_timeout", "120"))
        jobs = int(opts.get("jobs", "1"))
    except ValueError as err:
        print(f"run_megatron_unit_tests: --nproc takes N[,N...], --file-timeout seconds and "
              f"--jobs a count: {err}", file=sys.stderr)  # fmt: skip
        return 2
    if any(n < 1 for n in sizes) or jobs < 1:
        print(f"run_megatron_unit_tests: --nproc {opts['nproc']} --jobs {jobs}: each must be >= 1",
              file=sys.stderr)  # fmt: skip
        return 2
    pytest_opts, paths = split_paths(checkout, rest)
    paths = paths or ["tests/unit_tests"]
    deps_opt = ["--deps", opts["deps"]] if "deps" in opts else []  # the ranks' sys.path tail
    files = mtr.find_test_files(checkout, paths)
    sources = {f: (checkout / f).read_text(errors="replace") for f in files}
    excluded = {f: b for f in files if (b := mtr.cpu_blocker(sources[f]))}
    cpu = [f for f in files if f not in excluded]
    buckets: dict[str, list[str]] = defaultdict(list)
    for f in cpu:
        buckets[mtr.directory(f)].append(f)
    meta = {
        "command": " ".join(["python scripts/run_megatron_unit_tests.py", *_shown(sys.argv[1:])]),
        "megatron_commit": _commit(checkout),
        "gigatron_commit": _commit(script.parent.parent),
        "timeout": f"{timeout:g}",
        "n_files": len(files),
        "n_cpu": len(cpu),
        "excluded": excluded,
        "test_counts": {f: mtr.count_tests(s) for f, s in sources.items()},
    }
    lock = threading.Lock()

    def save() -> None:
        """Every test's outcome and message, and the run's facts, as JSON (after each directory,
        so a run stopped from outside keeps what finished)."""
        if "results" in opts:
            with lock:
                for _ in range(5):  # other directories' threads may add results meanwhile
                    try:
                        text = json.dumps({**{str(n): r for n, r in results.items()}, "meta": meta})
                        break
                    except RuntimeError:
                        time.sleep(0.1)
                else:
                    return
                Path(opts["results"]).write_text(text)

    results = {}
    with tempfile.TemporaryDirectory(prefix="megatron-tests-") as work:

        def run(n: int, name: str, bucket: list[str]) -> None:
            t0 = time.monotonic()
            _run_bucket(checkout, script, n, bucket, timeout, [*deps_opt, *pytest_opts],
                        Path(work), results[n])  # fmt: skip
            c = mtr.counts(t for k, t in results[n]["tests"].items() if k.split("::")[0] in bucket)
            took = time.monotonic() - t0
            print(f"N={n} {name}: {len(bucket)} files, {c['passed']} passed, {c['failed']} "
                  f"failed, {c['skipped']} skipped ({took:.0f} s)", flush=True)  # fmt: skip
            save()

        for n in sizes:
            results[n] = {"tests": {}, "import_errors": {}, "stopped": {}, "files": cpu}
        # --jobs J: J directories at once (each its own torchrun; a machine with J x N cores)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            runs = [(n, name, b) for n in sizes for name, b in sorted(buckets.items())]
            for done in [pool.submit(run, *r) for r in runs]:
                done.result()
    for n in sizes:
        c = mtr.counts(results[n]["tests"].values())
        print(f"megatron-on-gigatron N={n}: {c['passed']} passed, {c['failed']} failed, "
              f"{c['skipped']} skipped, {len(results[n]['import_errors'])} files failed to import, "
              f"{len(results[n]['stopped'])} files stopped")  # fmt: skip
    save()
    if "report" in opts:
        Path(opts["report"]).write_text(mtr.render(meta, results))
        print(f"report: {opts['report']}")
    return 0


def render_saved(paths: list[str], report: str) -> int:
    """`--render A.json,B.json --report R.md`: one report from the --results files of runs at
    other world sizes (e.g. 1,2 on one machine and 4,8 on a larger one) of one Megatron-LM commit;
    where the gigatron commits differ, the report names each world size's."""
    metas, results, sizes = [], {}, []
    for p in paths:
        saved = json.loads(Path(p).read_text())
        if "meta" not in saved:
            raise SystemExit(f"run_megatron_unit_tests: {p}: no 'meta' (written by --results?)")
        metas.append(saved.pop("meta"))
        sizes.append(sorted(int(n) for n in saved))
        for n, r in saved.items():
            if int(n) in results:
                raise SystemExit(f"run_megatron_unit_tests: world size {n} is in two files")
            results[int(n)] = r
    if len({m["megatron_commit"] for m in metas}) > 1:
        raise SystemExit(f"run_megatron_unit_tests: the files differ in megatron_commit: "
                         f"{sorted({m['megatron_commit'] for m in metas})}")  # fmt: skip
    meta = dict(metas[0], command=" ; ".join(m["command"] for m in metas))
    if len({m["gigatron_commit"] for m in metas}) > 1:  # e.g. 4, 8 ranks run on a larger machine
        meta["gigatron_commit"] = "; ".join(
            f"{m['gigatron_commit'][:10]} (world size {', '.join(map(str, ns))})"
            for m, ns in zip(metas, sizes)
        )
    rules_at = _commit(Path(__file__).resolve().parent.parent)
    if rules_at != meta["gigatron_commit"]:
        meta["note"] = (
            f"Outcomes are those of the run at gigatron `{meta['gigatron_commit']}`; skip reasons "
            f"and failures are classified by the rules at gigatron `{rules_at}` (`--render`)."
        )
    Path(report).write_text(mtr.render(meta, results))
    print(f"report: {report}")
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
    """Run `files` in sessions until each has run or is recorded as stopped. A file that hangs
    or kills a rank while it runs or while it is imported is stopped alone: the next session
    runs the files after it (after a hang at import, every file but it)."""
    remaining = list(files)
    while remaining:
        tag = f"n{n}-{next(_TAGS)}"  # names this launch's log, events and shared folder
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
            watch = _Watch(timeout, START_S)
            seen = 0
            while proc.poll() is None:
                time.sleep(0.5)
                events = mtr.load_events(events_path)
                for e in events[seen:]:
                    watch.see(e)
                seen = len(events)
                if watch.expired():
                    _kill(proc)
        events = mtr.load_events(events_path)
        for e in events:
            if e["kind"] == "test":
                res["tests"][e["nodeid"]] = {"outcome": e["outcome"], "message": e["message"]}
            elif e["kind"] == "import_error":
                res["import_errors"][e["file"]] = e["message"]
        if any(e["kind"] == "session_end" for e in events):
            return
        stop = watch.stop
        if stop is None:
            tail = (work / f"{tag}.log").read_bytes()[-300:].decode(errors="replace").strip()
            last = tail.splitlines()[-1] if tail else ""
            stop = f"a rank died (exit {proc.returncode}): {mtr.first_line(last)}"
        if watch.running is not None:
            res["stopped"][watch.running] = stop
            remaining = remaining[remaining.index(watch.running) + 1 :]
        elif watch.importing in remaining:  # no test ran yet: every other file runs next time
            res["stopped"][watch.importing] = stop
            remaining.remove(watch.importing)
        else:  # the ranks never reached pytest
            for f in remaining:
                res["stopped"][f] = stop
            return


class _Watch:
    """Rank 0's progress from its events, and when to give up: `timeout` seconds for a file
    to import or to run, START_S for the ranks to reach pytest, AFTER_END_S for the ranks to
    leave once rank 0's session ended. `stop` says why it gave up."""

    def __init__(self, timeout: float, start_s: float) -> None:
        self.timeout, self.start_s = timeout, start_s
        self.started = self.ended = False
        self.importing = self.running = self.stop = None
        self.since = time.monotonic()

    def see(self, event: dict) -> None:
        kind, now = event["kind"], time.monotonic()
        if kind == "worker_start":
            self.started, self.since = True, now
        elif kind == "collect_start":
            self.started, self.importing, self.since = True, event["file"], now
        elif kind == "file_start":
            self.started, self.running, self.since = True, event["file"], now
        elif kind == "session_end":
            self.ended, self.since = True, now

    def expired(self) -> bool:
        waited = time.monotonic() - self.since
        if self.ended:
            return waited > AFTER_END_S
        if waited <= (self.timeout if self.started else self.start_s):
            return False
        if self.running is not None:
            self.stop = f"timeout ({self.timeout:g} s)"
        elif self.importing is not None:
            self.stop = f"timeout while collecting ({self.timeout:g} s importing it)"
        elif self.started:
            self.stop = f"timeout while collecting ({self.timeout:g} s)"
        else:
            self.stop = f"the ranks did not reach pytest in {self.start_s:g} s"
        return True


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
