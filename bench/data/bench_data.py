"""Data-pipeline benchmark: index building (gigatron NumPy vs megatron-core C++) and preprocessing.

    python bench/data/bench_data.py [--workdir /tmp/gigatron_bench_data] [--repeats 5]

Prints one JSON object. Parts:
Times are CPU seconds of the benchmarking process (user + sys, best of `--repeats`, the two
implementations interleaved): the host is shared and wall time mostly measures other tenants.
  * sample_index: `build_sample_idx` alone on the synthetic 1M-document / ~1B-token corpus of
    bench/anchors (document lengths uniform in [200, 1800), seed 0), one shuffled epoch,
    seq_len 2048; best of `--repeats`; gigatron vs megatron-core's compiled helper.
  * gpt_index_build: the whole GPTDataset index build (document shuffle, sample index, shuffle
    index, .npy cache writes) through BlendedMegatronDatasetBuilder for 1M samples of 2048
    tokens (3 epochs), as in bench/anchors/data/megatron_index_build.py; gigatron vs
    megatron-core in the same run, and whether the two produced identical indices.
  * blending_indices_2 / _3 / _10 / _100: `build_blending_indices` for 1M samples from 2, 3,
    10 and 100 datasets (NumPy lanes), vs the C++ (bench/data/bench_blend.py has the full table).
  * preprocess: `gigatron preprocess` documents/s and tokens/s with 1 and 2 workers on a
    synthetic JSON-lines corpus with a byte-level BPE trained by `gigatron train-tokenizer`.
megatron-core parts are skipped (null) when it is not importable. Runs on CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time

import numpy

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gigatron.core.datasets import helpers  # noqa: E402
from gigatron.core.datasets.indexed_dataset import write_index  # noqa: E402

NUM_DOCS = 1_000_000
SEQ_LEN = 2048


def _mcore():
    try:
        from megatron.core.datasets import helpers as mcore_helpers

        return mcore_helpers
    except Exception:
        return None


def make_corpus(directory: str) -> tuple[str, numpy.ndarray]:
    """The anchors' synthetic corpus: sparse uint16 .bin, one sequence per document."""
    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "big")
    lengths = numpy.random.default_rng(0).integers(200, 1800, size=NUM_DOCS).astype(numpy.int32)
    if not os.path.exists(prefix + ".idx"):
        with open(prefix + ".bin", "wb") as f:
            f.truncate(int(lengths.sum()) * 2)
        write_index(prefix + ".idx", numpy.uint16, lengths, numpy.arange(NUM_DOCS + 1))
    return prefix, lengths


def _clock() -> float:
    # CPU time of this process (user + sys): the host is shared, and wall time mostly measures
    # the other tenants. Every timed function here is single-threaded.
    return time.process_time()


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = _clock()
        fn()
        times.append(_clock() - t0)
    return min(times)


def _best_pair(fn_a, fn_b, repeats: int) -> tuple[float, float]:
    """Interleave the two so both see the same host conditions; best of each."""
    a, b = [], []
    for _ in range(repeats):
        for fn, out in ((fn_a, a), (fn_b, b)):
            t0 = _clock()
            fn()
            out.append(_clock() - t0)
    return min(a), min(b)


def bench_sample_index(lengths: numpy.ndarray, repeats: int) -> dict:
    doc_idx = numpy.arange(NUM_DOCS, dtype=numpy.int32)
    numpy.random.RandomState(1234).shuffle(doc_idx)
    tokens = int(lengths.sum())
    args = (lengths, doc_idx, SEQ_LEN, 1, tokens, True, True)
    out = {"tokens": tokens, "documents": NUM_DOCS, "seq_len": SEQ_LEN}
    mcore = _mcore()
    if mcore is None:
        out["gigatron_s"] = _best(lambda: helpers.build_sample_idx(*args), repeats)
    else:
        out["gigatron_s"], out["megatron_cpp_s"] = _best_pair(
            lambda: helpers.build_sample_idx(*args), lambda: mcore.build_sample_idx(*args), repeats
        )
        out["ratio_gigatron_over_megatron"] = out["gigatron_s"] / out["megatron_cpp_s"]
        out["identical"] = bool(
            numpy.array_equal(helpers.build_sample_idx(*args), mcore.build_sample_idx(*args))
        )
    return out


def _build_gpt(impl: str, prefix: str, cache: str) -> tuple[float, object]:
    if impl == "gigatron":
        from gigatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    else:
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from gigatron.training.tokenizer import _NullTokenizer

    shutil.rmtree(cache, ignore_errors=True)
    cfg = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQ_LEN,
        blend=([prefix], None),
        split="100,0,0",
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        tokenizer=_NullTokenizer(50000),
        path_to_cache=cache,
    )
    t0 = _clock()
    sizes = [1_000_000, None, None]
    ds = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()[0]
    return _clock() - t0, ds


