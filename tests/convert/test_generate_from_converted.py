"""A converted checkpoint describes itself: `gigatron generate --load OUT --greedy` with no model
or tokenizer flags continues prompts exactly as transformers' greedy `generate` does.

Per family (GPT-2, Llama with GQA, Mistral, Qwen2, Mixtral, Qwen3, Qwen3-MoE, Phi-3): a tiny
random-weight model with a byte-level BPE `tokenizer.json` is saved by transformers and
converted with `gigatron convert`;
`gigatron generate --load OUT --prompt ... --greedy --max-new-tokens 8` (in a fresh process:
generation sets up process groups and global args) must give transformers' token ids. GPT-2
also runs as a subprocess through the `gigatron` command line; its printed text must be the
text transformers decodes. Before issue 30 these runs stopped at `--seq-length is required`;
with it given they fell back to the integer-only NullTokenizer and GPT-2 used erf GELU.
"""

import os
import subprocess
import sys

import pytest
import torch

from gigatron.testing import run_distributed
from tests._paths import REPO
from tests.convert.test_hf_fixtures import ADAPTER_FAMILIES, FAMILIES, make_hf_model

pytestmark = pytest.mark.multirank


transformers = pytest.importorskip("transformers")
ROOT = str(REPO)
PROMPTS = ["hello world", "the quick brown fox", "pack my box"]
NEW_TOKENS = 8
INIT_STD = 0.3  # HF's 0.02 gives tiny models that repeat one token


def _convert(family: str, tmp_path):
    from gigatron.cli import main as cli

    hf_dir, out = str(tmp_path / "hf"), str(tmp_path / "out")
    seed = (FAMILIES + ADAPTER_FAMILIES).index(family)
    hf = make_hf_model(family, hf_dir, seed=seed, tokenizer=True, init_std=INIT_STD)
    assert cli(["convert", "--load", hf_dir, "--save", out]) == 0
    return hf, transformers.AutoTokenizer.from_pretrained(hf_dir), out


def _hf_greedy(hf, tok) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, new ids) per prompt; generation stops at eos (id 0) as gigatron's does."""
    out = []
    for prompt in PROMPTS:
        ids = tok(prompt).input_ids
        with torch.no_grad():
            seq = hf.generate(
                torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, top_k=None
            )
        out.append((ids, seq[0, len(ids) :].tolist()))
    return out


def _generate(argv):
    from gigatron.tools import generate as tool

    return [(r.prompt_tokens, r.generated_tokens) for r in tool.run(argv)]


def _argv(out: str) -> list[str]:
    prompts = [a for p in PROMPTS for a in ("--prompt", p)]
    return ["--load", out, *prompts, "--greedy", "--max-new-tokens", str(NEW_TOKENS)]


# Gemma 2 / 3 have no gigatron train flags yet: generate refuses them (test_gemma_load_refused.py)
@pytest.mark.parametrize(
    "family", [f for f in FAMILIES + ADAPTER_FAMILIES if not f.startswith("gemma")]
)
def test_generate_from_converted_checkpoint_matches_transformers(family, tmp_path):
    hf, tok, out = _convert(family, tmp_path)
    want = _hf_greedy(hf, tok)
    (got,) = run_distributed(_generate, 1, args=(_argv(out),), timeout=120)
    assert [list(p) for p, _ in got] == [p for p, _ in want], "prompt tokenization differs"
    assert [list(g) for _, g in got] == [g for _, g in want]
    assert any(len(g) == NEW_TOKENS for _, g in want)  # not all stopped at eos at once


def test_generate_cli_subprocess_gpt2_text(tmp_path, capsys):
    """`gigatron generate` as a user runs it, from another working directory, after the
    converted directory was moved: the tokenizer is found next to the checkpoint. The
    converter's hint gives whole commands (it used to end in "...")."""
    hf, tok, out = _convert("gpt2", tmp_path)
    hint = capsys.readouterr().out
    assert f"generate:  gigatron generate --load {out} --prompt TEXT --greedy\n" in hint
    assert f"fine-tune: gigatron train --load {out} --finetune --save DIR" in hint
    assert "..." not in hint and "\u2026" not in hint
    moved = str(tmp_path / "moved")
    os.rename(out, moved)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "gigatron.cli", "generate", *_argv(moved)],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout
    assert "a gpt2 checkpoint from Hugging Face" in printed and "openai_gelu" in printed
    for i, (_, new) in enumerate(_hf_greedy(hf, tok)):
        stop = new[-1] == tok.eos_token_id
        end = "end-of-document" if stop else "token limit"
        header = f"----- prompt {i} ({len(new)} new tokens, stopped at {end}) -----"
        text = PROMPTS[i] + tok.decode(new[:-1] if stop else new)
        assert f"{header}\n{text}\n" in printed, printed
