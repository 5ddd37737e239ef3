"""A tiny embedded English corpus for demos (`make train`), tokenized on first use.

`tiny_stories.txt` (~300 KB, one short story per line) was composed by `_compose_corpus.py`
from a small seeded grammar: original text, no download. `prepare_demo_corpus()` trains a
GPT-2 style byte-level BPE on it (needs the `tokenizers` package, the `data` extra) and writes
Megatron `.bin/.idx` files once; later calls reuse them.

    from gigatron.data import prepare_demo_corpus
    demo = prepare_demo_corpus()          # ~/.cache/gigatron/demo by default
    demo.data_prefix, demo.vocab_file, demo.merge_file
    demo.megatron_args()                  # ["--data-path", ..., "--tokenizer-type", ...]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy

CORPUS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_stories.txt")
_FORMAT_VERSION = 1  # bump to rebuild caches written by older code


@dataclass(frozen=True)
class DemoCorpus:
    """Paths of the tokenized demo corpus and its tokenizer files."""

    data_prefix: str
    vocab_file: str
    merge_file: str
    tokenizer_dir: str
    vocab_size: int
    num_documents: int
    num_tokens: int
    tokenizer_type: str = "GPT2BPETokenizer"

    def megatron_args(self) -> list[str]:
        """Megatron-style flags for pretrain_gpt (`--data-path` ... `--merge-file`)."""
        return [
            "--data-path",
            self.data_prefix,
            "--tokenizer-type",
            self.tokenizer_type,
            "--vocab-file",
            self.vocab_file,
            "--merge-file",
            self.merge_file,
        ]


def demo_corpus_path() -> str:
    """Path of the raw text (one story per line)."""
    return CORPUS_FILE


def _default_dir() -> str:
    root = os.environ.get("GIGATRON_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "gigatron"
    )
    return os.path.join(root, "demo")


def prepare_demo_corpus(output_dir: str | None = None, vocab_size: int = 1024) -> DemoCorpus:
    """Tokenize the demo corpus into `output_dir` (once) and describe the result.

    Every story becomes one document ending in `<|endoftext|>`; tokens are uint16. Call it on one
    rank (then barrier) or on all ranks: files are written under temporary names and renamed.
    """
    from gigatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder
    from gigatron.tools.train_tokenizer import train_bpe_tokenizer
    from gigatron.training.tokenizer import _GPT2BPETokenizer

    output_dir = output_dir or _default_dir()
    tok_dir = os.path.join(output_dir, f"tokenizer_{vocab_size}")
    prefix = os.path.join(output_dir, f"tiny_stories_{vocab_size}_text_document")
    stamp = os.path.join(output_dir, f"tiny_stories_{vocab_size}.json")
    vocab_file, merge_file = (os.path.join(tok_dir, n) for n in ("vocab.json", "merges.txt"))

    if not _stamp_ok(stamp, prefix):
        with open(CORPUS_FILE, encoding="utf-8") as f:
            stories = [line.rstrip("\n") for line in f if line.strip()]
        if not os.path.isfile(merge_file):
            tmp_dir = f"{tok_dir}.tmp{os.getpid()}"
            train_bpe_tokenizer(stories, vocab_size, tmp_dir, min_frequency=2)
            os.makedirs(os.path.dirname(tok_dir), exist_ok=True)
            if not os.path.isdir(tok_dir):
                os.replace(tmp_dir, tok_dir)
        tokenizer = _GPT2BPETokenizer(vocab_file, merge_file)
        dtype = DType.optimal_dtype(tokenizer.vocab_size)
        tmp = f"{prefix}.tmp{os.getpid()}"
        builder = IndexedDatasetBuilder(tmp + ".bin", dtype=dtype)
        num_tokens = 0
        for story in stories:
            ids = tokenizer.tokenize(story) + [tokenizer.eod]
            builder.add_document(numpy.asarray(ids, dtype=dtype), [len(ids)])
            num_tokens += len(ids)
        builder.finalize(tmp + ".idx")
        os.replace(tmp + ".bin", prefix + ".bin")
        os.replace(tmp + ".idx", prefix + ".idx")
        info = {
            "version": _FORMAT_VERSION,
            "vocab_size": tokenizer.vocab_size,
            "num_documents": len(stories),
            "num_tokens": num_tokens,
            "corpus_bytes": os.path.getsize(CORPUS_FILE),
        }
        with open(f"{stamp}.tmp{os.getpid()}", "w") as f:
            json.dump(info, f)
        os.replace(f"{stamp}.tmp{os.getpid()}", stamp)
    with open(stamp) as f:
        info = json.load(f)
    IndexedDataset(prefix)  # validate the files
    return DemoCorpus(
        data_prefix=prefix,
        vocab_file=vocab_file,
        merge_file=merge_file,
        tokenizer_dir=tok_dir,
        vocab_size=info["vocab_size"],
        num_documents=info["num_documents"],
        num_tokens=info["num_tokens"],
    )


def _stamp_ok(stamp: str, prefix: str) -> bool:
    if not (os.path.isfile(stamp) and os.path.isfile(prefix + ".bin")):
        return False
    with open(stamp) as f:
        info = json.load(f)
    return (
        info.get("version") == _FORMAT_VERSION
        and info.get("corpus_bytes") == os.path.getsize(CORPUS_FILE)
        and os.path.isfile(prefix + ".idx")
    )
