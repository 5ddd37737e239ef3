"""`gigatron preprocess`: tokenize JSON lines (or plain text) into Megatron `.bin` / `.idx` files.

Mirrors Megatron-LM's `tools/preprocess_data.py`: same flags, same output names
(`{output_prefix}_{key}_{document|sentence}.bin/.idx`), same bytes (one document per input
line, one sequence per sentence, `--append-eod` adds the EOD id to the last sequence, token dtype
from the vocabulary size). Differences: input is streamed in bounded batches (memory does not grow
with the file), plain `.txt` input is accepted (one document per non-empty line), and a token id
at or above the vocabulary size is an error naming the document and position.

    gigatron preprocess --input corpus.jsonl --output-prefix data/corpus \\
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \\
        --append-eod --workers 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy

from gigatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

_BATCH_LINES = 64  # documents per task sent to a worker

_state: dict[str, Any] = {}


def _init_worker(args: argparse.Namespace) -> None:
    from gigatron.training.tokenizer import build_tokenizer

    _state["tokenizer"] = build_tokenizer(_quiet(args))
    _state["splitter"] = _sentence_splitter(args) if args.split_sentences else None
    _state["args"] = args


def _quiet(args: argparse.Namespace) -> argparse.Namespace:
    quiet = argparse.Namespace(**vars(args))
    quiet.rank = 1  # suppress the padded-vocab message in every worker
    return quiet


def _sentence_splitter(args: argparse.Namespace) -> Any:
    try:
        import nltk
    except ImportError:
        raise ValueError(
            "--split-sentences needs nltk: pip install nltk (or pip install 'gigatron[data]'), "
            "then fetch its sentence data with python -m nltk.downloader punkt_tab"
        ) from None
    # punkt_tab (plain-text parameters), never the pickled `punkt` models: NLTK >= 3.8.2 reads
    # them with PunktTokenizer; older releases only had the pickles (which can run code).
    punkt = getattr(getattr(nltk, "tokenize", None), "PunktTokenizer", None)
    if punkt is None:
        raise ValueError(
            f"--split-sentences needs nltk >= 3.8.2 (found {getattr(nltk, '__version__', '?')}): "
            "older releases load sentence splitters from pickles, which gigatron refuses"
        )
    try:
        return punkt(args.lang)
    except LookupError:
        raise ValueError(
            f"--split-sentences needs nltk's punkt_tab data for {args.lang!r}; install it with "
            "python -m nltk.downloader punkt_tab (gigatron downloads nothing)"
        ) from None


def _encode_batch(batch: list[tuple[int, str]]) -> list[tuple[int, dict, dict, int]]:
    """[(doc number, raw line)] -> [(doc number, ids per key, sentence lengths per key, bytes)]."""
    tokenizer, splitter, args = _state["tokenizer"], _state["splitter"], _state["args"]
    out = []
    for doc_no, line in batch:
        where = f"{args.input}: line {doc_no + 1}"
        if args.input_format == "text":
            record = {key: line.rstrip("\n") for key in args.json_keys}
        else:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where} is not JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{where} is a JSON {_json_type(record)}; each line must be an object with "
                    f"the key(s) {args.json_keys}"
                )
        ids, lens = {}, {}
        for key in args.json_keys:
            if key not in record:
                raise ValueError(f"{where} has no key {key!r}")
            text = record[key]
            _check_text(text, where, key)
            sentences = text if isinstance(text, list) else [text]
            if splitter is not None and not isinstance(text, list):
                sentences = splitter.tokenize(text)
            doc_ids: list[int] = []
            sentence_lens: list[int] = []
            for sentence in sentences:
                sentence_ids = tokenizer.tokenize(sentence)
                if len(sentence_ids) > 0:
                    doc_ids.extend(sentence_ids)
                    sentence_lens.append(len(sentence_ids))
            if doc_ids and args.append_eod:
                doc_ids.append(tokenizer.eod)
                sentence_lens[-1] += 1
            # Check and convert here, in the worker: the parent only writes bytes.
            arr = _checked_array(doc_ids, tokenizer.vocab_size, where, key)
            ids[key], lens[key] = arr, sentence_lens
        out.append((doc_no, ids, lens, len(line.encode("utf-8"))))
    return out


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _check_text(text: Any, where: str, key: str) -> None:
    """A value to tokenize is a string or a list of strings, each valid Unicode (JSON's \\ud800
    escapes can spell a lone surrogate, which no tokenizer can encode)."""
    for item in text if isinstance(text, list) else [text]:
        if not isinstance(item, str):
            raise ValueError(
                f"{where}: key {key!r} holds {type(item).__name__} {str(item)[:40]!r}; its value "
                "must be a string (or a list of strings)"
            )
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"{where}: key {key!r} holds a lone surrogate {item[err.start]!r} at character "
                f"{err.start}; text must be valid Unicode"
            ) from None


def _batches(path: str, begin: int, end: int | None) -> Iterator[list[tuple[int, str]]]:
    """Lines [begin, end) of `path` (numbered from 0), skipping blank lines, in batches.
    A line that is not UTF-8 is an error naming the file, the line and the byte."""
    batch: list[tuple[int, str]] = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f):
            if line_no < begin:
                continue
            if end is not None and line_no >= end:
                break
            try:
                line = raw.decode("utf-8-sig" if line_no == 0 else "utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}: line {line_no + 1} is not valid UTF-8 (byte 0x{raw[err.start]:02x} "
                    f"at byte {err.start} of the line: {err.reason})"
                ) from None
            if not line.strip():
                continue
            batch.append((line_no, line))
            if len(batch) == _BATCH_LINES:
                yield batch
                batch = []
    if batch:
        yield batch


def _output_prefix(args: argparse.Namespace, key: str) -> str:
    level = "sentence" if args.split_sentences else "document"
    return f"{args.output_prefix}_{key}_{level}"


def _checked_array(doc_ids: list[int], vocab_size: int, where: str, key: str) -> numpy.ndarray:
    """`[len]` token ids in the output dtype; an id outside [0, vocab_size) is an error."""
    arr = numpy.asarray(doc_ids, dtype=numpy.int64)
    bad = numpy.flatnonzero((arr >= vocab_size) | (arr < 0))
    if bad.size:
        pos = int(bad[0])
        raise ValueError(
            f"{where} (key {key!r}) has token id {int(arr[pos])} at position "
            f"{pos}, outside the tokenizer's vocabulary [0, {vocab_size})"
        )
    return arr.astype(DType.optimal_dtype(vocab_size))


def _process_range(args: argparse.Namespace, begin: int, end: int | None, suffix: str) -> dict:
    """Tokenize lines [begin, end) into `{prefix}{suffix}` files; return counters."""
    from gigatron.training.tokenizer import build_tokenizer

    vocab_size = build_tokenizer(_quiet(args)).vocab_size
    dtype = DType.optimal_dtype(vocab_size)
    builders = {
        key: IndexedDatasetBuilder(_output_prefix(args, key) + suffix + ".bin", dtype=dtype)
        for key in args.json_keys
    }
    stats = {"docs": 0, "tokens": 0, "bytes": 0}
    start = time.perf_counter()
    num_workers = max(1, args.workers)
    ctx = multiprocessing.get_context("spawn" if sys.platform == "darwin" else "fork")
    with ctx.Pool(num_workers, initializer=_init_worker, initargs=(args,)) as pool:
        pending: deque = deque()
        source = _batches(args.input, begin, end)
        exhausted = False
        while pending or not exhausted:
            # Keep at most 2 batches per worker in flight: memory stays bounded.
            while not exhausted and len(pending) < 2 * num_workers:
                batch = next(source, None)
                if batch is None:
                    exhausted = True
                else:
                    pending.append(pool.apply_async(_encode_batch, (batch,)))
            if not pending:
                break
            for _doc_no, ids, lens, num_bytes in pending.popleft().get():
                for key in args.json_keys:
                    builders[key].add_document(ids[key], lens[key])
                    stats["tokens"] += len(ids[key])
                stats["docs"] += 1
                stats["bytes"] += num_bytes
                if args.log_interval and stats["docs"] % args.log_interval == 0:
                    _log_progress(stats, time.perf_counter() - start)
    for key in args.json_keys:
        builders[key].finalize(_output_prefix(args, key) + suffix + ".idx")
    stats["seconds"] = time.perf_counter() - start
    return stats


def _log_progress(stats: dict, elapsed: float) -> None:
    elapsed = max(elapsed, 1e-9)
    print(
        f"Processed {stats['docs']} documents ({stats['docs'] / elapsed:.1f} docs/s, "
        f"{stats['tokens'] / elapsed:.0f} tokens/s, {stats['bytes'] / elapsed / 2**20:.2f} MB/s)",
        file=sys.stderr,
        flush=True,
    )


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _run_partition(args: argparse.Namespace, begin: int, end: int, index: int) -> dict:
    return _process_range(args, begin, end, f"_part{index}")


def preprocess(args: argparse.Namespace) -> dict:
    """Tokenize `args.input` into `.bin/.idx` files per json key; return throughput counters."""
    if not os.path.isfile(args.input):
        raise FileNotFoundError(f"--input {args.input} does not exist")
    # `--output-prefix data/corpus` in a fresh directory: create `data/` (Megatron does not).
    os.makedirs(os.path.dirname(os.path.abspath(args.output_prefix)), exist_ok=True)
    if args.partitions <= 1:
        return _process_range(args, 0, None, "")
    # Contiguous line ranges, tokenized in parallel processes, merged in order (same bytes as
    # one partition).
    num_lines = _count_lines(args.input) + 1
    bounds = [num_lines * p // args.partitions for p in range(args.partitions + 1)]
    part_args = argparse.Namespace(**vars(args))
    part_args.workers = max(1, args.workers // args.partitions)
    # ProcessPoolExecutor workers are not daemonic, so each partition can run its own Pool.
    ctx = multiprocessing.get_context("spawn" if sys.platform == "darwin" else "fork")
    with ProcessPoolExecutor(args.partitions, mp_context=ctx) as executor:
        jobs = [
            executor.submit(_run_partition, part_args, bounds[p], bounds[p + 1], p)
            for p in range(args.partitions)
        ]
        parts = [job.result() for job in jobs]
    for key in args.json_keys:
        prefix = _output_prefix(args, key)
        builder = None
        for p in range(args.partitions):
            part = f"{prefix}_part{p}"
            if builder is None:
                dtype = _dtype_of(part)
                builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
            builder.add_index(part)
        builder.finalize(prefix + ".idx")
        for p in range(args.partitions):
            for ext in (".bin", ".idx"):
                os.remove(f"{prefix}_part{p}{ext}")
    stats = {k: sum(part[k] for part in parts) for k in ("docs", "tokens", "bytes")}
    stats["seconds"] = max(part["seconds"] for part in parts)
    return stats


def _dtype_of(prefix: str) -> type:
    with open(prefix + ".idx", "rb") as f:
        header = f.read(18)
    return DType.dtype_from_code(header[17])


def get_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gigatron preprocess", description=__doc__.split("\n")[0])
    g = p.add_argument_group("input data")
    g.add_argument("--input", required=True, help="JSON lines (.json/.jsonl) or text (.txt)")
    g.add_argument("--json-keys", nargs="+", default=["text"])
    g.add_argument("--split-sentences", action="store_true", help="needs nltk + punkt data")
    g.add_argument("--keep-newlines", action="store_true")
    g.add_argument("--input-format", choices=["auto", "jsonl", "text"], default="auto")
    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-type", required=True)
    g.add_argument("--vocab-file", default=None)
    g.add_argument("--merge-file", default=None)
    g.add_argument("--tokenizer-model", default=None)
    g.add_argument("--vocab-size", type=int, default=None)
    g.add_argument("--vocab-extra-ids", type=int, default=0)
    g.add_argument("--append-eod", action="store_true")
    g.add_argument("--lang", default="english")
    g = p.add_argument_group("output data")
    g.add_argument("--output-prefix", required=True)
    g = p.add_argument_group("runtime")
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--partitions", type=int, default=1)
    g.add_argument("--log-interval", type=int, default=1000)
    args = p.parse_args(argv)
    if args.input_format == "auto":
        args.input_format = "text" if args.input.endswith(".txt") else "jsonl"
    if args.workers < 1 or args.partitions < 1:
        p.error(f"--workers ({args.workers}) and --partitions ({args.partitions}) must be >= 1")
    args.make_vocab_size_divisible_by = 128
    args.tensor_model_parallel_size = 1
    args.rank = 0
    return args


def main(argv: list[str] | None = None) -> int:
    args = get_args(argv)
    if args.split_sentences:
        _sentence_splitter(args)  # fail before starting workers when nltk is missing
    stats = preprocess(args)
    _log_progress(stats, stats["seconds"])
    for key in args.json_keys:
        print(f"wrote {_output_prefix(args, key)}.bin / .idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
