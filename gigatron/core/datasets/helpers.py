"""Index builders for GPT and blended datasets, in NumPy (Megatron compiles these from C++).

Mirrors `megatron.core.datasets.helpers` (`helpers.cpp`): same signatures, same outputs, bit for
bit. `build_sample_idx` is vectorised: a sample boundary is a global token position `i * seq_len`
in the concatenation of the documents in `document_index` order, so a cumulative sum of document
lengths plus one `searchsorted` finds every boundary at once. The blending builders follow
Megatron's greedy "largest error first" rule (in float64, like the C++). That rule is sequential;
it runs in parallel "lanes" over time (`_lane_choice`): blocks of steps side by side from guessed
counts, kept only where they agree with their neighbour, so the result is the sequential rule's.
Each lane step compares the errors either in float64 (`_blend_indices._lane_steps`) or, once
every weight times the step is large enough, as int64 keys that carry the dataset index in
their low bits, one max per lane (`_blend_keys._key_lane_steps`); before that, weights too
small to be exact keys are compared as rounded keys and the steps where one of them may win are
redone in float64 (`_blend_marks._marker_lane_steps`). The exhaustive variant runs one phase per
set of unspent datasets, with datasets of a handful of samples left out of the lanes and their
picks found as events (`_blend_rare._first_rare_win`). Inputs where lanes would
not pay (unnormalised or negative weights, NaN, short runs) take the plain loop, which is the
reference.

Layout: this module holds the public builders and the lane scheduling (`_lane_choice`,
`_blend_choice`, `_exhaustive_choice`); the step rules and lane kernels they call are in
`_blend_indices.py`, `_blend_keys.py`, `_blend_marks.py` and `_blend_rare.py`.
"""

from __future__ import annotations

import math

import numpy

from gigatron.core.datasets._blend_indices import (
    _exhaustive_steps,
    _fill_sample_index,
    _greedy_steps,
    _guess_counts,
    _lane_steps,
    _lane_steps_wide,
    _lanes_merge,
    _ranks,
    _sweep_lanes,
    _two_way_choice,
    _unlane,
)
from gigatron.core.datasets._blend_keys import (
    _KEY_MIN_DATASETS,
    _key_guard,
    _key_lane_steps,
    _key_ready_step,
    _key_rows,
    _keys_hold,
)
from gigatron.core.datasets._blend_marks import (
    _marked_steps,
    _marker_guard,
    _rare_guess,
    _rare_rerun,
    _rare_rows,
)
from gigatron.core.datasets._blend_rare import _first_rare_win, _rare_datasets, _rare_edges

_INT32_MAX = numpy.iinfo(numpy.int32).max


