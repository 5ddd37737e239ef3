"""Index builders for GPT and blended datasets, in NumPy (Megatron compiles these from C++).

Mirrors `megatron.core.datasets.helpers` (`helpers.cpp`): same signatures, same outputs, bit for
bit. `build_sample_idx` is vectorised: a sample boundary is a global token position `i * seq_len`
in the concatenation of the documents in `document_index` order, so a cumulative sum of document
lengths plus one `searchsorted` finds every boundary at once. The blending builders follow
Megatron's greedy "largest error first" rule (in float64, like the C++). That rule is sequential;
for two datasets it has a closed form (dataset 0 takes step i iff its count <= w0 * i), which is
used to predict whole blocks that are then checked against the float64 rule and repaired where
rounding disagrees, so the result stays bit-identical. Three or more datasets (and the exhaustive
variant, one phase per set of unspent datasets) run in parallel "lanes" over time: see
`_lane_choice`. Inputs where lanes would not pay (unnormalised or negative weights, NaN, short
runs) take the plain loop, which is the reference.
"""

from __future__ import annotations

import math

import numpy

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


def _greedy_steps(
    w: list[float],
    counts: list[int],
    begin: int,
    end: int,
    choice: numpy.ndarray,
    offset: int = 0,
) -> None:
    """Megatron's rule for steps [begin, end): argmax_k w_k * max(i, 1) - counts_k (ties: low k).

    Step i is written to `choice[i - offset]`.
    """
    if offset:
        choice = _Shifted(choice, offset)
    if len(w) > 12:  # many datasets: one NumPy argmax per step beats a Python loop over k
        _greedy_steps_numpy(w, counts, begin, end, choice)
        return
    ks = range(1, len(w))
    for i in range(begin, end):
        t = float(i) if i > 1 else 1.0
        best, best_err = 0, w[0] * t - counts[0]
        for k in ks:
            err = w[k] * t - counts[k]
            if err > best_err:
                best, best_err = k, err
        choice[i] = best
        counts[best] += 1


class _Shifted:
    """`a[i - offset]` for `a[i]`: lets the step loops write a tail buffer by global step."""

    def __init__(self, array: numpy.ndarray, offset: int) -> None:
        self.array, self.offset = array, offset

    def __setitem__(self, i: int, value: int) -> None:
        self.array[i - self.offset] = value


def _greedy_steps_numpy(
    w: list[float], counts: list[int], begin: int, end: int, choice: numpy.ndarray
) -> None:
    weights = numpy.asarray(w, dtype=numpy.float64)
    c = numpy.asarray(counts, dtype=numpy.float64)
    err = numpy.empty_like(weights)
    for i in range(begin, end):
        numpy.multiply(weights, float(i) if i > 1 else 1.0, out=err)
        err -= c
        best = int(err.argmax())  # first maximum: ties go to the lowest index, as in C++
        choice[i] = best
        c[best] += 1.0
    counts[:] = [int(x) for x in c]


