"""`gigatron <command> ...`: one entry point for the tools users run from a shell.

Each command lives in its own module with a `main(argv: list[str] | None) -> int | None`; this
file only dispatches, so a broken optional tool cannot break the others.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "gigatron.training.pretrain_gpt",
        "train a GPT model (Megatron's pretrain_gpt.py flags)",
    ),
    "train-bert": ("gigatron.training.pretrain_bert", "train a BERT model (pretrain_bert.py)"),
    "train-t5": ("gigatron.training.pretrain_t5", "train a T5 model (pretrain_t5.py)"),
    "preprocess": ("gigatron.tools.preprocess_data", "tokenize JSON lines / text into .bin/.idx"),
    "merge": ("gigatron.tools.merge_datasets", "merge several .bin/.idx prefixes into one"),
    "train-tokenizer": ("gigatron.tools.train_tokenizer", "train a BPE tokenizer on a corpus"),
    "generate": ("gigatron.tools.generate", "generate text from a checkpoint"),
    "convert": ("gigatron.tools.convert", "convert Hugging Face <-> gigatron checkpoints"),
}


def _usage() -> str:
    lines = ["usage: gigatron <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"gigatron: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    result = module.main(rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
