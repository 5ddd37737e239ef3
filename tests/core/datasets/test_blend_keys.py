"""Key lanes (`_key_lane_steps`: errors compared as int64 keys) against the float64 greedy rule.

The oracle is Megatron's loop (helpers.cpp `build_blending_indices`) step by step from the same
counts, written below with one NumPy argmax per step (ties: first maximum, as in C++), and
megatron-core's compiled helper where it is installed.
"""

import numpy
import pytest

from gigatron.core.datasets import _blend_keys, helpers

try:
    from megatron.core.datasets import helpers_cpp as mcore_helpers
except Exception:  # megatron-core missing or its C++ helper not built
    mcore_helpers = None


def _greedy(w, counts, begin, size):
    """(choice, count before) of steps [begin, begin + size) from `counts`, as helpers.cpp."""
    w = numpy.asarray(w, dtype=numpy.float64)
    c = numpy.asarray(counts, dtype=numpy.float64).copy()
    choice = numpy.empty(size, numpy.int16)
    sample = numpy.empty(size, numpy.int64)
    for i in range(size):
        k = int((w * max(float(begin + i), 1.0) - c).argmax())
        choice[i], sample[i] = k, int(c[k])
        c[k] += 1.0
    return choice, sample


def _cases():
    rng = numpy.random.default_rng(7)
    w6 = rng.random(6) + 0.05
    w100 = rng.random(100) + 0.5
    return {
        "6 random": w6 / w6.sum(),
        "8 equal (exact ties)": numpy.full(8, 1 / 8),
        "10 x 0.1 (sum rounds below 1)": numpy.full(10, 0.1),
        "100 random": w100 / w100.sum(),
        "7 with a tiny weight (float row)": numpy.array([2e-4, 0.2, 0.1, 0.2, 0.1998, 0.15, 0.15]),
        "6 with a zero weight": numpy.array([0.0, 0.2, 0.2, 0.2, 0.2, 0.2]),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_key_lane_steps_equal_greedy_rule(name):
    """Lanes started from exact counts: same choices and sample indices as the plain rule."""
    w = _cases()[name]
    num, lanes, steps = len(w), 4, 300
    begin = 60_000
    first = begin + numpy.arange(lanes) * 5_000  # [P]
    rows = _blend_keys._key_rows(list(w), begin)
    assert rows[0]  # some rows are keys
    assert bool(rows[1]) == ("tiny" in name)
    choice_before = helpers._lane_choice(list(w), int(first[-1]), keys=False)[0]  # exact
    counts = numpy.stack(
        [numpy.bincount(choice_before[:s], minlength=num) for s in first], axis=1
    ).astype(numpy.float64)  # [D, P] exact counts at each lane's start
    want = [_greedy(w, counts[:, p], int(first[p]), steps) for p in range(lanes)]
    out = numpy.empty((steps, lanes), numpy.int16)
    samp = numpy.empty((steps, lanes))
    if rows[1]:
        guard = numpy.full((2, lanes), [[numpy.inf], [-numpy.inf]])
        _blend_keys._key_lane_steps(list(w), rows, first, counts, steps, out, guard, samp=samp)
        assert guard[0].min() > -0.5 and guard[1].max() < 2.5
    else:
        top = numpy.empty((steps, lanes), numpy.int64)
        _blend_keys._key_lane_steps(list(w), rows, first, counts, steps, out, None, top, samp)
        assert _blend_keys._key_guard(top, num)
    for p in range(lanes):
        numpy.testing.assert_array_equal(out[:, p], want[p][0], err_msg=f"lane {p}")
        numpy.testing.assert_array_equal(samp[:, p], want[p][1], err_msg=f"lane {p}")


@pytest.fixture
def key_calls(monkeypatch):
    calls = []
    real = helpers._key_lane_steps

    def spy(*args, **kwargs):
        calls.append(args[4])  # steps
        return real(*args, **kwargs)

    monkeypatch.setattr(helpers, "_key_lane_steps", spy)
    return calls


def test_key_lanes_repair_and_guard(monkeypatch, key_calls):
    """Bad guesses (every lane disagrees: reruns side by side, then the plain-loop sweep) and a
    start whose errors leave the keys' exact range (the float lanes take over): all exact."""
    w = [0.3, 0.1, 0.15, 0.05, 0.25, 0.15]
    begin, size = 5_003, 2 * helpers._LANE_MIN_SIZE + 7
    counts0 = [int(c) for c in numpy.bincount(_greedy(w, [0] * 6, 0, begin)[0], minlength=6)]
    want = _greedy(w, counts0, begin, size)

    def bad_guess(weights, steps, taken):
        return numpy.tile(steps.astype(numpy.float64), (weights.shape[0], 1))

    monkeypatch.setattr(helpers, "_guess_counts", bad_guess)
    for max_passes, sweep in ((1000, 0), (1, 10**6)):
        monkeypatch.setattr(helpers, "_LANE_MAX_PASSES", max_passes)
        monkeypatch.setattr(helpers, "_LANE_SWEEP", sweep)
        got = helpers._lane_choice(w, size, begin, counts0)
        numpy.testing.assert_array_equal(got[0], want[0], err_msg=str(max_passes))
        numpy.testing.assert_array_equal(got[1], want[1], err_msg=str(max_passes))
    assert key_calls
    # Datasets 1, 2 and 5 far behind (errors under 2.5): a winning error soon passes 2.5, the
    # guard trips and the float lanes redo the steps.
    size = helpers._LANE_MIN_SIZE
    far = list(counts0)
    for k in (1, 2, 5):
        far[k] = int(numpy.ceil(w[k] * begin - 2.45))
    start_err = numpy.asarray(w) * begin - numpy.asarray(far)
    want = _greedy(w, far, begin, size)
    win = numpy.asarray(w)[want[0]] * (begin + numpy.arange(size)) - want[1]
    assert start_err.max() < 2.5 and win.max() >= 2.5
    key_calls.clear()
    got = helpers._lane_choice(w, size, begin, far)
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])
    assert key_calls  # keys were tried first


@pytest.mark.skipif(mcore_helpers is None, reason="megatron-core's compiled helpers not importable")
def test_key_blends_equal_megatron_cpp(key_calls):
    """build_blending_indices through the key lanes (6-100 datasets) and the exhaustive builder."""
    cases = _cases()
    rng = numpy.random.default_rng(8)
    for name, w in cases.items():
        size = 150_000
        got = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
        want = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
        helpers.build_blending_indices(*got, w, len(w), size, False)
        mcore_helpers.build_blending_indices(*want, w, len(w), size, False)
        numpy.testing.assert_array_equal(got[0], want[0], err_msg=name)
        numpy.testing.assert_array_equal(got[1], want[1], err_msg=name)
    assert len(key_calls) >= len(cases)
    sizes = rng.integers(5_000, 40_000, size=9).astype(numpy.int64)
    sizes[0] = 3  # spent early: a phase with one dataset fewer
    total = int(sizes.sum())
    got = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
    want = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
    helpers.build_exhaustive_blending_indices(*got, sizes, len(sizes))
    mcore_helpers.build_exhaustive_blending_indices(*want, sizes, len(sizes))
    numpy.testing.assert_array_equal(got[0], want[0])
    numpy.testing.assert_array_equal(got[1], want[1])
