"""T5Model at PP = 2 with Megatron's encoder/decoder split (encoder on stage 0, decoder + LM head
on stage 1) through the 1F1B schedule equals the one-rank model built from the same full weights
(fp32): loss and every gradient (the word/position embeddings live on both stages and their
grads are summed). The TP twin is shared with BERT: `../test_tensor_parallel_twins.py`."""

import dataclasses

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.T5 import T5Model
from gigatron.core.models.T5.t5_spec import (
    get_t5_decoder_with_local_block_spec,
    get_t5_encoder_with_local_block_spec,
)
from gigatron.core.pipeline_parallel.schedules import get_forward_backward_func
from gigatron.testing import run_distributed
from tests.core.models._encoder_cases import encoder_config

pytestmark = pytest.mark.multirank


V, SE, SD, B = 64, 12, 8, 2


def _build(tp=1, pp=1, add_encoder=True, add_decoder=True, post_process=True, position=None):
    cfg = dataclasses.replace(encoder_config(tp, pp=pp), variable_seq_lengths=pp > 1)
    enc_cfg = dataclasses.replace(cfg, num_layers=2)
    return T5Model(
        cfg,
        enc_cfg,
        get_t5_encoder_with_local_block_spec(2),
        get_t5_decoder_with_local_block_spec(2),
        vocab_size=V,
        max_sequence_length=16,
        share_embeddings_and_output_weights=True,
        add_encoder=add_encoder,
        add_decoder=add_decoder,
        post_process=post_process,
        position_embedding_type=position or "learned_absolute",
    )


def _inputs(i=0):
    g = torch.Generator().manual_seed(5 + i)
    enc = torch.randint(1, V, (B, SE), generator=g)
    dec = torch.randint(1, V, (B, SD), generator=g)
    enc[1, 9:] = 0  # padding, as T5MaskedWordPieceDataset pads with 0
    dec[1, 6:] = 0
    labels = torch.randint(0, V, (B, SD), generator=g)

    def keep(q, k):  # Megatron's local-spec masks: True = masked
        return ~((q[:, :, None] >= 1) & (k[:, None, :] >= 1))[:, None]

    causal = torch.ones(SD, SD, dtype=torch.bool).triu(1)
    return dict(
        encoder_input_ids=enc,
        decoder_input_ids=dec,
        encoder_attn_mask=keep(enc, enc),
        decoder_attn_mask=keep(dec, dec) | causal,
        encoder_decoder_attn_mask=keep(dec, enc),
        lm_labels=labels,
    )


def _reference(num_microbatches=1, position=None):
    parallel_state.initialize_model_parallel(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    torch.manual_seed(0)
    model = _build(position=position)
    batch = _inputs()
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "lm_labels"})
    loss = model(**batch)
    if num_microbatches == 1:
        loss.sum().backward()
    else:  # the schedule's loss: per-microbatch sum / num_microbatches
        loss = torch.stack([model(**_inputs(i)).sum() for i in range(num_microbatches)])
        (loss.sum() / num_microbatches).backward()
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    parallel_state.destroy_model_parallel()
    return full, logits, loss.detach(), grads


def _pp_forward_step(data_iterator, model):
    output = model(**next(data_iterator))  # stage 0: encoder output; stage 1: loss [b, sd]
    return output, lambda out: (out.sum(), {"loss": out.sum().detach()})


def _pp_body(num_microbatches):
    torch.set_num_threads(1)
    full, _, ref_losses, ref_grads = _reference(num_microbatches)
    parallel_state.initialize_model_parallel(1, 2)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    model = _build(pp=2, add_encoder=stage == 0, add_decoder=stage == 1, post_process=stage == 1)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(full[name])
    assert stage == 0 or not any(n.startswith("encoder.") for n in params)
    assert stage == 1 or not any(n.startswith(("decoder.", "lm_head.")) for n in params)
    reports = get_forward_backward_func()(
        forward_step_func=_pp_forward_step,
        data_iterator=iter([_inputs(i) for i in range(num_microbatches)]),
        model=model,
        num_microbatches=num_microbatches,
        seq_length=SE,
        micro_batch_size=B,
    )
    # Both stages embed tokens: sum their embedding grads (finalize_model_grads' embedding rule).
    for name in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight"):
        dist.all_reduce(params[name].grad, group=parallel_state.get_embedding_group())
    grad_err = 0.0
    for name, p in params.items():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=0, atol=1e-5, msg=name)
        grad_err = max(grad_err, (p.grad - ref_grads[name]).abs().max().item())
    loss_err = 0.0
    if stage == 1:
        losses = torch.stack([r["loss"] for r in reports])
        loss_err = (losses - ref_losses).abs().max().item()
        torch.testing.assert_close(losses, ref_losses, rtol=0, atol=1e-4)
    return {"stage": stage, "loss": loss_err, "grads": grad_err, "params": len(params)}


def test_t5_pipeline_encoder_decoder_split_matches_one_rank():
    results = run_distributed(_pp_body, 2, args=(2,), timeout=240)
    print(results)
    assert [r["stage"] for r in results] == [0, 1]
    for r in results:
        assert r["grads"] <= 1e-5 and r["loss"] <= 1e-4, r
