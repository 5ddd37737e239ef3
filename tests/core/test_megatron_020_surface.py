"""Smaller names megatron-core 0.20's own tests import, with Megatron's semantics: utils'
unwrap_model and version checks, the *_submodules spec functions, get_submodules' ValueError,
torch_norm.L2Norm, LanguageModelEmbedding.zero_parameters, tokenizers.text, the DISABLED rerun
state machine, create_all_gather_groups (dp_cp_ag) and parallel_state's AssertionError."""

import functools

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core import rerun_state_machine as rsm
from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.models.common.embeddings.language_model_embedding import (
    LanguageModelEmbedding,
)
from gigatron.core.models.gpt import gpt_layer_specs as specs
from gigatron.core.process_groups_config import ProcessGroupCollection
from gigatron.core.tokenizers.text import MegatronTokenizerText
from gigatron.core.tokenizers.text.libraries import NullTokenizer
from gigatron.core.transformer.module import Float16Module
from gigatron.core.transformer.spec_utils import ModuleSpec, get_submodules
from gigatron.core.transformer.torch_norm import L2Norm
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.utils import is_te_min_version, is_torch_min_version, unwrap_model
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()


def _config(**kw):
    return TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2,
                             use_cpu_initialization=True, **kw)  # fmt: skip


def test_unwrap_model_and_versions():
    inner = torch.nn.Linear(2, 2)
    f16 = Float16Module(_config(bf16=True), inner)
    ddp = DistributedDataParallel(_config(), DistributedDataParallelConfig(), f16)
    assert unwrap_model(ddp) is inner and unwrap_model([ddp, inner]) == [inner, inner]
    assert unwrap_model(ddp, (DistributedDataParallel,)) is f16  # only the listed wrappers
    assert is_torch_min_version("1.0") and not is_torch_min_version("999.0")
    assert is_torch_min_version(torch.__version__.split("+")[0])
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    assert not is_torch_min_version(f"{major}.{minor + 1}", check_equality=False)
    assert not is_te_min_version("0.1") and not is_te_min_version("1.3")


def test_submodules_specs_and_norms():
    local = specs.get_gpt_layer_local_submodules(qk_layernorm=True)
    assert local == specs.get_gpt_layer_local_spec(qk_layernorm=True).submodules
    te = specs.get_gpt_layer_with_transformer_engine_submodules()
    assert te == specs.get_gpt_layer_with_transformer_engine_spec().submodules
    with pytest.raises(ValueError, match="use_kitchen"):
        specs.get_gpt_layer_with_transformer_engine_submodules(use_kitchen=True)
    assert get_submodules(ModuleSpec(module=torch.nn.Linear, submodules=local)) is local
    assert get_submodules(functools.partial(torch.nn.Linear, submodules=local)) is local
    with pytest.raises(ValueError, match="Could not find `submodules`"):
        get_submodules(torch.nn.Linear)

    x = torch.randn(3, 5, dtype=torch.bfloat16)
    y = L2Norm(hidden_size=5, eps=1e-6)(x)
    ref = x.float() / (x.float().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    assert y.dtype == torch.bfloat16 and not list(L2Norm(5).parameters())
    torch.testing.assert_close(y, ref.bfloat16(), rtol=0, atol=0)

    emb = LanguageModelEmbedding(
        _config(), 16, 8, position_embedding_type="learned_absolute", num_tokentypes=2
    )
    emb.zero_parameters()
    for table in (emb.word_embeddings, emb.position_embeddings, emb.tokentype_embeddings):
        assert not table.weight.any() and table.weight.shared


def test_text_tokenizer_and_rerun_state_machine():
    tok = MegatronTokenizerText(None, {"library": "null-text"}, vocab_size=10)
    assert tok.tokenize("4 0 9") == [4, 0, 9] and tok.detokenize([1, 2]) == "1 2"
    assert (tok.vocab_size, tok.eod, tok.pad) == (10, 9, -1)
    assert NullTokenizer(10, eod_id=3).eod == 3
    with pytest.raises(ValueError, match="build_tokenizer"):
        MegatronTokenizerText(None, {"library": "huggingface"})

    from gigatron.core import config

    assert not config.is_experimental_enabled()
    config.set_experimental_flag(True)
    assert config.ENABLE_EXPERIMENTAL and config.is_experimental_enabled()
    config.set_experimental_flag(False)

    rsm.destroy_rerun_state_machine()
    machine = rsm.get_rerun_state_machine()
    runs = 0
    while machine.should_run_forward_backward(None):
        runs += 1
        machine.validate_result(torch.tensor(1.0), torch.isnan, "loss is NaN")
    assert runs == 1 and machine.should_checkpoint_and_exit() == (False, False, 0)
    assert machine.state_dict(None, "torch_dist") is None
    with pytest.raises(RuntimeError, match="loss is NaN"):
        machine.validate_result(torch.tensor(float("nan")), torch.isnan, "loss is NaN")
    machine.validate_result(torch.tensor(float("nan")), torch.isnan, "ok", fatal=False)
    spiky = [machine.is_unexpectedly_large(torch.tensor(v), 10, "loss", num_samples=2)
             for v in (1.0, -3.0, 29.0, 30.0, float("inf"))]  # fmt: skip
    assert spiky == [False, False, False, True, False]  # max |v| of the first 2 samples: 3
    with pytest.raises(AssertionError, match="already initialized"):
        rsm.initialize_rerun_state_machine()
    with pytest.raises(ValueError, match="DISABLED"):
        rsm.RerunStateMachine(mode=rsm.RerunMode.VALIDATE_RESULTS)
    assert list(rsm.RerunDataIterator(iter([1, 2]))) == [1, 2]
    rsm.destroy_rerun_state_machine()


def test_all_gather_groups_and_assertion_errors():
    dp_cp_ag, expt_ag = ps.create_all_gather_groups(for_expert_parallelism=True)
    dp_cp = ps.get_data_parallel_group(with_context_parallel=True)
    assert dist.get_process_group_ranks(dp_cp_ag) == dist.get_process_group_ranks(dp_cp)
    assert dp_cp_ag is not dp_cp and expt_ag is None  # EP = 1: no expert AG group
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    assert pgs.dp_cp_ag is None  # opt-in, as in Megatron
    pgs.dp_cp_ag = dp_cp_ag
    assert "dp_cp_ag(1)" in repr(pgs) and "expt_dp_ag" not in repr(pgs)
    assert repr(ProcessGroupCollection()) == "ProcessGroupCollection(empty)"
    assert repr(ProcessGroupCollection(hcp=[dp_cp, dp_cp])) == "ProcessGroupCollection(hcp([1, 1]))"
    with pytest.raises(ValueError, match="Invalid process groups requested"):
        ProcessGroupCollection.use_mpu_process_groups(["foo"])
    with pytest.raises(AssertionError, match="already initialized"):
        ps.initialize_model_parallel(1, 1)
    ps.destroy_model_parallel()
    try:
        with pytest.raises(AssertionError, match="not initialized"):
            ps.create_all_gather_groups()
    finally:
        ps.initialize_model_parallel(1, 1)  # for the fixture's teardown
