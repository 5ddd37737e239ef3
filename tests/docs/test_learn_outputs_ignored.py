"""What docs/learn.md's commands write in the repository root is ignored by git."""

import re
import shutil
import subprocess

import pytest

from tests._paths import REPO

_OUTPUT = re.compile(r"(--out|--save|--tensorboard-dir|--timeline|--output-prefix) ([\w./-]+)")
_FOLDERS = ("--save", "--tensorboard-dir")


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout"
)
def test_learn_md_outputs_are_git_ignored():
    found = _OUTPUT.findall((REPO / "docs" / "learn.md").read_text())
    outputs = sorted({path.rstrip("/") + ("/" if flag in _FOLDERS else "") for flag, path in found})
    assert {"ckpt/", "tb/", "timeline.json", "data/corpus"} <= set(outputs), outputs
    r = subprocess.run(
        ["git", "check-ignore", "--no-index", *outputs], cwd=REPO, capture_output=True, text=True
    )
    ignored = set(r.stdout.split())
    assert ignored == set(outputs), sorted(set(outputs) - ignored)
