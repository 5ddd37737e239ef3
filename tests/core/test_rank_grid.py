"""Rank layout tables, checked by hand against Megatron's documented examples."""

import itertools

import pytest

from gigatron.core._rank_grid import RankGenerator, dense_and_expert_generators


def _grids(world, order, tp=1, pp=1, cp=1, ep=1, etp=None):
    return dense_and_expert_generators(
        world, tp=tp, pp=pp, cp=cp, ep=ep, etp=tp if etp is None else etp, order=order
    )


# (world, order, sizes, {token: groups} dense, {token: groups} expert)
CASES = [
    (
        16,
        "tp-cp-ep-dp-pp",
        dict(tp=2, cp=2, pp=2, ep=4, etp=1),
        {
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
            "cp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
            "dp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
            "dp-cp": [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]],
            "pp": [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]],
            "tp-cp": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
            "tp-pp": [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]],
        },
        {
            "ep": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
            "dp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
            "tp": [[r] for r in range(16)],
            "pp": [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]],
        },
    ),
    (
        8,
        "tp-cp-ep-dp-pp",
        dict(tp=2, cp=2, pp=2, ep=2, etp=1),
        {
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
            "cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
            "dp": [[r] for r in range(8)],
            "dp-cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
            "pp": [[0, 4], [1, 5], [2, 6], [3, 7]],
            "tp-pp": [[0, 1, 4, 5], [2, 3, 6, 7]],
        },
        {
            "ep": [[0, 1], [2, 3], [4, 5], [6, 7]],
            "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        },
    ),
    (
        8,
        "tp-cp-ep-dp-pp",
        dict(tp=2, pp=1, ep=4, etp=2),
        {
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
            "dp": [[0, 2, 4, 6], [1, 3, 5, 7]],
            "pp": [[r] for r in range(8)],
        },
        {
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
            "ep": [[0, 2, 4, 6], [1, 3, 5, 7]],
            "dp": [[r] for r in range(8)],
            "tp-ep": [list(range(8))],
        },
    ),
    (
        8,
        "tp-pp-dp",
        dict(tp=2, pp=2),
        {
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
            "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
            "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
            "tp-pp": [[0, 1, 2, 3], [4, 5, 6, 7]],
            "cp": [[r] for r in range(8)],
        },
        {
            "ep": [[r] for r in range(8)],
            "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        },
    ),
    (
        16,
        "tp-pp-dp",
        dict(tp=2, pp=2),
        {
            "tp": [[2 * i, 2 * i + 1] for i in range(8)],
            "pp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
            "dp": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
            "tp-pp": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
            "tp-dp": [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]],
        },
        {
            "dp": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
        },
    ),
]


@pytest.mark.parametrize("world,order,sizes,dense_expected,expert_expected", CASES)
def test_hand_checked_groups(world, order, sizes, dense_expected, expert_expected):
    dense, expert = _grids(world, order, **sizes)
    for token, groups in dense_expected.items():
        assert dense.get_ranks(token) == groups, token
    for token, groups in expert_expected.items():
        assert expert.get_ranks(token) == groups, token


def test_groups_partition_the_world():
    dense, expert = _grids(16, "tp-cp-ep-dp-pp", tp=2, cp=2, pp=2, ep=2, etp=2)
    for gen, tokens in (
        (dense, ["tp", "cp", "dp", "pp", "dp-cp", "tp-pp", "tp-dp-cp"]),
        (expert, ["tp", "ep", "dp", "tp-ep", "tp-ep-pp"]),
    ):
        for token in tokens:
            flat = sorted(itertools.chain.from_iterable(gen.get_ranks(token)))
            assert flat == list(range(16)), token


def test_token_order_in_query_does_not_matter_and_offset_applies():
    gen = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-cp-ep-dp-pp", rank_offset=8)
    assert gen.get_ranks("dp-tp") == gen.get_ranks("tp-dp")
    assert gen.get_ranks("tp")[0] == [8, 9]


@pytest.mark.parametrize(
    "world,kwargs,message",
    [
        (8, dict(tp=3), r"world size \(8\) is not divisible by .*\(3\)"),
        (8, dict(tp=2, pp=2, cp=4), r"world size \(8\) is not divisible .* \(16\)"),
        (8, dict(tp=2, ep=3), r"expert model \(3\)"),
        (8, dict(tp=2, order="tp-dp-pp", cp=2), r"missing 'cp', whose size is 2"),
        (8, dict(tp=2, order="tp-xx-dp"), r"unknown axes \['xx'\]"),
        (8, dict(tp=2, order="tp-dp-tp"), r"names an axis twice"),
        (8, dict(tp=0), r"tensor model parallel size \(0\) must be >= 1"),
        (8, dict(pp=2, ep=4, etp=1, order="tp-pp-ep-dp"), r"expert data parallel size \(1\)"),
    ],
)
def test_impossible_layouts_raise_with_numbers(world, kwargs, message):
    kwargs = dict(kwargs)
    order = kwargs.pop("order", "tp-cp-ep-dp-pp")
    with pytest.raises(ValueError, match=message):
        _grids(world, order, **kwargs)


def test_pp_not_last_with_a_different_expert_dp_is_megatrons_assertion():
    """Megatron asserts it (AssertionError); gigatron's error is also a ValueError."""
    with pytest.raises(AssertionError, match=r"order 'tp-pp-ep-dp' does not end with 'pp'"):
        _grids(4, "tp-pp-ep-dp", pp=2, ep=2)


def _golden_cases():
    for world in (8, 16, 32, 64):
        for tp, pp, cp, ep in itertools.product((1, 2, 4), (1, 2, 4), (1, 2), (1, 2, 4)):
            if world % (tp * pp * cp) or world % (tp * pp * ep):
                continue
            yield world, tp, pp, cp, ep


def test_matches_megatron_core_rank_generator():
    """Every group of every layout equals megatron-core's, when megatron-core is installed."""
    mps = pytest.importorskip("megatron.core.parallel_state")
    count = 0
    for order in ("tp-cp-ep-dp-pp", "tp-pp-dp", "tp-dp-pp", "tp-cp-ep-pp-dp"):
        for world, tp, pp, cp, ep in _golden_cases():
            dp = world // (tp * pp * cp)
            try:
                dense, expert = _grids(world, order, tp=tp, pp=pp, cp=cp, ep=ep)
            except ValueError:
                continue
            ref_dense = mps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
            ref_expert = mps.RankGenerator(
                tp=tp, ep=ep, dp=world // (tp * ep * pp), pp=pp, cp=1, order=order
            )
            for token in ("tp", "pp", "dp", "cp", "dp-cp", "tp-pp", "tp-dp-cp", "tp-cp"):
                assert dense.get_ranks(token) == ref_dense.get_ranks(token), (order, token)
            for token in ("tp", "ep", "dp", "tp-ep", "tp-ep-pp"):
                assert expert.get_ranks(token) == ref_expert.get_ranks(token), (order, token)
            count += 1
    assert count > 50
