"""AutoBridge (Megatron-Bridge's API): HF dir -> TP2 model on gloo ranks -> logits equal
transformers' -> save_hf_pretrained loads in transformers with bitwise the original weights; and
export_ckpt of the ranks' torch_dist checkpoint (no model built) writes the same bytes.

Per family (Llama, Mixtral for MoE): a tiny random model saved by transformers; two ranks build
it through `AutoBridge.from_hf_pretrained(...).to_megatron_provider(load_weights=True)` at TP2,
run a forward (logits gathered over TP), save it with `save_hf_pretrained` (small shards: an
index is written) and save their model's `sharded_state_dict()` as a torch_dist checkpoint. In
this process: logits vs transformers (fp32, <= 1e-5), transformers loads the saved directory
with weights bitwise equal to the original, and `bridge.export_ckpt` of the checkpoint gives
files byte-identical to the ones the ranks wrote.
"""

import json
import os

import pytest
import torch

from gigatron.testing import run_distributed
from tests.convert.test_hf_fixtures import VOCAB, make_hf_model

pytestmark = pytest.mark.multirank
transformers = pytest.importorskip("transformers")
B, S = 2, 8
_SHARD = 40_000  # bytes: the tiny models are written in several files + index


def _rank_fn(cases, ids, tp=2):
    """For each (hf_dir, out_dir, ckpt_dir): TP `tp` logits and export-weights names."""
    import torch.distributed as dist

    import gigatron.compat.megatron as alias
    from gigatron.core import dist_checkpointing
    from gigatron.core import parallel_state as ps

    alias.install()
    from megatron.bridge import AutoBridge  # gigatron.convert.bridge through the alias

    results = []
    for hf_dir, out_dir, ckpt_dir in cases:
        bridge = AutoBridge.from_hf_pretrained(hf_dir)
        provider = bridge.to_megatron_provider(load_weights=True)
        provider.tensor_model_parallel_size = tp
        provider.finalize()
        provider.initialize_model_parallel(seed=7)
        model = provider.provide_distributed_model(wrap_with_ddp=False)
        with torch.no_grad():
            logits = model[0].eval()(ids, None, None)  # [b, s, v/tp]
        parts = [torch.empty_like(logits) for _ in range(tp)]
        dist.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
        bridge.save_hf_pretrained(model, out_dir, show_progress=False, max_shard_bytes=_SHARD)
        os.makedirs(ckpt_dir, exist_ok=True)
        dist_checkpointing.save(model[0].sharded_state_dict(), ckpt_dir)
        names = [name for name, _ in bridge.export_hf_weights(model)]
        results.append((torch.cat(parts, dim=-1)[..., :VOCAB], names))
        ps.destroy_model_parallel()
    return results


def _files(path):
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path))}


@pytest.mark.parametrize(
    "families,tp",
    [(("llama", "mixtral"), 2), (("gpt_oss",), 1)],  # GPT-OSS: stacked experts, one rank
    ids=["tp2", "gpt_oss"],
)
def test_autobridge_matches_transformers_and_saves_bitwise(tmp_path, families, tp):
    from gigatron.convert.bridge import AutoBridge
    from gigatron.convert.hf_io import INDEX_FNAME

    ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(5))
    models, cases = {}, []
    for family in families:
        d = {n: str(tmp_path / family / n) for n in ("hf", "out", "ckpt", "out2")}
        models[family] = (make_hf_model(family, d["hf"], seed=2), d)
        cases.append((d["hf"], d["out"], d["ckpt"]))
    per_rank = run_distributed(_rank_fn, tp, args=(cases, ids, tp), timeout=240)

    for i, family in enumerate(families):
        hf, d = models[family]
        with torch.no_grad():
            ref = hf(input_ids=ids).logits
        (got, names), (got1, names1) = per_rank[0][i], per_rank[-1][i]
        for logits in (got, got1):
            err = (logits - ref).abs().max().item()
            assert err <= 1e-5, f"{family}: max |logits - transformers| = {err}"

        original = hf.state_dict()
        reloaded = type(hf).from_pretrained(d["out"]).state_dict()
        assert sorted(reloaded) == sorted(original), family
        for name, t in original.items():
            assert reloaded[name].dtype == t.dtype and torch.equal(reloaded[name], t), name
        with open(os.path.join(d["out"], INDEX_FNAME)) as f:
            assert len(set(json.load(f)["weight_map"].values())) > 1  # sharded as HF shards
        assert names == names1 and len(names) == len(set(names))

        # torch_dist checkpoint (saved at TP2) -> HF without building a model: the same bytes
        AutoBridge.from_hf_pretrained(d["hf"]).export_ckpt(
            d["ckpt"], d["out2"], show_progress=False, max_shard_bytes=_SHARD
        )
        assert _files(d["out2"]) == _files(d["out"]), family


def test_supported_models_and_config_checks(tmp_path):
    from gigatron.convert.bridge import AutoBridge

    models = AutoBridge.list_supported_models()
    assert {"LlamaForCausalLM", "MixtralForCausalLM"} <= set(models)
    assert models == sorted(models)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4)
    assert AutoBridge.supports(cfg) and AutoBridge.supports(cfg.to_dict())
    assert not AutoBridge.supports({"model_type": "no_such_family"})
    assert not AutoBridge.can_handle(str(tmp_path))
    make_hf_model("llama", str(tmp_path / "hf"))
    assert AutoBridge.can_handle(str(tmp_path / "hf"))

    bridge = AutoBridge.from_hf_config(cfg)
    assert bridge.transformer_config.num_layers == 2
    with pytest.raises(ValueError, match="load_weights needs a HF directory"):
        bridge.to_megatron_provider(load_weights=True)
    provider = bridge.to_megatron_provider(load_weights=False)
    provider.tensor_model_parallel_size = 3
    assert provider.tensor_model_parallel_size == 3 and provider.hidden_size == 32
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        provider.finalize()  # 4 heads over 3 ranks: TransformerConfig's own check
    with pytest.raises(ValueError, match="not a TransformerConfig field"):
        provider.tensor_parallel_size = 2
    with pytest.raises(ValueError, match="torch_dtype"):
        AutoBridge.from_hf_pretrained(str(tmp_path / "hf"), torch_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="not a local directory"):
        AutoBridge.from_hf_pretrained("meta-llama/Llama-3.2-1B")
