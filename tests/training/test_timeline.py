"""`pretrain_gpt --timeline FILE --timeline-iters 1`: a real 4-rank CPU run (PP 2 x DP 2, tiny
GPT, 2 iterations) records, in one merged Chrome trace, exactly the chosen iteration's forwards,
backwards and exchanges, in the order `schedule_plan` gives each pipeline stage; evaluation and
the other iteration record nothing. `gigatron schedule --from-timeline` measures and draws it."""

import json
import re

import pytest

from gigatron.core.pipeline_parallel.schedule_plan import schedule_plan
from gigatron.testing import run_distributed
from gigatron.tools import _schedule_times as times
from gigatron.tools import schedule
from tests.training._gpt_runs import ARGS, run_pretrain_gpt

pytestmark = pytest.mark.multirank

NUM_MICROBATCHES = 4  # global 16 = micro 2 x DP 2 x 4


def _run(path: str) -> None:
    run_pretrain_gpt(
        ARGS
        + ["--global-batch-size", "16", "--pipeline-model-parallel-size", "2"]
        + ["--train-iters", "2", "--timeline", path, "--timeline-iters", "1"]
    )


def test_measured_timeline_follows_the_planned_order(tmp_path, capsys):
    path = str(tmp_path / "timeline.json")
    run_distributed(_run, 4, args=(path,), timeout=300)
    data = json.load(open(path))
    assert isinstance(data["traceEvents"], list)  # Chrome trace JSON (Perfetto loads it)
    rows = times.read_trace(path)
    assert {r["iteration"] for r in rows} == {1}  # not iteration 0, not the evaluation
    assert {r["rank"] for r in rows} == {0, 1, 2, 3}
    plan = schedule_plan(2, NUM_MICROBATCHES)
    for rank in range(4):
        mine = sorted((r for r in rows if r["rank"] == rank), key=lambda r: r["start"])
        compute = [r for r in mine if r["kind"] in ("forward", "backward")]
        order = [(r["kind"], r["microbatch"], r["chunk"]) for r in compute]
        pp = mine[0]["pp"]
        assert order == [(s.kind, s.microbatch, s.chunk) for s in plan.steps[pp]]
        # every activation / gradient crossing the stage boundary shows as a receive
        recvs = [n for r in mine if r["kind"] == "recv" for n in r["name"].split() if "@" in n]
        assert len([n for n in recvs if re.match(r"[FB]\d+@", n)]) >= NUM_MICROBATCHES
        assert all(a["end"] <= b["start"] + 1e-3 for a, b in zip(compute, compute[1:]))

    svg = tmp_path / "measured.svg"
    assert schedule.main(["--from-timeline", path, "--out", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "pp stage 0 (ranks [0, 1]): bubble" in out and "pp stage 1 (ranks [2, 3])" in out
    text = svg.read_text()
    for row in range(4):  # one row per rank: M forwards and M backwards each
        assert len(re.findall(rf'id="F-s{row}-m\d+-c0"', text)) == NUM_MICROBATCHES
        assert len(re.findall(rf'id="B-s{row}-m\d+-c0"', text)) == NUM_MICROBATCHES


def test_negative_timeline_iteration_is_refused_by_name():
    from types import SimpleNamespace

    from gigatron.training._timeline import check_timeline_args

    with pytest.raises(ValueError, match=r"--timeline-iters \(\[-1\]\) must be iteration numbers"):
        check_timeline_args(SimpleNamespace(timeline="t.json", timeline_iters=[2, -1]))
