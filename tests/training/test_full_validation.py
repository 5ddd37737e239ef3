"""--full-validation --multiple-validation-sets end to end: a provider that returns two
validation datasets gets one evaluation per set, each over every sample of its set once
(`args.eval_iters` = the sets' lengths), logged as "validation-<name> loss at ..." with
--validation-set-names; each loss equals the token-mean loss of its set by one direct forward."""

import pytest

from gigatron.testing import run_distributed
from gigatron.training.pretrain_gpt import train_valid_test_datasets_provider as _GPT_PROVIDER
from tests.training._gpt_runs import small_mock_corpus
from tests.training.test_final_eval import ARGS, _pretrain

pytestmark = pytest.mark.multirank

_SETS = (range(0, 3), range(3, 8))


def _provider(sizes):
    """pretrain_gpt's datasets, the validation split (8 samples) cut into two sets."""
    from torch.utils.data import Subset

    train, valid, test = _GPT_PROVIDER([sizes[0], 8, sizes[2]])
    return train, [Subset(valid, list(r)) for r in _SETS], test


_provider.is_distributed = True


def _loss_by_hand(model, dataset) -> float:
    import torch

    samples = [dataset[i] for i in range(len(dataset))]
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("tokens", "labels", "loss_mask")}
    module = model[0].module
    module.eval()
    with torch.no_grad():
        positions = torch.arange(batch["tokens"].shape[1]).expand_as(batch["tokens"])
        losses = module(batch["tokens"], positions, None, labels=batch["labels"])  # [b, s]
    mask = batch["loss_mask"]
    return float((losses.float() * mask).sum() / mask.sum())


def _run():
    from unittest import mock

    from gigatron.training import pretrain_gpt
    from gigatron.training.global_vars import get_args

    flags = ["--mock-data", "--train-iters", "1", "--eval-iters", "1"]
    flags += ["--full-validation", "--multiple-validation-sets", "--validation-set-names", "a", "b"]
    with mock.patch.object(pretrain_gpt, "train_valid_test_datasets_provider", _provider):
        lines, result = _pretrain(ARGS + flags)
        with small_mock_corpus():  # the corpus run_pretrain_gpt evaluated on
            _, valid_sets, _ = _provider([4, None, 4])
    by_hand = [_loss_by_hand(result["model"], ds) for ds in valid_sets]
    evals = [ln.split(" | ")[0] for ln in lines if " loss at " in ln]
    return get_args().eval_iters, [v["lm loss"] for v in result["valid"]], by_hand, evals


def test_each_validation_set_is_evaluated_whole_under_its_name():
    ((eval_iters, valid, by_hand, evals),) = run_distributed(_run, 1, timeout=180)
    assert eval_iters == [3, 5]
    assert evals == [
        "validation-a loss at iteration 1 on validation set",
        "validation-b loss at iteration 1 on validation set",
        "validation loss at iteration 1 on test set",
    ]
    for got, want in zip(valid, by_hand, strict=True):
        assert abs(got - want) <= 1e-5 * want, (valid, by_hand)
    assert valid[0] != valid[1]
