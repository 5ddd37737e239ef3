"""Marker lanes (`_blend_marks`: blends with weights too small to be exact keys) against the
float64 greedy rule, step for step.

The oracle is Megatron's loop (helpers.cpp `build_blending_indices`) written out in plain Python
below, and megatron-core's compiled helper where it is installed.
"""

import numpy
import pytest

from gigatron.core.datasets import _blend_marks, helpers

try:
    from megatron.core.datasets import helpers_cpp as mcore_helpers
except Exception:  # megatron-core missing or its C++ helper not built
    mcore_helpers = None

# 8 datasets, two picked a dozen times in 60K steps (rare: counts read from the lanes), one
# every ~250 steps; none is an exact key before step 16 / 3e-4 (the smallest not by step 60K).
_TINY = numpy.array([2e-4, 0.3, 3.3e-4, 0.2, 4e-3, 0.15, 0.1, 0.25])
_TINY /= _TINY.sum()


def _greedy(w, counts, begin, size):
    """(choice, count before) of steps [begin, begin + size) from `counts`, as helpers.cpp."""
    w = [float(x) for x in w]
    c = [int(x) for x in counts]
    choice = numpy.empty(size, numpy.int16)
    sample = numpy.empty(size, numpy.int64)
    for i in range(begin, begin + size):
        t = max(float(i), 1.0)
        best, best_err = 0, w[0] * t - c[0]
        for k in range(1, len(w)):
            err = w[k] * t - c[k]
            if err > best_err:
                best, best_err = k, err
        choice[i - begin], sample[i - begin] = best, c[best]
        c[best] += 1
    return choice, sample


def _blend(w, size):
    out = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
    helpers.build_blending_indices(*out, w, len(w), size)
    return out


@pytest.fixture
def marked(monkeypatch):
    """Counts of the marker steps each `_marker_lane_steps` call redid in float64."""
    calls = []
    real = _blend_marks._marker_lane_steps

    def spy(w, t0, counts, nsteps, out, top_keys, samp=None):
        real(w, t0, counts, nsteps, out, top_keys, samp)
        low = (1 << _blend_marks._marker_bits(w.shape[0])) - 1
        calls.append(int(numpy.count_nonzero((top_keys & low) == 0)))  # tag 0: a marker

    monkeypatch.setattr(_blend_marks, "_marker_lane_steps", spy)
    return calls


def test_marker_lanes_equal_greedy_rule(marked):
    """Lanes from exact counts at steps where no weight (step 0), some and most are exact keys:
    same choices and sample indices as the plain rule; markers were redone."""
    w, steps = _TINY, 200
    first = numpy.array([0, 40, 3_000, 20_000, 55_000])
    want = _greedy(w, [0] * 8, 0, int(first[-1]) + steps)
    counts = numpy.stack([numpy.bincount(want[0][:s], minlength=8) for s in first], axis=1)
    out = numpy.empty((steps, first.size), numpy.int16)
    samp = numpy.empty((steps, first.size))
    top = numpy.empty((steps, first.size), numpy.int64)
    lanes = counts.astype(numpy.float64)
    _blend_marks._marker_lane_steps(w, first.astype(numpy.float64), lanes, steps, out, top, samp)
    for p, s in enumerate(first):
        numpy.testing.assert_array_equal(out[:, p], want[0][s : s + steps], err_msg=f"lane {p}")
        numpy.testing.assert_array_equal(samp[:, p], want[1][s : s + steps], err_msg=f"lane {p}")
    assert _blend_marks._marker_guard(top, 8)
    assert marked[0] >= steps  # lane 0: every step a marker


def test_tiny_weight_blend_equals_sequential_rule(monkeypatch, marked):
    """A whole blend through marker lanes, rare counts read from the lanes, lanes rerun, and
    the plain-loop sweep; then with the rare datasets' first guesses far off: all exact."""
    size = 60_000
    want = _greedy(_TINY, [0] * 8, 0, size)
    reruns, swept = [], []
    real, sweep = helpers._rare_rerun, helpers._sweep_lanes

    def spy_sweep(*args):
        lanes = sweep(*args)
        swept.extend(lanes)
        return lanes

    monkeypatch.setattr(helpers, "_rare_rerun", lambda *a: reruns.append(1) or real(*a))
    monkeypatch.setattr(helpers, "_sweep_lanes", spy_sweep)
    for pick in (_blend_marks._RARE_PICK, -2.0):
        monkeypatch.setattr(_blend_marks, "_RARE_PICK", pick)
        got = _blend(_TINY, size)
        numpy.testing.assert_array_equal(got[0], want[0], err_msg=str(pick))
        numpy.testing.assert_array_equal(got[1], want[1], err_msg=str(pick))
    assert reruns and swept and sum(marked) > 0
    assert numpy.count_nonzero(want[0] == 0) >= 10  # the rare datasets were picked


@pytest.mark.skipif(mcore_helpers is None, reason="megatron-core's compiled helpers not importable")
def test_tiny_weight_blends_equal_megatron_cpp():
    """The benchmark's "blend-tiny" weights (`rng.random(D) ** 3 + 1e-4`) at 10 and 40 datasets."""
    for num in (10, 40):
        w = numpy.random.default_rng(0).random(num) ** 3 + 1e-4
        w /= w.sum()
        size = 200_000
        got = _blend(w, size)
        want = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
        mcore_helpers.build_blending_indices(*want, w, num, size, False)
        numpy.testing.assert_array_equal(got[0], want[0], err_msg=str(num))
        numpy.testing.assert_array_equal(got[1], want[1], err_msg=str(num))
