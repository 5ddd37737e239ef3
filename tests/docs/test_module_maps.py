"""The "Module map" sections of docs/training.md and docs/dist_checkpointing.md stay true: each
names every module of its package (subpackages included) on a line of its own, and no module
that is gone. Adding, renaming or removing a module without its map line fails here.
"""

from __future__ import annotations

import re

import pytest

from tests._paths import REPO

MAPS = {
    "docs/training.md": "gigatron/training",
    "docs/dist_checkpointing.md": "gigatron/core/dist_checkpointing",
}

_ENTRY = re.compile(r"^- `([\w/]+\.py)`", re.M)  # "- `path/in/package.py`: what it holds"
_PY_PATH = re.compile(r"`((?:[\w]+/)*\w+\.py)`")


def _section(page: str, heading: str) -> str:
    """The text under `heading` (its sub-headings included) up to the next heading of its level."""
    text = (REPO / page).read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    start = text.find(f"\n{heading}\n")
    assert start >= 0, f"{page} has no '{heading}' section"
    rest = text[start + len(heading) + 2 :]
    end = re.search(rf"^{level} ", rest, re.M)
    return rest[: end.start()] if end else rest


def _modules(package: str) -> list[str]:
    root = REPO / package
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py"))


def _entries(page: str) -> list[str]:
    return _ENTRY.findall(_section(page, "## Module map"))


@pytest.mark.parametrize("page, package", MAPS.items())
def test_module_map_names_every_module(page, package):
    missing = sorted(set(_modules(package)) - set(_entries(page)))
    assert not missing, f"{page}: the Module map has no line for {missing} (of {package}/)"


@pytest.mark.parametrize("page, package", MAPS.items())
def test_module_map_names_only_modules_that_exist(page, package):
    gone = sorted(set(_entries(page)) - set(_modules(package)))
    assert not gone, f"{page}: the Module map names {gone}, not modules of {package}/"


@pytest.mark.parametrize("page", MAPS)
def test_module_map_lists_each_module_once(page):
    entries = _entries(page)
    twice = sorted({e for e in entries if entries.count(e) > 1})
    assert not twice, f"{page}: the Module map lists {twice} more than once"


def test_how_a_checkpoint_is_written_names_existing_modules():
    """The write path of docs/dist_checkpointing.md: each module it names exists, as a repository
    path or a path inside gigatron/core/dist_checkpointing/."""
    path = _section("docs/dist_checkpointing.md", "### How a checkpoint is written")
    named = set(_PY_PATH.findall(path))
    expected = {"gigatron/training/checkpointing.py", "serialization.py", "checkpoint_files.py"}
    assert expected <= named
    package = REPO / MAPS["docs/dist_checkpointing.md"]
    gone = sorted(n for n in named if not (REPO / n).is_file() and not (package / n).is_file())
    assert not gone, f"docs/dist_checkpointing.md's write path names missing modules {gone}"


def test_sections_are_read_from_the_pages():
    """The section reader stops at the next heading of the same level (a guard for the tests
    above: an empty or overlong section would make them vacuous or lenient)."""
    section = _section("docs/training.md", "## Module map")
    assert "`training.py`" in section and "## Differences from Megatron" not in section
    assert len(_entries("docs/training.md")) >= 60
