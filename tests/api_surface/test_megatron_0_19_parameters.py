"""Parameters megatron-core 0.19 added to the API map's signatures, accepted by gigatron:
`GPTModel.forward(output_processor, output_processor_context)`,
`SelfAttention(pp_layer_offset, name)`, `CrossAttention` / `SharedExpertMLP(name)`,
`TopKRouter(is_mtp_layer)`, `get_forward_backward_func(schedule_pg_collection)`,
`dist_checkpointing.save(async_strategy)`, `DistributedDataParallel(full_param_layout)` (None or
a FullParamLayout: other values raise, naming the parameter)."""

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
from tests._one_rank import one_rank_fixtures

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


def test_ddp_full_param_layout_refuses_a_non_layout():
    model = _model()
    ddp_config = DistributedDataParallelConfig()
    DistributedDataParallel(model.config, ddp_config, model, full_param_layout=None)
    with pytest.raises(ValueError, match="full_param_layout"):
        DistributedDataParallel(model.config, ddp_config, _model(), full_param_layout=object())


# ---------------------------------------------------------------- the rest of 0.19's surface
def test_rank_generator_gtp_remat_axis():
    from gigatron.core.parallel_state import RankGenerator

    plain = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-cp-ep-dp-pp")
    assert plain.order == "tp-cp-ep-dp-pp-gtp_remat" and plain.world_size == 8
    assert plain.get_gtp_ranks(1) == [[r] for r in range(8)]  # singletons at size 1
    # a size-2 axis right after tp (where megatron-core injects it): world 16
    gen = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-gtp_remat-dp-pp", gtp_remat=2)
    assert gen.world_size == 16
    assert gen.get_gtp_ranks(2)[:3] == [[0, 2], [1, 3], [4, 6]]
    assert gen.get_ranks("tp") == [[2 * i, 2 * i + 1] for i in range(8)]
    assert gen.get_ranks("dp")[:2] == [[0, 4], [1, 5]]
    assert gen.get_ranks("pp")[0] == [0, 8]
    with pytest.raises(ValueError, match="gtp_remat_size"):
        gen.get_gtp_ranks(1)
    with pytest.raises(ValueError, match="missing 'gtp_remat'"):
        RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order="tp-dp", gtp_remat=2)


def test_gtp_groups_and_collection_on_one_rank():
    from gigatron.core import parallel_state as ps
    from gigatron.core.process_groups_config import ProcessGroupCollection

    gtp = ps.get_gtp_weight_remat_group()
    assert gtp.size() == 1 and ps.get_expert_gtp_weight_remat_group().size() == 1
    plain = ps.get_expert_tensor_model_pipeline_parallel_group()
    assert ps.get_expert_tensor_model_pipeline_parallel_group(with_egtp_remat=True) is plain
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    assert pgs.gtp_remat is gtp and pgs.dp_cp_gtp_remat is pgs.dp_cp
    assert pgs.expt_dp_gtp_remat is pgs.expt_dp and pgs.tp_ep_pp_with_egtp_remat is plain
    assert pgs.dp_cp_ag is None and pgs.expt_dp_ag is None  # Megatron's use_mpu leaves them None


def test_multi_module_process_group_collection():
    from gigatron.core.process_groups_config import (
        MultiModuleProcessGroupCollection,
        ProcessGroupCollection,
    )

    enc, llm = ProcessGroupCollection(), ProcessGroupCollection()
    both = MultiModuleProcessGroupCollection({"encoder": enc, "llm": llm}, "llm")
    assert both.get_language_model_collection() is llm and both.has_language_model()
    assert both["encoder"] is enc and list(both) == [enc, llm] and len(both) == 2
    assert both.get_module_collection("encoder") is enc and list(both.keys()) == ["encoder", "llm"]
    assert repr(both) == (
        "MultiModuleProcessGroupCollection(modules=[encoder, llm], "
        "language_model_module_name='llm')"
    )
    assert not MultiModuleProcessGroupCollection({"encoder": enc}).has_language_model()
    with pytest.raises(ValueError, match="cannot be empty"):
        MultiModuleProcessGroupCollection({})
    with pytest.raises(ValueError, match="'lm' not found"):
        MultiModuleProcessGroupCollection({"llm": llm}, "lm")
    with pytest.raises(ValueError, match="No language model"):
        MultiModuleProcessGroupCollection({"encoder": enc}).get_language_model_collection()
    with pytest.raises(ValueError, match="'x' not found"):
        both.get_module_collection("x")


