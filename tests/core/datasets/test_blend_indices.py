"""Blending indices (lanes in NumPy) against the sequential rule.

The oracle is Megatron's greedy loop (helpers.cpp `build_blending_indices`) written out in plain
Python below, and megatron-core's compiled helper itself where it is installed.
"""

import numpy
import pytest

from gigatron.core.datasets import helpers

try:
    from megatron.core.datasets import helpers_cpp as mcore_helpers
except Exception:  # megatron-core missing or its C++ helper not built
    mcore_helpers = None


def _build_blending_indices_reference(weights, num_datasets, size):
    """Megatron's loop step by step: argmax_k w_k * max(i, 1) - c_k in float64, ties to low k."""
    w = [float(x) for x in numpy.asarray(weights, dtype=numpy.float64)[:num_datasets]]
    counts = [0] * num_datasets
    dataset_index = numpy.empty(size, dtype=numpy.int16)
    sample_index = numpy.empty(size, dtype=numpy.int64)
    for i in range(size):
        t = max(float(i), 1.0)
        best, best_err = 0, w[0] * t - float(counts[0])
        for k in range(1, num_datasets):
            err = w[k] * t - float(counts[k])
            if err > best_err:
                best, best_err = k, err
        dataset_index[i] = best
        sample_index[i] = counts[best]
        counts[best] += 1
    return dataset_index, sample_index


def _gigatron(weights, size):
    out = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
    helpers.build_blending_indices(*out, numpy.asarray(weights, numpy.float64), len(weights), size)
    return out


def _weight_cases():
    rng = numpy.random.default_rng(4)
    cases = []
    for k in (3, 4, 5, 6, 8):
        w = rng.random(k) + 0.01
        cases.append(w / w.sum())
    cases.append(numpy.full(3, 1 / 3))  # exact ties every few steps
    cases.append(numpy.full(8, 1 / 8))
    cases.append(numpy.array([0.25, 0.25, 0.5]))
    cases.append(numpy.array([1e-5, 2e-5, 0.4, 0.6 - 3e-5]))  # tiny weights
    cases.append(numpy.array([1e-3] * 6 + [0.994]))
    return cases


@pytest.fixture
def lane_calls(monkeypatch):
    """The number of lanes of each `_greedy` call (how many run side by side)."""
    calls = []
    real = helpers._run_lanes

    def spy(w, lanes, start, *args):
        if len(args) == 4:  # a first run (no `diff`): every lane
            calls.append(lanes.size)
        return real(w, lanes, start, *args)

    monkeypatch.setattr(helpers, "_run_lanes", spy)
    return calls


@pytest.mark.parametrize("weights", _weight_cases(), ids=lambda w: f"{len(w)}way-{w[0]:.0e}")
def test_lanes_equal_sequential_rule(weights, lane_calls):
    size = 100_000
    got = _gigatron(weights, size)
    assert max(lane_calls) > 1  # lanes ran side by side, not one plain loop
    want = _build_blending_indices_reference(weights, len(weights), size)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("shift", [1.0, 40.0])
def test_lanes_repair_bad_guesses(monkeypatch, shift):
    """Wrong start counts (a few off, or far off and a wrong total: lanes that never meet their
    neighbours) still give the sequential rule's arrays: reruns, then chunks cut short."""
    weights = numpy.array([0.2, 0.3, 0.1, 0.4])
    size = 3 * (1 << 14) + 17
    want = _build_blending_indices_reference(weights, 4, size)
    real = helpers._guess

    def bad_guess(w, counts0, ahead, length):
        counts = real(w, counts0, ahead, length)
        counts[:, 0] += shift
        counts[:, 1] -= 1.0
        return counts

    monkeypatch.setattr(helpers, "_guess", bad_guess)
    got = _gigatron(weights, size)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize(
    "weights",
    [
        [0.0, 0.5, 0.5],
        [1.0, 2.0, 3.0],
        [-0.1, 0.6, 0.5],
        [0.3, 0.3, 0.3],
        [float("nan"), 0.5, 0.5],
        [0.5, float("nan"), 0.5],
        [0.2, float("inf"), 0.3],
    ],
)
def test_unusual_weights_match_sequential_rule(weights):
    """Zero, unnormalised, negative and NaN weights: same as the loop (lanes or not)."""
    size = 20_000
    got = _gigatron(weights, size)
    want = _build_blending_indices_reference(weights, 3, size)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])