def build_sample_idx(
    sizes: numpy.ndarray,
    document_indices: numpy.ndarray,
    sequence_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> numpy.ndarray:
    """Start (position in `document_indices`, token offset) of every sample, plus the end.

    Args:
        sizes: int32 `[num_sequences]` sequence lengths.
        document_indices: int32 `[num_docs_total]` sequence ids in epoch-shuffled order.
        sequence_length: tokens per sample (each sample also reads `add_extra` more).
        num_epochs, tokens_per_epoch: as computed by GPTDataset.

    Returns:
        `[num_samples + 1, 2]` int32 (int64 when the values may overflow int32). Sample `i`
        covers tokens from row `i` to row `i + 1` (plus `add_extra`): consecutive samples
        overlap by `add_extra` tokens.
    """
    extra = int(bool(add_extra_token_to_sequence))
    seq_len = int(sequence_length)
    total = int(num_epochs) * int(tokens_per_epoch) - extra
    # An empty split gives total = -1; the C++ integer division truncates that to 0 samples.
    if drop_last_partial_sequence:
        num_samples = max(total, 0) // seq_len
    else:
        # helpers.cpp divides in single precision: ceil(float(total) / seq_length).
        num_samples = max(0, int(math.ceil(numpy.float32(total) / numpy.float32(seq_len))))
    sample_idx_max = max(document_indices.shape[0], int(sizes.max()) if sizes.size else 0)
    out_dtype = numpy.int32 if sample_idx_max <= _INT32_MAX else numpy.int64

    sample_idx = numpy.empty((num_samples + 1, 2), dtype=out_dtype)
    sample_idx[0] = 0
    num_docs = document_indices.shape[0]
    # Sample i >= 1 starts at global token g = i * seq_len of the documents concatenated in
    # `document_indices` order. helpers.cpp records the document position k in which the previous
    # sample's `seq_len + extra` tokens end (cum[k] < g + extra <= cum[k + 1], cum = tokens before
    # position k) and the offset g - cum[k]. So k = #{k : (cum[k + 1] - extra) // seq_len < i}:
    # a bincount + cumsum, no binary search. Blocks of documents keep temporaries in cache.
    done = 0  # samples whose boundary has been placed
    tokens_before = 0  # cum at the start of the block
    block = 1 << 16
    for beg in range(0, num_docs, block):
        if done >= num_samples:
            break
        lengths = numpy.take(sizes, document_indices[beg : beg + block]).astype(numpy.int64)
        cum_end = numpy.cumsum(lengths)
        cum_end += tokens_before
        tokens_before = int(cum_end[-1])
        last = cum_end - extra
        last //= seq_len  # samples whose boundary lies before the end of each document
        numpy.clip(last, done, num_samples, out=last)
        hi = int(last[-1])
        if hi == done:
            continue
        counts = numpy.bincount(last - done, minlength=hi - done + 1)
        local = numpy.cumsum(counts[: hi - done])  # document of boundaries done+1 .. hi, - beg
        rows = sample_idx[done + 1 : hi + 1]
        rows[:, 0] = local + beg
        g = numpy.arange(done + 1, hi + 1, dtype=numpy.int64) * seq_len
        rows[:, 1] = g - (cum_end[local] - lengths[local])
        done = hi
    if done < num_samples:
        # A last partial sample runs past the final document: the C++ stops there and records
        # the last document with offset `size - extra`.
        sample_idx[done + 1 :, 0] = num_docs - 1
        sample_idx[done + 1 :, 1] = int(sizes[document_indices[-1]]) - extra
    return sample_idx


# Three or more datasets: "parallel in time". The rule depends on the past only through the
# count vector, and two runs of it started from different counts merge after a short while (each
# step hands the sample to the dataset furthest behind). So the steps are cut into P lanes that
# run side by side, one NumPy op over all lanes per dataset and step: lane p simulates global steps
# [p*L, p*L + W + L) from guessed counts, the first W steps only to forget the guess. A lane is
# exact when its counts after the warm-up equal the previous lane's final counts (lane 0 starts
# exactly at zero); lanes that disagree are run again from their neighbour's final counts until
# every lane agrees, so the result is the sequential rule's, step for step, in float64.
# `_lane_choice`, `_guess_counts` and these constants are looked up in this module when called:
# tests/core/datasets/test_blend_indices.py replaces them here to force every repair path.
_LANE_MIN_SIZE = 1 << 14  # below this the Python loop is as fast
_LANE_TARGET = 8192  # lanes per op: large enough that NumPy's per-call cost is amortised
_LANE_MIN_LENGTH = 128  # steps per lane (1/8 warm-up) for key lanes of 6 to 31 datasets, else 256
_LANE_MAX_PASSES = 8  # side-by-side reruns of disagreeing lanes, while there are many of them
_LANE_SWEEP = 32  # fewer disagreeing lanes than this: rerun them one by one in the plain loop
_MARK_SWEEP = 12  # the same for marker lanes (their leftovers are short chains: fewer passes pay)
_WIDE_DATASETS = 12  # more: float lanes as [P, D] rows (three NumPy calls per step)
_TWO_WAY_MAX = 1 << 20  # longer chunks of two datasets run in lanes (faster per step)
_SEGMENT = 1 << 23  # steps per `_lane_choice` call from `_blend_choice` (buffers ~18 bytes/step)


def _lane_choice(
    w: list[float],
    size: int,
    begin: int = 0,
    counts0: list[int] | None = None,
    keys: bool = True,
    out: tuple[numpy.ndarray, numpy.ndarray] | None = None,
    end_counts: list[int] | None = None,
    want_sample: bool = True,
    marks: bool = False,
) -> tuple[numpy.ndarray, numpy.ndarray | None]:
    """int16 `[size]` choices of the greedy rule for steps [begin, begin + size), exact, and
    int64 `[size]` the chosen dataset's count before each step (its sample index), or None for
    four datasets or fewer (a pass per dataset afterwards is cheaper than a gather per step).
    Written into `out` (int16 `[size]`, int64 `[size]`) when given; `end_counts` (a list) is
    set to the exact counts after the last step. `want_sample=False`: choices only.

    `counts0` are the exact counts before step `begin` (zeros by default); samples of step
    `begin` not in them went to datasets outside `w`. The lanes step with `_key_lane_steps` when
    its exactness conditions hold at `begin` and stay true (checked), else with `_lane_steps`.
    `marks=True` (with `keys`): weights too small to be exact keys yet; the lanes step with
    `_marker_lane_steps` (`_blend_marks`) and, under 32 datasets, the counts of datasets picked
    less than once a lane are read from the lanes (`_rare_counts`), lanes guessed wrong rerun.
    """
    weights = numpy.asarray(w, dtype=numpy.float64)
    counts0 = [0] * len(w) if counts0 is None else counts0
    short = _KEY_MIN_DATASETS <= len(w) < 32
    length = max(_LANE_MIN_LENGTH if short else 256, -(-size // _LANE_TARGET))
    warm = length // 8
    lanes = max(1, -(-(size - warm) // length))
    buf = numpy.empty((warm + length, lanes), dtype=numpy.int16)  # [steps, lanes]
    track = want_sample and len(w) > 4  # else a pass per dataset at the end is cheaper
    samp = numpy.empty((warm + length, lanes if track else 0))  # counts before each step
    first = begin + numpy.arange(lanes) * length  # global step of each lane's first step
    counts = _guess_counts(weights, first, begin - sum(counts0))  # [D, P]
    counts[:, 0] = counts0
    rows = _key_rows(w, begin)
    marks = keys and marks
    keys = keys and not marks and _keys_hold(weights, rows, begin, counts0)
    tops = marks or (keys and not rows[1])  # winning keys kept per step, checked at the end
    rare = _rare_rows(weights, length) if marks and short and track and lanes > 1 else []
    if len(rare):
        _rare_guess(weights, rare, counts, first)
    guess = counts.copy()
    top = numpy.empty((warm + length, lanes if tops else 0), dtype=numpy.int64)
    guard = numpy.full((2, lanes), [[numpy.inf], [-numpy.inf]])  # winning errors per lane

    def steps(t0, c, n, out, g, tk, sp, mins=None):
        t0 = t0.astype(numpy.float64)
        sp = sp if track else None
        if marks:
            _marked_steps(weights, t0, c, n, out, tk, sp, mins)
        elif tops:
            _key_lane_steps(w, rows, t0, c, n, out, top_keys=tk, samp=sp)
        elif keys:
            _key_lane_steps(w, rows, t0, c, n, out, g, samp=sp)
        elif len(w) > _WIDE_DATASETS:
            _lane_steps_wide(w, t0, c, n, out, sp)
        else:
            _lane_steps(w, t0, c, n, out, sp)

    steps(first, counts, warm, buf[:warm], guard, top[:warm], samp[:warm])
    guard[:, 1:] = [[numpy.inf], [-numpy.inf]]  # warm-up steps count for lane 0 only
    top[:warm, 1:] = top[:warm, :1]  # (valid keys, checked anyway)
    start = counts.copy()  # [D, P] counts at global step first + W
    mins = numpy.empty(lanes) if len(rare) else None  # smallest winning error per lane
    steps(first + warm, counts, length, buf[warm:], guard, top[warm:], samp[warm:], mins)
    if len(rare):  # rare datasets' counts read from the lanes' lows; rerun where guessed wrong
        _rare_rerun(
            weights, rare, first, warm, guess, (start, counts), mins, steps, (buf, samp, top)
        )
    for _ in range(_LANE_MAX_PASSES):  # many lanes disagree: run them again side by side
        redo = 1 + numpy.flatnonzero((start[:, 1:] != counts[:, :-1]).any(axis=0))
        if redo.size == 0 or redo.size < (_MARK_SWEEP if marks else _LANE_SWEEP):
            break
        start[:, redo] = counts[:, redo - 1]
        fixed = start[:, redo].copy()
        part = numpy.empty((length, redo.size), dtype=numpy.int16)
        part_samp = numpy.empty((length, redo.size if track else 0))
        fresh = numpy.full((2, redo.size), [[numpy.inf], [-numpy.inf]])
        fresh_top = numpy.empty((length, redo.size if tops else 0), dtype=numpy.int64)
        steps(first[redo] + warm, fixed, length, part, fresh, fresh_top, part_samp)
        buf[warm:, redo] = part
        if track:
            samp[warm:, redo] = part_samp
        guard[:, redo] = fresh
        if tops:
            top[warm:, redo] = fresh_top
        counts[:, redo] = fixed
    swept = _sweep_lanes(w, first + warm, start, counts, buf[warm:], samp[warm:] if track else None)
    guard[:, swept] = 0.0  # the plain loop is exact in any range
    if tops and swept:
        top[warm:, swept] = top[:1, :1]  # lane 0's first key: checked anyway
    ok = (_marker_guard if marks else _key_guard)(top, len(w)) if tops else guard[0].min() > -0.5
    ok = ok and (tops or guard[1].max() < 2.5)
    if (keys or marks) and not ok:
        return _lane_choice(w, size, begin, counts0, False, out, end_counts, want_sample)
    if end_counts is not None:  # the last lane's exact start, plus the steps it keeps
        last = lanes - 1
        if last == 0:
            tail, lane_begin = buf[:size, 0], numpy.asarray(counts0, dtype=numpy.float64)
        else:
            tail, lane_begin = buf[warm : size - last * length, last], start[:, last]
        end = lane_begin + numpy.bincount(tail, minlength=len(w))
        end_counts[:] = [int(x) for x in end]
    if out is None:
        out = (numpy.empty(size, dtype=numpy.int16), numpy.empty(size, dtype=numpy.int64))
    _unlane(buf, warm, out[0])
    if not track:
        return out[0], None
    _unlane(samp, warm, out[1])
    return out


def _blend_choice(w: list[float], choice: numpy.ndarray, sample: numpy.ndarray) -> bool:
    """`_lane_choice` from step 0 into `choice` (int16) and `sample` (int64), `[size]` each.

    Keys (`_key_lane_steps`) need every weight times the step to reach a bound: the steps before
    that run in marker lanes (`_blend_marks`; float lanes for 32+ datasets whose keys are ready
    by half the size) or the plain loop, when few. Segments of at most `_SEGMENT` steps
    keep the lane buffers small; each starts from the exact counts the previous one ends with.
    Returns whether `sample` was filled (not for four datasets or fewer).
    """
    size, num = choice.shape[0], len(w)
    ready = _key_ready_step(w)
    # Until the keys are ready: marker lanes (`_blend_marks`). With 32 datasets or more only
    # when the keys are never ready (ready > size / 2): else float lanes, a little faster there.
    marks = _KEY_MIN_DATASETS <= num and (num < 32 or ready > size // 2)
    if num < _KEY_MIN_DATASETS or ready > size // 2:
        ready = size
    counts = [0] * num
    begin = 0
    if 2 <= ready < _LANE_MIN_SIZE:  # lanes cost a few hundred steps of NumPy calls at least
        _greedy_steps(w, counts, 0, ready, choice)
        sample[:ready] = _ranks(choice[:ready], num)
        begin = ready
    while begin < size:
        end = min(size, ready if begin < ready else size, begin + _SEGMENT)
        if size - end < _LANE_MIN_SIZE:
            end = size
        part = (choice[begin:end], sample[begin:end])
        lanes_marks = marks and begin < ready
        keys = lanes_marks or begin >= ready
        _lane_choice(w, end - begin, begin, counts, keys, part, counts, marks=lanes_marks)
        begin = end
    return num > 4


def _exhaustive_choice(n: list[int]) -> numpy.ndarray:
    """int16 `[sum(n)]` choices of the exhaustive rule: lanes per set of unspent datasets.

    While no dataset is spent the rule is the plain greedy one over the unspent datasets, so
    lanes run a chunk of steps from the exact counts and keep it up to the step that spends a
    dataset, if any. Chunks double while nothing is spent (a dataset of a few samples may be spent
    early, the others near the end), so the steps past a spend that are thrown away stay few.
    Datasets of a handful of samples (`_blend_rare`) stay out of the lanes: the chunk is cut at
    the first step one of them wins, which gets one exact step.
    """
    total = sum(n)
    w = [x / float(total) for x in n]
    choice = numpy.empty(total, dtype=numpy.int16)
    counts = [0] * len(n)
    rare = set(_rare_datasets(n))
    begin, span = 0, 8 * _LANE_MIN_SIZE
    if rare:  # steps 0 and 1 (both at t = 1) exactly: `_first_rare_win` starts at step 2
        begin = min(total, 2)
        _exhaustive_steps(w, n, counts, 0, choice[:begin])
    while begin < total:
        active = [k for k in range(len(n)) if counts[k] < n[k]]
        lanes = [k for k in active if k not in rare]
        if len(lanes) < 2:
            lanes = active
        if len(active) == 1:  # the last unspent dataset takes every remaining step
            choice[begin:] = active[0]
            break
        if total - begin < _LANE_MIN_SIZE:
            _exhaustive_steps(w, n, counts, begin, choice)
            break
        size = min(total - begin, span)
        events = [k for k in active if k not in set(lanes)]
        if events:  # end the chunk a little past the first step a rare dataset may win
            slack = 1 << 12 if len(lanes) == 2 else 1 << 16
            edge = min(_rare_edges(w, lanes, events, counts, begin))
            size = min(size, max(edge - begin, 0) + slack)
        now = [counts[k] for k in lanes]
        if len(lanes) == 2 and size <= _TWO_WAY_MAX:  # the closed form, shifted by the others
            local = _two_way_choice(w[lanes[0]], w[lanes[1]], size, begin, (now[0], now[1]))
        else:
            local = _lane_choice([w[k] for k in lanes], size, begin, now, want_sample=False)[0]
        stop = size  # steps kept: up to and including the first spend
        per = numpy.bincount(local, minlength=len(lanes))
        for a, k in enumerate(lanes):
            if per[a] >= n[k] - counts[k]:
                hits = numpy.flatnonzero(local == a)
                stop = min(stop, int(hits[n[k] - counts[k] - 1]) + 1)
        won = _first_rare_win(w, lanes, events, counts, begin, local[:stop]) if events else stop
        numpy.take(numpy.asarray(lanes, dtype=numpy.int16), local[:won], out=choice[begin:][:won])
        if won < size:
            per = numpy.bincount(local[:won], minlength=len(lanes))
        for k, c in zip(lanes, per):
            counts[k] += int(c)
        begin += won
        if won < stop:  # a rare dataset wins this step: the plain rule over all unspent ones
            _exhaustive_steps(w, n, counts, begin, choice[: begin + 1])
            begin += 1
        span = min(_SEGMENT, max(8 * _LANE_MIN_SIZE, 2 * won))
    return choice


def build_blending_indices(
    dataset_index: numpy.ndarray,
    dataset_sample_index: numpy.ndarray,
    weights: numpy.ndarray | list[float],
    num_datasets: int,
    size: int,
    verbose: bool = False,
) -> None:
    """Fill `dataset_index` (int16 `[size]`) and `dataset_sample_index` (int64 `[size]`) in place.

    Step i picks the dataset with the largest `w_k * max(i, 1) - count_k` (ties: lowest k).
    """
    w = [float(x) for x in numpy.asarray(weights, dtype=numpy.float64)[:num_datasets]]
    if size >= _LANE_MIN_SIZE and num_datasets > 1 and _lanes_merge(w):
        choice = dataset_index[:size]
        if not _blend_choice(w, choice, dataset_sample_index[:size]):
            _fill_sample_index(choice, num_datasets, dataset_index, dataset_sample_index)
    else:
        if num_datasets == 2 and min(w) > 0:
            choice = _two_way_choice(w[0], w[1], size)
        else:
            choice = numpy.empty(size, dtype=numpy.int16)
            _greedy_steps(w, [0] * num_datasets, 0, size, choice)
        _fill_sample_index(choice, num_datasets, dataset_index, dataset_sample_index)
    if verbose:
        for k in range(num_datasets):
            achieved = numpy.count_nonzero(choice == k) / max(size, 1)
            print(f"   dataset {k}, input: {w[k]}, achieved: {achieved}")


def build_exhaustive_blending_indices(
    dataset_index: numpy.ndarray,
    dataset_sample_index: numpy.ndarray,
    sizes: numpy.ndarray | list[int],
    num_datasets: int,
) -> None:
    """Like `build_blending_indices` but draw exactly `sizes[k]` samples from dataset k.

    Weights are `sizes / total`; a dataset leaves the competition once it has its `sizes[k]`.
    """
    n = [int(x) for x in numpy.asarray(sizes, dtype=numpy.int64)[:num_datasets]]
    total = sum(n)
    w = [x / float(total) for x in n]
    if num_datasets == 2 and min(n) > 0 and total <= 4 * _TWO_WAY_MAX:
        # Until one dataset is spent the rule is the plain two-way greedy; after, the other
        # dataset takes every remaining step.
        choice = _two_way_choice(w[0], w[1], total)
        for k in (0, 1):
            hits = numpy.flatnonzero(choice == k)
            if hits.size >= n[k]:
                spent_at = int(hits[n[k] - 1])
                rest = choice[spent_at + 1 :]
                if numpy.count_nonzero(rest == k):
                    rest[:] = 1 - k
                    break
    else:
        choice = _exhaustive_choice(n)
    _fill_sample_index(choice, num_datasets, dataset_index, dataset_sample_index)
