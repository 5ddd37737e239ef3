"""Adapter-only checkpoints and Hugging Face PEFT export of `LoRA` adapters.

`save_adapters(model, lora, directory)` writes `adapters.safetensors` (the whole A / B of every
adapted layer under its global Megatron key, `decoder.layers.N.self_attention.linear_qkv.adapter.
linear_in.weight`, gathered over TP and PP) and `lora.json` (the LoRA config); the base weights
are not saved. `load_adapters(model, directory)` puts them back on any TP / PP layout.

`export_peft(adapters, lora, hf_dir, out)` writes what `peft.PeftModel.from_pretrained` reads
onto the transformers model of `hf_dir`: `adapter_config.json` (r = dim, lora_alpha = alpha,
target_modules = the HF projections) and `adapter_model.safetensors` with PEFT's keys
(`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`). The HF names and the row
layout of B (fused QKV groups, [gate; up]) come from the family's convert recipes, the same
declaration `gigatron convert` uses: B is split as the base weight is, A is shared by the HF
projections one Megatron layer feeds.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.training.peft.lora import LoRA, adapted_layers

_FILE, _CONFIG = "adapters.safetensors", "lora.json"


def adapter_state_dict(model) -> dict[str, torch.Tensor]:
    """{global key: whole fp32 CPU tensor} of every adapter (collective over TP and PP when
    torch.distributed is initialized: every rank returns the whole dict)."""
    out = {}
    for name, layer in adapted_layers(model):
        for part in ("linear_in", "linear_out"):
            w = getattr(layer.adapter, part).weight
            out[f"{name}.adapter.{part}.weight"] = layer.adapter.gather(part, w).float().cpu()
    if dist.is_initialized() and ps.model_parallel_is_initialized():
        if ps.get_pipeline_model_parallel_world_size() > 1:
            stages = [None] * ps.get_pipeline_model_parallel_world_size()
            dist.all_gather_object(stages, out, group=ps.get_pipeline_model_parallel_group())
            out = {k: v for stage in stages for k, v in stage.items()}
    return out


def save_adapters(model, lora: LoRA, directory: str) -> None:
    """Write the adapters and the LoRA config to `directory` (rank 0 writes; collective)."""
    from safetensors.torch import save_file

    state = adapter_state_dict(model)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    os.makedirs(directory, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(directory, _FILE))
    with open(os.path.join(directory, _CONFIG), "w") as f:
        json.dump(dataclasses.asdict(lora), f, indent=1)


def read_adapters(directory: str) -> tuple[dict[str, torch.Tensor], LoRA]:
    """(whole adapter tensors, LoRA config) of an adapter-only checkpoint."""
    from safetensors.torch import load_file

    path = os.path.join(directory, _FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory}: no {_FILE} (an adapter-only LoRA checkpoint)")
    with open(os.path.join(directory, _CONFIG)) as f:
        lora = LoRA(**json.load(f))
    return load_file(path), lora


@torch.no_grad()
def load_adapters(model, directory: str) -> None:
    """Copy an adapter-only checkpoint into the adapted `model`, each rank its shard."""
    state, _ = read_adapters(directory)
    for name, layer in adapted_layers(model):
        for part in ("linear_in", "linear_out"):
            key = f"{name}.adapter.{part}.weight"
            if key not in state:
                raise KeyError(f"{directory}: the adapter checkpoint has no {key}")
            w = getattr(layer.adapter, part).weight
            local = layer.adapter.shard(part, state[key])
            if local.shape != w.shape:
                raise ValueError(
                    f"{key}: checkpoint shape {tuple(state[key].shape)} does not fit the model's "
                    f"{tuple(w.shape)} on this rank"
                )
            w.copy_(local)


def export_peft(adapters: dict[str, torch.Tensor], lora: LoRA, hf_dir: str, out: str) -> None:
    """Write Hugging Face PEFT's adapter_config.json + adapter_model.safetensors (see the module
    docstring) for the transformers model in `hf_dir`."""
    from safetensors.torch import save_file

    from gigatron.convert import read_hf_config, recipes_for_keys, spec_from_hf_config

    spec = spec_from_hf_config(read_hf_config(hf_dir))
    if spec.family == "gpt2":
        raise ValueError("export_peft: GPT-2's Conv1D layers are not PEFT Linear targets")
    bases = sorted({k.split(".adapter.")[0] for k in adapters})
    recipes = {r.key: r for r in recipes_for_keys(spec, [b + ".weight" for b in bases])}
    tensors, targets = {}, set()
    for base in bases:
        recipe = recipes.get(base + ".weight")
        if recipe is None:
            raise ValueError(f"export_peft: {spec.family} has no Hugging Face tensor for {base}")
        a = adapters[f"{base}.adapter.linear_in.weight"]
        parts = recipe.to_hf(adapters[f"{base}.adapter.linear_out.weight"])
        for hf_key, b in zip(recipe.hf_keys, parts, strict=True):
            module = hf_key.removesuffix(".weight")
            targets.add(module.rsplit(".", 1)[-1])
            tensors[f"base_model.model.{module}.lora_A.weight"] = a.clone()  # one per module
            tensors[f"base_model.model.{module}.lora_B.weight"] = b.contiguous()
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.dim,
        "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": sorted(targets),
        "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "base_model_name_or_path": os.path.abspath(hf_dir), "inference_mode": True,
    }  # fmt: skip
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)
