"""`ensure_metadata_has_dp_cp_group`: the metadata handed to `sharded_state_dict` gains the
data-parallel x context-parallel group in place (Megatron's callers read it back after saving)."""

import tempfile

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.transformer.utils import ensure_metadata_has_dp_cp_group


class _Tiny(MegatronModule):
    def __init__(self):
        super().__init__(TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2))
        self.weight = torch.nn.Parameter(torch.ones(2, 2))


def test_none_gives_a_new_dict_with_no_group_before_model_parallel():
    assert not parallel_state.model_parallel_is_initialized()
    assert ensure_metadata_has_dp_cp_group(None) == {"dp_cp_group": None}


def test_metadata_that_is_not_a_dict_is_refused():
    with pytest.raises(TypeError, match="must be a dict"):
        ensure_metadata_has_dp_cp_group([("dp_cp_group", None)])


def test_sharded_state_dict_fills_the_callers_metadata_in_place():
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    try:
        metadata = {"singleton_local_shards": False}
        sharded = _Tiny().sharded_state_dict(metadata=metadata)
        group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        assert metadata["dp_cp_group"] is group
        assert set(sharded) == {"weight"}
        kept = {"dp_cp_group": "given"}
        assert ensure_metadata_has_dp_cp_group(kept) is kept and kept["dp_cp_group"] == "given"
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
