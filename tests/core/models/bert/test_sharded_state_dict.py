"""BertModel's `sharded_state_dict()` is megatron-core's: stacked layers (`encoder.layers.<name>`
with a leading num_layers axis), keyed by the module's own state-dict keys.

Two gloo ranks: a tiny BERT at TP = 2 (loaded from one full set of weights) is saved with
`dist_checkpointing.save(model.sharded_state_dict(), d)`; a fresh BERT at TP = 1 (DP = 2) loads
it back through `model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), d))`
and equals the full weights bitwise. On each rank every entry (dict key, checkpoint key, global
shape and offset, prepended axes, replica id, fragmentation) equals that of megatron-core 0.16's
own BertModel (built on CPU, TP = 2), and the dict keys are the module's `state_dict()` keys.
"""

import pytest
import torch
import torch.nn.functional as F

from gigatron.testing import run_distributed
from tests.core.models._sharded_structure import describe, differences

pytestmark = pytest.mark.multirank


V, MAX_SEQ, KW = 32, 16, dict(num_layers=2, hidden_size=16, num_attention_heads=2)


def _gigatron_bert(tp):
    from gigatron.core.models.bert import BertModel
    from gigatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        **KW, activation_func=F.gelu, tensor_model_parallel_size=tp, use_cpu_initialization=True
    )
    return BertModel(cfg, 2, bert_layer_local_spec, V, MAX_SEQ)


def _megatron_bert(tp):
    """megatron-core's BertModel (local spec) on CPU: `current_device` stubbed to "cpu"."""
    from megatron.core import parallel_state as mps
    from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from megatron.core.models.bert.bert_model import BertModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"
    mps.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        cfg = TransformerConfig(
            **KW, activation_func=F.gelu, tensor_model_parallel_size=tp, use_cpu_initialization=True
        )
        return describe(BertModel(cfg, 2, bert_layer_local_spec, V, MAX_SEQ).sharded_state_dict())
    finally:
        mps.destroy_model_parallel()


def _layout(sharded: dict) -> dict:
    """{checkpoint key: global shape (ShardedTensor) or ('object', shape) (ShardedObject)}."""
    out = {}
    for value in sharded.values():
        for sh in value if isinstance(value, list) else [value]:
            kind = type(sh).__name__
            if kind == "ShardedObject":
                out[sh.key] = ("object", tuple(sh.global_shape))
            else:
                assert kind == "ShardedTensor", (sh.key, kind)
                out[sh.key] = tuple(sh.global_shape)
    return out


def _roundtrip(ckpt_dir):
    from gigatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from gigatron.core.models.common.tp_state_dict import load_full_state_dict

    def init(tp):
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tp)
        tensor_parallel.model_parallel_cuda_manual_seed(1234)

    init(1)
    torch.manual_seed(0)
    full = {n: p.detach().clone() for n, p in _gigatron_bert(1).named_parameters()}

    init(2)
    saved = _gigatron_bert(2)
    load_full_state_dict(saved, full)
    sharded = saved.sharded_state_dict()
    own_keys = set(saved.state_dict()) == set(sharded)
    dist_checkpointing.save(sharded, ckpt_dir)
    structure = differences(describe(sharded), _megatron_bert(2))

    init(1)
    torch.manual_seed(1)
    fresh = _gigatron_bert(1)
    fresh.load_state_dict(dist_checkpointing.load(fresh.sharded_state_dict(), ckpt_dir))
    mismatched = [n for n, p in fresh.named_parameters() if not torch.equal(p, full[n])]
    return _layout(sharded), structure, own_keys, mismatched, len(full)


def test_bert_stacked_checkpoint_tp2_to_tp1_and_megatron_keys(tmp_path):
    results = run_distributed(_roundtrip, 2, args=(str(tmp_path),), timeout=120)
    for layout, structure, own_keys, mismatched, n_params in results:
        assert mismatched == [] and n_params == 39
        assert layout["encoder.layers.self_attention.linear_qkv.weight"] == (2, 48, 16)
        assert layout["encoder.layers.mlp.linear_fc1.layer_norm_weight"] == (2, 16)
        assert not any(k.startswith("encoder.layers.0.") for k in layout)
        assert layout["output_layer._extra_state"] == ("object", (1,))
        assert structure == [], "\n".join(structure)
        assert own_keys
