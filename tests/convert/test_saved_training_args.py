"""A converted checkpoint's saved args (and its gigatron_flags.txt) describe the model exactly.

`HFModelSpec.training_args()` parsed as `gigatron train` flags must build, through the training
path (`pretrain_gpt.model_provider`), the very model the converter's `spec.build_model` builds:
same parameters, same logits with the same weights. Checked per family and for the settings the
flags used to drop: GPT-2's tanh GELU (`--openai-gelu`), erf GELU, Llama-3.1 RoPE scaling
(`--use-rope-scaling --rope-scaling-factor`), DeepSeek-V3's MLA and router flags, GPT-OSS's
YaRN (`--position-embedding-type yarn`), sinks, windows and clamped GLU. Then the
files a conversion writes: the flags file lists the saved args, tokenizer paths are relative
to the (movable) checkpoint directory, command-line flags win, and `--load HF_DIR` keeps every
vocabulary row of its config.
"""

import json
import os

import pytest
import torch

from gigatron.convert.hf_config import args_to_flags, spec_from_hf_config

transformers = pytest.importorskip("transformers")
RUN = ["--micro-batch-size", "1", "--train-iters", "1", "--lr", "0", "--mock-data"]
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip


def _cfg(family, **changes):
    from tests.convert.test_hf_fixtures import hf_config

    if family.startswith("deepseek"):  # MLA + MoE (tests/convert/test_deepseek_convert.py)
        from tests.convert.test_deepseek_convert import deepseek_hf_config

        return {**deepseek_hf_config(family), "model_type": family, **changes}
    cfg = json.loads(hf_config(family).to_json_string())
    cfg.update(changes)
    return cfg


def _parsed(fields: dict):
    from gigatron.training.arguments import parse_args, validate_args

    args = parse_args(argv=args_to_flags(fields) + RUN)
    validate_args(args, 1)
    return args


@pytest.fixture
def global_args():
    from gigatron.convert._ckpt_layout import one_rank_world
    from gigatron.training import global_vars

    with one_rank_world():
        yield global_vars.set_args
    global_vars.destroy_global_vars()


