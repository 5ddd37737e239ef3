"""Bad data and flag values through `gigatron train` on 2 gloo ranks (issue 28, item 7): a blend
with --eval-iters 0 trains as one prefix does; a corpus whose documents are all empty, and a
build failure only rank 0 sees (it builds the indices first), stop every rank with the same one
line naming the file; --micro-batch-size 0 and --expert-model-parallel-size without experts stop
every rank before any collective.

Each rank returns its error as text instead of exiting, so a rank left waiting at a collective
shows up as a timeout (under torchrun it died with gloo's 'connection closed')."""

import pytest

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


FLAGS = [
    "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
    "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2",
    "--lr", "1e-3", "--vocab-size", "100", "--make-vocab-size-divisible-by", "64",
    "--log-interval", "100", "--no-progress-bar", "--num-workers", "0",
]  # fmt: skip


def _corpora(tmp):
    """On rank 0: `a` and `b` (200 documents each), `empty` (50 empty documents), `half` (40
    empty documents, then 40 with tokens)."""
    import numpy
    import torch
    import torch.distributed as dist

    from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from tests.core.datasets.test_empty_split import _corpus

    if dist.get_rank() == 0:
        _corpus(f"{tmp}/a", 200), _corpus(f"{tmp}/b", 200)
        for name, empty, full in (("empty", 50, 0), ("half", 40, 40)):
            builder = IndexedDatasetBuilder(f"{tmp}/{name}.bin", dtype=numpy.uint16)
            for i in range(empty + full):
                doc = [] if i < empty else [5] * 20 + [99]
                builder.add_document(torch.tensor(doc, dtype=torch.int64), [len(doc)])
            builder.finalize(f"{tmp}/{name}.idx")
    dist.barrier()


def _train(tmp, data, extra):
    """`gigatron train` with --data-path `data` (names under `tmp`): (iterations, validation
    loss) or the error as 'Type: message'."""
    from gigatron import cli
    from gigatron.training.global_vars import get_args

    _corpora(tmp)
    data = [d if d[0].isdigit() else f"{tmp}/{d}" for d in data]
    argv = FLAGS + ["--data-path", *data, "--data-cache-path", f"{tmp}/cache"] + extra
    try:
        cli.run(["train", *argv])  # raises (cli.main prints the error as one line)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    args = get_args()
    return args.iteration, len(args.train_history)


def test_blend_with_eval_iters_zero_trains_like_one_prefix(tmp_path):
    """0.5 a 0.5 b with --eval-iters 0 asks 0 validation / test samples: those splits are left
    out, as for one prefix (it failed with 'no samples to consume (total_samples=0)')."""
    flags = ["--eval-iters", "0"]
    blend = run_distributed(
        _train, 2, args=(str(tmp_path), ["0.5", "a", "0.5", "b"], flags), timeout=90
    )
    assert blend == [(2, 2), (2, 2)], blend


def test_corpus_of_empty_documents_fails_on_every_rank(tmp_path):
    """Every document of `empty` has 0 tokens: the same error on both ranks, naming the .bin and
    the rule, alone or in a blend (rank 0 raised; rank 1 waited at the build barrier), and
    before the test split's emptiness (the default 969,30,1 leaves 50 sequences none)."""
    blend, no_eval = ["0.5", "a", "0.5", "empty"], ["--eval-iters", "0"]
    for data, flags in ((["empty"], no_eval), (["empty"], []), (blend, no_eval)):
        got = run_distributed(_train, 2, args=(str(tmp_path), data, flags), timeout=60)
        assert got[0] == got[1], got
        assert f"{tmp_path}/empty.bin" in got[0] and "holds no tokens" in got[0], got
        assert got[0].startswith("ValueError: ") and "\n" not in got[0], got


def test_rank0_only_build_error_reaches_every_rank(tmp_path):
    """`half`'s train split (--split 50,50,0: its first 40 sequences) has no tokens though the
    corpus has: only the index build, which rank 0 runs first, finds it. Its error reaches rank
    1 at the build barrier."""
    flags = ["--split", "50,50,0", "--eval-iters", "0"]
    got = run_distributed(_train, 2, args=(str(tmp_path), ["half"], flags), timeout=60)
    assert got[0] == got[1], got
    assert "the train split of" in got[0] and f"{tmp_path}/half" in got[0], got


def test_cache_rank0_cannot_write_fails_on_every_rank(tmp_path):
    """--data-cache-path names a file: rank 0, which writes the cached indices, fails; the
    others get its error (they waited at the build barrier)."""
    flags = ["--eval-iters", "0", "--data-cache-path", f"{tmp_path}/a.idx"]
    got = run_distributed(_train, 2, args=(str(tmp_path), ["a"], flags), timeout=60)
    assert got[0] == got[1], got
    assert got[0].startswith("OSError: failed to build the GPTDataset indices"), got
    assert f"{tmp_path}/a.idx" in got[0] and "--data-cache-path" in got[0], got


def test_bad_batch_and_expert_flags_fail_on_every_rank(tmp_path):
    """--micro-batch-size 0 (ZeroDivisionError) and --expert-model-parallel-size 2 without
    --num-experts (accepted) are refused on both ranks before any collective."""
    cases = (
        (["--micro-batch-size", "0"], "ValueError: --micro-batch-size (0) must be >= 1"),
        (["--expert-model-parallel-size", "2"], "ValueError: --expert-model-parallel-size 2 "),
    )
    for extra, start in cases:
        got = run_distributed(_train, 2, args=(str(tmp_path), ["a"], extra), timeout=60)
        assert got[0] == got[1] and got[0].startswith(start), got


class _CacheFull(Exception):
    """Not a built-in: the other ranks raise a RuntimeError carrying its name and text."""


def _fails_on_rank0():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        raise _CacheFull("no space left for the indices")
    return "built"


def _generic_build():
    from gigatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder as Builder,
    )

    try:
        Builder.build_generic_dataset(_fails_on_rank0, lambda: True, True)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def test_rank0_error_of_any_type_reaches_every_rank():
    got = run_distributed(_generic_build, 2, timeout=30)
    assert got[0] == "_CacheFull: no space left for the indices", got
    assert got[1] == (
        "RuntimeError: rank 0 failed to build the datasets: _CacheFull: no space left for the "
        "indices"
    ), got
