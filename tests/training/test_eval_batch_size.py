"""--eval-global-batch-size / --eval-micro-batch-size (Megatron's ValidationConfig fields):
evaluation reads eval_global_batch_size samples per iteration in micro-batches of
eval_micro_batch_size, whatever the training sizes. The validation loss of a tiny run whose eval
sizes differ from its training sizes equals the token-mean loss of the split's first
eval_iters x eval_global_batch_size samples, computed by one forward of the trained model; on
two data-parallel ranks as on one. The sizes default to the training ones, and one that does
not split into whole micro-batches over the data-parallel ranks is refused."""

import pytest

from gigatron.compat.errors import ArgumentError
from gigatron.testing import run_distributed
from tests.training._gpt_runs import small_mock_corpus
from tests.training.test_final_eval import ARGS, _pretrain

pytestmark = pytest.mark.multirank


def _valid_loss_by_hand(model, num_samples: int) -> float:
    """Token-mean LM loss of the validation split's first `num_samples` samples."""
    import torch

    from gigatron.training import pretrain_gpt, training

    sizes = training.get_train_valid_test_num_samples()
    with small_mock_corpus():  # the corpus run_pretrain_gpt trained and evaluated on
        _, valid_ds, _ = pretrain_gpt.train_valid_test_datasets_provider(sizes)
    samples = [valid_ds[i] for i in range(num_samples)]
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("tokens", "labels", "loss_mask")}
    module = model[0].module
    module.eval()
    with torch.no_grad():
        positions = torch.arange(batch["tokens"].shape[1]).expand_as(batch["tokens"])
        losses = module(batch["tokens"], positions, None, labels=batch["labels"])  # [b, s]
    mask = batch["loss_mask"]
    return float((losses.float() * mask).sum() / mask.sum())


def _run(eval_gbs: int, eval_mbs: int, eval_iters: int):
    from gigatron.training.global_vars import get_args

    flags = ["--mock-data", "--train-iters", "2", "--eval-iters", str(eval_iters)]
    flags += ["--eval-global-batch-size", str(eval_gbs), "--eval-micro-batch-size", str(eval_mbs)]
    lines, result = _pretrain(ARGS + flags)  # training: micro 2, global 4
    args = get_args()
    by_hand = _valid_loss_by_hand(result["model"], eval_iters * eval_gbs)
    consumed = args.consumed_valid_samples
    return float(result["valid"]["lm loss"]), by_hand, consumed, args.data_parallel_size


@pytest.mark.parametrize(
    "world_size, eval_gbs, eval_mbs",
    [(1, 6, 3), (2, 6, 3)],
)
def test_validation_loss_reads_eval_batches_of_eval_micro_batches(world_size, eval_gbs, eval_mbs):
    results = run_distributed(_run, world_size, args=(eval_gbs, eval_mbs, 2), timeout=180)
    for valid, by_hand, consumed, dp in results:
        assert dp == world_size
        assert abs(valid - by_hand) <= 1e-5 * by_hand, (valid, by_hand)
        # the end's evaluations of --eval-iters 2, validation then test (Megatron counts both)
        assert consumed == 2 * 2 * eval_gbs


def _validated(*extra: str, world_size: int = 1):
    from gigatron.training.arguments import parse_args, validate_args

    argv = ARGS + ["--mock-data", "--train-iters", "1", *extra]
    return validate_args(parse_args(argv=argv), world_size=world_size)


def test_eval_batch_sizes_default_to_the_training_sizes():
    args = _validated()
    assert (args.eval_global_batch_size, args.eval_micro_batch_size) == (4, 2)
    args = _validated("--eval-micro-batch-size", "1")
    assert (args.eval_global_batch_size, args.eval_micro_batch_size) == (4, 1)


@pytest.mark.parametrize(
    "extra, world_size",
    [
        (["--eval-global-batch-size", "5"], 1),  # 5 % 2
        (["--eval-global-batch-size", "6", "--eval-micro-batch-size", "2"], 2),  # 6 % 4
        (["--eval-micro-batch-size", "3"], 1),  # the default eval global batch 4 % 3
        (["--eval-micro-batch-size", "0"], 1),
    ],
)
def test_eval_batch_not_in_whole_micro_batches_is_refused(extra, world_size):
    with pytest.raises(ArgumentError, match=r"eval_global_batch_size \(\d+\) must be divisible"):
        _validated(*extra, world_size=world_size)
