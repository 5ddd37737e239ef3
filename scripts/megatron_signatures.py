"""Read public signatures from a megatron-core source tree without importing it; write a table.

The API-surface audit (tests/api_surface/test_names_and_signatures.py) compares gigatron against the
installed megatron-core (0.16.1, the `test` extra) and against a vendored table of a newer release
that needs a newer Python (0.19.2 wants 3.12). This script makes that table with `ast` only: for
each symbol of tests/api_surface/_symbols.py it follows the imports of the source tree to the
definition and records

- callables (functions, methods, class constructors found through the bases): every parameter's
  name, kind and default;
- dataclasses: every field (bases first, as `dataclasses.fields`) and its default, plus the
  defaults the dataclass bases declare (the audit compares those under the base's own name);
- enums: member names and values (`auto()` counted as `enum` does);

a default is stored as its source text with a tag saying how to rebuild it (`literal`, `enum`,
`callable`, `external`, `float`, or `expr` when it cannot be rebuilt without importing
megatron-core). Regenerate the vendored table with:

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d /tmp/mcore019 megatron-core==0.19.2
    cd /tmp/mcore019 && unzip -q -o megatron_core-0.19.2-*.whl -d src && cd -
    python scripts/megatron_signatures.py /tmp/mcore019/src \
        > tests/fixtures/megatron_core_0.19.2_signatures.json

`tests/api_surface/test_names_and_signatures.py::test_source_table_matches_installed_megatron` runs
this reader over the installed megatron-core and checks it against `inspect`.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

_ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}
_EXTERNAL_INIT = [
    {"name": "args", "kind": "VAR_POSITIONAL"},
    {"name": "kwargs", "kind": "VAR_KEYWORD"},
]


class SourceTree:
    """Modules of one `megatron/core` tree, parsed on demand; names resolved through imports."""

    def __init__(self, root: str | Path):
        self.core = Path(root) / "megatron" / "core"
        if not self.core.is_dir():
            raise FileNotFoundError(f"no megatron/core under {root}")
        self._parsed: dict[str, ast.Module | None] = {}

    # ------------------------------------------------------------------ modules and names
    def _file(self, module: str) -> Path | None:
        base = self.core.joinpath(*module.split(".")) if module else self.core
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file() and (module or path.name == "__init__.py"):
                return path
        return None

    def module(self, module: str) -> ast.Module | None:
        if module not in self._parsed:
            path = self._file(module)
            self._parsed[module] = ast.parse(path.read_text()) if path else None
        return self._parsed[module]

    def _is_package(self, module: str) -> bool:
        path = self._file(module)
        return path is not None and path.name == "__init__.py"

    def _absolute(self, module: str, node: ast.ImportFrom) -> str | None:
        """The imported module, relative to megatron.core ("" is megatron.core); None: external."""
        if node.level == 0:
            name = node.module or ""
            if name == "megatron.core" or name.startswith("megatron.core."):
                return name.removeprefix("megatron.core").lstrip(".")
            return None
        parts = module.split(".") if module else []
        if not self._is_package(module):
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
        if node.module:
            parts += node.module.split(".")
        return ".".join(parts)

    def _bindings(self, module: str, name: str):
        """Statements of `module` that bind `name`: top-level ones last (they win)."""
        tree = self.module(module)
        found_top, found_nested = [], []

        def visit(stmts, nested):
            for stmt in stmts:
                out = found_nested if nested else found_top
                if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    if stmt.name == name:
                        out.append(stmt)
                elif isinstance(stmt, ast.ImportFrom | ast.Import):
                    for alias in stmt.names:
                        bound = alias.asname or alias.name.split(".")[0]
                        if bound == name or alias.name == "*":
                            out.append((stmt, alias))
                elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                        if stmt.value is not None:
                            out.append(stmt)
                elif isinstance(stmt, ast.If | ast.Try):
                    visit(stmt.body, True)
                    for handler in getattr(stmt, "handlers", []):
                        visit(handler.body, True)
                    visit(stmt.orelse, True)

        visit(tree.body if tree else [], False)
        return found_nested[:1] + found_top

    def resolve(self, module: str, name: str, _depth: int = 0):
        """What `name` means in `module`: ("class"|"function", module, node), ("module", name),
        ("external", dotted), ("value", module, expr) or None."""
        if _depth > 30:
            return None
        for binding in reversed(self._bindings(module, name)):
            if isinstance(binding, ast.ClassDef):
                return ("class", module, binding)
            if isinstance(binding, ast.FunctionDef | ast.AsyncFunctionDef):
                return ("function", module, binding)
            if isinstance(binding, ast.Assign | ast.AnnAssign):
                value = binding.value
                if isinstance(value, ast.Name | ast.Attribute):
                    return self.resolve_expr(module, value, _depth + 1)
                return ("value", module, value)
            stmt, alias = binding
            if isinstance(stmt, ast.Import):
                target = alias.name if alias.asname else alias.name.split(".")[0]
                if target.startswith("megatron.core"):
                    return ("module", target[len("megatron.core.") :])
                return ("external", target)
            source = self._absolute(module, stmt)
            if source is None:
                if alias.name == "*":
                    continue
                return ("external", f"{stmt.module}.{alias.name}")
            if alias.name == "*":
                found = self.resolve(source, name, _depth + 1)
                if found is not None:
                    return found
                continue
            found = self.resolve(source, alias.name, _depth + 1)
            if found is None and self.module(f"{source}.{alias.name}".strip(".")) is not None:
                found = ("module", f"{source}.{alias.name}".strip("."))
            return found
        if self.module(f"{module}.{name}".strip(".")) is not None:
            return ("module", f"{module}.{name}".strip("."))
        return None

    def resolve_expr(self, module: str, node: ast.expr, _depth: int = 0):
        if isinstance(node, ast.Name):
            return self.resolve(module, node.id, _depth)
        if isinstance(node, ast.Attribute):
            owner = self.resolve_expr(module, node.value, _depth)
            if owner is None:
                return None
            if owner[0] == "external":
                return ("external", f"{owner[1]}.{node.attr}")
            return self.member(owner, node.attr)
        return None

    def member(self, owner, name: str):
        if owner[0] == "module":
            return self.resolve(owner[1], name)
        if owner[0] == "class":
            for module, cls in self.mro(owner[1], owner[2]):
                for stmt in cls.body:
                    if (
                        isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                        and stmt.name == name
                    ):
                        kind = "class" if isinstance(stmt, ast.ClassDef) else "function"
                        return (kind, module, stmt, ("class", module, cls))
                    if isinstance(stmt, ast.Assign | ast.AnnAssign):
                        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                            return ("attribute", module, stmt.value, cls)
        return None

    # ------------------------------------------------------------------ classes
    def bases(self, module: str, cls: ast.ClassDef):
        out = []
        for base in cls.bases:
            if isinstance(base, ast.Subscript):  # Generic[T]
                base = base.value
            out.append(self.resolve_expr(module, base) or ("external", ast.unparse(base)))
        return out

    def mro(self, module: str, cls: ast.ClassDef):
        """Megatron-defined classes of the MRO (depth-first, left to right, no repeats)."""
        seen, out = set(), []

        def walk(mod, node):
            if id(node) in seen:
                return
            seen.add(id(node))
            out.append((mod, node))
            for base in self.bases(mod, node):
                if base[0] == "class":
                    walk(base[1], base[2])

        walk(module, cls)
        return out

    def external_bases(self, module: str, cls: ast.ClassDef) -> list[str]:
        return [
            b[1].rsplit(".", 1)[-1] if b[0] == "external" else "?"
            for mod, node in self.mro(module, cls)
            for b in self.bases(mod, node)
            if b[0] != "class"
        ]

    def is_dataclass(self, module: str, cls: ast.ClassDef) -> bool:
        return any(_is_dataclass_decorated(node) for _, node in self.mro(module, cls))

    def is_enum(self, module: str, cls: ast.ClassDef) -> bool:
        return bool(_ENUM_BASES & set(self.external_bases(module, cls)))

    # ------------------------------------------------------------------ values
    def encode(self, module: str, node: ast.expr | None) -> dict:
        """A default value as {tag: payload}; see the module docstring."""
        source = ast.unparse(node)
        try:
            ast.literal_eval(node)
            return {"literal": source}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "float"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
        ):
            return {"float": str(node.args[0].value).lower()}
        if isinstance(node, ast.Lambda):
            return {"callable": "<lambda>"}
        if isinstance(node, ast.BinOp | ast.UnaryOp):  # constant arithmetic: 2 ** 32
            value = _arithmetic(node)
            if value is not None:
                return {"literal": repr(value)}
        target = (
            self.resolve_expr(module, node) if isinstance(node, ast.Name | ast.Attribute) else None
        )
        if target is not None:
            if target[0] == "external":
                return {"external": target[1]}
            if target[0] in ("class", "function"):
                return {"callable": target[2].name}
            if target[0] == "value":
                return self.encode(target[1], target[2])
            if target[0] == "attribute" and self.is_enum(target[1], target[3]):
                return {"enum": [target[3].name, node.attr]}
        return {"expr": source}

    # ------------------------------------------------------------------ descriptions
    def describe(self, symbol: str) -> dict:
        module, _, qualname = symbol.partition(":")
        if self.module(module) is None:
            return {"kind": "missing"}
        target = ("module", module)
        for part in qualname.split("."):
            target = self.member(target, part) if target else None
        if target is None:
            return {"kind": "missing"}
        if target[0] == "function":
            return {"kind": "callable", "params": self._params(*target[1:])}
        if target[0] != "class":
            return {"kind": "other"}
        mod, cls = target[1], target[2]
        if self.is_enum(mod, cls):
            return {"kind": "enum", "members": self._members(mod, cls)}
        if self.is_dataclass(mod, cls):
            return {"kind": "dataclass", **self._fields(mod, cls)}
        init = self.member(target, "__init__")
        if init is not None and init[0] == "function":
            return {"kind": "callable", "params": self._params(*init[1:])}
        return {"kind": "callable", "params": _EXTERNAL_INIT}  # nn.Module / object: (*a, **kw)

    def _params(self, module: str, fn: ast.FunctionDef, owner=None) -> list[dict]:
        """Parameters but self / cls; `owner`: the ("class", module, node) a method is in."""
        raw = self._raw_params(module, fn, owner)
        return [p for p in raw if p["name"] not in ("self", "cls")]

    def _raw_params(self, module: str, fn: ast.FunctionDef, owner=None) -> list[dict]:
        for deco in fn.decorator_list:  # megatron.core.typed_torch.copy_signature(source, ...)
            if isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("copy_signature"):
                return self._copied_params(module, fn, deco, owner)
        a = fn.args
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        out = []
        for i, arg in enumerate(positional):
            kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
            out.append(self._param(module, arg.arg, kind, defaults[i]))
        if a.vararg:
            out.append({"name": a.vararg.arg, "kind": "VAR_POSITIONAL"})
        for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            out.append(self._param(module, arg.arg, "KEYWORD_ONLY", default))
        if a.kwarg:
            out.append({"name": a.kwarg.arg, "kind": "VAR_KEYWORD"})
        return out

    def _copied_params(self, module, fn: ast.FunctionDef, deco: ast.Call, owner) -> list[dict]:
        """`copy_signature` sets `__signature__`: the source's parameters, optionally without
        its first, after the decorated function's first when that is preserved."""
        options = {kw.arg: ast.literal_eval(kw.value) for kw in deco.keywords}
        source = None
        if owner is not None and isinstance(deco.args[0], ast.Name):  # a method of the class
            source = self.member(owner, deco.args[0].id)
        source = source or self.resolve_expr(module, deco.args[0])
        if source is None or source[0] != "function":
            raise ValueError(f"copy_signature source not found: {ast.unparse(deco.args[0])}")
        copied = self._raw_params(*source[1:])
        if options.get("handle_first_src_param", "copy") == "skip":
            copied = copied[1:]
        plain = ast.FunctionDef(**{**fn.__dict__, "decorator_list": []})
        if options.get("handle_first_dst_param", "drop") == "preserve":
            copied = self._raw_params(module, plain, owner)[:1] + copied
        return copied

    def _param(self, module, name, kind, default) -> dict:
        param = {"name": name, "kind": kind}
        if default is not None:
            param["default"] = self.encode(module, default)
        return param

    def _members(self, module: str, cls: ast.ClassDef) -> dict:
        members, last = {}, 0
        str_enum = "StrEnum" in self.external_bases(module, cls)
        for stmt in cls.body:
            if not (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                continue
            name = stmt.targets[0].id
            if name.startswith("_"):
                continue
            if isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func).endswith("auto"):
                value = repr(name.lower()) if str_enum else repr(last + 1)
                members[name] = {"literal": value}
            else:
                members[name] = self.encode(module, stmt.value)
            try:
                last = int(ast.literal_eval(members[name]["literal"]))
            except (KeyError, ValueError, TypeError, SyntaxError):
                pass
        return members

    def _fields(self, module: str, cls: ast.ClassDef) -> dict:
        """Fields as `dataclasses.fields` orders them, and the dataclass bases' defaults."""
        chain = self.mro(module, cls)
        inherited: dict[str, dict | None] = {}
        for mod, node in chain[1:]:  # as the audit does: `for base in __mro__[1:]: update`
            if self.is_dataclass(mod, node):
                inherited.update(self._all_fields(mod, node))
        return {"fields": self._all_fields(module, cls), "inherited": inherited}

    def _all_fields(self, module: str, cls: ast.ClassDef) -> dict:
        fields: dict[str, dict | None] = {}
        for mod, node in reversed(self.mro(module, cls)):
            if _is_dataclass_decorated(node):
                fields.update(self._own_fields(mod, node))
        return fields

    def _own_fields(self, module: str, cls: ast.ClassDef) -> dict:
        out = {}
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            annotation = ast.unparse(stmt.annotation)
            if "ClassVar" in annotation or "InitVar" in annotation:
                continue
            out[stmt.target.id] = self._field_default(module, stmt.value)
        return out

    def _field_default(self, module: str, value: ast.expr | None) -> dict | None:
        if value is None:
            return None
        if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "field":
            for kw in value.keywords:
                if kw.arg == "default":
                    return self.encode(module, kw.value)
                if kw.arg == "default_factory" and isinstance(kw.value, ast.Lambda):
                    return self.encode(module, kw.value.body)  # the audit calls the factory
                if kw.arg == "default_factory":
                    return _factory(self.encode(module, kw.value))
            return None
        return self.encode(module, value)