def _two_way_choice(w0: float, w1: float, size: int) -> numpy.ndarray:
    """int8 `[size]` choices of the greedy rule for two datasets, exact.

    In exact arithmetic (w0 + w1 = 1, i >= 1) dataset 1 wins iff c0 > w0 * i, so dataset 0 takes
    its j-th sample at p_j = max(p_{j-1} + 1, ceil(j / w0)). Blocks are predicted from that, then
    checked with the float64 rule; the first disagreement is replaced by a few exact steps.
    """
    choice = numpy.empty(size, dtype=numpy.int8)
    counts = [0, 0]
    head = min(size, 2)  # steps 0 and 1 both use t = 1
    _greedy_steps([w0, w1], counts, 0, head, choice)
    start, block = head, 1 << 16
    while start < size:
        end = min(size, start + block)
        n = end - start
        c0 = counts[0]
        j = numpy.arange(c0, c0 + n + 1, dtype=numpy.float64)
        due = numpy.ceil(j / w0) - j
        numpy.maximum.accumulate(due, out=due)
        picks0 = j + numpy.maximum(due, start - c0)  # float: huge (or inf) for tiny w0
        picks0 = picks0[picks0 < end].astype(numpy.int64)
        seg = numpy.ones(n, dtype=numpy.int8)
        seg[picks0 - start] = 0
        # Check every step of the block with the float64 rule, as the C++ computes it.
        is0 = seg == 0
        c0_before = c0 + numpy.cumsum(is0) - is0
        steps = numpy.arange(start, end, dtype=numpy.int64)
        t = steps.astype(numpy.float64)
        err0 = w0 * t - c0_before
        err1 = w1 * t - (steps - c0_before)
        bad = numpy.flatnonzero((err1 > err0).astype(numpy.int8) != seg)
        good = n if bad.size == 0 else int(bad[0])
        choice[start : start + good] = seg[:good]
        counts[0] += int(numpy.count_nonzero(is0[:good]))
        counts[1] = start + good - counts[0]
        start += good
        if good < n:  # repair: exact steps past the disagreement, then predict again
            stop = min(size, start + 64)
            _greedy_steps([w0, w1], counts, start, stop, choice)
            start = stop
    return choice


# Three or more datasets: "parallel in time". The rule depends on the past only through the
# count vector, and two runs of it started from different counts merge after a short while (each
# step hands the sample to the dataset furthest behind). So the steps are cut into P lanes that
# run side by side, one NumPy op over all lanes per dataset and step: lane p simulates global steps
# [p*L, p*L + W + L) from guessed counts, the first W steps only to forget the guess. A lane is
# exact when its counts after the warm-up equal the previous lane's final counts (lane 0 starts
# exactly at zero); lanes that disagree are run again from their neighbour's final counts until
# every lane agrees, so the result is the sequential rule's, step for step, in float64.
_LANE_MIN_SIZE = 1 << 14  # below this the Python loop is as fast
_LANE_TARGET = 8192  # lanes per op: large enough that NumPy's per-call cost is amortised
_LANE_MAX_PASSES = 8  # side-by-side reruns of disagreeing lanes, while there are many of them
_LANE_SWEEP = 32  # fewer disagreeing lanes than this: rerun them one by one in the plain loop


def _lane_steps(
    w: list[float], t0: numpy.ndarray, counts: numpy.ndarray, nsteps: int, out: numpy.ndarray
) -> None:
    """Megatron's rule for `nsteps` steps in every lane at once, in place.

    Args:
        w: the D weights.
        t0: float64 `[P]` global step of each lane's first step.
        counts: float64 `[D, P]` samples taken so far per dataset and lane (updated).
        out: int16 `[nsteps, P]` receives the chosen dataset of each step and lane.
    """
    num, lanes = counts.shape
    flat = counts.reshape(-1)
    lane_ids = numpy.arange(lanes)
    t = numpy.empty(lanes)
    best_err, err = numpy.empty(lanes), numpy.empty(lanes)
    better = numpy.empty(lanes, dtype=bool)
    best = numpy.empty(lanes, dtype=numpy.intp)
    for j in range(nsteps):
        numpy.add(t0, float(j), out=t)
        if j == 0:
            numpy.maximum(t, 1.0, out=t)  # steps 0 and 1 both use t = 1
        numpy.multiply(t, w[0], out=best_err)
        best_err -= counts[0]  # w_0 * t - c_0, rounded twice as in C++
        best.fill(0)
        for k in range(1, num):
            numpy.multiply(t, w[k], out=err)
            err -= counts[k]
            numpy.greater(err, best_err, out=better)  # strict: ties keep the lower index
            numpy.putmask(best, better, k)
            numpy.maximum(best_err, err, out=best_err)
        out[j] = best
        best *= lanes
        best += lane_ids
        flat[best] += 1.0


