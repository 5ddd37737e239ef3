"""docs/compat.md against the code: every row marked supported (or default only) must hold."""

import dataclasses
import importlib
import inspect
import re

import pytest

from tests._paths import REPO

TABLE = REPO / "docs" / "compat.md"
ROW = re.compile(
    r"^\| `(?P<path>[^`]+)` \| (?P<kind>\w+) \| (?P<status>[^|]+) \| (?P<params>[^|]*)\|$"
)


def _rows():
    for line in TABLE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            yield m["path"], m["kind"], m["status"].strip(), m["params"].strip()


def _resolve(path: str):
    module_name, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def test_table_has_rows():
    rows = list(_rows())
    assert len(rows) > 300
    assert sum(r[2] == "supported" for r in rows) > 100


@pytest.mark.parametrize(
    "path,kind,params",
    [(p, k, a) for p, k, s, a in _rows() if s == "supported" and k != "field"],
)
def test_supported_name_has_documented_signature(path, kind, params):
    obj = _resolve("gigatron" + path[len("megatron") :])
    assert inspect.isclass(obj) == (kind == "class"), path
    target = obj.__init__ if inspect.isclass(obj) else obj
    sig = inspect.signature(target)
    ours = set(sig.parameters)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    wanted = [p.strip() for p in params.split(",") if p.strip()]
    missing = [p for p in wanted if p not in ours]
    assert not missing, f"{path} lacks parameters {missing}"


@pytest.mark.parametrize(
    "path", [p for p, k, s, _ in _rows() if k == "field" and s in ("supported", "default only")]
)
def test_supported_config_field_exists(path):
    cls_path, _, field = path.rpartition(".")
    cls = _resolve("gigatron" + cls_path[len("megatron") :])
    assert field in {f.name for f in dataclasses.fields(cls)}, path
