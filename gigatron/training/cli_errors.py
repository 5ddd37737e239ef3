"""How the training flags talk to a person: one-line errors, hints, help with defaults.

Part of `gigatron.training.arguments` (not a Megatron module; Megatron prints argparse's usage
dump and asserts). A flag mistake is one line `gigatron <command>: error: <what>` with exit
status 2; `gigatron.cli` prints configuration errors raised later (ValueError ...) the same way.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import sys

from gigatron.core.datasets.utils import get_blend_from_list

# what `gigatron.cli` names the running command ("gigatron train"); argparse's prog otherwise
_PROGRAM: list[str] = []


def set_program(name: str) -> None:
    """`gigatron.cli` names the command it runs, for the error lines of the flag parser."""
    _PROGRAM[:] = [name]


def program(default: str = "gigatron train") -> str:
    return _PROGRAM[0] if _PROGRAM else default


_DESCRIPTIONS = {
    "gigatron train": "Train a GPT model with Megatron-LM's pretrain_gpt.py flags.",
    "gigatron train-bert": "Train a BERT model with Megatron-LM's pretrain_bert.py flags.",
    "gigatron train-t5": "Train a T5 model with Megatron-LM's pretrain_t5.py flags.",
}

EPILOG = """\
examples:
  gigatron train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \\
      --micro-batch-size 4 --train-iters 100 --lr 1e-3 --mock-data --vocab-size 1000
  torchrun --nproc-per-node 2 -m gigatron.cli train ... --tensor-model-parallel-size 2
  gigatron train --yaml-cfg run.yaml --lr 3e-4    (flags on the command line win over the file)

A configuration mistake stops with one line `gigatron <command>: error: ...` (exit status 2);
`gigatron --debug <command> ...` or GIGATRON_DEBUG=1 shows the traceback.
docs/training.md lists every flag, the Megatron ones gigatron refuses and its additions."""


def description(prog: str) -> str:
    return _DESCRIPTIONS.get(prog, "Megatron-LM's training flags.") + (
        "\nLaunch under torchrun for several ranks; without GPUs the ranks run on CPU (gloo)."
    )


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's layout (the epilog's lines kept) plus "(default: X)" on flags whose default
    says something (not None, not False, not already in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or isinstance(action, argparse._StoreFalseAction | argparse._HelpAction)
            or not action.option_strings
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors are one line on stderr (no usage dump), exit 2."""

    def error(self, message: str):
        hint = f"{self.prog} --help lists the flags"
        print(f"{self.prog}: error: {message} ({hint})", file=sys.stderr)
        sys.exit(2)


def suggest_flag(name: str, known: list[str]) -> str | None:
    """The known flag closest to `name`, or None when nothing is close.

    Whole-string similarity alone pairs flags of similar length and letters but unrelated
    words (`--log-num-zeros-in-grad` -> `--num-attention-heads`); a candidate must also share
    most of its dash-separated words with `name`, or be a near-typo of it (ratio >= 0.85)."""
    words = set(name.lstrip("-").split("-"))
    best, best_score = None, 0.0
    for flag in known:
        ratio = difflib.SequenceMatcher(None, name, flag).ratio()
        other = set(flag.lstrip("-").split("-"))
        overlap = len(words & other) / max(len(words | other), 1)
        if ratio < 0.85 and overlap < 0.5:
            continue
        score = ratio + overlap
        if score > best_score:
            best, best_score = flag, score
    return best


def known_flags(parser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def reject_unknown(parser, unknown: list[str]) -> None:
    """parser.error naming the first unknown flag and the closest known one."""
    flags = [u for u in unknown if u.startswith("--")]
    if not flags and unknown:
        parser.error(f"unexpected argument {unknown[0]!r}")
    for flag in flags:
        name = flag.split("=")[0]
        close = suggest_flag(name, known_flags(parser))
        hint = f"; did you mean {close}?" if close else ""
        parser.error(f"unknown flag {name}{hint}")


def launch_hint(world_size: int, needed: int) -> str:
    """How to start `needed` ranks, when this process was not started by a launcher."""
    if world_size != 1 or "WORLD_SIZE" in os.environ or needed <= 1:
        return ""
    command = program().split()[-1]
    return (
        f"; this process was not started by a launcher: run {needed} processes with "
        f"`torchrun --nproc-per-node {needed} -m gigatron.cli {command} ...`"
    )


def check_data_prefixes(data_path: list[str]) -> None:
    """Each --data-path prefix names a `.bin` / `.idx` pair; `gigatron preprocess` writes
    `<output-prefix>_text_document.bin/.idx`, so a prefix without that suffix is the usual slip."""
    prefixes, weights = get_blend_from_list(data_path)
    for prefix, weight in zip(prefixes, weights or [None] * len(prefixes)):
        if weight is not None and not (math.isfinite(weight) and weight >= 0):
            raise ValueError(
                f"--data-path: weight {weight:g} of {prefix} must be a finite number >= 0"
            )
    for prefix in prefixes:
        if os.path.exists(prefix + ".bin") and os.path.exists(prefix + ".idx"):
            continue
        stem, ext = os.path.splitext(prefix)
        if ext in (".bin", ".idx") and os.path.exists(stem + ".bin"):
            raise ValueError(
                f"--data-path {prefix}: --data-path takes the prefix without .bin / .idx: did "
                f"you mean --data-path {stem}?"
            )
        for suffix in ("_text_document", "_text_sentence"):
            if os.path.exists(prefix + suffix + ".bin"):
                raise ValueError(
                    f"--data-path {prefix}: no {prefix}.bin / .idx, but {prefix}{suffix}.bin "
                    f"exists: give --data-path {prefix}{suffix} (gigatron preprocess adds "
                    f"{suffix} to --output-prefix)"
                )
        missing = ".bin" if not os.path.exists(prefix + ".bin") else ".idx"
        raise ValueError(
            f"--data-path {prefix}: {prefix}{missing} does not exist; a prefix names the "
            "<prefix>.bin / <prefix>.idx pair `gigatron preprocess` writes (or pass --mock-data)"
        )