def _guess_counts(w: numpy.ndarray, steps: numpy.ndarray, taken: int) -> numpy.ndarray:
    """float64 `[D, P]` likely counts before each of `steps`: largest remainders of w * (s - 1).

    With weights summing to 1, dataset k's deficit w_k * s - c_k stays near [w_k - 1, w_k), which
    is what w * (s - 1) rounded to a total of s gives. `taken` samples went to datasets outside
    `w` (spent ones); the deficits then rise together, so all ideals shift by one amount.
    """
    num = w.shape[0]
    base = steps.astype(numpy.float64) - 1.0
    ideal = w[:, None] * base + (base - taken - w.sum() * base) / num  # [D, P], sums to s-1-taken
    counts = numpy.floor(ideal)
    short = numpy.clip(steps - taken - counts.sum(axis=0), 0, num).astype(numpy.int64)  # [P]
    order = numpy.argsort(counts - ideal, axis=0, kind="stable")  # largest remainder first
    rank = numpy.empty_like(order)
    numpy.put_along_axis(rank, order, numpy.arange(num)[:, None], axis=0)
    counts += rank < short
    return counts


def _lanes_merge(w: list[float]) -> bool:
    """Whether lanes are worth it: non-negative weights summing to 1 (as BlendedDataset passes).

    Other weights still give exact results in lanes, but guessed counts are then far off and the
    lanes rarely agree, so the plain loop is faster.
    """
    return min(w) >= 0.0 and abs(math.fsum(w) - 1.0) < 1e-6


