"""BertModel at PP = 2 through the 1F1B schedule equals the one-rank model built from the same
full weights (fp32): per-microbatch losses and every gradient (tied embedding/output grads summed
over the embedding group). The TP twin is shared with T5: `../test_tensor_parallel_twins.py`."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.bert import BertModel
from gigatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from gigatron.testing import run_distributed
from tests.core.models._encoder_cases import encoder_config

pytestmark = pytest.mark.multirank


V, S, B = 64, 8, 2


def _build(tp, sp):
    cfg = encoder_config(tp, sp)
    return BertModel(cfg, 2, bert_layer_local_spec, V, 16, share_embeddings_and_output_weights=True)


def _inputs():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (B, S), generator=g)
    types = (torch.arange(S) >= 4).long()[None].expand(B, -1).contiguous()
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 6:] = 0
    labels = torch.randint(0, V, (B, S), generator=g)
    return ids, types, mask, labels


def _run(model):
    ids, types, mask, labels = _inputs()
    with torch.no_grad():
        logits, _ = model(ids, mask, tokentype_ids=types)
    loss, binary = model(ids, mask, tokentype_ids=types, lm_labels=labels)
    (loss * mask).sum().backward(retain_graph=True)
    F.cross_entropy(binary, torch.tensor([0, 1])).backward()
    return logits, loss.detach(), binary.detach()


def _pp_inputs(i):
    ids, types, mask, labels = _inputs()
    g = torch.Generator().manual_seed(10 + i)
    return ids[torch.randperm(B, generator=g)], types, mask, labels.roll(i, dims=1)


def _pp_forward_step(data_iterator, model):
    ids, types, mask, labels = next(data_iterator)
    output = model(ids, mask, tokentype_ids=types, lm_labels=labels)

    def loss_func(out):  # last stage: (per-token loss [b, s], binary logits [b, 2])
        loss, binary = out
        total = (loss * mask).sum() + F.cross_entropy(binary, torch.tensor([0, 1]))
        return total, {"loss": total.detach().clone()}

    return output, loss_func


def _pp_body(num_microbatches):
    from gigatron.core.pipeline_parallel.schedules import get_forward_backward_func

    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    torch.manual_seed(0)
    ref = _build(1, False)
    ref_losses = []
    for i in range(num_microbatches):
        ids, types, mask, labels = _pp_inputs(i)
        loss, binary = ref(ids, mask, tokentype_ids=types, lm_labels=labels)
        total = (loss * mask).sum() + F.cross_entropy(binary, torch.tensor([0, 1]))
        (total / num_microbatches).backward()
        ref_losses.append(total.detach())
    full = {n: p.detach().clone() for n, p in ref.named_parameters()}
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(1, 2)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    cfg = encoder_config(1, False, pp=2)
    model = BertModel(
        cfg,
        2,
        bert_layer_local_spec,
        V,
        16,
        pre_process=stage == 0,
        post_process=stage == 1,
        share_embeddings_and_output_weights=True,
    )
    params = dict(model.named_parameters())
    # global layer index of each local layer: this stage's layers follow the previous stage's
    names = {n: n.replace("encoder.layers.0.", f"encoder.layers.{stage}.") for n in params}
    names["output_layer.weight"] = "embedding.word_embeddings.weight"  # last stage's tied copy
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(full[names[name]])
    reports = get_forward_backward_func()(
        forward_step_func=_pp_forward_step,
        data_iterator=iter([_pp_inputs(i) for i in range(num_microbatches)]),
        model=model,
        num_microbatches=num_microbatches,
        seq_length=S,
        micro_batch_size=B,
    )
    tied = model.shared_embedding_or_output_weight()  # finalize_model_grads' embedding rule
    dist.all_reduce(tied.grad, group=parallel_state.get_embedding_group())
    grad_err = 0.0
    for name, p in params.items():
        expected = ref_grads[names[name]]
        torch.testing.assert_close(p.grad, expected, rtol=0, atol=1e-5, msg=name)
        grad_err = max(grad_err, (p.grad - expected).abs().max().item())
    loss_err = 0.0
    if stage == 1:
        losses = torch.stack([r["loss"] for r in reports])
        loss_err = (losses - torch.stack(ref_losses)).abs().max().item()
        assert loss_err <= 1e-4, loss_err
    return {"stage": stage, "grads": grad_err, "loss": loss_err}


def test_bert_pipeline_parallel_matches_one_rank():
    results = run_distributed(_pp_body, 2, args=(2,), timeout=240)
    print(results)
    assert [r["stage"] for r in results] == [0, 1]
