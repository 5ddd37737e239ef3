"""PP = 2 with tied embeddings: the last stage's output weight starts equal to the first stage's
word embedding (zeroed, then all-reduced over the embedding group), and the two stages chained by
hand reproduce the single-stage model."""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _cfg(pp):
    return TransformerConfig(
        num_layers=2,
        hidden_size=16,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
    )


def _body():
    torch.set_num_threads(1)
    rank = dist.get_rank()
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    full = GPTModel(
        _cfg(1), get_gpt_layer_local_spec(), 32, 16, share_embeddings_and_output_weights=True
    ).eval()
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(1, 2)
    torch.manual_seed(100 + rank)  # stages start from different random weights
    stage = GPTModel(
        _cfg(2),
        get_gpt_layer_local_spec(),
        32,
        16,
        pre_process=rank == 0,
        post_process=rank == 1,
        share_embeddings_and_output_weights=True,
    ).eval()
    if rank == 1:
        assert stage.output_layer.weight.shared and stage.output_layer.weight.shared_embedding
    weight = stage.shared_embedding_or_output_weight().detach().clone()
    first_stage_weight = weight.clone()
    dist.broadcast(first_stage_weight, src=0)
    torch.testing.assert_close(weight, first_stage_weight, rtol=0, atol=0)

    # Load the single-stage weights into this stage and chain the stages by hand.
    sd = full.state_dict()
    mine = {}
    for key, value in sd.items():
        if key.startswith("decoder.layers."):
            index = int(key.split(".")[2])
            if index != rank:
                continue
            key = key.replace(f"decoder.layers.{index}.", "decoder.layers.0.")
        elif key.startswith("embedding") and rank != 0:
            continue
        elif key.startswith(("decoder.final", "output_layer")) and rank != 1:
            continue
        mine[key] = value
    if rank == 1:
        mine["output_layer.weight"] = sd["embedding.word_embeddings.weight"]
    missing, unexpected = stage.load_state_dict(mine, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if rank == 0:
            dist.send(stage(ids, None, None).contiguous(), dst=1)
            return None
        hidden = torch.empty(8, 2, 16)
        dist.recv(hidden, src=0)
        stage.set_input_tensor(hidden)
        torch.testing.assert_close(stage(None, None, None), full(ids, None, None))
    return True


def test_pipeline_tied_embeddings_and_stage_chaining():
    assert run_distributed(_body, 2, timeout=120) == [None, True]
