"""The documentation stays honest: README.md links every docs page, every relative link and
anchor resolves, every repository path named in backticks exists, and every `gigatron.x.y` name
imports (as a module, or an attribute of one).

A page, path or name that is renamed or removed without updating the docs fails here.
"""

from __future__ import annotations

import importlib
import itertools
import re
from pathlib import Path

import pytest

from tests._paths import REPO

ROOT = REPO
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a repository path: a top-level folder of this repo, then a file with an extension
_PATH = re.compile(
    r"(?<![\w./-])((?:tests|bench|gigatron|examples|scripts|docs)/[\w./{},*-]*\.\w+)"
)
_NAME = re.compile(r"\bgigatron(?:\.\w+)+")
# names of other projects' files written in our docs on purpose (not paths of this repo)
_FOREIGN_PATHS = {  # Megatron-LM's scripts
    "examples/gpt3/train_gpt3_175b_distributed.sh",
    "examples/mamba/train.sh",
}
_PLACEHOLDER_NAMES = {"gigatron.core.X"}  # README: `import megatron.core.X` -> `gigatron.core.X`


def _prose(page: Path) -> str:
    return _FENCE.sub("", page.read_text(encoding="utf-8"))


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces -> '-'."""
    out = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def _expand_braces(path: str) -> list[str]:
    """`tests/training/test_pretrain_{bert,t5}.py` -> both names."""
    parts = re.split(r"\{([^}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _unlinked(readme: str, docs: list[Path]) -> list[str]:
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", readme))
    return [f"docs/{p.name}" for p in docs if f"docs/{p.name}" not in linked]


def _broken_links(page: Path) -> list[str]:
    bad = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no heading #{anchor})")
    return bad


def _missing_paths(page: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for raw in _PATH.findall(page.read_text(encoding="utf-8")):
        if raw in _FOREIGN_PATHS or "*" in raw:
            continue
        bad += [p for p in _expand_braces(raw) if not (root / p).exists()]
    return sorted(set(bad))


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _bad_names(page: Path) -> list[str]:
    names = set(_NAME.findall(page.read_text(encoding="utf-8"))) - _PLACEHOLDER_NAMES
    return sorted(n for n in names if not _resolves(n))


def test_readme_links_every_docs_page():
    missing = _unlinked((ROOT / "README.md").read_text(encoding="utf-8"), DOCS)
    assert not missing, f"README.md's documentation table does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_and_anchors_resolve(page):
    bad = _broken_links(page)
    assert not bad, f"{_rel(page)}: broken links {bad}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_repository_paths_exist(page):
    bad = _missing_paths(page)
    assert not bad, f"{_rel(page)} names files that do not exist: {bad}"


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "compat.md"], ids=_rel)
def test_gigatron_names_import(page):
    # compat.md is generated and checked name by name by tests/compat/test_doc_table_holds.py
    bad = _bad_names(page)
    assert not bad, f"{_rel(page)} names {bad}, which do not import"


def test_checks_catch_broken_docs(tmp_path):
    """Each check above flags what it is meant to (so a passing run means something)."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Some Section: x\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok2](other.md#some-section-x) [gone](missing.md) "
        "[bad anchor](other.md#nope) [web](https://example.com)\n"
        "`tests/docs/test_links.py` `tests/training/no_such.py` "
        "`tests/docs/test_{docs,nothing}_x.py`\n"
        "```python\n[in code](ignored.md)\n```\n"
        "`gigatron.core.parallel_state.initialize_model_parallel` `gigatron.core.no_such_thing`\n"
    )
    assert _broken_links(page) == ["missing.md (no such file)", "other.md#nope (no heading #nope)"]
    assert _missing_paths(page) == [
        "tests/docs/test_docs_x.py", "tests/docs/test_nothing_x.py", "tests/training/no_such.py"
    ]  # fmt: skip
    assert _bad_names(page) == ["gigatron.core.no_such_thing"]
    assert _unlinked("[a](docs/a.md)", [Path("docs/a.md"), Path("docs/b.md")]) == ["docs/b.md"]
