"""HF `config.json` -> gigatron model description (TransformerConfig, GPTModel kwargs, flags).

No counterpart in megatron.core (Megatron Bridge does this outside the core). Works on the plain
JSON dict, so conversion needs no `transformers`. Each family's config mapping lives in its
adapter (`gigatron.convert.families`, keyed by `model_type`); here is what they share: the
model description `HFModelSpec`, the training arguments it implies, reading config.json. A
setting gigatron cannot reproduce exactly is a ValueError naming the key and its value (e.g.
Qwen2 `use_sliding_window`).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

from gigatron.convert._hf_sizes import check_config_sizes
from gigatron.convert.families import FAMILIES, get_family
from gigatron.convert.hf_io import HFReader
from gigatron.core.activations import quick_gelu
from gigatron.core.models.common.vocab_utils import vocab_size_with_padding
from gigatron.core.models.gpt import GPTModel
from gigatron.core.models.gpt import gpt_layer_specs as specs
from gigatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from gigatron.core.untrusted_files import UntrustedFileError, read_text

__all__ = ["FAMILIES", "HFModelSpec", "read_hf_config", "spec_from_hf_config"]


@dataclass
class HFModelSpec:
    """What gigatron needs to build, load and export one HF model."""

    family: str
    hf_config: dict
    config_kwargs: dict
    """TransformerConfig keyword arguments (no parallel sizes)."""
    model_kwargs: dict
    """GPTModel keyword arguments except `vocab_size` (see padded_vocab_size)."""
    vocab_size: int
    padded_vocab_size: int
    spec_kwargs: dict = field(default_factory=dict)
    """get_gpt_layer_*_spec keyword arguments (qk_layernorm, num_experts, normalization)."""

    @property
    def tied(self) -> bool:
        return bool(self.model_kwargs["share_embeddings_and_output_weights"])

    def transformer_config(self, **overrides):
        cls = MLATransformerConfig if self.config_kwargs.get("multi_latent_attention") else None
        return (cls or TransformerConfig)(**{**self.config_kwargs, **overrides})

    def layer_spec(self, fast: bool = False, config=None, vp_stage=None):
        """One layer spec, or with `config` (its moe_layer_freq a per-layer list: DeepSeek's
        leading dense layers) this pipeline stage's decoder block spec."""
        if config is not None and isinstance(config.moe_layer_freq, list):
            return specs.get_gpt_decoder_block_spec(
                config, use_transformer_engine=fast, normalization=config.normalization,
                vp_stage=vp_stage,
            )  # fmt: skip
        fn = specs.get_gpt_layer_fast_spec if fast else specs.get_gpt_layer_local_spec
        return fn(**self.spec_kwargs)

    def build_model(
        self, *, fast=False, pre_process=True, post_process=True, vp_stage=None, **config_overrides
    ):
        """A GPTModel for this HF model (parallel sizes go in `config_overrides`)."""

        config = self.transformer_config(**{"use_cpu_initialization": True, **config_overrides})
        return GPTModel(
            config,
            self.layer_spec(fast, config, vp_stage),
            vocab_size=self.padded_vocab_size,
            pre_process=pre_process,
            post_process=post_process,
            vp_stage=vp_stage,
            **self.model_kwargs,
        )

    def training_args(self) -> dict:
        """`gigatron train` argument fields (Megatron's names) describing this model: its
        shape, activation, norms, RoPE, biases, embeddings, MoE router, vocabulary, and
        `seq_length` = the model's maximum positions (the tokenizer: `tokenizer_args`)."""
        c, m = self.config_kwargs, self.model_kwargs
        args = dict(
            num_layers=c["num_layers"],
            hidden_size=c["hidden_size"],
            ffn_hidden_size=c["ffn_hidden_size"],
            num_attention_heads=c["num_attention_heads"],
            kv_channels=c.get("kv_channels") or c["hidden_size"] // c["num_attention_heads"],
            group_query_attention=c.get("num_query_groups") not in (None, c["num_attention_heads"]),
            num_query_groups=c.get("num_query_groups") or c["num_attention_heads"],
            seq_length=m["max_sequence_length"],
            max_position_embeddings=m["max_sequence_length"],
            position_embedding_type=m["position_embedding_type"],
            normalization=c.get("normalization", "LayerNorm"),
            norm_epsilon=c["layernorm_epsilon"],
            apply_layernorm_1p=False,
            apply_residual_connection_post_layernorm=False,
            swiglu=bool(c.get("gated_linear_unit")) and c["activation_func"] is not quick_gelu,
            quick_geglu=bool(c.get("gated_linear_unit")) and c["activation_func"] is quick_gelu,
            openai_gelu=_is_tanh_gelu(c["activation_func"]),
            squared_relu=False,
            disable_bias_linear=not c["add_bias_linear"],
            add_qkv_bias=bool(c.get("add_qkv_bias")),
            qk_layernorm=bool(c.get("qk_layernorm")),
            untie_embeddings_and_output_weights=not self.tied,
            hidden_dropout=c["hidden_dropout"],
            attention_dropout=c["attention_dropout"],
            init_method_std=c["init_method_std"],
            vocab_size=self.vocab_size,
            padded_vocab_size=self.padded_vocab_size,
        )
        if m["position_embedding_type"] == "yarn":  # Megatron's flags of the yarn_* fields
            args.update(
                rotary_base=m["rotary_base"],
                rotary_percent=m.get("rotary_percent", 1.0),
                **{flag: c[field] for flag, field in _GPT_YARN_ARGS.items() if field in c},
            )
        if m["position_embedding_type"] == "rope":
            args.update(
                rotary_base=m["rotary_base"],
                rotary_percent=m.get("rotary_percent", 1.0),
                rotary_interleaved=False,
                use_rope_scaling=bool(m.get("rope_scaling")),
                rope_scaling_factor=float(m.get("rope_scaling_factor", 8.0)),
                rotary_seq_len_interpolation_factor=m.get("seq_len_interpolation_factor"),
            )
        if c.get("window_size") is not None:  # Mistral / Mixtral / GPT-OSS sliding_window
            args.update(window_size=tuple(c["window_size"]))
        args.update({k: c[k] for k in _LAYER_ARGS if c.get(k) is not None})
        if c.get("num_moe_experts"):
            args.update(
                num_experts=c["num_moe_experts"],
                moe_router_topk=c["moe_router_topk"],
                moe_ffn_hidden_size=c["moe_ffn_hidden_size"],
                moe_aux_loss_coeff=c["moe_aux_loss_coeff"],
                moe_router_pre_softmax=c["moe_router_pre_softmax"],
                moe_router_load_balancing_type=c.get("moe_router_load_balancing_type", "aux_loss"),
                moe_token_dispatcher_type=c["moe_token_dispatcher_type"],
            )
            args.update({k: c[k] for k in _MOE_EXTRA_ARGS if k in c})
        if c.get("multi_latent_attention"):
            args.update({k: c[k] for k in _MLA_ARGS if k in c})
            args.update({f"yarn_{k}": c[k] for k in _YARN_ARGS if k in c})
        return args

    def training_flags(self, extra: dict | None = None) -> list[str]:
        """`training_args()` (updated with `extra`) as `gigatron train` flags: a True boolean
        is its bare flag, False and None are left out (the flags' defaults)."""
        return args_to_flags({**self.training_args(), **(extra or {})})