def test_linear_gtp_remat_size_and_old_positional_call():
    from gigatron.core.tensor_parallel import linear_with_grad_accumulation_and_async_allreduce

    x, w = torch.randn(3, 2, 4), torch.randn(5, 4)
    args = (x, w, None, False, False, False)
    out = linear_with_grad_accumulation_and_async_allreduce(*args, None, 0, None, 1)
    torch.testing.assert_close(out, x @ w.t())
    with pytest.raises(ValueError, match="gtp_remat_size=2"):
        linear_with_grad_accumulation_and_async_allreduce(*args, gtp_remat_size=2)
    with pytest.raises(TypeError, match="async_grad_allreduce"):  # 0.16's 9th argument
        linear_with_grad_accumulation_and_async_allreduce(*args, None, 0, False)


def test_get_batch_on_this_cp_rank_hybrid_parameters():
    from gigatron.core.utils import get_batch_on_this_cp_rank

    batch = {"tokens": torch.arange(8).view(1, 8)}
    assert get_batch_on_this_cp_rank(batch, False, None, None, False) is batch  # CP 1
    with pytest.raises(ValueError, match="is_hybrid_cp=True is not supported"):
        get_batch_on_this_cp_rank(batch, True)
    with pytest.raises(ValueError, match="hybrid_cp_group_func"):
        get_batch_on_this_cp_rank(batch, hybrid_cp_group_func=lambda group_size: None)
    with pytest.raises(TypeError, match="pass cp_group by keyword"):  # 0.16: (batch, cp_group)
        get_batch_on_this_cp_rank(batch, object())


def test_cp_split_per_document_and_per_sequence():
    """Packed documents [0, 8) and [8, 12) over CP 2: each document in 4 chunks, rank r keeps
    chunks r and 3 - r of every document (Transformer Engine's thd partition indices)."""
    from gigatron.core.utils import _split_per_document, _split_per_sequence

    tokens = torch.arange(12).view(1, 12)
    batch = {
        "tokens": tokens, "labels": tokens + 100, "attention_mask": None,
        "cu_seqlens": torch.tensor([[0, 8, 12]]), "max_seqlen": 8,
    }  # fmt: skip
    rank0 = _split_per_document(batch, cp=2, rank=0)
    rank1 = _split_per_document(batch, cp=2, rank=1)
    assert rank0["tokens"].tolist() == [[0, 1, 6, 7, 8, 11]]
    assert rank1["tokens"].tolist() == [[2, 3, 4, 5, 9, 10]]
    assert rank0["labels"].tolist() == [[100, 101, 106, 107, 108, 111]]
    assert rank0["cu_seqlens"] is batch["cu_seqlens"] and rank0["max_seqlen"] == 8
    per_sequence = _split_per_sequence(batch, cp=2, rank=0)  # use_per_sequence_balancing
    assert per_sequence["tokens"].tolist() == [[0, 1, 2, 9, 10, 11]]
    assert per_sequence["cu_seqlens"] is batch["cu_seqlens"]
    with pytest.raises(ValueError, match=r"document length \[8, 12\) \(4\)"):
        _split_per_document(batch, cp=4, rank=0)
    padded = dict(batch, cu_seqlens_padded=torch.tensor([[0, 4, 12]]))  # preferred when given
    assert _split_per_document(padded, cp=2, rank=0)["tokens"].tolist() == [[0, 3, 4, 5, 10, 11]]


def test_get_submodules():
    import functools

    from gigatron.core.transformer.mlp import MLP, MLPSubmodules
    from gigatron.core.transformer.spec_utils import ModuleSpec, get_submodules

    subs = MLPSubmodules()
    assert get_submodules(spec=ModuleSpec(module=MLP, submodules=subs)) is subs
    assert get_submodules(functools.partial(MLP, submodules=subs)) is subs
    with pytest.raises(ValueError, match="Could not find `submodules`"):
        get_submodules(MLP.forward)


