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
        (
            ["--pp", "4", "--vpp", "2", "--num-layers", "6"],
            "--num-layers (6) must be a positive multiple of --pp x --vpp (4 x 2 = 8)",
        ),
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


def test_vpp_model_chunks_follow_megatrons_layer_offsets(tmp_path, capsys):
    """chunk c of pp rank r is virtual stage c*P + r; its layers are what the model builds."""
    import torch

    from gigatron.core.transformer import TransformerConfig
    from gigatron.core.transformer.transformer_layer import (
        get_num_layers_to_build,
        get_transformer_layer_offset,
    )

    pp, vpp, num_layers = 4, 3, 24
    svg = tmp_path / "chunks.svg"
    argv = ["--world-size", "8", "--pp", str(pp), "--vpp", str(vpp), "--num-layers",
            str(num_layers), "--out", str(svg)]  # fmt: skip
    assert layout.main(argv) == 0
    ids = re.findall(r'id="chunk-p(\d+)-c(\d+)-s(\d+)"', svg.read_text())
    found = sorted((int(s), int(p), int(c)) for p, c, s in ids)
    assert found == [(c * pp + p, p, c) for c in range(vpp) for p in range(pp)]  # one box each
    config = TransformerConfig(num_layers=num_layers, hidden_size=32, num_attention_heads=4,
                               pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
                               virtual_pipeline_model_parallel_size=vpp)  # fmt: skip
    out = capsys.readouterr().out
    for p in range(pp):
        parts = []
        for c in range(vpp):
            first = get_transformer_layer_offset(config, vp_stage=c, pp_rank=p)
            last = first + get_num_layers_to_build(config, vp_stage=c, pp_rank=p) - 1
            parts.append(f"chunk {c} = stage {c * pp + p} (layers {first}-{last})")
        assert f"  pp {p}: " + "; ".join(parts) in out.splitlines()
    assert "  pp 1: chunk 0 = stage 1 (layers 2-3); chunk 1 = stage 5 (layers 10-11)" in out

    # without --num-layers: the stages only; without --vpp: one chunk per rank
    assert [c["stage"] for c in layout.model_chunks(2, 2, None) if c["pp_rank"] == 1] == [1, 3]
    assert [c["layers"] for c in layout.model_chunks(2, None, 8)] == [(0, 3), (4, 7)]
