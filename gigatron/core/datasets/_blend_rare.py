"""Rare datasets of the exhaustive blend (private): found as events, not guessed in lanes.

A dataset of a handful of samples among millions (weight 3 / total, say) is picked a few times
in the whole blend. Lanes guess its count from its weight and get it wrong for long stretches
(its error rises by 3e-6 a step, and when it wins depends on the other datasets' errors), so
lanes disagree and are rerun one by one. Instead, `helpers._exhaustive_choice` runs the lanes
over the other datasets only (as if the rare ones were spent) and `_first_rare_win` finds the
first step where a rare dataset would have won: up to that step the lanes' choices are the
rule's, that step goes to the rare dataset (one exact argmax), and the lanes go on after it.

Megatron's rule (helpers.cpp) at step i: the largest `e_k = fl(w_k * max(i, 1)) - c_k` over the
unspent datasets, ties to the lowest k. While a rare dataset r does not win, the winner is the
lanes' winner c and its error is the largest of the others, M(i) = fl(w_c * t) - c_c(i); r wins
first where `e_r(i) > M(i)`, or `==` with r < c. M(i) is at least the mean of the lanes'
errors, which has a closed form in i (the lanes take every step): steps where e_r is below that
mean (less a margin for rounding) are skipped without looking at them.
"""

from __future__ import annotations

import math

import numpy

from gigatron.core.datasets._blend_indices import _ranks

_RARE_MAX_SAMPLES = 16  # datasets of at most this many samples ...
_RARE_MAX_SHARE = 1.0 / 4096  # ... and at most this share of all samples are found as events
_RARE_MAX_DATASETS = 8  # more rare datasets than this: all stay in the lanes
_MARGIN = 1e-6  # on the mean error: the C++ rounding moves an error by far less


def _rare_datasets(n: list[int]) -> list[int]:
    """Datasets `_exhaustive_choice` handles as events (empty when there are too many)."""
    total = sum(n)
    share = total * _RARE_MAX_SHARE
    rare = [k for k, x in enumerate(n) if 0 < x <= _RARE_MAX_SAMPLES and x <= share]
    return rare if len(rare) <= _RARE_MAX_DATASETS and len(n) - len(rare) >= 2 else []


def _first_rare_win(
    w: list[float],
    lanes: list[int],
    rare: list[int],
    counts: list[int],
    begin: int,
    local: numpy.ndarray,
) -> int:
    """Offset in `local` of the first step a dataset in `rare` wins, or `local.shape[0]`.

    Args:
        w: all weights; lanes: the datasets `local` chose among (ascending); rare: unspent
            rare datasets; counts: all datasets' exact counts before step `begin`.
        local: int `[n]` the lanes' choices (indices into `lanes`) for steps begin, ...
            (begin >= 2: steps 0 and 1 both use t = 1, callers run them exactly).
    """
    size = local.shape[0]
    wf = numpy.asarray([w[k] for k in lanes], dtype=numpy.float64)
    ids = numpy.asarray(lanes, dtype=numpy.int64)
    first = size
    for r, edge in zip(rare, _rare_edges(w, lanes, rare, counts, begin)):
        lo = max(0, min(first, edge - begin))
        span = 4096
        while lo < first:  # windows that double: the win is usually just past the edge
            hi = min(first, lo + span)
            hit = _win_in(w, wf, ids, r, counts, begin, local, lo, hi)
            if hit < hi:
                first = hit
                break
            lo, span = hi, 2 * span
    return first


def _rare_edges(
    w: list[float], lanes: list[int], rare: list[int], counts: list[int], begin: int
) -> list[int]:
    """Per rare dataset, a step before which it cannot win (arguments as `_first_rare_win`).

    Its error must exceed the lanes' largest, so their mean: at step i >= 2 that mean is
    `(w_lanes * i - c_lanes - (i - begin)) / nf` in exact arithmetic (the lanes take every step).
    """
    nf = len(lanes)
    w_lanes = math.fsum(w[k] for k in lanes)
    taken = begin - sum(counts[k] for k in lanes)
    edges = []
    for r in rare:
        slope = w[r] - (w_lanes - 1.0) / nf
        edge = (counts[r] + taken / nf - _MARGIN) / slope if slope > 0 else 0.0
        edges.append(max(begin, int(min(edge, 2.0**62)) - 2))
    return edges


def _win_in(
    w: list[float],
    wf: numpy.ndarray,
    ids: numpy.ndarray,
    r: int,
    counts: list[int],
    begin: int,
    local: numpy.ndarray,
    lo: int,
    hi: int,
) -> int:
    """First offset in [lo, hi) where rare dataset r beats the lanes' winner, else hi."""
    nf = wf.shape[0]
    seg = local[lo:hi]
    base = numpy.asarray([counts[k] for k in ids], dtype=numpy.float64)
    base += numpy.bincount(local[:lo], minlength=nf)
    before = base[seg] + _ranks(seg, nf)
    t = numpy.arange(begin + lo, begin + hi, dtype=numpy.float64)
    top = wf[seg] * t - before  # the lanes' winning error M(i), steps >= 2
    err = w[r] * t - float(counts[r])
    wins = (err > top) | ((err == top) & (ids[seg] > r))
    hit = int(wins.argmax())
    return lo + hit if wins[hit] else hi
