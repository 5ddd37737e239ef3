"""Parameters megatron-core 0.19 added to the API map's signatures, accepted by gigatron:
`GPTModel.forward(output_processor, output_processor_context)`,
`SelfAttention(pp_layer_offset, name)`, `CrossAttention` / `SharedExpertMLP(name)`,
`TopKRouter(is_mtp_layer)`, `get_forward_backward_func(schedule_pg_collection)`,
`dist_checkpointing.save(async_strategy)`, `DistributedDataParallel(full_param_layout)` (only
None: other values raise, naming the parameter)."""

import os

import pytest
import torch

from gigatron.core import dist_checkpointing
from gigatron.core.dist_checkpointing import ShardedTensor
from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.core.pipeline_parallel.schedules import (
    forward_backward_no_pipelining,
    forward_backward_pipelining_without_interleaving,
)
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests.unit._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=123)


def _model():
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=2, hidden_size=12, num_attention_heads=4, use_cpu_initialization=True
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=100,
        max_sequence_length=16,
    )


def test_output_processor_replaces_the_output_layer_and_loss():
    model = _model().eval()
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    seen = {}

    def processor(*, hidden_states, output_layer, output_weight, context, labels, **rest):
        seen.update(rest, context=context, labels=labels, shape=tuple(hidden_states.shape))
        logits, _ = output_layer(hidden_states, weight=output_weight)  # [s, b, V]
        return logits.transpose(0, 1) * context

    with torch.no_grad():
        plain = model(ids, None, None)
        out = model(ids, None, None, labels=ids, output_processor=processor,
                    output_processor_context=2.0)  # fmt: skip
    assert seen["shape"] == (8, 2, 12) and seen["context"] == 2.0 and seen["labels"] is ids
    assert seen["config"] is model.config and seen["scale_logits"](plain) is plain
    assert callable(seen["compute_language_model_loss"])
    torch.testing.assert_close(out, plain * 2.0, rtol=0, atol=0)


def test_attention_takes_pp_layer_offset_and_name():
    layer = _model().decoder.layers[1]
    spec = get_gpt_layer_local_spec().submodules.self_attention
    attn = spec.module(
        config=layer.config, submodules=spec.submodules, layer_number=2, pp_layer_offset=0,
        name="self_attention", **spec.params,
    )  # fmt: skip
    assert attn.pp_layer_offset == 0 and attn.name == "self_attention"
    import inspect

    from gigatron.core.transformer.attention import CrossAttention
    from gigatron.core.transformer.moe.router import TopKRouter
    from gigatron.core.transformer.moe.shared_experts import SharedExpertMLP

    # positions as megatron-core 0.19: name last, after pg_collection
    for cls in (CrossAttention, SharedExpertMLP):
        assert list(inspect.signature(cls.__init__).parameters)[-2:] == ["pg_collection", "name"]
    assert list(inspect.signature(TopKRouter.__init__).parameters)[-1] == "is_mtp_layer"


def test_schedule_pg_collection():
    class MultiModuleProcessGroupCollection:  # Megatron's cross-grid collection, by name
        pass

    plain = object()  # any other value is ignored, as in Megatron
    assert get_forward_backward_func(1, None, plain) is forward_backward_no_pipelining
    assert (
        get_forward_backward_func(2, None, schedule_pg_collection=plain)
        is forward_backward_pipelining_without_interleaving
    )
    with pytest.raises(ValueError, match="multi-module"):
        get_forward_backward_func(2, None, MultiModuleProcessGroupCollection())


def test_save_async_strategy(tmp_path):
    def sd():
        return {"w": ShardedTensor.from_rank_offsets("w", torch.arange(4.0))}

    for strategy in ("nvrx", "mcore"):
        d = tmp_path / strategy
        os.makedirs(d)
        dist_checkpointing.save(sd(), str(d), async_strategy=strategy)
        assert torch.equal(dist_checkpointing.load(sd(), str(d))["w"], torch.arange(4.0))
    os.makedirs(tmp_path / "bad")
    with pytest.raises(CheckpointingException, match="async_strategy 'torch'"):
        dist_checkpointing.save(sd(), str(tmp_path / "bad"), async_strategy="torch")


def test_ddp_full_param_layout_only_none():
    model = _model()
    ddp_config = DistributedDataParallelConfig()
    DistributedDataParallel(model.config, ddp_config, model, full_param_layout=None)
    with pytest.raises(ValueError, match="full_param_layout"):
        DistributedDataParallel(model.config, ddp_config, _model(), full_param_layout=object())