def bench_gpt_build(prefix: str, workdir: str, repeats: int) -> dict:
    """Alternate the two builders (cache wiped each time) and keep each one's best time."""
    has_mcore = _mcore() is not None
    t_g = t_m = float("inf")
    for _ in range(repeats):
        t, ds_g = _build_gpt("gigatron", prefix, os.path.join(workdir, "cache_g"))
        t_g = min(t_g, t)
        if has_mcore:
            t, ds_m = _build_gpt("megatron", prefix, os.path.join(workdir, "cache_m"))
            t_m = min(t_m, t)
    out = {"samples": len(ds_g), "repeats": repeats, "gigatron_s": t_g}
    if has_mcore:
        out["megatron_s"] = t_m
        out["ratio_gigatron_over_megatron"] = t_g / t_m
        out["identical"] = all(
            numpy.array_equal(getattr(ds_g, a), getattr(ds_m, a))
            for a in ("document_index", "sample_index", "shuffle_index")
        )
        out["same_cache_files"] = sorted(os.listdir(os.path.join(workdir, "cache_g"))) == sorted(
            os.listdir(os.path.join(workdir, "cache_m"))
        )
    return out


def bench_blending(size: int, weights: list[float], repeats: int) -> dict:
    weights = numpy.array(weights) / sum(weights)
    k = len(weights)
    out = {"size": size, "datasets": k}

    def run(module):
        a, b = numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64)
        module.build_blending_indices(a, b, weights, k, size, False)
        return a, b

    mcore = _mcore()
    if mcore is None:
        out["gigatron_s"] = _best(lambda: run(helpers), repeats)
    else:
        out["gigatron_s"], out["megatron_cpp_s"] = _best_pair(
            lambda: run(helpers), lambda: run(mcore), repeats
        )
        out["ratio_gigatron_over_megatron"] = out["gigatron_s"] / out["megatron_cpp_s"]
        out["identical"] = all(numpy.array_equal(x, y) for x, y in zip(run(helpers), run(mcore)))
    return out


def _weights(num: int) -> list[float]:
    return list(numpy.random.default_rng(0).random(num) + 0.05)  # as bench/data/bench_blend.py


def bench_preprocess(workdir: str, num_docs: int) -> dict:
    from gigatron.tools.train_tokenizer import train_bpe_tokenizer

    rng = numpy.random.default_rng(0)
    words = [
        "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(2, 9)))
        for _ in range(3000)
    ]
    docs = [" ".join(rng.choice(words, size=rng.integers(50, 400))) + "." for _ in range(num_docs)]
    path = os.path.join(workdir, "pre.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    tok_dir = os.path.join(workdir, "tok")
    train_bpe_tokenizer(docs[:2000], vocab_size=8000, output_dir=tok_dir)
    out = {"documents": num_docs, "bytes": os.path.getsize(path), "tokenizer": "GPT2BPE 8000"}
    for workers in (1, 2):
        # A fresh interpreter per run, as a user runs it (the tokenizer training above used
        # Rust threads in this process, which forked workers should not inherit).
        cmd = [sys.executable, "-m", "gigatron.cli", "preprocess", "--input", path]
        cmd += ["--output-prefix", os.path.join(workdir, f"pre{workers}"), "--append-eod"]
        cmd += ["--tokenizer-type", "GPT2BPETokenizer", "--log-interval", "0"]
        cmd += ["--vocab-file", os.path.join(tok_dir, "vocab.json")]
        cmd += ["--merge-file", os.path.join(tok_dir, "merges.txt"), "--workers", str(workers)]
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        # Last progress line: "Processed N documents (D docs/s, T tokens/s, M MB/s)".
        line = [x for x in proc.stderr.splitlines() if x.startswith("Processed")][-1]
        nums = re.findall(r"([0-9.]+) (docs/s|tokens/s|MB/s)", line)
        rates = {unit: float(value) for value, unit in nums}
        out[f"workers_{workers}"] = {
            "docs_per_s": rates["docs/s"],
            "tokens_per_s": rates["tokens/s"],
            "tokens_per_s_per_worker": rates["tokens/s"] / workers,
            "mb_per_s": rates["MB/s"],
            # Wall-clock rates above depend on the host's load; CPU time (parent + workers,
            # including interpreter start-up) does not.
            "cpu_s_all_processes": cpu_s,
            "tokens_per_cpu_s": rates["tokens/s"] * (num_docs / rates["docs/s"]) / cpu_s,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/tmp/gigatron_bench_data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blend-size", type=int, default=1_000_000)
    parser.add_argument("--preprocess-docs", type=int, default=5000)
    args = parser.parse_args()
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29577")
    if _mcore() is not None:
        # megatron-core's BlendedDataset / GPTDataset cache logic asks torch.distributed for ranks.
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    prefix, lengths = make_corpus(os.path.join(args.workdir, "corpus"))
    mcore_version = None
    try:
        from importlib.metadata import version

        mcore_version = version("megatron-core")
    except Exception:
        pass
    result = {
        "bench": "data",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "load_avg_1m": os.getloadavg()[0],
        },
        "versions": {
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "torch": torch.__version__,
            "megatron_core": mcore_version,
        },
        "sample_index": bench_sample_index(lengths, args.repeats),
        "gpt_index_build": bench_gpt_build(prefix, args.workdir, args.repeats),
        "blending_indices_2": bench_blending(args.blend_size, [0.3, 0.7], args.repeats),
        "blending_indices_3": bench_blending(args.blend_size, [0.5, 0.3, 0.2], args.repeats),
        "blending_indices_10": bench_blending(args.blend_size, _weights(10), args.repeats),
        "blending_indices_100": bench_blending(args.blend_size, _weights(100), args.repeats),
        "preprocess": bench_preprocess(args.workdir, args.preprocess_docs),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
