"""Blending indices: gigatron (NumPy) against megatron-core's compiled helper, CPU seconds.

    python bench/data/bench_blend.py [--datasets 2,3,10,100] [--sizes 1000000,100000000]
        [--repeats 5] [--megatron-path DIR]

For each number of datasets D (weights `rng.random(D) + 0.05`, normalised, seed 0) and size:
`build_blending_indices` of gigatron and of megatron-core (`helpers_cpp`) run one after the
other in this process, `--repeats` times, best CPU time of each (user + sys of this process: the
host is shared, wall time mostly measures the other tenants); then both outputs
(`dataset_index`, `dataset_sample_index`) are compared element for element. Then the exhaustive
builder, dataset sizes uniform in [0.5, 1.5) * size / D (seed 1) but the first of 3 samples.
Between them, "blend-tiny": weights `rng.random(D) ** 3 + 1e-4` (seed 0) at the first size only.
Prints a table and one `RESULT {json}` line. Needs megatron-core with its compiled helper,
installed or in `--megatron-path` (a directory holding the `megatron` package, put first on
`sys.path` here only: gigatron itself never imports megatron).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import warnings

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gigatron.core.datasets import helpers  # noqa: E402


def _cpu(fn, *args) -> float:
    t0 = time.process_time()
    fn(*args)
    return time.process_time() - t0


def _case(mcore, build, arg, num: int, size: int, repeats: int, extra: tuple) -> dict:
    got = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
    want = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(_cpu(getattr(helpers, build), *got, arg, num, *extra))
        theirs.append(_cpu(getattr(mcore, build), *want, arg, num, *extra))
    same = bool(numpy.array_equal(got[0], want[0]) and numpy.array_equal(got[1], want[1]))
    g, m = min(ours), min(theirs)
    return {"gigatron_s": g, "megatron_cpp_s": m, "ratio": g / m, "identical": same}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", default="2,3,10,100")
    parser.add_argument("--sizes", default="1000000,100000000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--megatron-path", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.megatron_path:
        sys.path.insert(0, args.megatron_path)
    from megatron.core.datasets import helpers_cpp as mcore

    rows = []
    for size in (int(x) for x in args.sizes.split(",")):
        repeats = args.repeats if size <= 10_000_000 else max(1, args.repeats // 2)
        for num in (int(x) for x in args.datasets.split(",")):
            w = numpy.random.default_rng(0).random(num) + 0.05
            w /= w.sum()
            r = _case(mcore, "build_blending_indices", w, num, size, repeats, (size, False))
            rows.append({"builder": "blend", "datasets": num, "size": size, **r})
            print(_line(rows[-1]), flush=True)
    size = int(args.sizes.split(",")[0])
    for num in (int(x) for x in args.datasets.split(",")):  # tiny weights, short run
        w = numpy.random.default_rng(0).random(num) ** 3 + 1e-4
        w /= w.sum()
        r = _case(mcore, "build_blending_indices", w, num, size, args.repeats, (size, False))
        rows.append({"builder": "blend-tiny", "datasets": num, "size": size, **r})
        print(_line(rows[-1]), flush=True)
    for size in (int(x) for x in args.sizes.split(",")):
        repeats = args.repeats if size <= 10_000_000 else max(1, args.repeats // 2)
        for num in (int(x) for x in args.datasets.split(",")):
            # dataset sizes uniform in [0.5, 1.5) * size / D, one of 3 samples (spent early)
            rng = numpy.random.default_rng(1)
            counts = (rng.random(num) + 0.5) * (size / num)
            counts[0] = 3
            counts = counts.astype(numpy.int64)
            total = int(counts.sum())
            r = _case(mcore, "build_exhaustive_blending_indices", counts, num, total, repeats, ())
            rows.append({"builder": "exhaustive", "datasets": num, "size": total, **r})
            print(_line(rows[-1]), flush=True)
    result = {
        "bench": "blend",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "numpy": numpy.__version__,
        "commit": _commit(),
        "rows": rows,
    }
    print("RESULT " + json.dumps(result))
    return 0 if all(r["identical"] for r in rows) else 1


def _commit() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True
        )
        return out.stdout.decode().strip() or "unknown"
    except OSError:
        return "unknown"


def _line(r: dict) -> str:
    return (
        f"{r['builder']:10s} D={r['datasets']:3d} n={r['size']:>11,d}  "
        f"gigatron {r['gigatron_s']:8.4f} s  megatron C++ {r['megatron_cpp_s']:8.4f} s  "
        f"{r['ratio']:5.2f}x  identical: {'yes' if r['identical'] else 'NO'}"
    )


if __name__ == "__main__":
    sys.exit(main())
