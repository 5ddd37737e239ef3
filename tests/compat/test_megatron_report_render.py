"""`run_megatron_unit_tests.py --render A.json,B.json --report R.md`: one report from the
--results files of runs at different world sizes (scripts/megatron_launch.render_saved)."""

from __future__ import annotations

import json
import sys

import pytest

from tests._paths import REPO

sys.path.insert(0, str(REPO / "scripts"))

import megatron_launch  # noqa: E402


def _saved(path, sizes, gigatron="abc", command="run", megatron="m1"):
    meta = {
        "command": command, "megatron_commit": megatron, "gigatron_commit": gigatron,
        "timeout": "120", "n_files": 1, "n_cpu": 1, "excluded": {}, "test_counts": {"t.py": 2},
    }  # fmt: skip
    out = {"meta": meta}
    for n, passed in sizes.items():
        tests = {f"tests/unit_tests/t.py::test_{i}": {"outcome": "passed", "message": ""}
                 for i in range(passed)}  # fmt: skip
        out[str(n)] = {"tests": tests, "import_errors": {}, "stopped": {}, "files": ["t.py"]}
    path.write_text(json.dumps(out))
    return str(path)


def test_runs_at_other_world_sizes_make_one_report(tmp_path):
    a = _saved(tmp_path / "a.json", {1: 2, 2: 1}, command="run 1,2")
    b = _saved(tmp_path / "b.json", {4: 2, 8: 0}, command="run 4,8")
    report = tmp_path / "r.md"
    assert megatron_launch.render_saved([a, b], str(report)) == 0
    text = report.read_text()
    assert "`run 1,2 ; run 4,8`" in text and "world sizes run: 1, 2, 4, 8" in text
    for row in ("| 1 | 2 | 0 | 0 | 0 | 0 |", "| 2 | 1 |", "| 4 | 2 |", "| 8 | 0 |"):
        assert row in text


def test_runs_at_other_gigatron_commits_name_each_world_sizes_commit(tmp_path):
    a = _saved(tmp_path / "a.json", {1: 2, 2: 1}, gigatron="abc")
    b = _saved(tmp_path / "b.json", {4: 2}, gigatron="def")
    assert megatron_launch.render_saved([a, b], str(tmp_path / "r.md")) == 0
    assert "abc (world size 1, 2); def (world size 4)" in (tmp_path / "r.md").read_text()


def test_files_of_other_megatron_commits_or_the_same_world_size_are_refused(tmp_path):
    a = _saved(tmp_path / "a.json", {1: 2})
    with pytest.raises(SystemExit, match="megatron_commit"):
        megatron_launch.render_saved(
            [a, _saved(tmp_path / "b.json", {2: 1}, megatron="m2")], str(tmp_path / "r.md")
        )
    with pytest.raises(SystemExit, match="world size 1 is in two files"):
        megatron_launch.render_saved(
            [a, _saved(tmp_path / "c.json", {1: 1})], str(tmp_path / "r.md")
        )
    (tmp_path / "old.json").write_text(json.dumps({"1": {}}))
    with pytest.raises(SystemExit, match="no 'meta'"):
        megatron_launch.render_saved([str(tmp_path / "old.json")], str(tmp_path / "r.md"))