# DeepSeek's MoE router, MLA and YaRN settings (config field = flag name; YaRN's flags carry
# Megatron's `yarn_` prefix)
_MOE_EXTRA_ARGS = (
    "moe_layer_freq", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
    "moe_router_score_function",
    "moe_router_enable_expert_bias", "moe_router_num_groups", "moe_router_group_topk",
    "moe_router_topk_scaling_factor", "moe_router_dtype",
)  # fmt: skip
_MLA_ARGS = (
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
    "qk_pos_emb_head_dim", "v_head_dim", "rope_type", "rotary_scaling_factor", "mscale",
    "mscale_all_dim",
)  # fmt: skip
_YARN_ARGS = ("original_max_position_embeddings", "beta_fast", "beta_slow")
# GPTModel's YaRN (position_embedding_type 'yarn'): flag -> TransformerConfig field
_GPT_YARN_ARGS = {
    "rotary_scaling_factor": "yarn_rotary_scaling_factor",
    "yarn_original_max_position_embeddings": "yarn_original_max_position_embeddings",
    "yarn_beta_fast": "yarn_beta_fast", "yarn_beta_slow": "yarn_beta_slow",
    "mscale": "yarn_mscale", "mscale_all_dim": "yarn_mscale_all_dim",
    "yarn_correction_range_round_to_int": "yarn_correction_range_round_to_int",
}  # fmt: skip
# Per-layer attention / MLP settings (GPT-OSS), config field = flag name
_LAYER_ARGS = (
    "window_attn_skip_freq", "softmax_type", "glu_linear_offset", "activation_func_clamp_value",
)  # fmt: skip
_NEGATED = {"yarn_correction_range_round_to_int"}  # False: the --no- flag

# Fields of a converted checkpoint's args that are not `gigatron train` flags.
_NOT_FLAGS = ("padded_vocab_size", "hf_model_type", "hf_config_json", "tokenizer_in_checkpoint_dir")
_INT_IF_WHOLE = ("rotary_base",)  # an int flag; config.json may spell it 10000.0


def args_to_flags(fields: dict) -> list[str]:
    """Argument fields (Megatron's names) as command-line flags, in the order given."""
    out = []
    for name, value in fields.items():
        flag = "--" + name.replace("_", "-")
        if name in _NEGATED and value is False:
            out.append("--no-" + flag[2:])
            continue
        if name in _NOT_FLAGS or value is None or value is False:
            continue
        if value is True:
            out.append(flag)
            continue
        if name in _INT_IF_WHOLE and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, list):  # --moe-layer-freq [0,1,1]: one word, no spaces
            value = "[" + ",".join(str(v) for v in value) + "]"
        if isinstance(value, tuple):  # --window-size 127,0
            value = ",".join(str(v) for v in value)
        out += [flag, str(value)]
    return out


