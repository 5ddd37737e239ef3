"""Every test module that starts ranks carries `pytestmark = pytest.mark.multirank` (alone or in a
list), so `pytest -m "not multirank"` is the process-free set and `-m multirank` the spawned one.

A module starts ranks when it calls `gigatron.testing.run_distributed`, launches
`torch.distributed.run` (torchrun), or joins a process group of more than one rank; or when it
calls a function of another tests module that does.
"""

import ast
from pathlib import Path

from tests._paths import REPO

TESTS = REPO / "tests"


def _starts_ranks(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value in ("torch.distributed.run", "torchrun"):
            return True
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name == "run_distributed":
            return True
        if name == "init_process_group":
            world = next((k.value for k in sub.keywords if k.arg == "world_size"), None)
            if not (isinstance(world, ast.Constant) and world.value == 1):
                return True
    return False


def _module_path(module: str) -> Path | None:
    path = REPO / (module.replace(".", "/") + ".py")
    return path if path.is_file() else None


def _launching_names(path: Path) -> set[str]:
    """Top-level functions of a tests module that start ranks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and _starts_ranks(n)
    }


def _uses_launching_helper(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            helper = _module_path(node.module)
            if helper and {a.name for a in node.names} & _launching_names(helper):
                return True
    return False


def _marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return any(
                isinstance(n, ast.Attribute) and n.attr == "multirank" for n in ast.walk(node.value)
            )
    return False


def unmarked_multirank_modules(root: Path = TESTS) -> list[str]:
    out = []
    for path in sorted(root.rglob("test_*.py")):
        if "fixtures" in path.parts or path == Path(__file__):
            continue  # this module names the launchers it looks for
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if (_starts_ranks(tree) or _uses_launching_helper(tree)) and not _marked(tree):
            out.append(str(path.relative_to(root.parent)))
    return out


def test_every_module_that_starts_ranks_is_marked_multirank():
    assert unmarked_multirank_modules() == []


def test_the_check_finds_an_unmarked_module(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "from gigatron.testing import run_distributed\n\n"
        "def test_x():\n    run_distributed(print, 2)\n"
    )
    (tmp_path / "test_b.py").write_text(
        "import pytest\n\npytestmark = [pytest.mark.slow, pytest.mark.multirank]\n\n"
        "def test_x():\n    run_distributed(print, 2)\n"
    )
    (tmp_path / "test_c.py").write_text("def test_x():\n    assert 'torchrun --nproc-per-node 2'\n")
    (tmp_path / "test_d.py").write_text(
        "def test_x():\n    cmd = ['python', '-m', 'torch.distributed.run']\n"
    )
    found = unmarked_multirank_modules(tmp_path)
    assert [Path(p).name for p in found] == ["test_a.py", "test_d.py"]
