"""bench/ stays an index: a short top level (the runner, the README, the reports, the anchors and
one folder per subject), every script listed in bench/README.md, every link there resolving, and
every bench module importing by its full name (`bench.<folder>.<module>`), as the scripts import
each other."""

import importlib
import re

import pytest

from tests._paths import REPO
from tests.docs.test_links import _broken_links

BENCH = REPO / "bench"
README = BENCH / "README.md"
# third-party packages a module may need that the CPU test machine may lack
_OPTIONAL = {"triton", "torchao", "megatron", "transformer_engine"}


def _modules() -> list[str]:
    files = sorted(BENCH.glob("*/*.py"))
    return [
        ".".join(f.relative_to(REPO).with_suffix("").parts)
        for f in files
        if f.parent.name != "anchors" and f.name != "__init__.py"
    ]


def _scripts() -> list[str]:
    """Benchmark scripts and tools (not `_private` helpers), as paths relative to bench/."""
    return [m.split(".", 1)[1].replace(".", "/") + ".py" for m in _modules() if "._" not in m]


def _unlisted(text: str, scripts: list[str]) -> list[str]:
    return [s for s in scripts if not re.search(rf"(?<![\w/]){re.escape(s)}\b", text)]


def test_top_level_is_an_index():
    entries = sorted(p.name for p in BENCH.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 20, f"bench/ has {len(entries)} entries: {entries}"
    loose = [e for e in entries if e.endswith(".py") and e != "__init__.py"]
    assert not loose, f"scripts directly in bench/ (put them in a folder): {loose}"


def test_readme_lists_every_script_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    missing = _unlisted(text, _scripts())
    assert not missing, f"bench/README.md does not list {missing}"
    assert not _broken_links(README), _broken_links(README)


def test_checks_catch_an_unlisted_script():
    assert "gpt/bench_gpt.py" in _scripts() and "_lib/args.py" not in _scripts()
    scripts = ["gpt/bench_gpt.py", "tools/compare.py"]
    assert _unlisted("| [gpt/bench_gpt.py](gpt/bench_gpt.py) | `tools/compare.py` |", scripts) == []
    assert _unlisted("`gpt/bench_gpt_old.py`, `moe/tools/compare.py`", scripts) == scripts


@pytest.mark.parametrize("name", _modules())
def test_module_imports_by_its_full_name(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in _OPTIONAL:
            pytest.skip(f"{name} needs {e.name}")
        raise
