"""Exhaustive blends with datasets of a handful of samples (`_blend_rare`): events, not lanes.

The oracle is Megatron's exhaustive loop written out in Python
(test_blend_indices._build_exhaustive_blending_indices_reference); the shifted two-way closed
form is checked against the plain greedy loop from the same exact counts.
"""

import numpy
import pytest

from gigatron.core.datasets import _blend_indices, _blend_rare, helpers
from tests.core.datasets.test_blend_indices import (
    _build_exhaustive_blending_indices_reference,
)


@pytest.fixture
def rare_wins(monkeypatch):
    """Offsets returned by `_first_rare_win` that cut a chunk (a rare dataset won there)."""
    wins = []
    real = helpers._first_rare_win

    def spy(w, lanes, rare, counts, begin, local):
        got = real(w, lanes, rare, counts, begin, local)
        if got < local.shape[0]:
            wins.append(begin + got)
        return got

    monkeypatch.setattr(helpers, "_first_rare_win", spy)
    return wins


@pytest.mark.parametrize(
    "sizes",
    [
        [3, 40_000, 35_000],  # two datasets in the lanes: the shifted closed form
        [3, 31_000, 27_000, 22_000, 9_000, 16_000, 25_000],  # lanes, keys
        [2, 5, 30_000, 5, 30_000, 30_000],  # equal rare sizes: exact ties among them
        [16, 1, 70_000, 7, 70_000],  # a rare dataset of one sample spent at step 0
    ],
)
def test_rare_datasets_are_events(sizes, rare_wins):
    total = sum(sizes)
    got = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
    helpers.build_exhaustive_blending_indices(*got, numpy.asarray(sizes, numpy.int64), len(sizes))
    want = _build_exhaustive_blending_indices_reference(sizes)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])
    rare = set(_blend_rare._rare_datasets(sizes))
    assert rare  # the cases take the event path
    # every sample of a rare dataset past step 1 came from an event (no lane picked one), but
    # for the last few thousand steps, which the plain loop runs
    picked = {i for i in range(2, total) if int(want[0][i]) in rare}
    assert set(rare_wins) <= picked
    assert all(i >= total - helpers._LANE_MIN_SIZE for i in picked - set(rare_wins))
    assert len(rare_wins) >= 3


def test_two_way_choice_shifted_equals_greedy_loop():
    # two datasets after others took `taken` samples: weights sum to less than 1
    w0, w1 = 0.41, 0.58
    begin, counts0 = 5_000, (2_049, 2_895)  # taken = 56
    size = 40_000
    got = _blend_indices._two_way_choice(w0, w1, size, begin, counts0)
    want = numpy.empty(size, dtype=numpy.int16)
    _blend_indices._greedy_steps([w0, w1], list(counts0), begin, begin + size, want, offset=begin)
    numpy.testing.assert_array_equal(got, want)


def test_rare_edges_are_lower_bounds():
    # the step where each rare dataset first wins is never before its edge
    sizes = [4, 9, 50_000, 45_000, 30_000]
    want = _build_exhaustive_blending_indices_reference(sizes)[0]
    total = sum(sizes)
    w = [x / total for x in sizes]
    lanes, rare = [2, 3, 4], [0, 1]
    counts = [0] * len(sizes)
    for i in range(total):
        k = int(want[i])
        if k in rare and i >= 2:
            edge = _blend_rare._rare_edges(w, lanes, [k], counts, i)[0]
            assert edge <= i, (k, i, edge)
            edges = _blend_rare._rare_edges(w, lanes, [k], counts, 2)[0]
            assert edges <= i
        counts[k] += 1


@pytest.mark.parametrize("sizes", [[20_000, 31_000], [3, 30_000, 26_000], [35_000, 2, 9]])
def test_long_two_dataset_chunks_take_lanes(sizes, monkeypatch):
    # chunks of two datasets longer than _TWO_WAY_MAX run in lanes (and D = 2 exhaustive blends
    # longer than 4x that in `_exhaustive_choice`); the last unspent dataset fills the tail
    monkeypatch.setattr(helpers, "_TWO_WAY_MAX", 1 << 12)
    calls = []
    real = helpers._lane_choice

    def spy(w, size, *args, **kwargs):
        calls.append(len(w))
        return real(w, size, *args, **kwargs)

    monkeypatch.setattr(helpers, "_lane_choice", spy)
    total = sum(sizes)
    got = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
    helpers.build_exhaustive_blending_indices(*got, numpy.asarray(sizes, numpy.int64), len(sizes))
    want = _build_exhaustive_blending_indices_reference(sizes)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])
    assert 2 in calls