def _is_tanh_gelu(fn) -> bool:
    return isinstance(fn, functools.partial) and fn.keywords.get("approximate") == "tanh"


# Every argument field `training_args` / `tokenizer_args` may write: what a checkpoint
# converted from Hugging Face (or trained from one) gives `gigatron train / generate --load`.
MODEL_ARGS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels",
    "group_query_attention", "num_query_groups", "seq_length", "max_position_embeddings",
    "position_embedding_type", "normalization", "norm_epsilon", "apply_layernorm_1p",
    "apply_residual_connection_post_layernorm", "swiglu", "openai_gelu", "squared_relu",
    "disable_bias_linear", "add_qkv_bias", "qk_layernorm", "untie_embeddings_and_output_weights",
    "hidden_dropout", "attention_dropout", "init_method_std", "vocab_size",
    "make_vocab_size_divisible_by", "rotary_base", "rotary_percent", "rotary_interleaved",
    "use_rope_scaling", "rope_scaling_factor", "rotary_seq_len_interpolation_factor",
    "window_size", *_LAYER_ARGS, "quick_geglu", "yarn_correction_range_round_to_int",
    "num_experts", "moe_router_topk",
    "moe_ffn_hidden_size", "moe_aux_loss_coeff", "moe_router_pre_softmax",
    "moe_router_load_balancing_type", "moe_token_dispatcher_type", *_MOE_EXTRA_ARGS,
    *_MLA_ARGS, *(f"yarn_{k}" for k in _YARN_ARGS), "tokenizer_type",
    "tokenizer_model", "vocab_file", "merge_file", "hf_model_type", "hf_config_json",
)  # fmt: skip
TOKENIZER_PATH_ARGS = ("tokenizer_model", "vocab_file", "merge_file")


def tokenizer_args(hf_dir: str, *, path: str) -> dict:
    """Tokenizer argument fields for the tokenizer files in `hf_dir`, naming that directory
    `path`: `tokenizer.json` -> HuggingFaceTokenizer; `vocab.json` + `merges.txt` ->
    GPT2BPETokenizer; nothing usable -> NullTokenizer (token ids in and out)."""
    if os.path.isfile(os.path.join(hf_dir, "tokenizer.json")):
        return dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=path)
    if all(os.path.isfile(os.path.join(hf_dir, n)) for n in ("vocab.json", "merges.txt")):
        return dict(
            tokenizer_type="GPT2BPETokenizer",
            vocab_file=os.path.join(path, "vocab.json"),
            merge_file=os.path.join(path, "merges.txt"),
        )
    return dict(tokenizer_type="NullTokenizer")


def parse_config_json(path: str) -> dict:
    """A HF config.json from elsewhere: a regular UTF-8 file within `LIMITS["json_small"]`
    holding a JSON object; anything else is one line naming the file."""
    text = read_text(path, what="Hugging Face config", max_bytes="json_small")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise UntrustedFileError(
            f"{path} is not JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    if not isinstance(cfg, dict):
        raise UntrustedFileError(f"{path} holds a {type(cfg).__name__}, not a JSON object")
    return cfg


def read_hf_config(hf_dir: str, reader: HFReader | None = None) -> dict:
    """`hf_dir`/config.json, its sizes checked against the tensors in the directory's
    safetensors headers (`reader`, or one opened here when the directory holds safetensors)
    before anything is built from it."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.lexists(path):
        raise ValueError(f"{hf_dir}: no config.json (a Hugging Face model directory needs one)")
    cfg = parse_config_json(path)
    if reader is None and any(n.endswith(".safetensors") for n in os.listdir(hf_dir)):
        reader = HFReader(hf_dir)
    if reader is not None:
        check_config_sizes(cfg, reader.shapes(), path)
    return cfg


def is_hf_dir(path: str) -> bool:
    """True for a directory holding config.json and safetensors weights."""
    if not (path and os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))):
        return False
    return any(n.endswith(".safetensors") for n in os.listdir(path))


def spec_from_hf_config(
    cfg: dict, *, make_vocab_size_divisible_by: int = 128, tensor_model_parallel_size: int = 1
) -> HFModelSpec:
    """Parse a config.json dict; ValueError for an unknown family or an unsupported setting."""
    family = cfg.get("model_type")
    config_kwargs, model_kwargs, spec_kwargs = get_family(family).parse(cfg)
    vocab = int(cfg["vocab_size"])
    padded = vocab_size_with_padding(
        vocab, make_vocab_size_divisible_by, tensor_model_parallel_size
    )
    return HFModelSpec(family, cfg, config_kwargs, model_kwargs, vocab, padded, spec_kwargs)