@pytest.mark.parametrize(
    "family, changes",
    [
        ("gpt2", {}),  # gelu_new: tanh GELU
        ("gpt2", {"activation_function": "gelu"}),
        ("llama", {}),
        ("llama", {"rope_parameters": LLAMA3_ROPE}),
        ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.5}}),
        ("mistral", {}),
        ("qwen2", {}),
        ("mixtral", {}),
        ("deepseek_v3", {}),  # MLA, YaRN, sigmoid grouped router + expert bias, a dense layer
        ("gpt_oss", {}),  # GPTModel YaRN (no rounding), sinks, windows, clamped quick-GEGLU
    ],
)
def test_saved_args_build_the_converted_model(family, changes, global_args):
    from gigatron.training.pretrain_gpt import model_provider

    spec = spec_from_hf_config(_cfg(family, **changes))
    fields = spec.training_args()
    args = _parsed(fields)
    for name, value in fields.items():
        if name != "padded_vocab_size":  # not a flag; the tokenizer's padding sets it
            assert getattr(args, name) == value, name
    args.padded_vocab_size = spec.padded_vocab_size
    global_args(args)
    torch.manual_seed(0)
    ref = spec.build_model().eval()
    with torch.no_grad():  # random norms too (HF-style init leaves them at 1)
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model = model_provider().eval()
    assert model.load_state_dict(ref.state_dict(), strict=True)
    ids = torch.randint(0, spec.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = model(ids, None, None), ref(ids, None, None)
    # the training path builds the fast spec (SDPA, fused norms): fp32 rounding apart, the same
    # numbers; a wrong GELU or RoPE is off by > 1e-3 with these weights
    err = (got - want).abs().max().item()
    print(f"{family} {sorted(changes)}: max |model_provider - spec.build_model| = {err:.1e}")
    assert err <= 2e-5, err
    if family == "gpt_oss":
        config = model.decoder.layers[0].config
        for field in (
            "yarn_rotary_scaling_factor",
            "yarn_correction_range_round_to_int",
            "softmax_type",
            "window_attn_skip_freq",
            "activation_func_clamp_value",
        ):
            assert getattr(config, field) == spec.config_kwargs[field], field  # fmt: skip
    if family == "gpt2":
        assert args.openai_gelu == (changes.get("activation_function") != "gelu")
    if changes.get("rope_parameters", {}).get("rope_type") == "linear":
        assert args.rotary_seq_len_interpolation_factor == 2.5
    elif "rope_parameters" in changes:
        assert (args.use_rope_scaling, args.rope_scaling_factor, args.rotary_base) == (
            True,
            32.0,
            500000,
        )


def test_converted_flags_file_and_movable_tokenizer(tmp_path, capsys):
    from gigatron.convert import convert_hf_to_gigatron
    from gigatron.convert.hf_config import MODEL_ARGS
    from gigatron.training.arguments import parse_args
    from gigatron.training.checkpoint_args import (
        apply_checkpoint_model_args,
        checkpoint_model_args,
        saved_args,
    )
    from tests.convert.test_hf_fixtures import make_hf_model

    hf_dir, out, moved = str(tmp_path / "hf"), str(tmp_path / "out"), str(tmp_path / "moved")
    make_hf_model("gpt2", hf_dir, tokenizer=True)
    convert_hf_to_gigatron(hf_dir, out)
    saved = saved_args(out)
    assert (saved.tokenizer_type, saved.tokenizer_model) == ("HuggingFaceTokenizer", ".")
    assert saved.openai_gelu and saved.seq_length == saved.max_position_embeddings == 64
    with open(os.path.join(out, "gigatron_flags.txt")) as f:
        flags = f.read().split()
    from_flags = parse_args(argv=flags + RUN)
    for name in MODEL_ARGS:
        if hasattr(saved, name) and name not in ("hf_model_type", "hf_config_json"):
            want = os.path.abspath(out) if name == "tokenizer_model" else getattr(saved, name)
            got = getattr(from_flags, name)
            assert (os.path.abspath(got) if name == "tokenizer_model" else got) == want, name

    os.rename(out, moved)
    fields, what = checkpoint_model_args(moved)
    assert fields["tokenizer_model"] == os.path.abspath(moved) and "gpt2" in what
    args = parse_args(argv=["--load", moved, "--seq-length", "16", *RUN])
    taken = apply_checkpoint_model_args(args, {"seq_length", "load"})
    assert args.seq_length == 16 and "seq_length" not in taken and args.openai_gelu
    line = capsys.readouterr().out
    assert line.startswith(f"loading {moved}: a gpt2 checkpoint from Hugging Face")
    assert "openai_gelu" in line and line.rstrip().endswith("from the command line: seq_length")


def test_load_hf_dir_keeps_config_vocab_beyond_tokenizer(tmp_path):
    """HF configs pad their vocabulary past the tokenizer's (Qwen2: 151936 vs 151646): the
    model built for `--load HF_DIR` has room for every row of the weights."""
    from gigatron.training.arguments import parse_args
    from gigatron.training.checkpoint_args import checkpoint_model_args, hf_dir_vocab
    from tests.convert.test_hf_fixtures import make_hf_model

    hf_dir = str(tmp_path / "hf")
    make_hf_model("qwen2", hf_dir, tokenizer=True, vocab=400)  # tokenizer: 300 ids
    fields, what = checkpoint_model_args(hf_dir)
    assert fields["tokenizer_model"] == os.path.abspath(hf_dir) and fields["vocab_size"] == 400
    assert what.startswith("a Hugging Face qwen2 directory")
    args = parse_args(argv=["--load", hf_dir, "--tensor-model-parallel-size", "2", *RUN])
    assert hf_dir_vocab(args).padded_vocab_size == 512  # 400 -> 2 x 128 multiple
