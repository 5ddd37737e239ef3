"""Documented commands as a user pastes them: demo training runs (under 100 iterations) set
--eval-iters (at Megatron's default of 100 they spend most of their time evaluating), and prompts
with escapes are quoted so that bash passes them on."""

import re

from tests._paths import REPO

_BLOCK = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", re.S)
_TRAIN = re.compile(r"pretrain_(gpt|bert|t5)|gigatron(\.cli)? train(-bert|-t5)?\b")


def _commands():
    for path in [
        REPO / "README.md",
        REPO / "examples" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]:
        text = path.read_text()
        for block in _BLOCK.finditer(text):
            line = text[: block.start()].count("\n") + 1
            for cmd in re.sub(r"\\\n\s*", " ", block.group(1)).splitlines():
                if _TRAIN.search(cmd):
                    yield f"{path.relative_to(REPO)}:{line}", cmd


def test_short_documented_runs_set_eval_iters():
    short = []
    for where, cmd in _commands():
        iters = re.search(r"--train-iters (\d+)", cmd)
        if iters and int(iters.group(1)) < 100 and "--eval-iters" not in cmd:
            short.append(f"{where}: {cmd[:80]}")
    assert not short, "\n".join(short)


def test_some_commands_are_found():
    assert sum(1 for _ in _commands()) >= 5


def test_prompts_with_escapes_use_ansi_c_quoting():
    """`--prompt "...\\n"` passes a backslash and an n; bash's $'...' passes a newline."""
    literal = []
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        for m in re.finditer(r"--prompt (\$?)(['\"])(.*?)\2", path.read_text()):
            if "\\" in m.group(3) and not (m.group(1) == "$" and m.group(2) == "'"):
                literal.append(f"{path.name}: {m.group(0)}")
    assert not literal, literal
