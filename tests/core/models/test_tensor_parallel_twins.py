"""BERT and T5 at TP = 2 equal the one-rank model built from the same full weights (fp32):
vocab-sharded logits, per-token loss, BERT's binary logits, and every gradient (SP-marked
weights summed over TP, finalize_model_grads' rule). BERT with and without sequence parallelism,
T5 with learned and relative positions. (The PP = 2 twins are model-specific: see
`bert/test_pipeline_parallel.py` and `T5/test_pipeline_parallel.py`.)"""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.common.tp_state_dict import shard_for_rank
from gigatron.testing import run_distributed
from tests.core.models._encoder_cases import CASES

pytestmark = pytest.mark.multirank


def _reference(case, variant):
    """One rank: full weights, outputs and gradients."""
    parallel_state.initialize_model_parallel(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    torch.manual_seed(0)
    model = case.build(1, variant)
    outputs, total = case.outputs(model, case.batch())
    total.backward()
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    parallel_state.destroy_model_parallel()
    return full, {k: v.detach() for k, v in outputs.items()}, grads


def _body(name, tp):
    torch.set_num_threads(1)
    case = CASES[name]
    errors = {}
    for variant in case.variants:
        full, ref, ref_grads = _reference(case, variant)
        parallel_state.initialize_model_parallel(tp)
        tensor_parallel.model_parallel_cuda_manual_seed(1)
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        model = case.build(tp, variant)
        params = dict(model.named_parameters())
        assert set(params) == set(full), variant
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(shard_for_rank(full[n], p, tp_rank, tp))
        outputs, total = case.outputs(model, case.batch())
        total.backward()
        ref["logits"] = ref["logits"].chunk(tp, dim=-1)[tp_rank]
        errs = {k: (v.detach() - ref[k]).abs().max().item() for k, v in outputs.items()}
        errs["grads"] = 0.0
        for n, p in params.items():
            grad = p.grad
            if getattr(p, "sequence_parallel", False):
                grad = grad.clone()
                dist.all_reduce(grad, group=parallel_state.get_tensor_model_parallel_group())
            expected = shard_for_rank(ref_grads[n], p, tp_rank, tp)
            torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5, msg=f"{variant} {n}")
            errs["grads"] = max(errs["grads"], (grad - expected).abs().max().item())
        errors[variant] = errs
        parallel_state.destroy_model_parallel()
    return errors


@pytest.mark.parametrize("name", sorted(CASES))
def test_tensor_parallel_matches_one_rank(name):
    results = run_distributed(_body, 2, args=(name, 2), timeout=240)
    for errors in results:
        assert set(errors) == set(CASES[name].variants)
        for variant, errs in errors.items():
            assert max(errs.values()) <= 1e-5, (variant, errs)
