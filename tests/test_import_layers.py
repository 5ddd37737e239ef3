"""The import contract: gigatron's packages form floors, and imports only point down.

Checked statically over `ast` (no module is imported), for every `import` statement in
`gigatron/`, at module level or inside a function, because a function-level import that only
dodges a circle is still a circle. Three rules:

1. **No circles.** An import of `a.b.c` runs `a/__init__`, `a/b/__init__` and `a/b/c`, so it is an
   edge to each of them (not to packages the importer already sits in: those are being imported
   already). Lazy names that a package `__init__` loads through `importlib` on first use are not
   edges.
2. **No upward imports.** Every module sits on a floor (`LAYERS`, bottom first; the longest
   matching prefix wins) and may import only its own floor and the floors below:

       gigatron, compat leaves (megatron_only_fields, missing_names, loss_reports)
       core: utilities and process groups < tensor_parallel < transformer < models;
             pipeline_parallel, distributed, dist_checkpointing, optimizer, inference on top
       core.tokenizers, core.datasets < gigatron.data < compat over core < training
       < convert < tools < compat.megatron, cli; gigatron.testing on top of core

3. **No `_private` module of another package.** `pkg/_x.py` is for `pkg` and its subpackages;
   what other packages need gets a public-in-package name.

The checker is self-contained so the test can move with tests/ reorganisations; the unit tests at
the bottom feed it tiny synthetic packages to show that a planted circle, upward import or
private import fails it. docs/architecture.md explains the floors.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterable

from tests._paths import REPO

ROOT = REPO / "gigatron"

# Bottom first, one floor per folder. A folder is a package directly under `gigatron/` or
# `gigatron/core/` (with its subpackages), or a module file directly there (`OPENED` says which
# packages are opened into folders). Folders on the same floor may import each other (without
# circles). Every folder must be on some floor.
OPENED = ("gigatron", "gigatron.core")
LAYERS: list[list[str]] = [
    # the version, and Megatron compatibility: plain data that imports nothing of ours (the
    # megatron.* alias reaches gigatron's modules by name only, through importlib)
    ["gigatron", "gigatron.compat"],
    # core's leaves: plain data and helpers that communicate through nothing of ours; the
    # checkpoint format (save / load over torch.distributed.checkpoint, and the files of a
    # training checkpoint: directories, tracker, commit)
    [
        "gigatron.core",
        "gigatron.core._rank_grid",
        "gigatron.core.hyper_comm_grid",
        "gigatron.core.dist_checkpointing",
        "gigatron.core.timers",
        "gigatron.core.model_parallel_config",
        "gigatron.core.num_microbatches_calculator",
        "gigatron.core.optimizer_param_scheduler",
        "gigatron.core.untrusted_files",
        "gigatron.core.untrusted_pickle",
        "gigatron.core.untrusted_yaml",
        "gigatron.core._rank_utils",
        "gigatron.core._experimental",
        "gigatron.core._param_layout",
        "gigatron.core._buffer_layout",
        "gigatron.core.fp8_utils",
        "gigatron.core.activations",
        "gigatron.core.config",
        "gigatron.core.packed_seq_params",
        "gigatron.core.msc_utils",
        "gigatron.core.typed_torch",
        "gigatron.core._slurm_utils",
        "gigatron.core.rerun_state_machine",
    ],
    # the process groups (the only globals) and the utilities over them
    [
        "gigatron.core.parallel_state",
        "gigatron.core._parallel_state_store",
        "gigatron.core._parallel_state_getters",
        "gigatron.core.process_groups_config",
        "gigatron.core.utils",
        "gigatron.core.layout_invariant_init",
    ],
    # tensor parallelism: collectives, RNG, sharded layers
    ["gigatron.core.tensor_parallel"],
    # transformer building blocks (with the RoPE the attention modules apply) and their enums;
    # fused kernels over TP layers and the attention mask types
    # and the state-space mixers of hybrid models beside them
    [
        "gigatron.core.transformer",
        "gigatron.core.enums",
        "gigatron.core.fusions",
        "gigatron.core.ssm",
    ],
    # models assembled from the blocks; the Transformer Engine spec provider (TE absent) beside
    # the layer specs
    ["gigatron.core.models", "gigatron.core.extensions"],
    # what runs models: schedules, data parallelism, optimizers, generation; the data side
    [
        "gigatron.core.pipeline_parallel",
        "gigatron.core.distributed",
        "gigatron.core.optimizer",
        "gigatron.core.inference",
        "gigatron.core.inference_params",
        "gigatron.core.datasets",
        "gigatron.core.tokenizers",
        "gigatron.core.safe_globals",
    ],
    # tests' helpers over core
    ["gigatron.testing"],
    # Hugging Face <-> gigatron conversion (writes the training checkpoint format of core)
    ["gigatron.convert"],
    # the training library (loop, arguments, tokenizers, checkpoints, Megatron-LM's flags), which
    # starts from HF dirs through convert
    ["gigatron.training"],
    # programs over the library, and the demo corpus built with them
    ["gigatron.tools", "gigatron.data"],
    # the command line
    ["gigatron.cli"],
]

# Modules placed on a floor other than their folder's: module -> (a folder on the floor it stands
# on, why). Empty: every module stands on its folder's floor.
OFF_FLOOR: dict[str, tuple[str, str]] = {}


def module_layers(layers: list[list[str]], off_floor: dict) -> list[list[str]]:
    """`layers` with each off-floor module added to the floor of the folder it names."""
    out = [list(floor) for floor in layers]
    for mod, (beside, _why) in off_floor.items():
        next(floor for floor in out if beside in floor).append(mod)
    return out


# Breaks tolerated for now, as (rule, importer, imported) without the "gigatron." prefix (a circle
# by its first module). Empty since issue 32 cleared the last ones; fix a break rather than list it.
ALLOWED: tuple[tuple[str, str, str], ...] = ()


# ---------------------------------------------------------------------------------------------
# The checker


def module_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py under `root` (a package directory)."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _targets(mod: str, is_pkg: bool, node: ast.AST, mods: dict) -> Iterable[str]:
    """The modules of our tree that one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        # `from pkg import sub` imports the submodule sub; `from pkg import name` only pkg.
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name:
            yield name


