"""T5Model(parallel_output=False) with lm_labels on TP = 2 gloo ranks: the per-token loss is the
full-vocabulary cross entropy of the logits it returns, and loss and every gradient equal the
parallel_output=True model's, with tied (LM head bias) and untied output weights.

Megatron feeds the gathered [sd, b, V] logits to vocab_parallel_cross_entropy, which reads them
as a V-wide shard per rank: the loss comes out log(tp) too high there (gigatron differs on
purpose)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state
from gigatron.core.models.T5 import T5Model
from gigatron.core.models.T5.t5_spec import (
    get_t5_decoder_with_local_block_spec,
    get_t5_encoder_with_local_block_spec,
)
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


V, SE, SD, B = 32, 8, 6, 2


def _model(parallel_output, tied):
    torch.manual_seed(0)  # CPU initialisation: the same full weights, sharded, in every model
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        activation_func=F.gelu,
        tensor_model_parallel_size=2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    return T5Model(
        config,
        dataclasses.replace(config),
        get_t5_encoder_with_local_block_spec(2),
        get_t5_decoder_with_local_block_spec(2),
        vocab_size=V,
        max_sequence_length=SE,
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=tied,
    )


def _inputs():
    g = torch.Generator().manual_seed(1)
    enc = torch.randint(1, V, (B, SE), generator=g)
    dec = torch.randint(1, V, (B, SD), generator=g)
    enc[1, 6:] = 0  # padding
    labels = torch.randint(0, V, (B, SD), generator=g)

    def masked(q, k):  # [b, 1, sq, sk], True = masked
        return ~((q[:, :, None] >= 1) & (k[:, None, :] >= 1))[:, None]

    causal = torch.ones(SD, SD, dtype=torch.bool).triu(1)
    return (enc, dec, masked(enc, enc), masked(dec, dec) | causal, masked(dec, enc)), labels


def _loss_and_grads(model, batch, labels):
    loss = model(*batch, lm_labels=labels)  # [b, sd]
    loss.mean().backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _worker(tied):
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(2)
    batch, labels = _inputs()
    model = _model(False, tied)
    with torch.no_grad():
        logits = model(*batch)  # [b, sd, V]: gathered
    assert logits.shape == (B, SD, V)
    loss, grads = _loss_and_grads(model, batch, labels)
    ref = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(loss, ref.view(B, SD), rtol=1e-5, atol=1e-5)
    ref_loss, ref_grads = _loss_and_grads(_model(True, tied), batch, labels)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad, rtol=1e-5, atol=1e-6, msg=name)
    head = "lm_head.output_layer.bias" if tied else "lm_head.output_layer.weight"
    assert ref_grads[head].abs().max() > 1e-3
    return (loss - ref_loss).abs().max().item()


@pytest.mark.parametrize("tied", [True, False])
def test_parallel_output_false_loss_is_full_vocab_cross_entropy(tied):
    run_distributed(_worker, 2, args=(tied,), timeout=120)