def test_mlp_module_spec_positional_order():
    from gigatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec

    assert get_mlp_module_spec(False, None, False, None, True) == get_mlp_module_spec()
    with pytest.raises(ValueError, match="moe_use_legacy_grouped_gemm"):
        get_mlp_module_spec(moe_use_legacy_grouped_gemm=True)


def test_save_positional_order(tmp_path):
    def sd():
        return {"w": ShardedTensor.from_rank_offsets("w", torch.arange(4.0))}

    dist_checkpointing.save(sd(), str(tmp_path), None, False)  # 0.19: validate_access_integrity
    assert torch.equal(dist_checkpointing.load(sd(), str(tmp_path))["w"], torch.arange(4.0))
    os.makedirs(tmp_path / "old")
    with pytest.raises(TypeError, match="common_strategy"):  # 0.16: common_strategy fourth
        dist_checkpointing.save(sd(), str(tmp_path / "old"), None, None)
    dist_checkpointing.save(sd(), str(tmp_path / "old"), common_strategy=None)


def test_load_positional_order(tmp_path):
    from gigatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy

    dist_checkpointing.save(
        {"w": ShardedTensor.from_rank_offsets("w", torch.arange(4.0))}, tmp_path
    )
    request = lambda: {"w": ShardedTensor.from_rank_offsets("w", torch.zeros(4))}  # noqa: E731
    got = dist_checkpointing.load(request(), str(tmp_path), None, True, "raise_all")  # 0.19 order
    assert torch.equal(got["w"], torch.arange(4.0))
    with pytest.raises(TypeError, match="common_strategy"):  # 0.16: common_strategy fourth
        dist_checkpointing.load(request(), str(tmp_path), None, None)
    assert dist_checkpointing.load(request(), str(tmp_path), common_strategy=None)["w"][3] == 3
    assert get_default_load_sharded_strategy().backend == "torch_dist"  # 0.19: no directory


def test_sampling_params_019_fields():
    from gigatron.core.inference.sampling_params import SamplingParams

    params = SamplingParams(detokenize_stop_sequence=True, return_prompt_tokens=True)
    assert params.num_tokens_to_generate is None and params.detokenize_stop_sequence
    assert SamplingParams().serialize()["return_prompt_tokens"] is False


def test_hyper_comm_grid_views(monkeypatch):
    """register_view: another factorization of the same 8 ranks; a shared dim must enumerate
    the same groups in both views (checked), and groups over shared dims only are the base's."""
    from gigatron.core.hyper_comm_grid import HyperCommGrid

    monkeypatch.setenv("WORLD_SIZE", "8")
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    grid.register_view("expert", [2, 2, 2], ["tp", "ep", "edp"], shared_dims=["tp"])
    assert grid.get_rank_enum("tp", view="expert") == grid.get_rank_enum("tp")
    assert grid.get_rank_enum("ep", view="expert") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.get_rank_enum(["edp", "ep"], view="expert") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert grid._key("tp", "expert")[0] == "tp"  # the base view's group
    assert grid._key(["ep", "tp"], "expert")[0] == ("expert", ("ep", "tp"))
    with pytest.raises(ValueError, match="different membership"):  # "tp" would be [0, 4], ...
        grid.register_view("bad", [4, 2], ["x", "tp"], shared_dims=["tp"])
    with pytest.raises(ValueError, match="already registered"):
        grid.register_view("expert", [8], ["all"])
    with pytest.raises(ValueError, match="has size 4"):
        grid.register_view("small", [2, 2], ["a", "b"])
    with pytest.raises(ValueError, match="not in the base view"):
        grid.register_view("odd", [8], ["all"], shared_dims=["all"])
    with pytest.raises(KeyError, match="not registered"):
        grid.get_rank_enum("tp", view="nope")
    with pytest.raises(ValueError, match="'dp' is not in view 'expert'"):
        grid.get_rank_enum("dp", view="expert")
    with pytest.raises(KeyError, match="for view 'expert' hasn't been created"):
        grid.get_pg("ep", view="expert")
