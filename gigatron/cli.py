"""`gigatron <command> ...`: one entry point for the tools users run from a shell.

Each command lives in its own module with a `main(argv: list[str] | None) -> int | None`; this
file only dispatches, so a broken optional tool cannot break the others. `main` is the program:
a configuration mistake (a ValueError, a missing file, an unreadable checkpoint) is printed as
one line `gigatron <command>: error: ...` with exit status 2; `--debug` (anywhere) or
GIGATRON_DEBUG=1 lets the exception through with its traceback. `run` dispatches and raises,
for callers that want the exception.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "gigatron.training.pretrain_gpt",
        "train a GPT model (Megatron's pretrain_gpt.py flags)",
    ),
    "train-bert": ("gigatron.training.pretrain_bert", "train a BERT model (pretrain_bert.py)"),
    "train-t5": ("gigatron.training.pretrain_t5", "train a T5 model (pretrain_t5.py)"),
    "train-hybrid": (
        "gigatron.training.pretrain_hybrid",
        "train a hybrid Mamba-2 / attention model (pretrain_hybrid.py)",
    ),
    "preprocess": ("gigatron.tools.preprocess_data", "tokenize JSON lines / text into .bin/.idx"),
    "merge": ("gigatron.tools.merge_datasets", "merge several .bin/.idx prefixes into one"),
    "train-tokenizer": ("gigatron.tools.train_tokenizer", "train a BPE tokenizer on a corpus"),
    "generate": ("gigatron.tools.generate", "generate text from a checkpoint"),
    "convert": ("gigatron.tools.convert", "convert Hugging Face <-> gigatron checkpoints"),
    "layout": (
        "gigatron.tools.layout",
        "print and draw which rank holds which TP/PP/DP/CP/EP piece",
    ),
    "schedule": ("gigatron.tools.schedule", "draw a pipeline schedule: planned or a --timeline"),
    "plot": ("gigatron.tools.plot", "plot loss, learning rate, grad norm, throughput of a run"),
    "estimate": (
        "gigatron.tools.estimate",
        "memory / FLOPs / comm / time per rank of a planned layout; --dry-run checks every rank",
    ),
}

# `gigatron generate --help`: its own flags and the few training flags it reads (its parser is
# the whole training parser, whose model flags only override the checkpoint's)
_GENERATE_FLAGS = (
    "--load",
    "--tensor-model-parallel-size",
    "--seed",
    "--bf16",
    "--fp16",
    "--tokenizer-type",
    "--tokenizer-model",
    "--vocab-file",
    "--merge-file",
)


def _usage() -> str:
    lines = ["usage: gigatron [--version] [--debug] <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "",
        "`gigatron <command> --help` lists the command's flags. A configuration mistake stops",
        "with one line `gigatron <command>: error: ...` (exit status 2); --debug or",
        "GIGATRON_DEBUG=1 shows the traceback instead.",
    ]
    return "\n".join(lines)


def _generate_help() -> str:
    from gigatron.tools import generate
    from gigatron.training.arguments import build_parser
    from gigatron.training.cli_errors import HelpFormatter

    full = build_parser(generate.add_text_generation_args)._option_string_actions
    p = argparse.ArgumentParser(
        prog="gigatron generate",
        description=generate.__doc__,
        formatter_class=HelpFormatter,
        epilog="Every model flag of `gigatron train --help` is accepted too; a flag given "
        "overrides the checkpoint's value.",
    )
    generate.add_text_generation_args(p)
    g = p.add_argument_group("checkpoint, layout, tokenizer (default: the checkpoint's)")
    for flag in _GENERATE_FLAGS:
        action = full[flag]
        kw = {"help": action.help, "default": action.default if flag == "--seed" else None}
        if action.nargs == 0:
            kw["action"] = "store_true"
        else:
            kw.update(type=action.type, choices=action.choices, metavar=action.metavar)
        g.add_argument(flag, **kw)
    return p.format_help()


# bare `gigatron train`: no silent multi-minute demo (pretrain_gpt.main says the same)
_TRAIN_WITHOUT_FLAGS = (
    "gigatron train: error: no flags given: pass Megatron's pretrain_gpt.py flags "
    "(`gigatron train --help`), or --demo for the built-in demo that `make train` runs "
    "(about 2 minutes on 2 CPU cores)"
)


def run(argv: list[str]) -> int:
    """Run `gigatron <argv[0]> <argv[1:]>`; exceptions propagate."""
    from gigatron.training import cli_errors

    name, rest = argv[0], argv[1:]
    cli_errors.set_program(f"gigatron {name}")
    module = importlib.import_module(COMMANDS[name][0])
    result = module.main(rest)
    return result if isinstance(result, int) else 0


def _is_configuration_error(err: BaseException) -> bool:
    from gigatron.core.dist_checkpointing import CheckpointingException

    return isinstance(err, ValueError | FileNotFoundError | CheckpointingException)


def _one_line(err: BaseException) -> str:
    """The message on one line, without the source-path suffix some messages carry."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return re.sub(r"\s*\(gigatron/[\w/]+\.py\)$", "", text) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("GIGATRON_DEBUG", "0") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from gigatron import __version__

        print(f"gigatron {__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"gigatron: error: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    if name == "train" and len(argv) == 1:  # before importing the training stack (seconds)
        print(_TRAIN_WITHOUT_FLAGS, file=sys.stderr)
        return 2
    if name == "generate" and ("-h" in argv or "--help" in argv):
        print(_generate_help())
        return 0
    try:
        code = run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BrokenPipeError:  # `gigatron layout ... | head`: the reader is done, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as err:
        if debug or not _is_configuration_error(err):
            raise
        if os.environ.get("RANK", "0") == "0":  # every rank meets the same mistake
            print(f"gigatron {name}: error: {_one_line(err)}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
