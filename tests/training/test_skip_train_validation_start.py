"""--skip-train after --load evaluates the validation split from its first sample, as Megatron
(`build_pretraining_data_loader(valid_ds, 0)` under skip_train): the validation split is sized
for one evaluation there, so resuming its loader at the checkpoint's consumed_valid_samples
(three evaluations of the training run) read other samples, or past its end. The loss equals a
by-hand forward of the split's first samples through the loaded model."""

import pytest

from gigatron.testing import run_distributed
from tests.training._gpt_runs import small_mock_corpus
from tests.training.test_final_eval import ARGS, _pretrain

pytestmark = pytest.mark.multirank


def _valid_loss_by_hand(model, eval_iters: int) -> float:
    """Token-mean LM loss of the validation split's first eval_iters * global_batch_size
    samples, in one forward of the unwrapped model."""
    import torch

    from gigatron.training import pretrain_gpt, training
    from gigatron.training.global_vars import get_args

    args = get_args()
    sizes = training.get_train_valid_test_num_samples()
    with small_mock_corpus():  # the corpus run_pretrain_gpt trained and evaluated on
        _, valid_ds, _ = pretrain_gpt.train_valid_test_datasets_provider(sizes)
    samples = [valid_ds[i] for i in range(eval_iters * args.global_batch_size)]
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("tokens", "labels", "loss_mask")}
    module = model[0].module
    module.eval()
    with torch.no_grad():
        positions = torch.arange(batch["tokens"].shape[1]).expand_as(batch["tokens"])
        losses = module(batch["tokens"], positions, None, labels=batch["labels"])  # [b, s]
    mask = batch["loss_mask"]
    return float((losses.float() * mask).sum() / mask.sum())


def _runs(ckpt: str):
    from gigatron.training.global_vars import get_args

    flags = ["--mock-data", "--eval-iters", "1", "--eval-interval", "1", "--train-iters", "2"]
    _pretrain(ARGS + flags + ["--save", ckpt, "--save-interval", "2"])
    consumed = get_args().consumed_valid_samples
    _, result = _pretrain(ARGS + flags + ["--load", ckpt, "--skip-train"])
    loaded = get_args().consumed_valid_samples
    return (
        consumed,
        loaded,
        float(result["valid"]["lm loss"]),
        _valid_loss_by_hand(result["model"], eval_iters=1),
    )


def test_skip_train_after_load_evaluates_from_the_first_validation_sample(tmp_path):
    ((consumed, loaded, valid, by_hand),) = run_distributed(_runs, 1, args=(str(tmp_path / "c"),))
    assert consumed > 0 and loaded == consumed  # the checkpoint carries the count
    assert abs(valid - by_hand) < 1e-5, (valid, by_hand)