def _lane_choice(
    w: list[float], size: int, begin: int = 0, counts0: list[int] | None = None
) -> numpy.ndarray:
    """int16 `[size]` choices of the greedy rule for steps [begin, begin + size), exact.

    `counts0` are the exact counts before step `begin` (zeros by default); samples of step
    `begin` not in them went to datasets outside `w`.
    """
    weights = numpy.asarray(w, dtype=numpy.float64)
    counts0 = [0] * len(w) if counts0 is None else counts0
    length = max(256, -(-size // _LANE_TARGET))
    warm = length // 8
    lanes = max(1, -(-(size - warm) // length))
    buf = numpy.empty((warm + length, lanes), dtype=numpy.int16)  # [steps, lanes]
    first = begin + numpy.arange(lanes) * length  # global step of each lane's first step
    counts = _guess_counts(weights, first, begin - sum(counts0))  # [D, P]
    counts[:, 0] = counts0
    _lane_steps(w, first.astype(numpy.float64), counts, warm, buf[:warm])
    start = counts.copy()  # [D, P] counts at global step first + W
    _lane_steps(w, (first + warm).astype(numpy.float64), counts, length, buf[warm:])
    for _ in range(_LANE_MAX_PASSES):  # many lanes disagree: run them again side by side
        redo = 1 + numpy.flatnonzero((start[:, 1:] != counts[:, :-1]).any(axis=0))
        if redo.size == 0 or redo.size < _LANE_SWEEP:
            break
        start[:, redo] = counts[:, redo - 1]
        fixed = start[:, redo].copy()
        part = numpy.empty((length, redo.size), dtype=numpy.int16)
        _lane_steps(w, (first[redo] + warm).astype(numpy.float64), fixed, length, part)
        buf[warm:, redo] = part
        counts[:, redo] = fixed
    _sweep_lanes(w, first + warm, start, counts, buf[warm:])
    choice = numpy.empty(warm + lanes * length, dtype=numpy.int16)
    choice[: warm + length] = buf[:, 0]
    choice[warm + length :] = buf[warm:, 1:].T.reshape(-1)
    return choice[:size]


def _sweep_lanes(
    w: list[float],
    begin: numpy.ndarray,
    start: numpy.ndarray,
    counts: numpy.ndarray,
    out: numpy.ndarray,
) -> None:
    """Make every lane agree with its predecessor, in order, rerunning lanes with the plain loop.

    Args:
        begin: int `[P]` global step where each lane's kept steps start.
        start, counts: float64 `[D, P]` counts of each lane at its kept steps' start and end.
        out: int16 `[L, P]` the lanes' kept steps (rerun lanes are rewritten).
    """
    length, lanes = out.shape
    todo = list(1 + numpy.flatnonzero((start[:, 1:] != counts[:, :-1]).any(axis=0)))
    todo.reverse()
    while todo:
        lane = int(todo.pop())
        while True:
            exact = [int(x) for x in counts[:, lane - 1]]
            start[:, lane] = exact
            column = numpy.empty(length, dtype=numpy.int16)
            step = int(begin[lane])
            _greedy_steps(w, exact, step, step + length, column, offset=step)
            out[:, lane] = column
            counts[:, lane] = exact
            lane += 1  # the next lane now starts from new counts: check it again
            if todo and todo[-1] == lane:
                todo.pop()
            if lane == lanes or (start[:, lane] == counts[:, lane - 1]).all():
                break


def _exhaustive_steps(
    w: list[float], n: list[int], counts: list[int], begin: int, choice: numpy.ndarray
) -> None:
    """Megatron's exhaustive rule from step `begin` (exact `counts`) to the end of `choice`."""
    unspent = [k for k in range(len(n)) if counts[k] < n[k]]
    for i in range(begin, choice.shape[0]):
        t = float(i) if i > 1 else 1.0
        best, best_err = -1, -math.inf
        for k in unspent:
            err = w[k] * t - counts[k]
            if err > best_err:
                best, best_err = k, err
        choice[i] = best
        counts[best] += 1
        if counts[best] == n[best]:
            unspent.remove(best)


def _exhaustive_choice(n: list[int]) -> numpy.ndarray:
    """int16 `[sum(n)]` choices of the exhaustive rule: lanes per set of unspent datasets.

    While no dataset is spent the rule is the plain greedy one over the unspent datasets, so
    lanes run a chunk of steps from the exact counts and keep it up to the step that spends a
    dataset, if any. Chunks double while nothing is spent (a dataset of a few samples may be spent
    early, the others near the end), so the steps past a spend that are thrown away stay few.
    """
    total = sum(n)
    w = [x / float(total) for x in n]
    choice = numpy.empty(total, dtype=numpy.int16)
    counts = [0] * len(n)
    begin, span = 0, 8 * _LANE_MIN_SIZE
    while begin < total:
        active = [k for k in range(len(n)) if counts[k] < n[k]]
        if total - begin < _LANE_MIN_SIZE or len(active) < 2:
            _exhaustive_steps(w, n, counts, begin, choice)
            break
        size = min(total - begin, span)
        now = [counts[k] for k in active]
        local = _lane_choice([w[k] for k in active], size, begin, now)
        stop = size  # steps kept: up to and including the first spend
        for a, k in enumerate(active):
            hits = numpy.flatnonzero(local == a)
            if hits.size >= n[k] - counts[k]:
                stop = min(stop, int(hits[n[k] - counts[k] - 1]) + 1)
        phase = numpy.asarray(active, dtype=numpy.int16)[local[:stop]]
        choice[begin : begin + stop] = phase
        for k, c in enumerate(numpy.bincount(phase, minlength=len(n))):
            counts[k] += int(c)
        begin += stop
        span = max(8 * _LANE_MIN_SIZE, 2 * stop)
    return choice


def _fill_sample_index(
    choice: numpy.ndarray, num_datasets: int, dataset_index: numpy.ndarray, sample: numpy.ndarray
) -> None:
    size = choice.shape[0]
    dataset_index[:size] = choice
    for k in range(num_datasets):
        where = numpy.flatnonzero(choice == k)
        sample[where] = numpy.arange(where.size)


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
    if num_datasets == 2 and min(w) > 0:
        choice = _two_way_choice(w[0], w[1], size)
    elif size >= _LANE_MIN_SIZE and num_datasets > 1 and _lanes_merge(w):
        choice = _lane_choice(w, size)
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
    if num_datasets == 2 and min(n) > 0:
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