def _is_main_block(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` runs only when the file is the program, never on import."""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def import_statements(tree: ast.Module) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth, except under `if __name__ == ...`."""
    todo = [n for n in tree.body if not _is_main_block(n)]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def import_edges(root: pathlib.Path) -> dict[str, dict[str, tuple[int, bool]]]:
    """importer -> {imported module: (line, named)} for every import statement, at any depth.

    `named` is False for the package `__init__`s an import runs on the way to the module it names.
    """
    mods = module_files(root)
    edges: dict[str, dict[str, tuple[int, bool]]] = {m: {} for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in import_statements(ast.parse(path.read_text(), str(path))):
            for target in _targets(mod, is_pkg, node, mods):
                edges[mod][target] = (node.lineno, True)
                # Importing a.b.c runs a/__init__ and a/b/__init__ first, unless the importer
                # is inside them (then they are already being imported).
                parts = target.split(".")
                for i in range(1, len(parts)):
                    dep = ".".join(parts[:i])
                    if dep != mod and not mod.startswith(dep + ".") and dep in mods:
                        edges[mod].setdefault(dep, (node.lineno, False))
            edges[mod].pop(mod, None)
    return edges


def find_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        sccs.append(sorted(comp))
    return sccs


def floor_of(mod: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """(floor index, matching prefix) by the longest prefix of `mod` listed in `layers`."""
    best = None
    for i, floor in enumerate(layers):
        for prefix in floor:
            if (mod == prefix or mod.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[1])
            ):
                best = (i, prefix)
    return best


def private_owner(target: str) -> str | None:
    """The package a `_private` module belongs to: its path up to the first `_name` part."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def violations(root: pathlib.Path, layers: list[list[str]]) -> list[str]:
    """Every broken rule, one line each (empty when the contract holds)."""
    edges = import_edges(root)
    out = [f"circle: {' <-> '.join(c)}" for c in find_cycles(edges)]
    for mod, deps in edges.items():
        here = floor_of(mod, layers)
        if here is None:
            out.append(f"no floor: {mod} matches no prefix in LAYERS")
            continue
        for dep, (line, named) in deps.items():
            if not named:
                continue
            there = floor_of(dep, layers)
            if there is not None and there[0] > here[0]:
                out.append(
                    f"upward: {mod} imports {dep} (line {line}; {there[1]} is above {here[1]})"
                )
            owner = private_owner(dep)
            if owner is not None and mod != owner and not mod.startswith(owner + "."):
                out.append(f"private: {mod} imports {dep} (line {line}; private to {owner})")
    return out


def folder_of(mod: str, opened: tuple[str, ...]) -> str:
    """The folder a module belongs to: the child of the deepest `opened` package above it (a
    subpackage with everything under it, or a module file), or the opened package itself."""
    best = ""
    for pkg in opened:
        if mod.startswith(pkg + ".") and len(pkg) > len(best):
            best = pkg
    if not best:
        return mod
    return best + "." + mod[len(best) + 1 :].split(".")[0]


def folder_violations(
    root: pathlib.Path, layers: list[list[str]], opened: tuple[str, ...], off_floor: dict
) -> list[str]:
    """The contract between folders: no circle, no upward import, every folder on a floor, and
    no module on a floor other than its folder's unless `off_floor` names it."""
    edges = import_edges(root)
    folders = {m: folder_of(m, opened) for m in edges}
    floor = {name: i for i, names in enumerate(layers) for name in names}
    out = [f"folder without a floor: {f}" for f in sorted(set(folders.values()) - set(floor))]
    out += [f"not a folder: {name} in LAYERS" for name in floor if name not in folders.values()]
    graph: dict[str, dict[str, tuple[int, bool]]] = {f: {} for f in folders.values()}
    for mod, deps in edges.items():
        for dep, (line, named) in deps.items():
            a, b = folders[mod], folders[dep]
            if a == b:
                continue
            graph[a].setdefault(b, (line, named))
            if named and a in floor and b in floor and floor[b] > floor[a] and mod not in off_floor:
                out.append(f"folder upward: {a} imports {b} ({mod} line {line} imports {dep})")
    out += [f"folder circle: {' <-> '.join(c)}" for c in find_cycles(graph)]
    placed = module_layers(layers, off_floor)
    for mod, folder in folders.items():
        here = floor_of(mod, placed)
        moved = here is not None and folder in floor and here[0] != floor[folder]
        if moved and mod not in off_floor:
            out.append(f"off its folder's floor: {mod} ({here[1]} places it)")
    return out


# ---------------------------------------------------------------------------------------------
# The contract on gigatron/


def _allowed() -> tuple[str, ...]:
    """The violation-line starts that ALLOWED names."""
    return tuple(
        f"{rule}: gigatron.{a}" + (f" imports gigatron.{b}" if b else "") for rule, a, b in ALLOWED
    )


def test_gigatron_keeps_the_import_contract():
    found = violations(ROOT, module_layers(LAYERS, OFF_FLOOR))
    found = [v for v in found if not v.startswith(_allowed())]
    assert not found, "import contract broken (see docs/architecture.md):\n" + "\n".join(found)


def test_every_folder_is_one_floor_with_no_circle_and_no_upward_import():
    found = folder_violations(ROOT, LAYERS, OPENED, OFF_FLOOR)
    assert not found, "folder contract broken (see docs/architecture.md):\n" + "\n".join(found)


def test_allow_list_has_no_stale_entries():
    found = violations(ROOT, module_layers(LAYERS, OFF_FLOOR))
    stale = [a for a in _allowed() if not any(v.startswith(a) for v in found)]
    assert not stale, f"remove from ALLOWED (fixed): {stale}"


# ---------------------------------------------------------------------------------------------
# The checker on planted violations


def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """Write a tiny package `pkg` ("pkg.low.a" -> pkg/low/a.py, ".__init__" for a package's
    own code) and return its directory."""
    for name, source in files.items():
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(tmp_path).parents[:-1]:
            (tmp_path / parent / "__init__.py").touch()
        path.write_text(source)
    return tmp_path / "pkg"


# pkg.low < pkg.high; pkg.low.a imports pkg.low.b, pkg.high.c imports pkg.low.a
_CLEAN = {
    "pkg.low.a": "from pkg.low import b\n",
    "pkg.low.b": "import os\n",
    "pkg.high.c": "from pkg.low.a import *\n",
}
_FLOORS = [["pkg", "pkg.low"], ["pkg.high"]]


def test_checker_passes_a_clean_package(tmp_path):
    assert violations(_package(tmp_path, _CLEAN), _FLOORS) == []


def test_checker_finds_a_circle_behind_a_function_level_import(tmp_path):
    files = {**_CLEAN, "pkg.low.b": "def f():\n    from pkg.low.a import x\n"}
    assert violations(_package(tmp_path, files), _FLOORS) == ["circle: pkg.low.a <-> pkg.low.b"]


def test_checker_finds_a_circle_through_a_package_init(tmp_path):
    # pkg.low.b -> pkg.high (its __init__ runs) -> pkg.high.c -> pkg.low.a -> pkg.low.b
    files = {**_CLEAN, "pkg.high.__init__": "from pkg.high import c\n"}
    files["pkg.low.b"] = "from pkg.high.d import y\n"
    files["pkg.high.d"] = "y = 1\n"
    found = violations(_package(tmp_path, files), [["pkg", "pkg.low", "pkg.high"]])
    assert found == ["circle: pkg.high <-> pkg.high.c <-> pkg.low.a <-> pkg.low.b"]


def test_checker_finds_an_upward_import(tmp_path):
    files = {**_CLEAN, "pkg.high.d": "y = 1\n", "pkg.low.b": "from pkg.high.d import y\n"}
    found = violations(_package(tmp_path, files), _FLOORS)
    assert found == ["upward: pkg.low.b imports pkg.high.d (line 1; pkg.high is above pkg.low)"]


def test_checker_finds_a_private_import_across_packages(tmp_path):
    files = {
        **_CLEAN,
        "pkg.low._secret": "z = 1\n",
        "pkg.high.c": "from pkg.low._secret import z\n",
    }
    found = violations(_package(tmp_path, files), _FLOORS)
    assert found == ["private: pkg.high.c imports pkg.low._secret (line 1; private to pkg.low)"]


def test_checker_ignores_the_program_block(tmp_path):
    files = {**_CLEAN, "pkg.low.b": "if __name__ == '__main__':\n    from pkg.high import c\n"}
    assert violations(_package(tmp_path, files), _FLOORS) == []


def test_folder_checker_finds_a_circle_between_folders_without_a_module_circle(tmp_path):
    # pkg.a.x -> pkg.b.y and pkg.b.z -> pkg.a.w: no module circle, but folders a and b are one
    files = {
        "pkg.a.x": "from pkg.b import y\n",
        "pkg.b.y": "import os\n",
        "pkg.b.z": "from pkg.a import w\n",
        "pkg.a.w": "import os\n",
    }
    root = _package(tmp_path, files)
    floors = [["pkg", "pkg.a", "pkg.b"]]
    assert violations(root, floors) == []
    assert folder_violations(root, floors, ("pkg",), {}) == ["folder circle: pkg.a <-> pkg.b"]


def test_folder_checker_finds_a_module_placed_off_its_folders_floor(tmp_path):
    root = _package(tmp_path, _CLEAN)
    floors = [["pkg", "pkg.low"], ["pkg.high"]]
    assert folder_violations(root, floors, ("pkg",), {}) == []
    lifted = [["pkg", "pkg.low"], ["pkg.high", "pkg.low.b"]]
    found = folder_violations(root, lifted, ("pkg",), {})
    assert found == [
        "not a folder: pkg.low.b in LAYERS",
        "off its folder's floor: pkg.low.b (pkg.low.b places it)",
    ]
    assert folder_violations(root, floors, ("pkg",), {"pkg.low.b": ("pkg.high", "why")}) == []


if __name__ == "__main__":
    for v in violations(ROOT, module_layers(LAYERS, OFF_FLOOR)):
        print(v)
    for v in folder_violations(ROOT, LAYERS, OPENED, OFF_FLOOR):
        print(v)
