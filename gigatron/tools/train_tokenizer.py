"""`gigatron train-tokenizer`: train a GPT-2 style byte-level BPE tokenizer on a local corpus.

Uses the Hugging Face `tokenizers` library. Writes `tokenizer.json` (load with
`--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR`) and `vocab.json` + `merges.txt`
(load with `--tokenizer-type GPT2BPETokenizer --vocab-file ... --merge-file ...`); both give the
same ids. `<|endoftext|>` is always in the vocabulary (it is the EOD token).

    gigatron train-tokenizer --input corpus.jsonl --vocab-size 8000 --output-dir tok/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator

from gigatron.core.untrusted_files import open_regular_file

EOD_TOKEN = "<|endoftext|>"


def iter_texts(paths: list[str], json_keys: list[str]) -> Iterator[str]:
    """Texts from JSON-lines files (the `json_keys` fields) or plain text files (one per line)."""
    for path in paths:
        is_json = path.endswith((".json", ".jsonl"))
        with open_regular_file(path, what="--input") as raw:
            for line_no, data in enumerate(raw, 1):
                try:
                    line = data.decode("utf-8").replace("\r\n", "\n")
                except UnicodeDecodeError as e:
                    raise ValueError(
                        f"{path}:{line_no}: not valid UTF-8 (byte 0x{data[e.start]:02x} at "
                        f"column {e.start + 1})"
                    ) from None
                if not line.strip():
                    continue
                if not is_json:
                    yield line
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line_no}: not a JSON line ({err.msg})") from None
                for key in json_keys:
                    if key in record:
                        yield record[key]


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    output_dir: str,
    min_frequency: int = 2,
    special_tokens: list[str] | None = None,
) -> str:
    """Train byte-level BPE on `texts`; write tokenizer.json, vocab.json, merges.txt.

    Returns the path of tokenizer.json.
    """
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as err:
        raise ImportError(
            "train-tokenizer needs `tokenizers`: pip install 'gigatron[data]'"
        ) from err
    specials = [EOD_TOKEN] + [t for t in (special_tokens or []) if t != EOD_TOKEN]
    if vocab_size < 256 + len(specials):
        raise ValueError(
            f"vocab_size ({vocab_size}) must be at least 256 byte tokens + {len(specials)} "
            "special tokens"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    os.makedirs(output_dir, exist_ok=True)
    json_path = os.path.join(output_dir, "tokenizer.json")
    tokenizer.save(json_path)
    tokenizer.model.save(output_dir)  # vocab.json + merges.txt
    with open(os.path.join(output_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": EOD_TOKEN, "bos_token": EOD_TOKEN}, f)
    return json_path


def get_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gigatron train-tokenizer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--input", nargs="+", required=True, help="JSON-lines or text files")
    parser.add_argument("--json-keys", nargs="+", default=["text"])
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--special-tokens", nargs="*", default=[])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = get_args(argv)
    for path in args.input:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--input {path} does not exist")
    path = train_bpe_tokenizer(
        iter_texts(args.input, args.json_keys),
        args.vocab_size,
        args.output_dir,
        args.min_frequency,
        args.special_tokens,
    )
    print(f"wrote {path} and vocab.json / merges.txt in {args.output_dir}")
    with open(os.path.join(args.output_dir, "vocab.json"), encoding="utf-8") as f:
        reached = len(json.load(f))
    if reached < args.vocab_size:
        print(
            f"warning: --vocab-size {args.vocab_size} asked for, {reached} tokens reached: the "
            f"corpus has too few distinct merges occurring at least --min-frequency "
            f"{args.min_frequency} times (use a larger corpus or ask for fewer tokens)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
