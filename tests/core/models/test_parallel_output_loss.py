"""BERT and T5 with parallel_output=False and lm_labels on TP = 2 gloo ranks: the per-token loss
is the full-vocabulary cross entropy of the logits they return, and the loss (BERT: and binary
logits) and every gradient equal the parallel_output=True model's; T5 with tied (LM head bias)
and untied output weights. One spawned pair of ranks runs every case.

Megatron feeds the gathered [s, b, V] logits to vocab_parallel_cross_entropy, which reads them as
a V-wide shard per rank: the loss comes out log(tp) too high there (gigatron differs on purpose)."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state
from gigatron.testing import run_distributed
from tests.core.models._encoder_cases import CASES, V

pytestmark = pytest.mark.multirank


def _loss_and_grads(case, model, batch):
    outputs, total = case.outputs(model, batch)
    total.backward()
    return {k: v.detach() for k, v in outputs.items()}, {
        n: p.grad for n, p in model.named_parameters()
    }


def _body():
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(2)
    checked = []
    for case in CASES.values():
        batch = case.batch()
        for variant in case.parallel_output_variants:
            torch.manual_seed(0)  # CPU initialisation: the same full weights in both models
            out, grads = _loss_and_grads(case, case.build(2, variant, False), batch)
            labels = case.labels(batch)
            assert out["logits"].shape == (*labels.shape, V)  # gathered
            ref = F.cross_entropy(
                out["logits"].reshape(-1, V), labels.reshape(-1), reduction="none"
            )
            torch.testing.assert_close(out["loss"], ref.view(labels.shape), rtol=1e-5, atol=1e-5)
            torch.manual_seed(0)
            ref_out, ref_grads = _loss_and_grads(case, case.build(2, variant, True), batch)
            for key in out.keys() - {"logits"}:
                torch.testing.assert_close(out[key], ref_out[key], rtol=1e-5, atol=1e-6)
            assert grads.keys() == ref_grads.keys()
            for n, ref_grad in ref_grads.items():
                torch.testing.assert_close(grads[n], ref_grad, rtol=1e-5, atol=1e-6, msg=n)
            for n in case.head_grads(variant):
                assert ref_grads[n].abs().max() > 1e-3, (case.name, variant, n)
            checked.append(f"{case.name}/{variant}")
    return checked


def test_parallel_output_false_loss_is_full_vocab_cross_entropy():
    for checked in run_distributed(_body, 2, timeout=180):
        assert checked == ["bert/tied", "t5/tied", "t5/untied"]