def _arithmetic(node: ast.expr) -> int | float | None:
    """The value of `+ - * / // ** %` over numeric constants, else None."""
    ops = {
        ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b,
        ast.Pow: lambda a, b: a**b, ast.Mod: lambda a, b: a % b,
    }  # fmt: skip
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _arithmetic(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        a, b = _arithmetic(node.left), _arithmetic(node.right)
        if a is not None and b is not None:
            return ops[type(node.op)](a, b)
    return None


def _factory(encoded: dict) -> dict:
    """`default_factory=X`: the audit calls it, so store what the call gives where we can."""
    builtins = {"list": "[]", "dict": "{}", "set": "set()", "tuple": "()"}
    name = encoded.get("external") or encoded.get("expr")
    if name in builtins:
        return {"literal": builtins[name]}
    return {"factory": encoded}


def _is_dataclass_decorated(cls: ast.ClassDef) -> bool:
    for deco in cls.decorator_list:
        func = deco.func if isinstance(deco, ast.Call) else deco
        if ast.unparse(func).split(".")[-1] == "dataclass":
            return True
    return False


def version(tree: SourceTree) -> str:
    info = tree.module("package_info")
    values = {}
    for stmt in info.body if info else []:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            try:
                values[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            except ValueError:
                pass
    return ".".join(str(values.get(k, "?")) for k in ("MAJOR", "MINOR", "PATCH"))


def table(root: str | Path, symbols: list[str]) -> dict:
    tree = SourceTree(root)
    return {
        "megatron_core": version(tree),
        "regenerate": "python scripts/megatron_signatures.py <unpacked wheel> (see its docstring)",
        "symbols": {s: tree.describe(s) for s in symbols},
    }


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.api_surface._symbols import SYMBOLS

    out = table(argv[0], SYMBOLS)
    symbols = out.pop("symbols")
    head = json.dumps(out)[:-1]  # one symbol a line: small diffs when a release changes
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in symbols.items()]
    sys.stdout.write(head + ', "symbols": {\n' + ",\n".join(lines) + "\n}}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
