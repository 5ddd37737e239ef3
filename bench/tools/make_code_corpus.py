"""Write a JSON-lines corpus of real Python source from this machine's installed packages.

The FP8 convergence run (`bash bench/run.sh fp8-convergence`) needs a real corpus, and the GPU
machine reaches no data hub: this gathers the standard library and site-packages sources on the
CPU machine, in a fixed order, up to a byte budget, for `gigatron train-tokenizer` and
`gigatron preprocess`; the .bin/.idx travel to the GPU machine (carried, git-ignored).

    python bench/tools/make_code_corpus.py OUT.jsonl [--bytes 90000000]
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path


def sources(limit: int):
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    total = 0
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) < 200:
                continue
            yield text
            total += len(text)
            if total >= limit:
                return


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=90_000_000)
    args = ap.parse_args(argv)
    n = size = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for text in sources(args.bytes):
            f.write(json.dumps({"text": text}) + "\n")
            n, size = n + 1, size + len(text)
    print(json.dumps({"documents": n, "chars": size, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
