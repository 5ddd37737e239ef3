"""Schedule tables against hand-drawn cases, Megatron's warmup rule, and a pure simulation that
every rank's table can run to the end (no deadlock) with each input produced before use."""

import pytest

from gigatron.core.pipeline_parallel._schedule_table import (
    FORWARD,
    get_schedule_table,
    interleaved_table,
    no_pipelining_table,
    num_warmup_microbatches,
    one_f_one_b_table,
    slot_plan,
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


def _plans(pp, vp, m, group, forward_only):
    plans = []
    for r in range(pp):
        if vp == 1:
            steps = one_f_one_b_table(pp, r, m, forward_only=forward_only)
        else:
            steps = interleaved_table(
                pp, r, m, vp, microbatch_group_size_per_vp_stage=group, forward_only=forward_only
            )
        warmup = num_warmup_microbatches(
            pp_size=pp, pp_rank=r, num_microbatches=m, num_model_chunks=vp, interleaved=vp > 1,
            microbatch_group_size_per_vp_stage=group, forward_only=forward_only,
        )  # fmt: skip
        plans.append((steps, slot_plan(steps, warmup, pp, r, vp, pair_steady=vp > 1)))
    return plans


def _batches(plan, two_phase):
    """The executor's batches: before each slot, the previous slot's sends + this slot's recvs
    (`separate`: sends first, alone). two_phase (variable_seq_lengths over NCCL): each batch
    becomes a batch of shape messages followed by a batch of data."""
    out, pending = [], []

    def emit(sends, recvs):
        if sends or recvs:
            if two_phase:
                out.append(([("shape", t) for t in sends], [("shape", t) for t in recvs]))
            out.append((sends, recvs))

    for slot in plan:
        if slot.separate:
            emit(pending, [])
            pending = []
        emit(pending, slot.recvs)
        pending = slot.sends
    emit(pending, [])
    return out


def _simulate(plans, rendezvous, two_phase=False):
    """Run every rank's batches; a batch completes when each receive's send has been posted and,
    with `rendezvous` (NCCL groups), each send's receive too. Returns per-link message orders."""
    batches = [_batches(plan, two_phase) for _, plan in plans]
    pos, sent, received = [0] * len(plans), set(), set()
    while any(p < len(b) for p, b in zip(pos, batches)):
        for r, b in enumerate(batches):
            if pos[r] < len(b):
                sent.update(b[pos[r]][0])
                received.update(b[pos[r]][1])
        moved = False
        for r, b in enumerate(batches):
            if pos[r] < len(b):
                sends, recvs = b[pos[r]]
                if all(t in sent for t in recvs) and (
                    not rendezvous or all(t in received for t in sends)
                ):
                    pos[r] += 1
                    moved = True
        assert moved, f"deadlock at batch positions {pos}"
    assert sent == received  # every tensor sent is received exactly once, and vice versa
    if two_phase:
        return None
    pp = len(plans)
    links = {}
    for r, (_, plan) in enumerate(plans):
        for slot in plan:
            for t in slot.sends:  # sender's order on the link r -> receiver
                links.setdefault(("send", r, t.stage % pp), []).append(t)
            for t in slot.recvs:  # receiver's order on the link sender -> r
                src = (t.stage - 1 if t.kind == FORWARD else t.stage + 1) % pp
                links.setdefault(("recv", src, r), []).append(t)
    return links


@pytest.mark.parametrize(
    "pp,vp,m,group",
    [(2, 1, 1, None), (2, 1, 4, None), (4, 1, 2, None), (4, 1, 8, None), (3, 1, 2, None),
     (8, 1, 3, None), (2, 2, 2, None), (2, 2, 4, None), (2, 2, 8, None), (4, 2, 4, None),
     (4, 2, 8, None), (4, 3, 12, None), (2, 4, 6, None), (3, 2, 6, None), (2, 2, 5, 3),
     (2, 3, 8, 4), (4, 2, 8, 8), (8, 2, 8, None)],
)  # fmt: skip
@pytest.mark.parametrize("forward_only", [False, True])
def test_plans_run_without_deadlock_and_in_link_order(pp, vp, m, group, forward_only):
    plans = _plans(pp, vp, m, group, forward_only)
    n_kinds = 1 if forward_only else 2
    for steps, plan in plans:
        assert len(steps) == len(set(steps)) == m * vp * n_kinds
        assert [s for slot in plan for s in slot.steps] == steps
    # every stage runs every microbatch: the union of steps covers all (mb, stage, kind)
    done = {(s.kind, s.microbatch, s.chunk * pp + r) for r, (st, _) in enumerate(plans) for s in st}
    assert len(done) == m * pp * vp * n_kinds
    links = _simulate(plans, rendezvous=False)  # gloo: sends never block
    if group not in (None, pp):
        return  # larger groups: gloo only (schedules.py rejects them on NCCL)
    links = _simulate(plans, rendezvous=True)  # NCCL: a batch waits for all of its ops
    if vp == 1 or m != pp or pp == 2:  # schedules.py rejects the rest with variable lengths
        _simulate(plans, rendezvous=True, two_phase=True)  # NCCL + variable_seq_lengths
    # Each link carries its messages (activations and gradients together) in the order the
    # receiver consumes them, so NCCL, which ignores tags, pairs them correctly too.
    for (kind, src, dst), order in links.items():
        if kind == "send":
            assert order == links.get(("recv", src, dst), []), (src, dst)
