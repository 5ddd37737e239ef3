"""`pretrain_gpt --timeline FILE --timeline-iters 1`: two real 4-rank CPU runs in one spawn
(PP 2 x DP 2 with 1F1B, then PP 2 x VPP 2 x DP 2 interleaved; tiny GPT, 2 iterations, 4
microbatches per DP rank each)
record, in one merged Chrome trace each, exactly the chosen iteration's forwards, backwards and
exchanges, in the order `schedule_plan` gives each pipeline stage (each model chunk's too);
evaluation and the other iteration record nothing. `gigatron schedule --from-timeline` measures
and draws them; its per-stage averaging over DP replicas is checked on hand-made rows."""

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
WORLD, DP = 4, 2
STAGE_OF = {0: 0, 1: 0, 2: 1, 3: 1}  # rank -> pp stage (order tp-cp-ep-dp-pp: DP inside a stage)
RUNS = {  # name -> (virtual pipeline size, extra flags)
    "1f1b": (None, []),
    "interleaved": (2, ["--num-layers", "4", "--virtual-pipeline-model-parallel-size", "2"]),
}


def _run(paths: dict) -> None:
    for name, (_, extra) in RUNS.items():
        run_pretrain_gpt(
            ARGS
            + ["--pipeline-model-parallel-size", "2", "--train-iters", "2"]
            + ["--global-batch-size", str(2 * DP * NUM_MICROBATCHES)]
            + ["--timeline", paths[name], "--timeline-iters", "1", *extra]
        )


def _check_trace(path: str, vpp: int | None) -> None:
    assert isinstance(json.load(open(path))["traceEvents"], list)  # Chrome trace (Perfetto)
    rows = times.read_trace(path)
    assert {r["iteration"] for r in rows} == {1}  # not iteration 0, not the evaluation
    assert {(r["rank"], r["pp"]) for r in rows} == set(STAGE_OF.items())
    plan = schedule_plan(2, NUM_MICROBATCHES, virtual_pipeline_model_parallel_size=vpp)
    assert plan.kind == ("interleaved" if vpp else "1f1b")
    for rank in range(WORLD):
        mine = sorted((r for r in rows if r["rank"] == rank), key=lambda r: r["start"])
        compute = [r for r in mine if r["kind"] in ("forward", "backward")]
        order = [(r["kind"], r["microbatch"], r["chunk"]) for r in compute]
        assert order == [(s.kind, s.microbatch, s.chunk) for s in plan.steps[STAGE_OF[rank]]]
        assert {r["chunk"] for r in compute} == set(range(vpp or 1))
        # every activation / gradient crossing the stage boundary shows as a receive
        recvs = [n for r in mine if r["kind"] == "recv" for n in r["name"].split() if "@" in n]
        assert len([n for n in recvs if re.match(r"[FB]\d+@", n)]) >= NUM_MICROBATCHES
        assert all(a["end"] <= b["start"] + 1e-3 for a, b in zip(compute, compute[1:]))


def test_measured_timeline_follows_the_planned_order(tmp_path, capsys):
    paths = {name: str(tmp_path / f"{name}.json") for name in RUNS}
    run_distributed(_run, WORLD, args=(paths,), timeout=300)
    for name, (vpp, _) in RUNS.items():
        _check_trace(paths[name], vpp)

    svg = tmp_path / "measured.svg"
    assert schedule.main(["--from-timeline", paths["interleaved"], "--out", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "pp stage 0 (ranks [0, 1]): bubble" in out and "pp stage 1 (ranks [2, 3])" in out
    text = svg.read_text()
    for row in range(WORLD):  # one row per rank: M forwards and M backwards per model chunk
        for chunk in range(2):
            assert len(re.findall(rf'id="F-s{row}-m\d+-c{chunk}"', text)) == NUM_MICROBATCHES
            assert len(re.findall(rf'id="B-s{row}-m\d+-c{chunk}"', text)) == NUM_MICROBATCHES


def test_measured_stages_average_their_dp_replicas():
    def row(rank, pp, kind, start, end):
        return {"rank": rank, "pp": pp, "kind": kind, "start": start, "end": end}

    rows = [  # span 10 ms; ranks 0, 1: pp 0 (busy 4 and 6); ranks 2, 3: pp 1 (busy 10 and 2)
        row(0, 0, "forward", 0, 4), row(1, 0, "backward", 2, 8), row(1, 0, "recv", 0, 2),
        row(2, 1, "forward", 0, 10), row(3, 1, "backward", 8, 10), row(3, 1, "recv", 1, 8),
    ]  # fmt: skip
    m = times.measure(rows)
    assert m["span_ms"] == 10
    assert m["stages"][0] == {"bubble": pytest.approx(0.5), "comm_wait_ms": 1.0, "ranks": [0, 1]}
    assert m["stages"][1] == {"bubble": pytest.approx(0.4), "comm_wait_ms": 3.5, "ranks": [2, 3]}


def test_negative_timeline_iteration_is_refused_by_name():
    from types import SimpleNamespace

    from gigatron.training._timeline import check_timeline_args

    with pytest.raises(ValueError, match=r"--timeline-iters \(\[-1\]\) must be iteration numbers"):
        check_timeline_args(SimpleNamespace(timeline="t.json", timeline_iters=[2, -1]))
