"""BertModel(parallel_output=False) with lm_labels on TP = 2 gloo ranks: the per-token loss is
the full-vocabulary cross entropy of the logits it returns, and loss, binary logits and every
gradient equal the parallel_output=True model's.

Megatron feeds the gathered [s, b, V] logits to vocab_parallel_cross_entropy, which reads them as
a V-wide shard per rank: the loss comes out log(tp) too high there (gigatron differs on purpose)."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state
from gigatron.core.models.bert import BertModel
from gigatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


V, S, B = 32, 8, 2


def _model(parallel_output):
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
    return BertModel(
        config,
        2,
        bert_layer_local_spec,
        V,
        S,
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=True,
    )


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, S), generator=g)
    types = (torch.arange(S) >= 4).long()[None].expand(B, -1).contiguous()
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 6:] = 0
    labels = torch.randint(0, V, (B, S), generator=g)
    return ids, types, mask, labels


def _loss_and_grads(model, ids, types, mask, labels):
    loss, binary = model(ids, mask, tokentype_ids=types, lm_labels=labels)  # [b, s], [b, 2]
    (loss.mean() + F.cross_entropy(binary, torch.tensor([0, 1]))).backward()
    return loss.detach(), binary.detach(), {n: p.grad for n, p in model.named_parameters()}


def _worker():
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(2)
    ids, types, mask, labels = _inputs()
    model = _model(False)
    with torch.no_grad():
        logits, _ = model(ids, mask, tokentype_ids=types)  # [b, s, V]: gathered
    assert logits.shape == (B, S, V)
    loss, binary, grads = _loss_and_grads(model, ids, types, mask, labels)
    ref = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(loss, ref.view(B, S), rtol=1e-5, atol=1e-5)
    ref_loss, ref_binary, ref_grads = _loss_and_grads(_model(True), ids, types, mask, labels)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(binary, ref_binary, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad, rtol=1e-5, atol=1e-6, msg=name)
    assert ref_grads["output_layer.bias"].abs().max() > 1e-3
    assert ref_grads["embedding.word_embeddings.weight"].abs().max() > 1e-3
    return (loss - ref_loss).abs().max().item()


def test_parallel_output_false_loss_is_full_vocab_cross_entropy():
    run_distributed(_worker, 2, timeout=120)
