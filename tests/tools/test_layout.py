"""`gigatron layout`: the table and the picture carry initialize_model_parallel's groups
(`parallel_state.rank_layout`): one SVG box per rank per axis, as many per group as its size,
groups that leave a node marked; 1,024 ranks at the data level; Megatron's order rules."""

import re

import pytest

from gigatron.cli import main as cli_main
from gigatron.core.parallel_state import rank_layout
from gigatron.tools import layout

pytest.importorskip("matplotlib")


def test_svg_boxes_per_group_and_node_crossing(tmp_path, capsys):
    svg = tmp_path / "layout.svg"
    argv = ["--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2", "--out", str(svg)]
    assert layout.main(argv) == 0
    text = svg.read_text()
    ids = re.findall(r'id="rank-(\w+)-g(\d+)-r(\d+)"', text)
    ref = rank_layout(16, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                      context_parallel_size=2)  # fmt: skip
    for axis in ("tp", "cp", "dp", "pp"):
        mine = [(int(g), int(r)) for a, g, r in ids if a == axis]
        assert sorted(r for _, r in mine) == list(range(16))  # every rank once per panel
        by_group: dict[int, list[int]] = {}
        for g, r in mine:
            by_group.setdefault(g, []).append(r)
        assert [sorted(by_group[g]) for g in sorted(by_group)] == ref.groups[axis]
    assert {a for a, _, _ in ids} == {"tp", "cp", "dp", "pp"}  # ep = 1: no panel
    out = capsys.readouterr().out
    # default order tp-cp-ep-dp-pp, 8 per node: only the pipeline groups leave a node
    assert "tp groups: 8 of 2 ranks, 0 spanning several nodes" in out
    assert "pp groups: 8 of 2 ranks, 8 spanning several nodes" in out
    assert "[0, 8]*" in out
    row = next(line for line in out.splitlines() if line.split()[:2] == ["11", "1"])
    assert row.split() == ["11", "1", "1", "1", "0", "0", "1"]  # rank node tp cp ep dp pp


def test_thousand_ranks_at_the_data_level():
    lay = rank_layout(1024, tensor_model_parallel_size=8, pipeline_model_parallel_size=8,
                      context_parallel_size=2, expert_model_parallel_size=4,
                      order="tp-cp-ep-dp-pp")  # fmt: skip
    data = layout.describe(lay, 8)
    sizes = {"tp": 8, "cp": 2, "ep": 4, "dp": 8, "pp": 8}
    assert list(data["axes"]) == ["tp", "cp", "ep", "dp", "pp"]
    for axis, size in sizes.items():
        groups = data["axes"][axis]["groups"]
        assert len(groups) == 1024 // size and all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(1024))
    assert data["axes"]["tp"]["crossing"] == []  # TP 8 fills one 8-GPU node
    assert len(data["axes"]["pp"]["crossing"]) == 1024 // 8
    assert data["rows"][1023] == {"rank": 1023, "node": 127, "tp": 7, "cp": 1, "ep": 3,
                                  "dp": 7, "pp": 7}  # fmt: skip


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tp", "3"], "world size (8) is not divisible by tensor (3)"),
        (["--tp", "2", "--order", "tp-pp"], "order 'tp-pp' is missing 'dp', whose size is 4"),
        (["--order", "tp-xx-dp"], "order 'tp-xx-dp' has unknown axes ['xx']"),
        (["--out", "a.jpg"], "must end in one of"),
        (["--vpp", "2"], "--vpp (2) needs --pp > 1"),
    ],
)
def test_bad_layouts_are_one_line_errors(argv, message, capsys):
    assert cli_main(["layout", "--world-size", "8", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gigatron layout: error:") and message in err and "\n" not in err


def test_missing_matplotlib_is_one_line(monkeypatch, tmp_path, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = str(tmp_path / "x.svg")
    assert cli_main(["layout", "--world-size", "2", "--tp", "2", "--out", out]) == 2
    assert "needs matplotlib: pip install 'gigatron[plot]'" in capsys.readouterr().err
