"""Every ```python block of README.md and docs/*.md runs as shown, in a fresh process (forked
from one that has imported torch and gigatron: `_snippet_runner.py`).

A block that cannot run alone (it uses a model or a directory the reader brings) is marked by an
HTML comment on the line before it, `<!-- fragment: why -->`, and is skipped. Where a page shows
a block's output, the output is checked too (`_EXPECTED`). The blocks are CPU-sized: 1-4 s each
on 2 cores (gloo ranks through `gigatron.testing.run_distributed`, or one process).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._paths import REPO

pytestmark = pytest.mark.multirank


ROOT = REPO
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# (page, n-th python block): text its stdout must contain, as the page shows it
_EXPECTED = {
    ("testing.md", 0): "[{'sum': tensor([1.5000, 1.5000]), 'rank': 0}, ",
    ("parallel_state.md", 0): "[(0, 0, 0, 0), (1, 1, 0, 0), (2, 0, 0, 1), (3, 1, 0, 1), ",
    ("transformer.md", 0): "did you mean 'num_query_groups'?",
    ("tensor_parallel.md", 1): "[0.0, 0.0]",
    ("pipeline_parallel.md", 0): "[[], [",
    ("ddp_overlap.md", 0): (
        "['bucket 0', 'bucket 1', 'bucket 2', 'backward reached the input', 'bucket 3']"
    ),
    ("optimizer.md", 0): "(True, ",
    ("checkpoints.md", 0): "(100, 1000000000.0)",
    ("dist_checkpointing.md", 0): "['.metadata', '__0_0.distcp', 'common.pt', 'metadata.json']",
    ("datasets.md", 0): "1000 50 50 torch.Size([32])",
    ("context_parallel.md", 0): "[torch.Size([1, 8]), torch.Size([1, 8])]",
    ("packed_sequences.md", 0): "tensor(True)",
    ("bert_t5.md", 1): "[(0, []), (1, [4.19",
}
_SLOW = {("tensor_parallel.md", 1)}  # torch.compile on 2 ranks: ~6 s


def _blocks():
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for i, m in enumerate(_BLOCK.finditer(text)):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            key = (page.name, i)
            marks = [pytest.mark.slow] if key in _SLOW else []
            if before.startswith("<!-- fragment"):
                marks.append(pytest.mark.skip(reason=before))
            out.append(pytest.param(key, m.group(1), marks=marks, id=f"{page.name}-{i}"))
    return out


BLOCKS = _blocks()


def test_pages_have_runnable_blocks():
    runnable = [p for p in BLOCKS if not any(m.name == "skip" for m in p.marks)]
    assert len(runnable) >= 15, [p.id for p in runnable]
    ids = {p.id for p in BLOCKS}
    assert {f"{page}-{i}" for page, i in _EXPECTED} <= ids, "an _EXPECTED entry names no block"


@pytest.fixture(scope="module")
def runner():
    """One `_snippet_runner.py` process for the module: it imports torch and gigatron once and
    forks a child per snippet (~2 s of imports saved per block)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_snippet_runner.py"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("key", "code"), BLOCKS)
def test_doc_block_runs(key, code, tmp_path, runner):
    script = tmp_path / "snippet.py"
    script.write_text(code)
    runner.stdin.write(json.dumps({"script": str(script)}) + "\n")
    runner.stdin.flush()
    rc = json.loads(runner.stdout.readline())["rc"]
    stdout = (tmp_path / "stdout.txt").read_text()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert rc == 0, f"{key} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    want = _EXPECTED.get(key)
    assert want is None or want in stdout, f"{key}: {want!r} not in output:\n{stdout}"
