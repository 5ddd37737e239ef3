"""The hybrid layer pattern: parsing (main / MTP parts), counts, and the pipeline stage of each
rank by `|` segments or an even split, with the refusals naming the rule (no processes)."""

import pytest

from gigatron.core.models.hybrid.hybrid_layer_allocation import (
    get_hybrid_layer_counts,
    get_hybrid_total_layer_count,
    get_hybrid_total_pipeline_segment_count,
    parse_hybrid_pattern,
    select_pipeline_segment,
)


def test_parse_splits_main_and_mtp_and_counts_layers():
    parsed = parse_hybrid_pattern("M-M-|M-M*-/MM/MM")
    assert (parsed.main_pattern, parsed.mtp_pattern, parsed.mtp_num_depths) == (
        "M-M-|M-M*-",
        "MM",
        2,
    )
    assert parse_hybrid_pattern("M*M*").mtp_num_depths == 0
    assert get_hybrid_total_layer_count("M-M-|M-M*-/MM") == 9
    assert get_hybrid_total_pipeline_segment_count("M-M-|M-M*-/MM") == 2
    counts = get_hybrid_layer_counts("M*M-|E-")
    assert (counts["M"], counts["*"], counts["-"], counts["E"], counts["G"]) == (2, 1, 2, 1, 0)


@pytest.mark.parametrize(
    "pattern, match",
    [("M*X", "'X' is not a valid layer symbol"), ("MM/M*/MM", "All MTP patterns must be identical"),
     ("M*+", "both Attention and MLA/DSA")],
)  # fmt: skip
def test_bad_patterns_are_refused_by_rule(pattern, match):
    with pytest.raises(ValueError, match=match):
        parse_hybrid_pattern(pattern)


@pytest.mark.parametrize(
    "pattern, pp_rank, pp_size, vp_stage, expected",
    [
        ("M*M-", 0, 1, None, (list("M*M-"), 0)),
        ("M*|M-", 1, 2, None, (list("M-"), 2)),
        ("M*M-", 1, 2, None, (list("M-"), 2)),  # no pipes: even split
        ("M|*|M|-", 1, 2, 1, (list("-"), 3)),  # virtual stage 1 of rank 1: segment 3
        ("MM|*|M-", 2, 3, None, (list("M-"), 3)),
    ],
)
def test_pipeline_segment_of_each_stage(pattern, pp_rank, pp_size, vp_stage, expected):
    got = select_pipeline_segment(pattern, vp_stage=vp_stage, pp_rank=pp_rank, pp_size=pp_size)
    assert got == expected


def test_uneven_split_and_its_refusals():
    assert select_pipeline_segment("MMM-", first_stage_layers=1, pp_rank=1, pp_size=2) == (
        list("MM-"), 1,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"segments \(3\).*divisible by pipeline_model_parallel"):
        select_pipeline_segment("M|*|M", pp_rank=0, pp_size=2)
    with pytest.raises(ValueError, match=r"Number of layers \(3\)"):
        select_pipeline_segment("M*M", pp_rank=0, pp_size=2)
    with pytest.raises(ValueError, match="cannot be set when hybrid_layer_pattern has pipe"):
        select_pipeline_segment("M|M", first_stage_layers=1, pp_rank=0, pp_size=2)
