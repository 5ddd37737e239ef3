"""Schedule tables against hand-drawn cases, Megatron's warmup rule, and a pure simulation that
every rank's table can run to the end (no deadlock) with each input produced before use."""

import pytest

from gigatron.core.pipeline_parallel._schedule_table import (
    BACKWARD,
    FORWARD,
    get_schedule_table,
    interleaved_table,
    no_pipelining_table,
    num_warmup_microbatches,
    one_f_one_b_table,
)


def _s(steps):
    return " ".join(repr(s) for s in steps)


def test_no_pipelining():
    assert _s(no_pipelining_table(3)) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0"
    assert _s(no_pipelining_table(3, forward_only=True)) == "F0.0 F1.0 F2.0"


# Hand-drawn 1F1B, pp = 4, M = 4: rank r warms up with 3 - r forwards.
ONE_F_ONE_B_PP4_M4 = {
    0: "F0.0 F1.0 F2.0 F3.0 B0.0 B1.0 B2.0 B3.0",
    1: "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 B2.0 B3.0",
    2: "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 B3.0",
    3: "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0",
}


@pytest.mark.parametrize("rank", range(4))
def test_one_f_one_b_hand_drawn(rank):
    assert _s(one_f_one_b_table(4, rank, 4)) == ONE_F_ONE_B_PP4_M4[rank]


def test_one_f_one_b_fewer_microbatches_than_stages():
    # warmup is capped at M: rank 0 of 4 with M = 2 runs all forwards, then all backwards
    assert _s(one_f_one_b_table(4, 0, 2)) == "F0.0 F1.0 B0.0 B1.0"
    assert _s(one_f_one_b_table(4, 3, 2)) == "F0.0 B0.0 F1.0 B1.0"
    assert _s(one_f_one_b_table(4, 1, 3, forward_only=True)) == "F0.0 F1.0 F2.0"


def test_megatron_schedule_table_example():
    # The example in Megatron's source: PP2, group 3, M 5, VP2.
    table = get_schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


# Hand-drawn interleaved, pp = 2, vp = 2, M = 4 (group = pp = 2).
# Forward order (mb.chunk): 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1; backward: same, chunks reversed.
# Warmup: rank 0: 2 * (2 - 0 - 1) + (2 - 1) * 2 = 4, rank 1: 0 + 2 = 2.
INTERLEAVED_PP2_VP2_M4 = {
    0: "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0",
    1: "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0",
}


@pytest.mark.parametrize("rank", range(2))
def test_interleaved_hand_drawn(rank):
    assert _s(interleaved_table(2, rank, 4, 2)) == INTERLEAVED_PP2_VP2_M4[rank]


def test_warmup_rule():
    kw = dict(num_model_chunks=2, microbatch_group_size_per_vp_stage=4, interleaved=True)
    assert num_warmup_microbatches(pp_size=4, pp_rank=0, num_microbatches=8, **kw) == 6 + 4
    assert num_warmup_microbatches(pp_size=4, pp_rank=3, num_microbatches=8, **kw) == 4
    assert num_warmup_microbatches(pp_size=4, pp_rank=0, num_microbatches=4, **kw) == 8  # capped
    assert num_warmup_microbatches(pp_size=4, pp_rank=1, num_microbatches=8) == 2
    assert num_warmup_microbatches(pp_size=1, pp_rank=0, num_microbatches=8) == 0


def test_interleaving_errors_name_values():
    with pytest.raises(ValueError, match=r"\(4\).*\[pipeline_model_parallel_size \(4\), "):
        interleaved_table(4, 0, 3, 2)  # M < pp
    with pytest.raises(ValueError, match=r"microbatch_group_size_per_vp_stage \(9\)"):
        interleaved_table(2, 0, 8, 2, microbatch_group_size_per_vp_stage=9)
    with pytest.raises(RuntimeError, match=r"num_microbatches \(5\) % .* = 1"):
        interleaved_table(4, 0, 5, 2)  # final group of 1 < pp


def _simulate(tables, pp, vp):
    """Run all ranks' tables with async sends and blocking receives; return per-link orders.

    A forward of (mb, c) on rank r needs the forward of virtual stage c * pp + r - 1; a backward
    needs its own forward and the backward of the next virtual stage. Fails on deadlock.
    """
    done, pos = set(), [0] * pp
    sent = {}  # (src, dst, direction) -> list of (mb, stage) in send order
    recvd = {}
    last = pp * vp - 1
    while any(pos[r] < len(tables[r]) for r in range(pp)):
        progressed = False
        for r in range(pp):
            while pos[r] < len(tables[r]):
                st = tables[r][pos[r]]
                stage = st.chunk * pp + r
                if st.kind == FORWARD:
                    dep = None if stage == 0 else (FORWARD, st.microbatch, stage - 1)
                else:
                    dep = None if stage == last else (BACKWARD, st.microbatch, stage + 1)
                    assert (FORWARD, st.microbatch, stage) in done
                if dep is not None and dep not in done:
                    break
                if dep is not None:
                    src = dep[2] % pp
                    recvd.setdefault((src, r, st.kind), []).append((st.microbatch, stage))
                    sent.setdefault((src, r, st.kind), [])
                done.add((st.kind, st.microbatch, stage))
                pos[r] += 1
                progressed = True
        assert progressed, f"deadlock at positions {pos}"
    # messages over each link, in the order the sender produced them
    for src, dst, kind in recvd:
        step = 1 if kind == FORWARD else -1
        sent[(src, dst, kind)] = [
            (s.microbatch, s.chunk * pp + src + step)
            for s in tables[src]
            if s.kind == kind
            and 0 <= s.chunk * pp + src + step <= last
            and (s.chunk * pp + src + step) % pp == dst
        ]
    return sent, recvd, done


@pytest.mark.parametrize(
    "pp,vp,m,group",
    [(2, 1, 1, None), (2, 1, 4, None), (4, 1, 2, None), (4, 1, 8, None), (2, 2, 2, None),
     (2, 2, 4, None), (2, 2, 8, None), (4, 2, 4, None), (4, 2, 8, None), (4, 3, 12, None),
     (2, 4, 6, None), (3, 2, 6, None), (2, 2, 5, 3), (2, 3, 8, 4), (4, 2, 8, 8)],
)  # fmt: skip
@pytest.mark.parametrize("forward_only", [False, True])
def test_tables_run_without_deadlock_and_in_link_order(pp, vp, m, group, forward_only):
    if vp == 1:
        tables = [one_f_one_b_table(pp, r, m, forward_only=forward_only) for r in range(pp)]
    else:
        tables = [
            interleaved_table(
                pp, r, m, vp, microbatch_group_size_per_vp_stage=group, forward_only=forward_only
            )
            for r in range(pp)
        ]
    sent, recvd, done = _simulate(tables, pp, vp)
    n_kinds = 1 if forward_only else 2
    assert len(done) == m * pp * vp * n_kinds  # every step of every stage ran exactly once
    for t in tables:
        assert len(t) == len(set(t)) == m * vp * n_kinds
    # Per link and direction, receivers consume messages in the order they were sent (NCCL
    # matches point-to-point messages by order, not by tag).
    for link, got in recvd.items():
        assert got == sent[link], link
