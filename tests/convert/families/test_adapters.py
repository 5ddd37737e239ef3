"""Each family adapter on one rank: transformers' logits (fp32, <= 1e-5) from a GPTModel filled by
`load_hf_into_model` through the local and the fast layer spec (MoE families also with
GroupedMLP experts); `convert_hf_to_gigatron` then `convert_gigatron_to_hf` gives bitwise the
original tensors (names, dtypes, shapes); and the registry's refusals are one-line errors.
TP 2 x PP 2 (and EP 2) for the same families: tests/convert/test_hf_parity.py."""

import pytest
import torch

from tests._one_rank import one_rank_fixtures
from tests.convert.test_hf_fixtures import ADAPTER_FAMILIES, FAMILIES, VOCAB, make_hf_model

transformers = pytest.importorskip("transformers")
gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)
B, S = 2, 12


def _model(spec, fast: bool, grouped: bool):
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt import gpt_layer_specs as specs

    if not grouped:
        return spec.build_model(fast=fast).eval()
    config = spec.transformer_config(use_cpu_initialization=True, moe_grouped_gemm=True)
    fn = specs.get_gpt_layer_fast_spec if fast else specs.get_gpt_layer_local_spec
    layer = fn(**spec.spec_kwargs, moe_grouped_gemm=True)
    return GPTModel(config, layer, vocab_size=spec.padded_vocab_size, **spec.model_kwargs).eval()


LAYOUTS = [(f, fast, False) for f in FAMILIES + ADAPTER_FAMILIES for fast in (False, True)]
LAYOUTS += [
    (f, fast, True) for f in ("mixtral", "qwen3_moe", "qwen2_moe") for fast in (False, True)
]


@pytest.mark.parametrize(("family", "fast", "grouped"), LAYOUTS)
def test_adapter_logits_match_transformers(family, fast, grouped, tmp_path, single_rank):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config

    hf = make_hf_model(family, str(tmp_path), seed=len(family), init_std=0.2)
    spec = spec_from_hf_config(read_hf_config(str(tmp_path)))
    model = _model(spec, fast, grouped)
    load_hf_into_model([model], str(tmp_path))
    ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        ours = model(ids, None, attention_mask=None)[..., :VOCAB]
    err = ((ours - ref).abs().max() / ref.abs().max()).item()
    assert err <= 1e-5, f"{family}: relative max |logits - transformers| = {err}"


@pytest.mark.parametrize("family", ADAPTER_FAMILIES)
def test_convert_then_export_is_bitwise(family, tmp_path):
    from gigatron.convert import convert_gigatron_to_hf, convert_hf_to_gigatron
    from gigatron.convert.hf_io import HFReader

    hf_dir, ckpt, back = (str(tmp_path / n) for n in ("hf", "gt", "back"))
    make_hf_model(family, hf_dir)
    convert_hf_to_gigatron(hf_dir, ckpt)
    convert_gigatron_to_hf(ckpt, back)
    orig, exported = HFReader(hf_dir), HFReader(back)
    assert sorted(orig.keys()) == sorted(exported.keys())
    for name in orig.keys():
        a, b = orig.get(name), exported.get(name)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"model_type": "bloom"}, "model_type ('bloom') is not one of"),
        ({"model_type": "qwen3", "attention_bias": True}, "attention_bias/mlp_bias"),
        ({"model_type": "qwen3_moe", "decoder_sparse_step": 2}, "decoder_sparse_step (2)"),
        ({"model_type": "phi3", "rope_parameters": {"rope_type": "longrope"}}, "rope_type"),
        ({"model_type": "gpt_oss", "swiglu_alpha": 1.5}, "swiglu_alpha (1.5)"),
        ({"model_type": "gpt_oss", "attention_bias": False}, "attention_bias (False)"),
        (
            {"model_type": "gpt_oss", "rope_parameters": {"rope_type": "yarn", "factor": 2.0}},
            "original_max_position_embeddings",
        ),
    ],
)
def test_unsupported_config_is_a_one_line_error(cfg, message):
    from gigatron.convert import spec_from_hf_config

    base = dict(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=64, vocab_size=VOCAB, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=24,
    )  # fmt: skip
    with pytest.raises(ValueError) as info:
        spec_from_hf_config({**base, **cfg})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_list_names_every_family_and_its_layouts():
    from gigatron.convert.families import FAMILIES as REGISTRY
    from gigatron.convert.families import describe

    table = describe()
    for name in FAMILIES + ADAPTER_FAMILIES + ("deepseek_v2", "deepseek_v3"):
        line = next(row for row in table.splitlines() if row.startswith(name + " "))
        assert ("EP" in line) == REGISTRY[name].ep and "TP PP" in line, line
