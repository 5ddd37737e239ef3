"""LanguageModule.compute_language_model_loss hands the module's TP group to the loss."""

from types import SimpleNamespace

import torch

from gigatron.core.models.common.language_module import language_module as lm


def test_loss_passes_the_modules_tp_group(monkeypatch):
    group = object()
    seen = {}

    def fake_ce(logits, labels, label_smoothing=0.0, tp_group=None):
        seen["tp_group"] = tp_group
        return torch.zeros_like(labels, dtype=logits.dtype)

    monkeypatch.setattr(lm.tensor_parallel, "vocab_parallel_cross_entropy", fake_ce)
    module = SimpleNamespace(tp_group=group)
    loss = lm.LanguageModule.compute_language_model_loss(
        module, labels=torch.zeros(2, 3, dtype=torch.long), logits=torch.randn(3, 2, 5)
    )
    assert seen["tp_group"] is group
    assert loss.shape == (2, 3)


def test_pg_collection_tp_is_stored_and_none_means_parallel_state():
    config = SimpleNamespace(virtual_pipeline_model_parallel_size=None)
    group = object()
    with_pg = lm.LanguageModule(config, pg_collection=SimpleNamespace(tp=group))
    assert with_pg.tp_group is group
    assert lm.LanguageModule(config).tp_group is None
