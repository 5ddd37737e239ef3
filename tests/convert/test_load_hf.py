"""load_hf_into_model on one rank: a DDP-wrapped GPTModel (fast spec, what `gigatron train`
builds) filled from HF files reproduces transformers' logits, including Llama-3.1 rope scaling."""

import pytest
import torch

from tests._one_rank import one_rank_fixtures
from tests.convert.test_hf_fixtures import VOCAB, make_hf_model

transformers = pytest.importorskip("transformers")


gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)


def _llama31(path, original: int):
    import json

    make_hf_model("llama", path)
    with open(f"{path}/config.json") as f:
        cfg = json.load(f)
    cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": original}  # fmt: skip
    cfg["max_position_embeddings"] = 64
    with open(f"{path}/config.json", "w") as f:
        json.dump(cfg, f)
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_ddp_wrapped_fast_spec_model_matches_transformers(family, tmp_path):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    hf = make_hf_model(family, str(tmp_path))
    spec = spec_from_hf_config(read_hf_config(str(tmp_path)))
    model = spec.build_model(fast=True)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    load_hf_into_model([ddp], str(tmp_path))
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = ddp.eval()(ids, None, None)[..., :VOCAB]
        ref = hf(input_ids=ids).logits
    assert (ours - ref).abs().max().item() <= 1e-5


def test_llama3_rope_scaling_is_refused_unless_megatrons_fixed_values(tmp_path):
    from gigatron.convert import read_hf_config, spec_from_hf_config

    _llama31(str(tmp_path), 16)  # Megatron fixes original_max_position_embeddings at 8192
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        spec_from_hf_config(read_hf_config(str(tmp_path)))


def test_llama31_rope_scaling_matches_transformers(tmp_path):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config

    hf = _llama31(str(tmp_path), 8192)
    spec = spec_from_hf_config(read_hf_config(str(tmp_path)))
    assert spec.model_kwargs["rope_scaling"] and spec.model_kwargs["rope_scaling_factor"] == 8.0
    model = spec.build_model().eval()
    load_hf_into_model(model, str(tmp_path))
    ids = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids, None, None)[..., :VOCAB]
        ref = hf(input_ids=ids).logits
    assert (ours - ref).abs().max().item() <= 1e-5
    # The frequencies themselves: scaled (differ from plain RoPE) exactly as transformers does.
    theirs = hf.model.rotary_emb.inv_freq
    torch.testing.assert_close(model.rotary_pos_emb.inv_freq, theirs, rtol=1e-6, atol=0)
    plain = 1.0 / (500000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    assert not torch.allclose(theirs, plain)


@pytest.mark.parametrize("reload", [True, False])
def test_training_hook_refreshes_bf16_main_params(reload, tmp_path):
    """bf16 model + distributed optimizer: after load_hf_for_training an lr=0 step keeps the HF
    weights; filling the model without refreshing the fp32 main copies (the negative control)
    lets the step write the random init back."""
    from gigatron.convert import (
        load_hf_for_training,
        load_hf_into_model,
        read_hf_config,
        spec_from_hf_config,
    )
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from gigatron.core.transformer.module import Float16Module

    hf = make_hf_model("llama", str(tmp_path))
    spec = spec_from_hf_config(read_hf_config(str(tmp_path)))
    model = spec.build_model(fast=True, bf16=True, params_dtype=torch.bfloat16)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                               use_distributed_optimizer=True)  # fmt: skip
    ddp = DistributedDataParallel(model.config, ddp_config, Float16Module(model.config, model))
    opt_config = OptimizerConfig(lr=0.0, bf16=True, params_dtype=torch.bfloat16,
                                 use_distributed_optimizer=True)  # fmt: skip
    opt = get_megatron_optimizer(opt_config, [ddp])
    if reload:
        assert load_hf_for_training([ddp], opt, str(tmp_path))
    else:
        load_hf_into_model([ddp], str(tmp_path))
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    ddp(ids, None, None, labels=ids).float().mean().backward()
    assert opt.step()[0]
    w = dict(model.named_parameters())["decoder.layers.0.self_attention.linear_proj.weight"]
    ref = hf.model.layers[0].self_attn.o_proj.weight.to(torch.bfloat16)
    assert torch.equal(w.detach(), ref) == reload


def test_training_hook_ignores_gigatron_checkpoints(tmp_path):
    from gigatron.convert import load_hf_for_training

    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    assert load_hf_for_training([], None, str(tmp_path)) is False
    assert load_hf_for_training([], None, None) is False