@pytest.mark.skipif(mcore_helpers is None, reason="megatron-core's compiled helpers not importable")
def test_lanes_equal_megatron_cpp():
    rng = numpy.random.default_rng(5)
    for trial in range(12):
        k = int(rng.integers(3, 9))
        w = rng.random(k) ** 3 + 1e-6 if trial % 3 else numpy.ones(k)
        w = w / w.sum()
        size = int(rng.integers(1, 150_000))
        got = _gigatron(w, size)
        want = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
        mcore_helpers.build_blending_indices(*want, w, k, size, False)
        numpy.testing.assert_array_equal(got[0], want[0], err_msg=str((trial, w, size)))
        numpy.testing.assert_array_equal(got[1], want[1], err_msg=str((trial, w, size)))


@pytest.mark.parametrize("num", [2, 31, 120])
def test_two_and_many_datasets_equal_sequential_rule(num):
    """Two datasets (no third to break ties) and many, some with tiny weights."""
    rng = numpy.random.default_rng(num)
    w = rng.random(num) ** 4 + 1e-5
    w /= w.sum()
    size = 40_000 if num > 2 else 120_000
    got = _gigatron(w, size)
    want = _build_blending_indices_reference(w, num, size)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])


def _build_exhaustive_blending_indices_reference(sizes):
    """Megatron's exhaustive loop: the same rule over unspent datasets, weights sizes / total."""
    n = [int(x) for x in sizes]
    total = sum(n)
    w = [x / float(total) for x in n]
    counts = [0] * len(n)
    unspent = [k for k in range(len(n)) if n[k] > 0]
    dataset_index = numpy.empty(total, dtype=numpy.int16)
    sample_index = numpy.empty(total, dtype=numpy.int64)
    for i in range(total):
        t = max(float(i), 1.0)
        best, best_err = -1, -numpy.inf
        for k in unspent:
            err = w[k] * t - float(counts[k])
            if err > best_err:
                best, best_err = k, err
        dataset_index[i] = best
        sample_index[i] = counts[best]
        counts[best] += 1
        if counts[best] == n[best]:
            unspent.remove(best)
    return dataset_index, sample_index


@pytest.mark.parametrize(
    "sizes",
    [
        [30_000, 30_000, 30_000],  # ties, all spent at the very end
        [1, 2, 3, 40_000],  # small datasets spent early: several phases
        [20_000, 1, 25_000, 7],
        [12_345, 23_456, 34_567, 5_678, 6_789],
        [5, 9_000, 0, 9_000],  # an empty dataset never takes part
        [60_000, 3],  # two datasets, one spent early
    ],
)
def test_exhaustive_equals_sequential_rule(sizes, lane_calls):
    total = sum(sizes)
    got = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
    helpers.build_exhaustive_blending_indices(*got, numpy.asarray(sizes, numpy.int64), len(sizes))
    assert max(lane_calls) > 1  # at least the first chunk ran in lanes
    want = _build_exhaustive_blending_indices_reference(sizes)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])
    assert numpy.bincount(got[0], minlength=len(sizes)).tolist() == list(sizes)


@pytest.mark.skipif(mcore_helpers is None, reason="megatron-core's compiled helpers not importable")
def test_exhaustive_equals_megatron_cpp():
    rng = numpy.random.default_rng(6)
    for trial in range(6):
        k = int(rng.integers(3, 9))
        sizes = rng.integers(1, 60_000, size=k).astype(numpy.int64)
        sizes[0] = 1 + trial  # one nearly empty dataset: spent long before the end
        total = int(sizes.sum())
        got = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
        want = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
        helpers.build_exhaustive_blending_indices(*got, sizes, k)
        mcore_helpers.build_exhaustive_blending_indices(*want, sizes, k)
        numpy.testing.assert_array_equal(got[0], want[0], err_msg=str(sizes))
        numpy.testing.assert_array_equal(got[1], want[1], err_msg=str(sizes))
