"""Hugging Face <-> gigatron checkpoint conversion (GPT-2, Llama 1-3, Mistral, Qwen2, Mixtral).

`convert_hf_to_gigatron(hf_dir, out_dir)` writes a torch_dist training checkpoint that loads at
any TP x PP layout; `convert_gigatron_to_hf(ckpt_dir, out_dir)` writes safetensors back;
`load_hf_into_model(model_chunks, hf_dir)` fills a built (sharded) model straight from HF files;
`recipes_for_keys(spec, keys)` gives the per-tensor mapping of Megatron keys to HF tensors.
See docs/convert.md.
"""

from gigatron.convert._recipes import recipes_for_keys
from gigatron.convert.gigatron_to_hf import convert_gigatron_to_hf
from gigatron.convert.hf_config import HFModelSpec, is_hf_dir, read_hf_config, spec_from_hf_config
from gigatron.convert.hf_to_gigatron import (
    convert_hf_to_gigatron,
    load_hf_for_training,
    load_hf_into_model,
)

__all__ = [
    "HFModelSpec",
    "convert_gigatron_to_hf",
    "convert_hf_to_gigatron",
    "is_hf_dir",
    "load_hf_for_training",
    "load_hf_into_model",
    "read_hf_config",
    "recipes_for_keys",
    "spec_from_hf_config",
]
