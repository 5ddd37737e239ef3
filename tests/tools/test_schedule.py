"""`gigatron schedule`: the planned schedule is the executor's table (`schedule_plan`, what
`get_forward_backward_func`'s schedules run), drawn with one SVG box per forward / backward per
stage; the simulated bubble of 1F1B is (P-1)/(M+P-1) and of interleaving (P-1)/(V*M+P-1);
PP 16 x 64 microbatches at the data level."""

import re

import pytest

from gigatron.cli import main as cli_main
from gigatron.core.pipeline_parallel.schedule_plan import BACKWARD, FORWARD, schedule_plan
from gigatron.tools import _schedule_times as times
from gigatron.tools import schedule


@pytest.mark.parametrize("pp, m", [(2, 1), (2, 4), (4, 4), (4, 8), (3, 7), (8, 5)])
def test_planned_1f1b_bubble_is_the_formula(pp, m):
    plan = schedule_plan(pp, m)
    assert plan.kind == "1f1b"
    bubble = times.bubbles(times.simulate(plan), pp)
    assert bubble == pytest.approx([(pp - 1) / (m + pp - 1)] * pp, abs=1e-12)


@pytest.mark.parametrize("pp, m, v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (4, 12, 3)])
def test_planned_interleaved_bubble_is_the_formula(pp, m, v):
    plan = schedule_plan(pp, m, virtual_pipeline_model_parallel_size=v)
    bubble = times.bubbles(times.simulate(plan), pp)
    assert bubble == pytest.approx([(pp - 1) / (v * m + pp - 1)] * pp, abs=1e-12)


def test_svg_boxes_per_stage_and_phases(tmp_path, capsys):
    svg = tmp_path / "interleaved.svg"
    argv = ["--pp", "4", "--num-microbatches", "8", "--vpp", "2", "--out", str(svg)]
    assert schedule.main(argv) == 0
    text = svg.read_text()
    for stage in range(4):
        for kind in "FB":
            boxes = re.findall(rf'id="{kind}-s{stage}-m(\d+)-c(\d+)"', text)
            assert sorted(boxes) == sorted((str(mb), str(c)) for mb in range(8) for c in range(2))
        for phase in ("warmup", "steady", "cooldown"):
            assert f'id="phase-{phase}-s{stage}"' in text
    out = capsys.readouterr().out
    assert "bubble (idle fraction of the step): 0.1579; formula (P-1)/(V*M+P-1)" in out
    assert "= 0.1579" in out


def test_plan_is_what_the_schedules_run_and_scales():
    plan = schedule_plan(16, 64)
    rows = times.simulate(plan)
    for rank in range(16):
        steps = plan.steps[rank]
        assert plan.warmup[rank] == 16 - rank - 1
        assert sum(s.kind == FORWARD for s in steps) == sum(s.kind == BACKWARD for s in steps)
        mine = [(r["kind"], r["microbatch"]) for r in rows if r["rank"] == rank]
        assert mine == [(s.kind, s.microbatch) for s in steps] and len(mine) == 128
    phases = schedule.phases(plan.steps[0], plan.warmup[0])
    assert phases.count("warmup") == 15 and phases.count("cooldown") == 15
    assert times.bubbles(rows, 16)[0] == pytest.approx(15 / 79)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pp", "4", "--num-microbatches", "0"], "num_microbatches (0) must be >= 1"),
        (["--pp", "4", "--num-microbatches", "2", "--vpp", "2"],
         "microbatch_group_size_per_vp_stage (4) must lie in"),
        (["--pp", "4"], "give --pp and --num-microbatches"),
    ],
)  # fmt: skip
def test_bad_schedules_are_one_line_errors(argv, message, capsys):
    assert cli_main(["schedule", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gigatron schedule: error:") and message in err
