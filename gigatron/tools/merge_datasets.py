"""`gigatron merge`: concatenate several `.bin/.idx` datasets into one (Megatron's
`tools/merge_datasets.py`). Inputs are prefixes or directories (every prefix inside, sorted by
name, as Megatron does); all must share a token dtype.

    gigatron merge --input data/shards/ --output-prefix data/merged
"""

from __future__ import annotations

import argparse
import os
import sys

from gigatron.core.datasets.indexed_dataset import (
    IndexedDataset,
    IndexedDatasetBuilder,
    get_bin_path,
    get_idx_path,
)


def _prefixes_in(directory: str) -> list[str]:
    prefixes = set()
    for name in os.listdir(directory):
        stem, ext = os.path.splitext(name)
        if ext not in (".bin", ".idx") or not os.path.isfile(os.path.join(directory, name)):
            continue
        pair = os.path.join(directory, stem + (".bin" if ext == ".idx" else ".idx"))
        if not os.path.isfile(pair):
            raise FileNotFoundError(f"{os.path.join(directory, name)} has no matching {pair}")
        prefixes.add(os.path.join(directory, stem))
    if not prefixes:
        raise FileNotFoundError(f"{directory} holds no .bin/.idx datasets")
    return sorted(prefixes)


def merge_datasets(inputs: list[str], output_prefix: str, multimodal: bool = False) -> int:
    """Merge `inputs` (prefixes or directories) into `output_prefix`; return sequences written."""
    prefixes: list[str] = []
    for item in inputs:
        prefixes.extend(_prefixes_in(item) if os.path.isdir(item) else [item])
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
    builder = None
    for prefix in prefixes:
        dataset = IndexedDataset(prefix, multimodal=multimodal)  # validates both files
        if builder is None:
            dtype = dataset.index.dtype
            builder = IndexedDatasetBuilder(get_bin_path(output_prefix), dtype, multimodal)
        del dataset
        builder.add_index(prefix)
    builder.finalize(get_idx_path(output_prefix))
    return len(builder.sequence_lengths)


def main(argv: list[str] | None = None) -> int:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())  # a whole sentence or two
    parser = argparse.ArgumentParser(prog="gigatron merge", description=first_paragraph)
    parser.add_argument("--input", nargs="+", required=True, help="prefixes or directories")
    parser.add_argument(
        "--output-prefix", required=True, help="writes <output-prefix>.bin and .idx"
    )
    parser.add_argument("--multimodal", action="store_true", help="inputs carry sequence modes")
    args = parser.parse_args(argv)
    n = merge_datasets(args.input, args.output_prefix, args.multimodal)
    print(f"wrote {args.output_prefix}.bin / .idx ({n} sequences)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
